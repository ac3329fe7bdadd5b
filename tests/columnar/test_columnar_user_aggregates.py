"""User-defined vectorized aggregates (``VectorizedAggregateFunction``: Flink's
AggregateFunction over arrays) in keyed ``agg`` and in windows: the same values as a
per-row computation and as the per-record windows with the equivalent per-record
AggregateFunction, sessions merging their accumulators, exact through a failure and a
restore at another parallelism."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from reactive import (
    AggregateFunction,
    CheckpointConfig,
    ConfigurationError,
    Dataflow,
    JobFailedError,
    RestartStrategy,
)
from reactive.columnar import VectorizedAggregateFunction
from reactive.connectors.collections import ListSink
from reactive.connectors.files import CommittingFileSink
from reactive.testing import TestingSource
from tests.columnar.test_columnar_windows import ASSIGNERS, DELAY, events, ordered


class Variance(VectorizedAggregateFunction):
    """Population variance of the non-null values (None without any)."""

    accumulators = {"n": (np.int64, 0), "sum": (np.float64, 0.0), "sq": (np.float64, 0.0)}
    result_type = pa.float64()

    def update(self, acc, slots, groups, values):
        valid = values.is_valid().to_numpy(zero_copy_only=False)
        x = values.fill_null(0).to_numpy(zero_copy_only=False).astype(np.float64)
        at = slots[groups[valid]]
        np.add.at(acc["n"], at, 1)
        np.add.at(acc["sum"], at, x[valid])
        np.add.at(acc["sq"], at, x[valid] * x[valid])

    def merge(self, acc, into, other):
        for name in acc:
            np.add.at(acc[name], into, other[name])

    def result(self, acc):
        n = np.maximum(acc["n"], 1)
        mean = acc["sum"] / n
        return pa.array(acc["sq"] / n - mean * mean, mask=acc["n"] == 0)


class VarianceRecords(AggregateFunction):
    """:class:`Variance` as a per-record AggregateFunction (the reference)."""

    def create_accumulator(self) -> tuple[int, float, float]:
        return (0, 0.0, 0.0)

    def add(self, r: dict[str, Any], acc: tuple[int, float, float]) -> tuple[int, float, float]:
        if r["v"] is None:
            return acc
        x = float(r["v"])
        return (acc[0] + 1, acc[1] + x, acc[2] + x * x)

    def merge(self, a: Any, b: Any) -> Any:
        return (a[0] + b[0], a[1] + b[1], a[2] + b[2])

    def get_result(self, acc: Any) -> float | None:
        n = max(acc[0], 1)
        mean = acc[1] / n
        return None if acc[0] == 0 else acc[2] / n - mean * mean


def reference_variance(values: list[Any]) -> float | None:
    acc = VarianceRecords().create_accumulator()
    for v in values:
        acc = VarianceRecords().add({"v": v}, acc)
    return VarianceRecords().get_result(acc)


@pytest.mark.parametrize("emit", ["final", "changelog"])
async def test_keyed_user_aggregate_equals_a_per_row_computation(emit):
    table = events(1500, seed=2)
    flow = Dataflow("udaf", parallelism=2, max_parallelism=16)
    out = ListSink()
    (flow.from_arrow(table, batch_size=101).key_by("k")
         .agg(emit=emit, var=("v", Variance()), n=("v", "count")).to_records().sink(out))
    await flow.run()
    seen: dict[str, list[Any]] = collections.defaultdict(list)
    expected = []
    for r in table.to_pylist():
        seen[r["k"]].append(r["v"])
        expected.append((r["k"], reference_variance(seen[r["k"]]),
                         sum(v is not None for v in seen[r["k"]])))
    if emit == "final":
        expected = [(k, reference_variance(vs), sum(v is not None for v in vs))
                    for k, vs in seen.items()]
    assert ordered((r["k"], r["var"], r["n"]) for r in out.records) == ordered(expected)


async def records_windows(table: pa.Table, assigner: Any) -> list[tuple[Any, ...]]:
    flow = Dataflow("udaf-records", parallelism=2, max_parallelism=16)
    out = ListSink()
    (flow.from_collection(table.to_pylist()).set_parallelism(1)
         .assign_timestamps(lambda r: r["ts"], max_out_of_orderness=DELAY).set_parallelism(1)
         .key_by(lambda r: r["k"]).window(assigner).allowed_lateness(20)
         .aggregate(VarianceRecords()).map(lambda r: (r.key, r.start, r.end, r.value))
         .sink(out))
    await flow.run()
    return ordered(out.records)


@pytest.mark.parametrize("kind", ["tumbling", "sliding", "session"])
async def test_user_aggregate_in_windows_equals_the_per_record_aggregate_function(kind):
    table = events(2000, seed=4)
    flow = Dataflow("udaf-windows", parallelism=2, max_parallelism=16)
    out = ListSink()
    (flow.from_arrow(table, batch_size=61).assign_timestamps("ts", DELAY).set_parallelism(1)
         .key_by("k").window(ASSIGNERS[kind], timestamp="ts").allowed_lateness(20)
         .agg(var=("v", Variance())).to_records().sink(out))
    await flow.run()
    got = ordered((r["k"], r["window_start"], r["window_end"], r["var"]) for r in out.records)
    assert got == await records_windows(table, ASSIGNERS[kind])


def test_a_user_aggregate_without_accumulators_fails_when_built():
    class Empty(Variance):
        accumulators: dict[str, tuple[Any, Any]] = {}

    keyed = Dataflow("bad").from_arrow(events(10)).key_by("k")
    with pytest.raises(ConfigurationError, match="accumulators"):
        keyed.agg(x=("v", Empty()))
    with pytest.raises(ConfigurationError, match="no column"):
        keyed.agg(x=("missing", Variance()))


async def test_user_aggregate_windows_exact_through_a_failure_and_a_rescale(tmp_path: Path):
    import pyarrow.parquet as pq

    table = events(3000, seed=8)
    out, chk = tmp_path / "out", tmp_path / "chk"

    def job(parallelism: int, fail: bool) -> Dataflow:
        # batches of 40 rows; the source holds at row 760 until a checkpoint completes and,
        # with ``fail``, fails the job at row 1,520 (a checkpoint lies between on any
        # machine); without, a checkpoint marker stands there: same items at same indices
        batches = table.to_batches(max_chunksize=40)
        source = TestingSource([*batches[:19], TestingSource.CHECKPOINT, *batches[19:38],
                                TestingSource.ABORT if fail else TestingSource.CHECKPOINT,
                                *batches[38:]], batch_size=1)
        source.schema = table.schema  # type: ignore[attr-defined]

        flow = Dataflow("udaf-eo", parallelism=parallelism, max_parallelism=16)
        (flow.columnar_source(source, uid="source")
             .assign_timestamps("ts", DELAY).set_parallelism(1).uid("stamps")
             .key_by("k").window(ASSIGNERS["session"], timestamp="ts").allowed_lateness(20)
             .agg(var=("v", Variance())).uid("windows")
             .sink(CommittingFileSink(out, format="parquet")).uid("sink"))
        return flow

    config = CheckpointConfig(interval=0.01, directory=chk)
    with pytest.raises(JobFailedError):
        await job(2, True).run(checkpoints=config, restart=RestartStrategy.none())
    await job(3, False).run(checkpoints=config, resume=True)
    rows = [r for p in sorted(out.glob("part-*")) for r in pq.read_table(p).to_pylist()]
    got = ordered((r["k"], r["window_start"], r["window_end"], r["var"]) for r in rows)
    assert got == await records_windows(table, ASSIGNERS["session"])
