"""Columnar streams: record batches through sources, vectorized operators, the columnar
key_by exchange (agreeing with the per-record key groups) and keyed aggregation with
columnar state, exactly once across a failure and a restore at another parallelism."""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reactive import (
    CheckpointConfig,
    ConfigurationError,
    Dataflow,
    JobFailedError,
    RestartStrategy,
    UnsupportedKeyError,
    assign_to_key_group,
    key_group_range_for_operator,
)
from reactive.columnar import SchemaMismatchError
from reactive.columnar.grouping import Grouping
from reactive.columnar.key_index import KeyIndex
from reactive.columnar.partitioning import ColumnarKeyGroupPartitioner
from reactive.connectors.collections import ListSink
from reactive.connectors.files import CommittingFileSink
from reactive.testing import AbortExecution, TestingSource


def words_table(n: int = 2000, vocabulary: int = 50, seed: int = 1) -> pa.Table:
    rng = np.random.default_rng(seed)
    idx = rng.zipf(1.3, n) % vocabulary
    return pa.table({"word": [f"w{i}" for i in idx], "n": rng.integers(-50, 50, n),
                     "x": rng.normal(size=n)})


def chain(exc: BaseException | None) -> list[BaseException]:
    out = []
    while exc is not None:
        out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out


# ---------------------------------------------------------------------- stateless
async def test_filter_select_map_batches_match_a_batch_computation():
    table = words_table()
    flow = Dataflow("columnar-stateless")
    sink = ListSink()
    (flow.from_arrow(table, batch_size=128)
         .filter(pc.field("n") > 0)
         .select("word", "n", doubled=pc.field("n") * 2)
         .map_batches(lambda b: b.append_column("neg", pc.negate(b.column("n"))),
                      schema=pa.schema([("word", pa.string()), ("n", pa.int64()),
                                        ("doubled", pa.int64()), ("neg", pa.int64())]))
         .to_records().sink(sink))
    await flow.run()
    kept = table.filter(pc.field("n") > 0)
    expected = [{"word": w, "n": n, "doubled": 2 * n, "neg": -n}
                for w, n in zip(kept.column("word").to_pylist(), kept.column("n").to_pylist(),
                                strict=True)]
    assert sink.records == expected


async def test_to_columnar_and_back():
    records = [{"word": f"w{i % 7}", "n": i} for i in range(500)]
    schema = pa.schema([("word", pa.string()), ("n", pa.int64())])
    flow = Dataflow("columnar-roundtrip", batch_size=64)
    sink = ListSink()
    (flow.from_collection(records).to_columnar(schema).key_by("word")
         .agg(count=("n", "count"), total=("n", "sum")).to_records().sink(sink))
    await flow.run()
    counts: dict[str, int] = collections.Counter()
    totals: dict[str, int] = collections.Counter()
    expected = []
    for r in records:
        counts[r["word"]] += 1
        totals[r["word"]] += r["n"]
        expected.append({"word": r["word"], "count": counts[r["word"]],
                         "total": totals[r["word"]]})
    assert sink.records == expected  # parallelism 1: the input order


async def test_a_batch_of_another_schema_fails_naming_operator_column_and_position():
    table = words_table(1000)

    def breaks(b: pa.RecordBatch) -> pa.RecordBatch:
        return b.set_column(1, "n", pc.cast(b.column("n"), pa.float64()))

    flow = Dataflow("columnar-schema")
    flow.from_arrow(table, batch_size=300).map_batches(breaks, name="cast-n").to_records() \
        .sink(ListSink())
    with pytest.raises(JobFailedError) as info:
        await flow.run(restart=RestartStrategy.none())
    err = next(e for e in chain(info.value) if isinstance(e, SchemaMismatchError))
    assert err.operator == "cast-n" and err.column == "n" and err.position == "row 0"
    assert "double" in str(err) and "int64" in str(err)


def test_from_arrow_refuses_batches_of_different_schemas():
    a = pa.record_batch({"k": ["a"], "n": [1]})
    b = pa.record_batch({"k": ["b"], "n": [1.5]})
    with pytest.raises(ConfigurationError, match=r"column 'n'.*row 1"):
        Dataflow("bad").from_arrow([a, b])


def test_unknown_columns_and_functions_fail_when_built():
    s = Dataflow("bad").from_arrow(words_table(10))
    with pytest.raises(ConfigurationError, match="no column 'nope'"):
        s.key_by("nope")
    with pytest.raises(ConfigurationError, match="unknown function 'median'"):
        s.key_by("word").agg(m=("n", "median"))
    with pytest.raises(ConfigurationError, match="numeric"):
        s.key_by("n").agg(m=("word", "sum"))


# ---------------------------------------------------------------------- key groups
keys_st = st.one_of(
    st.lists(st.one_of(st.none(), st.text(max_size=12)), min_size=1, max_size=60),
    st.lists(st.one_of(st.none(), st.integers(min_value=-2**63, max_value=2**63 - 1)),
             min_size=1, max_size=60),
).filter(lambda keys: any(k is not None for k in keys))  # a column of nulls has no type


@settings(max_examples=60, deadline=None)
@given(keys=keys_st, maxp=st.integers(1, 300), parallelism=st.integers(1, 7),
       dictionary=st.booleans())
def test_columnar_key_groups_agree_with_the_per_record_api(keys, maxp, parallelism, dictionary):
    parallelism = min(parallelism, maxp)
    column = pa.array(keys)
    if dictionary:
        column = column.dictionary_encode()
    batch = pa.record_batch({"k": column, "row": list(range(len(keys)))})
    index = KeyIndex(["k"], maxp)
    found = index.lookup(batch)
    row_kgs = index.key_groups[found.slots][found.codes]
    assert row_kgs.tolist() == [assign_to_key_group(k, maxp) for k in keys]
    # one slot per distinct key (None included), the same in a second batch
    row_slots = found.slots[found.codes].tolist()
    assert len(set(row_slots)) == len(set(keys)) == index.size
    again = index.lookup(batch.slice(len(keys) // 2))
    assert again.slots[again.codes].tolist() == row_slots[len(keys) // 2:]
    # the exchange sends each row to the instance owning its key group, in input order
    partitioner = ColumnarKeyGroupPartitioner(parallelism, ["k"], maxp)
    parts = partitioner.split([batch])
    for channel, batches in enumerate(parts):
        kgr = key_group_range_for_operator(channel, parallelism, maxp)
        rows = [r for b in batches for r in b.column("row").to_pylist()]
        assert rows == sorted(rows)
        assert all(assign_to_key_group(keys[r], maxp) in kgr for r in rows)
    assert sorted(r for bs in parts for b in bs for r in b.column("row").to_pylist()) == \
        list(range(len(keys)))


def test_a_key_without_canonical_encoding_names_the_operator():
    index = KeyIndex(["x"], 128, operator="agg-x")
    with pytest.raises(UnsupportedKeyError, match="NaN") as info:
        index.lookup(pa.record_batch({"x": [1.5, float("nan")]}))
    assert info.value.operator == "agg-x"
    assert index.size == 0


@settings(max_examples=40, deadline=None)
@given(codes=st.lists(st.integers(0, 70_000), min_size=1, max_size=200))
def test_grouping_ranks_and_running_extrema(codes):
    arr = np.array(codes, np.int64)
    _, dense = np.unique(arr, return_inverse=True)
    # the codes as given (large, sparse) and as dense indices take both sort paths
    for c, ng in ((arr, 70_001), (dense.astype(np.int64), int(dense.max()) + 1)):
        g = Grouping(c, ng)
        values = (c * 7919) % 101 - 50
        seen: dict[int, list[int]] = collections.defaultdict(list)
        ranks, maxima, sums = [], [], []
        for code, v in zip(c.tolist(), values.tolist(), strict=True):
            seen[code].append(v)
            ranks.append(len(seen[code]) - 1)
            maxima.append(max(seen[code]))
            sums.append(sum(seen[code]))
        assert g.rank().tolist() == ranks
        assert g.running_max(values)[0].tolist() == maxima
        assert g.running_sum(values)[0].tolist() == sums


# ---------------------------------------------------------------------- aggregation
async def test_final_aggregates_equal_pyarrow_group_by_with_nulls():
    table = words_table(3000)
    n = table.column("n").to_pylist()
    table = table.set_column(1, "n", pa.array([None if i % 11 == 0 else v
                                               for i, v in enumerate(n)], pa.int64()))
    flow = Dataflow("columnar-final", parallelism=3, max_parallelism=16)
    sink = ListSink()
    (flow.from_arrow(table, batch_size=257).key_by("word")
         .agg(emit="final", count=("n", "count"), total=("n", "sum"), lo=("n", "min"),
              hi=("n", "max"), avg=("x", "mean"), xmax=("x", "max"), first=("n", "first"),
              last=("n", "last"))
         .to_records().sink(sink))
    await flow.run()
    expected = table.group_by("word", use_threads=False).aggregate(
        [("n", "count"), ("n", "sum"), ("n", "min"), ("n", "max"), ("x", "mean"),
         ("x", "max"), ("n", "first"), ("n", "last")]).to_pylist()
    got = {r["word"]: r for r in sink.records}
    assert len(got) == len(sink.records) == len(expected)
    for e in expected:
        r = got[e["word"]]
        assert (r["count"], r["total"], r["lo"], r["hi"]) == \
            (e["n_count"], e["n_sum"], e["n_min"], e["n_max"])
        assert r["avg"] == pytest.approx(e["x_mean"]) and r["xmax"] == e["x_max"]
        assert (r["first"], r["last"]) == (e["n_first"], e["n_last"])


async def test_changelog_running_count_per_row_with_dictionary_keys():
    table = words_table(4000)
    table = table.set_column(0, "word", table.column("word").dictionary_encode())
    flow = Dataflow("columnar-changelog", parallelism=2, max_parallelism=32)
    sink = ListSink()
    (flow.from_arrow(table, batch_size=500).key_by("word")
         .agg(count=("word", "count")).to_records().sink(sink))
    await flow.run()
    per_word: dict[str, list[int]] = collections.defaultdict(list)
    for r in sink.records:
        per_word[r["word"]].append(r["count"])
    expected = collections.Counter(table.column("word").to_pylist())
    assert {w: c for w, c in per_word.items()} == \
        {w: list(range(1, n + 1)) for w, n in expected.items()}


# ---------------------------------------------------------------------- exactly once
def committed_rows(directory: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    rows = []
    for part in sorted(directory.glob("part-*")):
        if part.suffix == ".parquet":
            rows.extend(pq.read_table(part).to_pylist())
        else:
            rows.extend(json.loads(line) for line in part.read_text().splitlines())
    return rows


def agg_job(name: str, table: pa.Table, parallelism: int, out: Path, fail_at: int,
            fail: bool, fmt: str = "jsonl") -> Dataflow:
    """The running count and sum per word of ``table``, read in batches of 50 rows by a
    scripted source that holds at row ``fail_at // 2`` until a checkpoint completes. With
    ``fail``, it fails the job at row ``fail_at`` (``TestingSource`` markers), so a
    checkpoint lies between the start and the failure on any machine; without, a checkpoint
    marker stands there instead, so that a resumed run (same ``fail_at``) reads the same
    items at the same indices."""
    batches = table.to_batches(max_chunksize=50)
    at = fail_at // 50  # the index of the batch that starts at row fail_at
    items: list[Any] = [*batches[:at // 2], TestingSource.CHECKPOINT, *batches[at // 2:at],
                        TestingSource.ABORT if fail else TestingSource.CHECKPOINT,
                        *batches[at:]]
    source = TestingSource(items, batch_size=1)
    source.schema = table.schema  # type: ignore[attr-defined]

    flow = Dataflow(name, parallelism=parallelism, max_parallelism=16)
    counts = (flow.columnar_source(source, uid="source")
              .key_by("word").agg(count=("word", "count"), total=("n", "sum")).uid("agg"))
    if fmt == "parquet":  # the record batches themselves, no per-row conversion
        counts.sink(CommittingFileSink(out, format="parquet"), name="sink").uid("sink")
    else:
        counts.to_records().sink(CommittingFileSink(out, format=fmt), name="sink").uid("sink")
    return flow


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
async def test_exactly_once_through_a_failure_and_a_restore_at_another_parallelism(tmp_path,
                                                                                   fmt):
    table = words_table(20_000, vocabulary=40)
    out, chk = tmp_path / "out", tmp_path / "chk"
    config = CheckpointConfig(interval=0.01, directory=chk)
    first = agg_job("columnar-eo", table, 2, out, fail_at=10_000, fail=True, fmt=fmt)
    with pytest.raises(JobFailedError) as info:
        await first.run(checkpoints=config, restart=RestartStrategy.none())
    assert any(isinstance(e, AbortExecution) for e in chain(info.value))
    assert len(committed_rows(out)) < table.num_rows  # it failed part way
    second = agg_job("columnar-eo", table, 3, out, fail_at=10_000, fail=False, fmt=fmt)
    await second.run(checkpoints=config, resume=True)

    rows = committed_rows(out)
    assert len(rows) == table.num_rows  # no row lost, none twice
    per_word: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
    for r in rows:
        per_word[r["word"]].append((r["count"], r["total"]))
    batch = table.group_by("word").aggregate([("word", "count"), ("n", "sum")])
    for e in batch.to_pylist():
        updates = sorted(per_word[e["word"]])
        assert [c for c, _ in updates] == list(range(1, e["word_count"] + 1))
        assert updates[-1][1] == e["n_sum"]


@settings(max_examples=80, deadline=None)
@given(values=st.one_of(
    st.lists(st.text(max_size=70), max_size=40),
    st.lists(st.binary(max_size=70), max_size=40),
    st.lists(st.integers(min_value=-2**63, max_value=2**63 - 1), max_size=40)),
    large=st.booleans(), cut=st.integers(0, 3), maxp=st.integers(1, 32768))
def test_vectorized_canonical_hash_equals_mmh3_of_encode_key(values, large, cut, maxp):
    from reactive.columnar.canonical_hash import key_groups_of

    array = pa.array(values)
    if pa.types.is_null(array.type):  # [] has no value type
        return
    if large and pa.types.is_string(array.type):
        array = array.cast(pa.large_string())
    elif large and pa.types.is_binary(array.type):
        array = array.cast(pa.large_binary())
    array = array.slice(min(cut, len(array)))  # an offset into the buffers
    found = key_groups_of(array, maxp)
    if found is None:  # only rows wider than MAX_WIDTH bytes fall back
        assert any(len(v.encode() if isinstance(v, str) else v) > 60
                   for v in array.to_pylist())
        return
    assert found.tolist() == [assign_to_key_group(v, maxp) for v in array.to_pylist()]


@pytest.mark.parametrize("collide", [False, True])
def test_key_index_slots_are_one_per_distinct_key(monkeypatch, collide):
    """The hash table only proposes slots: with every hash equal (collide), distinct keys
    still get distinct slots and a key keeps its slot across batches and a restore."""
    import reactive.columnar.key_index as key_index

    if collide:
        monkeypatch.setattr(key_index, "identity_hashes",
                            lambda a: np.zeros(len(a), np.uint64))
    rng = np.random.default_rng(3)
    index = KeyIndex(["k"], 64)
    slot_of: dict[str, int] = {}
    for _ in range(6):
        words = [f"k{i}" for i in rng.integers(0, 300, 400)]
        keys = index.lookup(pa.record_batch({"k": words}))
        row_slots = keys.slots[keys.codes].tolist()
        for w, s in zip(words, row_slots, strict=True):
            assert slot_of.setdefault(w, s) == s
    assert len(set(slot_of.values())) == len(slot_of) == index.size
    # a restored index (keys installed with their key groups) finds the same keys
    restored = KeyIndex(["k"], 64)
    columns = index.keys_prefix([len(c) for c in index.key_chunks])
    restored.install(columns)
    words = sorted(slot_of)
    keys = restored.lookup(pa.record_batch({"k": words}))
    assert keys.slots[keys.codes].tolist() == [slot_of[w] for w in words]
    assert restored.size == index.size


async def test_changelog_values_of_every_function_equal_a_per_row_reference():
    table = words_table(3000, vocabulary=30)
    n = table.column("n").to_pylist()
    table = table.set_column(1, "n", pa.array([None if i % 7 == 0 else v
                                               for i, v in enumerate(n)], pa.int64()))
    flow = Dataflow("columnar-changelog-all", batch_size=4)
    sink = ListSink()
    functions = ["count", "sum", "mean", "min", "max", "first", "last"]
    (flow.from_arrow(table, batch_size=173).key_by("word")
         .agg(**{f: ("n", f) for f in functions}).to_records().sink(sink))
    await flow.run()
    seen: dict[str, list[int]] = collections.defaultdict(list)
    expected = []
    for w, v in zip(table.column("word").to_pylist(), table.column("n").to_pylist(),
                    strict=True):
        if v is not None:
            seen[w].append(v)
        vs = seen[w]
        expected.append({"word": w, "count": len(vs), "sum": sum(vs) if vs else None,
                         "mean": sum(vs) / len(vs) if vs else None,
                         "min": min(vs, default=None), "max": max(vs, default=None),
                         "first": vs[0] if vs else None, "last": vs[-1] if vs else None})
    assert len(sink.records) == len(expected)
    for got, want in zip(sink.records, expected, strict=True):
        assert got == pytest.approx(want) if want["mean"] is not None else got == want


# ---------------------------------------------------------------------- incremental snapshots
def count_operator(kgr, incremental: bool, maxp: int = 16):
    from reactive.columnar.aggregate_operator import ColumnarAggregateOperator
    from reactive.columnar.aggregates import parse_aggregates
    from reactive.columnar.state import ColumnarKeyedStateBackend

    schema = pa.schema([("word", pa.string()), ("n", pa.int64())])
    specs = parse_aggregates(schema, {"count": ("word", "count"), "total": ("n", "sum")})
    out = pa.schema([schema.field("word"), *(s.output_field() for s in specs)])
    op = ColumnarAggregateOperator("agg", "agg", ["word"], specs, "final", out)
    op.setup(0, 1, maxp, ColumnarKeyedStateBackend(kgr, maxp, incremental))
    return op


async def snapshot(op, job_dir: Path, checkpoint_id: int, complete: bool = True):
    from reactive.state.backend import SnapshotContext

    ctx = SnapshotContext(checkpoint_id, job_dir, job_dir / f"chk-{checkpoint_id}",
                          job_dir / "shared", "agg", 0)
    handle = await op.keyed_backend.snapshot(ctx).write()
    if complete:
        op.notify_checkpoint_complete(checkpoint_id)
    return handle


def batch_of(words: list[str]) -> pa.RecordBatch:
    return pa.record_batch({"word": words, "n": list(range(len(words)))})


def finals(op) -> dict[str, tuple[int, int]]:
    rows = [r for b in op.end_input() for r in b.to_pylist()]
    out = {r["word"]: (r["count"], r["total"]) for r in rows}
    assert len(out) == len(rows)  # one row per key
    return out


async def test_incremental_snapshots_write_changed_keys_and_restore_at_another_parallelism(
        tmp_path):
    from reactive import KeyGroupRange

    op = count_operator(KeyGroupRange(0, 15), incremental=True)
    op.open()
    words = [f"w{i}" for i in range(1000)]
    op.process_batch([batch_of(words)])
    full = await snapshot(op, tmp_path, 1)
    op.process_batch([batch_of(words[:10])])  # 1% of the keys change
    aborted = await snapshot(op, tmp_path, 2, complete=False)  # its changes must not be lost
    op.process_batch([batch_of(words[5:15])])
    delta = await snapshot(op, tmp_path, 3)
    assert full["format"] == delta["format"] == "arrow-ipc-chain-v1"

    def rows(handle, i):
        with pa.ipc.open_file(tmp_path / handle["files"][i]["path"]) as f:
            return f.read_all().num_rows

    assert rows(full, 0) == 1000
    assert rows(aborted, 1) == 10
    assert len(delta["chain"]) == 2 and rows(delta, 1) == 15  # w0..w14: both intervals
    assert delta["files"][1]["size"] * 10 <= delta["files"][0]["size"]
    expected = finals(op)
    # restored at parallelism 2: each instance reads its key groups along the chain
    got: dict[str, tuple[int, int]] = {}
    for i in range(2):
        kgr = key_group_range_for_operator(i, 2, 16)
        restored = count_operator(kgr, incremental=True)
        restored.keyed_backend.restore([delta], tmp_path)
        restored.open()
        part = finals(restored)
        assert all(assign_to_key_group(w, 16) in kgr for w in part)
        got.update(part)
    assert got == expected


async def test_incremental_chains_are_bounded_by_full_files(tmp_path):
    from reactive import KeyGroupRange
    from reactive.columnar.state import MAX_CHAIN

    op = count_operator(KeyGroupRange(0, 15), incremental=True)
    op.open()
    lengths = []
    for cid in range(1, 3 * MAX_CHAIN):
        op.process_batch([batch_of([f"w{cid % 7}", f"x{cid}"])])
        lengths.append(len((await snapshot(op, tmp_path, cid))["chain"]))
    assert max(lengths) == MAX_CHAIN and lengths.count(1) >= 2
    restored = count_operator(KeyGroupRange(0, 15), incremental=True)
    restored.keyed_backend.restore([await snapshot(op, tmp_path, 100)], tmp_path)
    restored.open()
    assert finals(restored) == finals(op)


@pytest.mark.parametrize("incremental", [False, True])
async def test_exactly_once_with_the_heap_backend_full_and_incremental(tmp_path, incremental):
    from reactive.backends.heap import HeapStateBackend

    table = words_table(20_000, vocabulary=40, seed=5)
    out, chk = tmp_path / "out", tmp_path / "chk"
    config = CheckpointConfig(interval=0.01, directory=chk)
    backend = HeapStateBackend(incremental=incremental)
    first = agg_job("columnar-eo-heap", table, 3, out, fail_at=10_000, fail=True)
    with pytest.raises(JobFailedError):
        await first.run(checkpoints=config, restart=RestartStrategy.none(),
                        state_backend=backend)
    second = agg_job("columnar-eo-heap", table, 1, out, fail_at=10_000, fail=False)
    await second.run(checkpoints=config, resume=True, state_backend=backend)
    rows = committed_rows(out)
    assert len(rows) == table.num_rows
    per_word: dict[str, list[int]] = collections.defaultdict(list)
    for r in rows:
        per_word[r["word"]].append(r["count"])
    expected = collections.Counter(table.column("word").to_pylist())
    assert {w: sorted(c) for w, c in per_word.items()} == \
        {w: list(range(1, n + 1)) for w, n in expected.items()}


async def test_a_savepoint_of_columnar_state_restores_at_another_parallelism(tmp_path):
    """Stop-with-savepoint while the job runs (incremental backend: the savepoint is still
    full and self-contained), move it, and finish the input from it at parallelism 2."""
    import shutil

    from reactive import PushSource
    from reactive.backends.heap import HeapStateBackend

    words = [f"w{i % 13}" for i in range(300)] + [f"v{i % 5}" for i in range(200)]
    schema = pa.schema([("word", pa.string())])

    def build(flow: Dataflow, source_stream) -> ListSink:
        sink = ListSink()
        (source_stream.to_columnar(schema).key_by("word")
             .agg(emit="final", count=("word", "count")).uid("agg")
             .to_records().sink(sink))
        return sink

    backend = HeapStateBackend(incremental=True)
    source = PushSource(capacity=1000)
    flow = Dataflow("columnar-savepoint", parallelism=3, max_parallelism=16)
    build(flow, flow.source(source, uid="push"))
    job = await flow.start(checkpoints=CheckpointConfig(interval=0.01, directory=tmp_path / "c"),
                           state_backend=backend)
    for w in words[:299]:
        await source.send({"word": w})
    await source.send({"word": words[299]}, durable=True)  # all 300 in a checkpoint
    savepoint = await job.stop(path=tmp_path / "sp")
    await job.wait()
    assert savepoint is not None
    moved = tmp_path / "moved"
    shutil.move(str(tmp_path / "sp"), moved)

    flow2 = Dataflow("columnar-savepoint", parallelism=2, max_parallelism=16)
    sink = build(flow2, flow2.from_collection([{"word": w} for w in words[300:]]))
    await flow2.run(checkpoints=CheckpointConfig(interval=0.01, directory=tmp_path / "c2"),
                    restore_from=moved, allow_non_restored_state=True, state_backend=backend)
    assert {r["word"]: r["count"] for r in sink.records} == collections.Counter(words)
    assert len(sink.records) == len(set(words))


async def test_to_columnar_fails_naming_the_record_and_the_column():
    from reactive import UserFunctionError

    schema = pa.schema([("word", pa.string()), ("n", pa.int64())])
    records = [{"word": "a", "n": 1}, {"word": "b", "n": "two"}, {"word": "c", "n": 3}]
    flow = Dataflow("columnar-bad-record")
    flow.from_collection(records).to_columnar(schema, name="to-arrow").to_records() \
        .sink(ListSink())
    with pytest.raises(JobFailedError) as info:
        await flow.run(restart=RestartStrategy.none())
    err = next(e for e in chain(info.value) if isinstance(e, UserFunctionError))
    assert err.operator == "to-arrow" and err.record == {"word": "b", "n": "two"}
    assert "column 'n'" in str(err)


async def test_several_key_columns_key_by_the_tuple():
    rng = np.random.default_rng(9)
    a = [f"a{i}" for i in rng.integers(0, 6, 800)]
    b = rng.integers(0, 5, 800).tolist()
    table = pa.table({"a": pa.array(a).dictionary_encode(), "b": b})
    index = KeyIndex(["a", "b"], 32)
    keys = index.lookup(table.to_batches()[0])
    assert index.key_groups[keys.slots][keys.codes].tolist() == \
        [assign_to_key_group((x, y), 32) for x, y in zip(a, b, strict=True)]
    flow = Dataflow("columnar-tuple-keys", parallelism=2, max_parallelism=32)
    sink = ListSink()
    (flow.from_arrow(table, batch_size=97).key_by("a", "b")
         .agg(emit="final", count=("b", "count")).to_records().sink(sink))
    await flow.run()
    assert {(r["a"], r["b"]): r["count"] for r in sink.records} == \
        collections.Counter(zip(a, b, strict=True))


def test_several_key_columns_group_dictionary_columns_by_value_not_by_code():
    # dictionary columns are grouped by their own codes: a dictionary repeating a value,
    # another batch's dictionary in another order, and null indices must still give one
    # slot per distinct key tuple
    index = KeyIndex(["a", "b"], 32)

    def rows_of(a: pa.Array, b: list[int]) -> list[int]:
        batch = pa.record_batch({"a": a, "b": pa.array(b, pa.int64())})
        keys = index.lookup(batch)
        return keys.slots[keys.codes].tolist()

    first = rows_of(pa.DictionaryArray.from_arrays(pa.array([0, 2, 1, 0, 2], pa.int32()),
                                                   pa.array(["x", "y", "x"])),
                    [1, 1, 1, 2, 2])
    assert first[0] == first[1] != first[2]  # ("x", 1) twice through two codes
    assert first[3] == first[4] != first[0]  # ("x", 2)
    second = rows_of(pa.DictionaryArray.from_arrays(pa.array([1, 0, None], pa.int32()),
                                                    pa.array(["y", "x"])), [1, 1, 1])
    assert second[:2] == [first[0], first[2]]
    third = rows_of(pa.array(["x", "y", None]), [1, 1, 1])
    assert third == second  # the null key: one slot, whatever the encoding
    assert index.size == 4


def test_the_parquet_sink_refuses_record_batches_of_another_schema_or_after_records(tmp_path):
    def transaction(directory: Path):
        directory.mkdir()
        instance = CommittingFileSink(directory, format="parquet").create_writer(0, 1).sink
        return instance, instance.begin_transaction()

    sink, txn = transaction(tmp_path / "a")
    sink.write(txn, [pa.record_batch({"a": [1, 2]})])
    with pytest.raises(ValueError, match=r"schema \['a'\] \(string\) does not match"):
        sink.write(txn, [pa.record_batch({"a": ["x"]})])
    sink, txn = transaction(tmp_path / "b")
    sink.write(txn, [{"a": 1}])
    with pytest.raises(ValueError, match="a record batch after dict records"):
        sink.write(txn, [pa.record_batch({"a": [1]})])


async def test_job_results_of_a_columnar_sink_are_record_batches(tmp_path):
    from reactive.connectors.collections import DiscardingSink

    table = words_table(1000)
    flow = Dataflow("columnar-results")
    (flow.from_arrow(table, batch_size=100).key_by("word").agg(count=("word", "count"))
         .sink(DiscardingSink()).uid("out"))
    job = await flow.start(checkpoints=CheckpointConfig(interval=0.01, directory=tmp_path))
    batches = [b async for b in job.results("out")]
    await job.wait()
    assert all(isinstance(b, pa.RecordBatch) for b in batches)
    counts = collections.Counter(table.column("word").to_pylist())
    final: dict[str, int] = {}
    for b in batches:
        final.update(zip(b.column("word").to_pylist(), b.column("count").to_pylist(),
                         strict=True))
    assert final == counts


@pytest.mark.parametrize("incremental", [False, True])
async def test_columnar_snapshots_read_as_key_group_streams(tmp_path, incremental):
    """What the embedding's state queries and the PySpark bridge's checkpoint reader see:
    per key, each aggregate's value (a mean, not its sum and count)."""
    from reactive import CheckpointStorage
    from reactive.backends.heap import HeapStateBackend
    from reactive.state.key_group_stream import merge_key_groups, read_key_groups

    table = words_table(5000)
    flow = Dataflow("columnar-read", parallelism=2, max_parallelism=16)
    (flow.from_arrow(table, batch_size=250).key_by("word")
         .agg(count=("n", "count"), avg=("n", "mean")).uid("agg").sink(ListSink()))
    job = await flow.run(checkpoints=CheckpointConfig(interval=0.01, directory=tmp_path),
                         state_backend=HeapStateBackend(incremental=incremental))
    chk = CheckpointStorage(tmp_path, "columnar-read").completed()[-1]
    states: dict[str, dict[Any, Any]] = {}
    for sub in chk.metadata.operators["agg"].subtasks.values():
        assert sub.keyed_state is not None
        with read_key_groups(sub.keyed_state.to_json(), chk.job_dir) as stream:
            for name, values in merge_key_groups(stream).items():
                states.setdefault(name, {}).update(values)
    expected = table.group_by("word").aggregate([("n", "count"), ("n", "mean")]).to_pylist()
    assert states["count"] == {e["word"]: e["n_count"] for e in expected}
    assert states["avg"] == pytest.approx({e["word"]: e["n_mean"] for e in expected})
    # the embedding's committed state queries go through the same reader
    word = expected[0]["word"]
    assert await job.query_state("agg", "count", word) == expected[0]["n_count"]


async def test_a_non_parallel_columnar_source_keeps_its_order_into_an_operator_of_one():
    """A columnar source that runs as one instance (a scripted source here) hands its
    batches on in the order it read them, at any default parallelism: the event-time
    windows after it see the same watermarks as ``from_arrow``'s and count every row."""
    from reactive import TumblingEventTimeWindows
    from reactive.testing import TestingSource

    rnd = np.random.default_rng(5)
    ts = np.arange(2000, dtype=np.float64) + rnd.integers(0, 4, 2000)  # disorder within 4
    table = pa.table({"k": [f"k{i % 7}" for i in range(2000)], "ts": ts,
                      "v": np.ones(2000, dtype=np.int64)})

    async def windowed(scripted: bool) -> list[tuple[Any, ...]]:
        flow = Dataflow("order", parallelism=2, max_parallelism=16)
        if scripted:
            source = TestingSource(table.to_batches(max_chunksize=25), batch_size=1)
            source.schema = table.schema  # type: ignore[attr-defined]
            stream = flow.columnar_source(source)
        else:
            stream = flow.from_arrow(table, batch_size=25)
        out: ListSink[Any] = ListSink()
        (stream.assign_timestamps("ts", 4).set_parallelism(1)
               .key_by("k").window(TumblingEventTimeWindows.of(100), timestamp="ts")
               .agg(n=("v", "count")).as_stream()
               .flat_map(lambda b: [(r["k"], r["window_start"], r["n"])
                                    for r in b.to_pylist()]).sink(out))
        await flow.run()
        return sorted(out.records)

    scripted = await windowed(True)
    assert scripted == await windowed(False)
    assert sum(n for _, _, n in scripted) == 2000
