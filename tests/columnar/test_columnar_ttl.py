"""Time-to-live of the columnar keyed aggregation (``agg(..., ttl=...)``): a key not written
for ``ttl`` seconds of processing time is expired (a manual clock moves time, no sleeps):
seen again it counts from zero, and it is left out of the final output and of snapshots,
which carry the keys' last-write times so a restore at another parallelism neither
resurrects an expired key nor expires a live one early."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from reactive import ConfigurationError, Dataflow, KeyGroupRange, key_group_range_for_operator
from reactive.connectors.collections import ListSink
from reactive.state.ttl_config import StateTtlConfig
from reactive.time.clock import ManualClock
from tests.columnar.test_columnar import batch_of, finals, snapshot, words_table

TTL = 10.0


def ttl_operator(kgr: KeyGroupRange, clock: ManualClock, incremental: bool = False,
                 emit: str = "final"):
    from reactive.columnar.aggregate_operator import ColumnarAggregateOperator
    from reactive.columnar.aggregates import parse_aggregates
    from reactive.columnar.state import ColumnarKeyedStateBackend

    schema = pa.schema([("word", pa.string()), ("n", pa.int64())])
    specs = parse_aggregates(schema, {"count": ("word", "count"), "total": ("n", "sum")})
    out = pa.schema([schema.field("word"), *(s.output_field() for s in specs)])
    op = ColumnarAggregateOperator("agg", "agg", ["word"], specs, emit, out,
                                   StateTtlConfig(TTL, clock=clock))
    op.setup(0, 1, 16, ColumnarKeyedStateBackend(kgr, 16, incremental))
    return op


def rows_written(handle: dict, job_dir: Path) -> list[str]:
    words = []
    for ref in handle["files"]:
        with pa.ipc.open_file(job_dir / ref["path"]) as f:
            words.extend(f.read_all().column("word").to_pylist())
    return words


def test_an_expired_key_counts_from_zero_and_leaves_the_final_output():
    clock = ManualClock(1000.0)
    op = ttl_operator(KeyGroupRange(0, 15), clock, emit="changelog")
    op.open()
    op.process_batch([batch_of(["a", "b", "a"])])  # n = 0, 1, 2
    clock.advance(5)
    op.process_batch([batch_of(["a"])])  # a: written at 1005
    clock.advance(TTL - 5)  # 1010: b (written at 1000) expires now, a lives until 1015
    [out] = op.process_batch([batch_of(["b", "a", "b"])])
    # b starts from a fresh accumulator: its expired count (1) and total (1) are gone
    assert out.to_pylist() == [{"word": "b", "count": 1, "total": 0},
                               {"word": "a", "count": 4, "total": 3},
                               {"word": "b", "count": 2, "total": 2}]
    op.emit = "final"
    clock.advance(TTL - 0.001)  # a, b written at 1010: live until 1020
    assert finals(op) == {"a": (4, 3), "b": (2, 2)}
    clock.advance(0.001)
    assert finals(op) == {}  # an expired value is never returned


@pytest.mark.parametrize("incremental", [False, True])
async def test_a_restore_at_another_parallelism_keeps_live_keys_and_drops_expired_ones(
        tmp_path, incremental):
    clock = ManualClock(0.0)
    op = ttl_operator(KeyGroupRange(0, 15), clock, incremental)
    op.open()
    words = [f"w{i}" for i in range(100)]
    op.process_batch([batch_of(words)])  # every word written at 0
    first = await snapshot(op, tmp_path, 1)
    assert sorted(rows_written(first, tmp_path)) == sorted(words)
    clock.advance_to(8)
    op.process_batch([batch_of(words[:50])])  # w0..w49 written at 8: live until 18
    clock.advance_to(12)  # w50..w99 expired at 10
    handle = await snapshot(op, tmp_path, 2)
    # the snapshot writes no expired key (incremental: the changed, live keys)
    assert sorted(rows_written(handle, tmp_path)[100 if incremental else 0:]) == \
        sorted(words[:50])
    assert finals(op) == {w: (2, i + i) for i, w in enumerate(words[:50])}

    def restore(at: float) -> list:
        clock.advance_to(at)
        ops = []
        for i in range(2):
            kgr = key_group_range_for_operator(i, 2, 16)
            restored = ttl_operator(kgr, clock, incremental)
            restored.keyed_backend.restore([handle], tmp_path)
            restored.open()
            ops.append(restored)
        return ops

    # restored later, 1 s before w0..w49 expire: no expired key comes back, no live one
    # is lost (an incremental chain's older file still holds w50..w99, written at 0)
    ops = restore(17.0)
    got: dict = {}
    for restored in ops:
        got.update(finals(restored))
    assert got == {w: (2, i + i) for i, w in enumerate(words[:50])}
    assert sum(r.index.size for r in ops) == 50  # expired keys take no slot
    # a live key goes on counting; an expired one comes back from zero
    for restored in ops:
        restored.process_batch([batch_of(["w0", "w99"])])
    merged: dict = {}
    for restored in ops:
        merged.update(finals(restored))
    assert merged["w0"] == (3, 0) and merged["w99"] == (1, 1)
    clock.advance_to(18.0)  # w1..w49 (written at 8) expire now; w0, w99 (at 17) live
    merged = {}
    for restored in ops:
        merged.update(finals(restored))
    assert merged == {"w0": (3, 0), "w99": (1, 1)}
    # restored after w0..w49's expiry: nothing comes back
    assert all(finals(r) == {} for r in restore(18.0))


async def test_agg_with_ttl_in_a_dataflow_equals_the_batch_computation():
    table = words_table(3000)
    flow = Dataflow("columnar-ttl", parallelism=2, max_parallelism=16)
    sink = ListSink()
    (flow.from_arrow(table, batch_size=257).key_by("word")
         .agg(emit="final", ttl=StateTtlConfig(60.0, clock=ManualClock(0.0)),
              count=("n", "count"), total=("n", "sum"))
         .to_records().sink(sink))
    await flow.run()
    expected = table.group_by("word", use_threads=False).aggregate(
        [("n", "count"), ("n", "sum")]).to_pylist()
    assert sorted((r["word"], r["count"], r["total"]) for r in sink.records) == \
        sorted((e["word"], e["n_count"], e["n_sum"]) for e in expected)


@pytest.mark.parametrize("ttl", [
    0, -1.0, StateTtlConfig(5.0, time_characteristic="event_time"),
    StateTtlConfig(5.0, visibility="return_expired_if_not_cleaned_up")])
def test_a_ttl_the_aggregation_cannot_keep_is_refused_when_built(ttl):
    flow = Dataflow("columnar-ttl-bad")
    keyed = flow.from_arrow(words_table(10)).key_by("word")
    with pytest.raises(ConfigurationError, match="ttl"):
        keyed.agg(ttl=ttl, count=("n", "count"))


async def test_a_reader_of_an_incremental_chain_sees_no_key_expired_at_its_barrier(tmp_path):
    """The older file of a chain still holds keys that expired since: the snapshot's
    key-group reader (state queries, the checkpoint reader) leaves them out."""
    from reactive.state.key_group_stream import read_key_groups

    clock = ManualClock(0.0)
    op = ttl_operator(KeyGroupRange(0, 15), clock, incremental=True)
    op.open()
    op.process_batch([batch_of(["a", "b", "c"])])
    await snapshot(op, tmp_path, 1)
    clock.advance_to(8)
    op.process_batch([batch_of(["a"])])
    clock.advance_to(12)  # b and c expired at 10
    handle = await snapshot(op, tmp_path, 2)
    assert len(handle["chain"]) == 2
    counts: dict = {}
    for kg in read_key_groups(handle, tmp_path):
        counts.update(kg.states["count"])
    assert counts == {"a": 2}


@pytest.mark.parametrize("emit", ["changelog", "final"])
def test_after_expiry_every_function_equals_a_fresh_aggregation_of_the_later_rows(emit):
    """A key's state after its expiry is that of a key never seen: for every function
    (running and final), the values equal an aggregation without ttl of the later rows."""
    from reactive.columnar.aggregate_operator import ColumnarAggregateOperator
    from reactive.columnar.aggregates import parse_aggregates

    table = words_table(600, vocabulary=20)
    early, late = table.slice(0, 300).to_batches()[0], table.slice(300).to_batches()[0]
    functions = {f: ("n" if f != "mean" else "x", f)
                 for f in ("count", "sum", "mean", "min", "max", "first", "last")}
    specs = parse_aggregates(table.schema, functions)
    out = pa.schema([table.schema.field("word"), *(s.output_field() for s in specs)])

    def operator(ttl: StateTtlConfig | None) -> ColumnarAggregateOperator:
        from reactive.columnar.state import ColumnarKeyedStateBackend

        op = ColumnarAggregateOperator("agg", "agg", ["word"], specs, emit, out, ttl)
        op.setup(0, 1, 16, ColumnarKeyedStateBackend(KeyGroupRange(0, 15), 16))
        op.open()
        return op

    clock = ManualClock(0.0)
    with_ttl = operator(StateTtlConfig(TTL, clock=clock))
    with_ttl.process_batch([early])
    clock.advance(TTL)  # every key of the early rows expires
    got = with_ttl.process_batch([late]) + with_ttl.end_input()
    fresh = operator(None)
    expected = fresh.process_batch([late]) + fresh.end_input()
    rows = [r for b in got for r in b.to_pylist()]
    want = [r for b in expected for r in b.to_pylist()]
    if emit == "final":  # one row per key, in slot order (the ttl run met keys earlier)
        rows, want = sorted(rows, key=str), sorted(want, key=str)
    assert len(rows) == len(want) > 0 and rows == want


def test_a_dictionary_value_without_rows_in_a_batch_is_not_written_by_it():
    """A dictionary-encoded batch maps its whole dictionary to slots: only the keys its
    rows hold are written (their time to live restarts), the others keep their time."""
    clock = ManualClock(0.0)
    op = ttl_operator(KeyGroupRange(0, 15), clock)
    op.open()
    op.process_batch([batch_of(["a", "b"])])
    clock.advance_to(8)
    words = pa.DictionaryArray.from_arrays(pa.array([0, 0], pa.int32()), pa.array(["a", "b"]))
    op.process_batch([pa.record_batch({"word": words, "n": [1, 2]})])
    clock.advance_to(12)  # b, written at 0 only, expired at 10
    assert finals(op) == {"a": (3, 3)}


@pytest.mark.parametrize("incremental", [False, True])
async def test_expired_keys_leave_memory_and_snapshots_stay_exact(tmp_path, incremental,
                                                                  monkeypatch):
    """An open key space (each key active for one batch): the key index stays bounded by
    about four times the live keys, and a snapshot taken across the drop (incremental: a chain
    from before it) restores exactly the live keys and values."""
    from reactive.columnar.aggregate_operator import ColumnarAggregateOperator

    monkeypatch.setattr(ColumnarAggregateOperator, "compact_min_slots", 64)
    clock = ManualClock(0.0)
    op = ttl_operator(KeyGroupRange(0, 15), clock, incremental)
    op.open()
    sizes = []
    for step in range(60):
        clock.advance(1.0)  # a key lives TTL = 10 batches
        op.process_batch([batch_of([f"k{step}-{i}" for i in range(20)] + ["hot"])])
        sizes.append(op.index.size)
        if step == 30:
            await snapshot(op, tmp_path, 1)
    assert max(sizes[30:]) <= 4 * 11 * 21 + 21  # not 60 * 20 keys
    handle = await snapshot(op, tmp_path, 2)
    if incremental:  # the chain's first file has the slots of before the drop
        assert len(handle["chain"]) == 2
    expected = {f"k{s}-{i}": (1, i) for s in range(50, 60) for i in range(20)}
    expected["hot"] = (60, 60 * 20)
    assert finals(op) == expected
    restored = ttl_operator(KeyGroupRange(0, 15), clock, incremental)
    restored.keyed_backend.restore([handle], tmp_path)
    restored.open()
    assert finals(restored) == expected


async def test_a_snapshot_in_flight_across_the_drop_writes_the_state_at_its_barrier(
        tmp_path, monkeypatch):
    from reactive.columnar.aggregate_operator import ColumnarAggregateOperator
    from reactive.state.backend import SnapshotContext

    # the check runs before the third batch (100 keys), which finds 99 of them expired
    monkeypatch.setattr(ColumnarAggregateOperator, "compact_min_slots", 100)
    clock = ManualClock(0.0)
    op = ttl_operator(KeyGroupRange(0, 15), clock)
    op.open()
    op.process_batch([batch_of([f"old{i}" for i in range(1, 100)])])
    clock.advance(5)
    op.process_batch([batch_of(["old0"])])
    ctx = SnapshotContext(1, tmp_path, tmp_path / "chk-1", tmp_path / "shared", "agg", 0)
    in_flight = op.keyed_backend.snapshot(ctx)  # the synchronous part only
    clock.advance(5)  # old1..old99 expire: the next batch drops them from memory
    op.process_batch([batch_of(["old0", "new"])])
    assert op.index.size == 2
    handle = await in_flight.write()
    restored = ttl_operator(KeyGroupRange(0, 15), ManualClock(5.0))
    restored.keyed_backend.restore([handle], tmp_path)
    restored.open()
    assert finals(restored) == {"old0": (1, 0), **{f"old{i}": (1, i - 1) for i in range(1, 100)}}
    assert finals(op) == {"old0": (2, 0), "new": (1, 1)}
