"""Event-time windows of columnar streams: tumbling, sliding and session windows over a
timestamp column give the per-record windows' results on the same input (final values,
late firings within the allowed lateness, late rows to the late output), whatever the batch
size, and stay exact through a failure and a restore at another parallelism."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from reactive import (
    CheckpointConfig,
    ConfigurationError,
    Dataflow,
    JobFailedError,
    RestartStrategy,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    UserFunctionError,
)
from reactive.connectors.collections import ListSink
from reactive.connectors.files import CommittingFileSink
from reactive.testing import AbortExecution, TestingSource
from reactive.windowing import EventTimeSessionWindows, TumblingProcessingTimeWindows
from reactive.windowing.aggregates import Aggregates, count, max_of, mean, min_of, sum_of

ASSIGNERS = {
    "tumbling": TumblingEventTimeWindows.of(100),
    "sliding": SlidingEventTimeWindows.of(100, 30),
    "sliding-gaps": SlidingEventTimeWindows.of(20, 50, 10),
    "session": EventTimeSessionWindows.with_gap(15),
}
DELAY = 5.0  # the watermark's bounded out-of-orderness


def events(n: int = 3000, seed: int = 3, keys: int = 7, disorder: int = 40) -> pa.Table:
    """Rows mostly in event-time order, some up to ``disorder`` seconds behind (late ones
    among them), with nulls in ``v``."""
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(0, 2000, n)) + rng.integers(-disorder, 10, n)
    v = rng.integers(-5, 50, n)
    return pa.table({"k": [f"k{i}" for i in rng.integers(0, keys, n)],
                     "ts": ts,
                     "v": pa.array(v, mask=rng.random(n) < 0.05)})


async def columnar_windows(table: pa.Table, assigner: Any, lateness: float, batch_size: int,
                     parallelism: int = 2) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    flow = Dataflow("columnar-windows", parallelism=parallelism, max_parallelism=16)
    windowed = (flow.from_arrow(table, batch_size=batch_size)
                    .assign_timestamps("ts", DELAY).set_parallelism(1)
                    .key_by("k").window(assigner, timestamp="ts").allowed_lateness(lateness))
    results, late = ListSink(), ListSink()
    windowed.agg(n=("v", "count"), s=("v", "sum"), lo=("v", "min"), hi=("v", "max"),
                 m=("v", "mean")).to_records().sink(results)
    windowed.late_data().to_records().sink(late)
    await flow.run()
    return (ordered(_result_row(r) for r in results.records),
            ordered((r["k"], r["ts"], r["v"]) for r in late.records))


def ordered(rows: Any) -> list[tuple[Any, ...]]:
    """Rows sorted, None (a null) before any value."""
    return sorted(rows, key=lambda row: [(x is not None, x if x is not None else 0)
                                         for x in row])


def _result_row(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r["k"], r["window_start"], r["window_end"], r["n"], r["s"], r["lo"], r["hi"],
            r["m"])


async def per_record_windows(table: pa.Table, assigner: Any, lateness: float
                       ) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The same windows through the per-record API (the reference)."""
    flow = Dataflow("per-record-windows", parallelism=2, max_parallelism=16)
    stream = (flow.from_collection(table.to_pylist()).set_parallelism(1)
                  .assign_timestamps(lambda r: r["ts"], max_out_of_orderness=DELAY)
                  .set_parallelism(1))
    windowed = stream.key_by(lambda r: r["k"]).window(assigner).allowed_lateness(lateness)
    results, late = ListSink(), ListSink()

    def v(r: dict[str, Any]) -> Any:
        return r["v"]

    stats = Aggregates(count(v), sum_of(v, dtype="int"), min_of(v, dtype="int"),
                       max_of(v, dtype="int"), mean(v))
    windowed.aggregate(stats).map(lambda r: (r.key, r.start, r.end, *r.value)).sink(results)
    windowed.late_data().map(lambda r: (r["k"], r["ts"], r["v"])).sink(late)
    await flow.run()
    return ordered(results.records), ordered(late.records)


@pytest.mark.parametrize("lateness", [0, 20])
@pytest.mark.parametrize("kind", list(ASSIGNERS))
async def test_windows_equal_the_per_record_windows(kind, lateness):
    table = events(1500)
    expected_results, expected_late = await per_record_windows(table, ASSIGNERS[kind], lateness)
    results, late = await columnar_windows(table, ASSIGNERS[kind], lateness, batch_size=97)
    assert results == expected_results
    assert late == expected_late
    if kind == "tumbling":
        # the input really has late rows, and late firings within the lateness
        assert late
        if lateness:
            windows = [(r[0], r[1]) for r in results]
            assert len(set(windows)) < len(windows)


@pytest.mark.parametrize("kind", ["sliding", "session"])
async def test_window_results_do_not_depend_on_the_batch_size(kind):
    table = events(400, seed=5)
    one = await columnar_windows(table, ASSIGNERS[kind], 10, batch_size=1)
    assert await columnar_windows(table, ASSIGNERS[kind], 10, batch_size=13) == one
    assert await columnar_windows(table, ASSIGNERS[kind], 10, batch_size=400,
                            parallelism=3) == one


async def test_arrow_timestamp_columns_and_several_key_columns():
    base = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
    seconds = [0, 30, 59, 61, 125, 40, 190]
    table = pa.table({
        "a": ["x", "x", "y", "x", "x", "x", "y"], "b": [1, 1, 1, 1, 1, 2, 1],
        "at": pa.array([base + datetime.timedelta(seconds=s) for s in seconds],
                       pa.timestamp("ms", tz="UTC")),
        "v": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]})
    flow = Dataflow("timestamps", parallelism=1)
    out = ListSink()
    (flow.from_arrow(table, batch_size=2).assign_timestamps("at", 100)
         .key_by("a", "b").window(TumblingEventTimeWindows.of(60), timestamp="at")
         .agg(total=("v", "sum")).to_records().sink(out))
    await flow.run()
    minute = datetime.timedelta(seconds=60)
    got = sorted((r["a"], r["b"], r["window_start"], r["window_end"], r["total"])
                 for r in out.records)
    assert got == [("x", 1, base, base + minute, 3.0),
                   ("x", 1, base + minute, base + 2 * minute, 4.0),
                   ("x", 1, base + 2 * minute, base + 3 * minute, 5.0),
                   ("x", 2, base, base + minute, 6.0),
                   ("y", 1, base, base + minute, 3.0),
                   ("y", 1, base + 3 * minute, base + 4 * minute, 7.0)]


def test_unsupported_windows_and_columns_fail_when_built():
    flow = Dataflow("bad")
    keyed = flow.from_arrow(events(10)).key_by("k")
    with pytest.raises(ConfigurationError, match="Tumbling"):
        keyed.window(TumblingProcessingTimeWindows.of(10), timestamp="ts")
    with pytest.raises(ConfigurationError, match="no timestamp column"):
        keyed.window(TumblingEventTimeWindows.of(10), timestamp="when")
    with pytest.raises(ConfigurationError, match="timestamp column 'k'"):
        keyed.window(TumblingEventTimeWindows.of(10), timestamp="k")
    with pytest.raises(ConfigurationError, match="first is not supported in session"):
        keyed.window(EventTimeSessionWindows.with_gap(5), timestamp="ts").agg(f=("v", "first"))


async def test_a_null_timestamp_fails_naming_the_operator_and_the_position():
    table = pa.table({"k": ["a", "b", "c"], "ts": pa.array([1, None, 3], pa.int64()),
                      "v": [1, 2, 3]})
    flow = Dataflow("nulls", parallelism=1)
    (flow.from_arrow(table, batch_size=1).assign_timestamps("ts", name="stamps")
         .key_by("k").window(TumblingEventTimeWindows.of(10), timestamp="ts")
         .agg(n=("v", "count")).to_records().sink(ListSink()))
    with pytest.raises(JobFailedError) as info:
        await flow.run(restart=RestartStrategy.none())
    errors = [e for e in _chain(info.value) if isinstance(e, UserFunctionError)]
    assert errors and "stamps" in str(errors[0]) and "row 1" in str(errors[0])
    assert "timestamp column 'ts' is null" in str(errors[0])


def _chain(exc: BaseException | None) -> list[BaseException]:
    out = []
    while exc is not None:
        out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out


# ---------------------------------------------------------------------- exactly once
def window_job(table: pa.Table, assigner: Any, parallelism: int, out: Path,
               checkpoints: Path, fail_at: int | None) -> Dataflow:
    """The windows over ``table`` read in batches of 40 rows by a scripted source. With
    ``fail_at``, the source holds at row ``fail_at // 2`` until a checkpoint completes and
    fails the job at row ``fail_at`` (``TestingSource`` markers), so a checkpoint lies
    between the start and the failure on any machine. Without, a checkpoint marker stands
    where the failure was: a resumed run reads the same items at the same indices."""
    batches = table.to_batches(max_chunksize=40)
    at = (fail_at or 1000) // 40  # the index of the batch that starts at row fail_at
    items: list[Any] = [*batches[:at // 2], TestingSource.CHECKPOINT, *batches[at // 2:at],
                        TestingSource.ABORT if fail_at is not None else TestingSource.CHECKPOINT,
                        *batches[at:]]
    source = TestingSource(items, batch_size=1)
    source.schema = table.schema  # type: ignore[attr-defined]

    flow = Dataflow("columnar-window-eo", parallelism=parallelism, max_parallelism=16)
    (flow.columnar_source(source, uid="source")
         .assign_timestamps("ts", DELAY).set_parallelism(1).uid("stamps")
         .key_by("k").window(assigner, timestamp="ts").allowed_lateness(20)
         .agg(n=("v", "count"), s=("v", "sum"), lo=("v", "min"), hi=("v", "max"),
              m=("v", "mean")).uid("windows")
         .sink(CommittingFileSink(out, format="parquet")).uid("sink"))
    return flow


@pytest.mark.parametrize("kind", ["tumbling", "sliding", "session"])
async def test_exactly_once_through_a_failure_and_a_restore_at_another_parallelism(tmp_path,
                                                                                   kind):
    import pyarrow.parquet as pq

    table = events(2000, seed=11)
    assigner = ASSIGNERS[kind]
    out, chk = tmp_path / "out", tmp_path / "chk"
    config = CheckpointConfig(interval=0.01, directory=chk)
    first = window_job(table, assigner, 2, out, chk, fail_at=1000)
    with pytest.raises(JobFailedError) as info:
        await first.run(checkpoints=config, restart=RestartStrategy.none())
    assert any(isinstance(e, AbortExecution) for e in _chain(info.value))
    before = [r for part in out.glob("part-*") for r in pq.read_table(part).to_pylist()]
    await window_job(table, assigner, 3, out, chk, fail_at=None).run(checkpoints=config,
                                                                   resume=True)
    rows = [r for part in sorted(out.glob("part-*")) for r in pq.read_table(part).to_pylist()]
    expected, _ = await per_record_windows(table, assigner, 20)
    assert len(before) < len(expected)  # the first run failed part way
    assert ordered(_result_row(r) for r in rows) == expected
