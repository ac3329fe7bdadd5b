"""``MaxRows``, the vectorized aggregate that keeps the rows with a group's highest value
(ties kept, SQL's ``RANK() = 1``): its accumulators across batches and merges, and in
tumbling and session windows the same rows as a per-record AggregateFunction keeping the
maximum's rows, and per key on the heap and RocksDB backends the rows a Python loop keeps."""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from reactive import AggregateFunction, ConfigurationError, Dataflow
from reactive.columnar import MaxRows
from reactive.connectors.collections import ListSink
from tests.columnar.test_columnar_windows import ASSIGNERS, DELAY, events, ordered

ROW = pa.struct([("v", pa.int64()), ("at", pa.timestamp("ms")), ("name", pa.string())])


def rows(*values: tuple[int | None, int, str | None]) -> pa.StructArray:
    return pa.array([{"v": v, "at": dt.datetime(2020, 1, 1) + dt.timedelta(seconds=s),
                      "name": n} for v, s, n in values], ROW)


def fresh(fn: MaxRows, slots: int) -> dict[str, np.ndarray]:
    return {name: np.full(slots, initial, dtype)
            for name, (dtype, initial) in fn.accumulators.items()}


def kept(fn: MaxRows, acc: dict[str, np.ndarray]) -> list[list[tuple[Any, ...]]]:
    return [[(r["v"], r["at"].second, r["name"]) for r in slot]
            for slot in fn.result(acc).to_pylist()]


def test_max_rows_keeps_every_tie_across_batches_and_merges() -> None:
    fn = MaxRows(ROW, by="v", capacity=3)
    acc = fresh(fn, 3)
    # slot 0: 2, 5, 5; slot 1: 4; a null value is skipped; slot 2 sees nothing
    fn.update(acc, np.array([0, 1]), np.array([0, 0, 1, 0, 1]),
              rows((2, 1, "a"), (5, 2, "b"), (4, 3, None), (5, 4, "c"), (None, 5, "d")))
    assert kept(fn, acc) == [[(5, 2, "b"), (5, 4, "c")], [(4, 3, None)], []]
    # a later batch: another tie in slot 0 (kept after the earlier ones), a higher value
    # replacing slot 1's, a lower one left out
    fn.update(acc, np.array([1, 0]), np.array([0, 1, 0, 1]),
              rows((6, 6, "e"), (5, 7, "f"), (-1, 8, "g"), (1, 9, "h")))
    assert kept(fn, acc) == [[(5, 2, "b"), (5, 4, "c"), (5, 7, "f")], [(6, 6, "e")], []]
    # merging slot 1 into the empty slot 2, then slot 2 into slot 0: the higher value wins
    fn.merge(acc, np.array([2]), {name: a[1:2].copy() for name, a in acc.items()})
    assert kept(fn, acc)[2] == [(6, 6, "e")]
    fn.merge(acc, np.array([0]), {name: a[2:3].copy() for name, a in acc.items()})
    assert kept(fn, acc)[0] == [(6, 6, "e")]
    # a fourth tie is beyond the capacity: the job fails instead of dropping one
    with pytest.raises(ValueError, match="more than 3 rows tie"):
        fn.update(acc, np.array([0]), np.zeros(3, np.int64),
                  rows((6, 10, "x"), (6, 11, "y"), (6, 12, "z")))


def test_max_rows_ranks_floats_skipping_nan() -> None:
    row = pa.struct([("x", pa.float64()), ("id", pa.int64())])
    fn = MaxRows(row, by="x", capacity=2)
    acc = fresh(fn, 1)
    fn.update(acc, np.array([0]), np.zeros(4, np.int64),
              pa.array([{"x": -3.5, "id": 1}, {"x": float("nan"), "id": 2},
                        {"x": None, "id": 3}, {"x": -3.5, "id": 4}], row))
    assert fn.result(acc).to_pylist() == [[{"x": -3.5, "id": 1}, {"x": -3.5, "id": 4}]]


def test_max_rows_checks_its_row_type() -> None:
    with pytest.raises(ConfigurationError, match="struct"):
        MaxRows(pa.int64(), by="v")
    with pytest.raises(ConfigurationError, match="no field 'w'"):
        MaxRows(ROW, by="w")
    with pytest.raises(ConfigurationError, match="number or a timestamp"):
        MaxRows(ROW, by="name")


class MaxRowsRecords(AggregateFunction):
    """The reference: the highest ``v`` and the ``(v, ts, k)`` rows that have it."""

    def create_accumulator(self) -> tuple[Any, tuple[Any, ...]]:
        return (None, ())

    def add(self, r: dict[str, Any], acc: tuple[Any, tuple[Any, ...]]) -> Any:
        v = r["v"]
        if v is None or (acc[0] is not None and v < acc[0]):
            return acc
        row = (v, r["ts"], r["k"])
        return (v, (*acc[1], row)) if v == acc[0] else (v, (row,))

    def merge(self, a: Any, b: Any) -> Any:
        if a[0] is None or (b[0] is not None and b[0] > a[0]):
            return b
        return a if b[0] is None or b[0] < a[0] else (a[0], a[1] + b[1])

    def get_result(self, acc: Any) -> list[Any]:
        return sorted(acc[1])


@pytest.mark.parametrize("kind", ["tumbling", "session"])
async def test_max_rows_in_windows_equals_the_per_record_aggregate(kind: str) -> None:
    # values in a narrow range: many windows have tied maxima; rows in event-time order, so
    # that each window fires once, whatever the sources' watermark timing
    table = events(2000, seed=6).sort_by("ts")
    table = table.set_column(2, "v", pc.divide(table.column("v"), 10))
    row = pa.struct([("v", pa.int64()), ("ts", pa.int64()), ("k", pa.string())])
    flow = Dataflow("max-rows", parallelism=2, max_parallelism=16)
    out = ListSink()
    (flow.from_arrow(table, batch_size=61).assign_timestamps("ts", DELAY).set_parallelism(1)
         .select("k", "ts", row=pc.make_struct(pc.field("v"), pc.field("ts"), pc.field("k"),
                                               field_names=["v", "ts", "k"]))
         .key_by("k").window(ASSIGNERS[kind], timestamp="ts").allowed_lateness(20)
         .agg(top=("row", MaxRows(row, by="v", capacity=64))).to_records().sink(out))
    await flow.run()
    got = ordered((r["k"], r["window_start"], r["window_end"],
                   tuple(sorted((t["v"], t["ts"], t["k"]) for t in r["top"])))
                  for r in out.records)

    reference = Dataflow("max-rows-records", parallelism=2, max_parallelism=16)
    expected = ListSink()
    (reference.from_collection(table.to_pylist()).set_parallelism(1)
              .assign_timestamps(lambda r: r["ts"], max_out_of_orderness=DELAY)
              .set_parallelism(1)
              .key_by(lambda r: r["k"]).window(ASSIGNERS[kind]).allowed_lateness(20)
              .aggregate(MaxRowsRecords())
              .map(lambda r: (r.key, r.start, r.end, tuple(r.value))).sink(expected))
    await reference.run()
    assert got == ordered(expected.records)
    assert any(len(r[3]) > 1 for r in got)  # ties were kept


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
async def test_max_rows_per_key_on_both_backends(backend: str, tmp_path: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # a keyed (not windowed) aggregate: on RocksDB its timestamps and strings go through
    # the store's rows, the cache emptied and read back many times (8 slots cached)
    from reactive.backends.rocksdb import RocksDBStateBackend
    from reactive.columnar.aggregate_operator import ColumnarAggregateOperator

    monkeypatch.setattr(ColumnarAggregateOperator, "cache_slots", 8)
    table = events(3000, seed=9, keys=40)
    table = table.set_column(2, "v", pc.divide(table.column("v"), 10)).append_column(
        "at", pc.cast(pc.multiply(table.column("ts"), 1000), pa.timestamp("ms")))
    row = pa.struct([("v", pa.int64()), ("at", pa.timestamp("ms")), ("k", pa.string())])
    flow = Dataflow("max-rows-keyed", parallelism=2, max_parallelism=16)
    out = ListSink()
    keyed = (flow.from_arrow(table, batch_size=97)
             .select("k", row=pc.make_struct(pc.field("v"), pc.field("at"), pc.field("k"),
                                             field_names=["v", "at", "k"]))
             .key_by("k"))
    keyed.agg(emit="final", top=("row", MaxRows(row, by="v", capacity=128))) \
        .to_records().sink(out)
    await flow.run(state_backend=None if backend == "heap"
                   else RocksDBStateBackend(tmp_path / "work"))
    got = {r["k"]: sorted((t["v"], t["at"], t["k"]) for t in r["top"]) for r in out.records}
    expected: dict[str, list[Any]] = {}
    for r in table.to_pylist():
        if r["v"] is None:
            continue
        kept = expected.setdefault(r["k"], [])
        if kept and r["v"] > kept[0][0]:
            kept.clear()
        if not kept or r["v"] == kept[0][0]:
            kept.append((r["v"], r["at"], r["k"]))
    assert got == {k: sorted(v) for k, v in expected.items()}
    assert any(len(v) > 1 for v in got.values())
