"""Columnar keyed state in RocksDB (``RocksDBStateBackend``): the aggregation's rows read and
written per batch behind a small cache of slots, exactly once through a failure and a
restore at another parallelism, snapshots readable by the key-group reader, and a clear
refusal to restore a snapshot of the other backend."""

from __future__ import annotations

import collections
import pickle
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reactive import CheckpointConfig, CheckpointStorage, Dataflow, RestartStrategy
from reactive.backends.heap import HeapStateBackend
from reactive.backends.rocksdb import RocksDBStateBackend
from reactive.columnar.aggregate_operator import ColumnarAggregateOperator
from reactive.connectors.collections import ListSink
from reactive.errors import JobFailedError
from reactive.state.key_group_stream import read_key_groups
from reactive.testing import AbortExecution
from tests.columnar.test_columnar import agg_job, chain, committed_rows, words_table


@pytest.fixture(autouse=True)
def small_cache(monkeypatch):
    # 8 cached slots for 40 words: most batches read and write rows in RocksDB
    monkeypatch.setattr(ColumnarAggregateOperator, "cache_slots", 8)


@pytest.mark.parametrize("cache_slots", [8, 1 << 18])
async def test_rocksdb_columnar_exactly_once_through_a_failure_and_a_rescale(
        tmp_path, monkeypatch, cache_slots):
    # 8 slots: most batches read and write rows in RocksDB; 2**18: every key stays cached
    # (no row is read until the restore, after which each key's row must be read back)
    monkeypatch.setattr(ColumnarAggregateOperator, "cache_slots", cache_slots)
    table = words_table(20_000, vocabulary=40)
    out, chk = tmp_path / "out", tmp_path / "chk"
    config = CheckpointConfig(interval=0.01, directory=chk)
    backend = RocksDBStateBackend(tmp_path / "work")
    first = agg_job("columnar-rocks", table, 2, out, fail_at=10_000, fail=True)
    with pytest.raises(JobFailedError) as info:
        await first.run(checkpoints=config, restart=RestartStrategy.none(),
                        state_backend=backend)
    assert any(isinstance(e, AbortExecution) for e in chain(info.value))
    assert len(committed_rows(out)) < table.num_rows

    # the aggregation's state is RocksDB's: its key-group reader sees each key's row
    completed = CheckpointStorage(chk, "columnar-rocks").completed()[-1]
    handles = [s.keyed_state.to_json() for s in
               completed.metadata.operators["agg"].subtasks.values() if s.keyed_state]
    assert handles and all(h["backend"] == "rocksdb" for h in handles)
    rows = {}
    for h in handles:
        for kg in read_key_groups(h, completed.job_dir):
            rows.update(kg.states["_columnar"])
    assert rows and all(k.startswith("w") for k in rows)
    # (count.n, total.n, total.acc): a word's count is its total's count of values
    assert all(r[0] == r[1] >= 1 for r in rows.values())

    second = agg_job("columnar-rocks", table, 3, out, fail_at=10_000, fail=False)
    await second.run(checkpoints=config, resume=True, state_backend=backend)
    rows_out = committed_rows(out)
    assert len(rows_out) == table.num_rows  # no row lost, none twice
    per_word: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
    for r in rows_out:
        per_word[r["word"]].append((r["count"], r["total"]))
    batch = table.group_by("word").aggregate([("word", "count"), ("n", "sum")])
    for e in batch.to_pylist():
        updates = sorted(per_word[e["word"]])
        assert [c for c, _ in updates] == list(range(1, e["word_count"] + 1))
        assert updates[-1][1] == e["n_sum"]


async def test_rocksdb_final_aggregates_equal_a_batch_group_by(tmp_path):
    table = words_table(3000, vocabulary=60)
    flow = Dataflow("columnar-rocks-final", parallelism=2, max_parallelism=16)
    sink = ListSink()
    (flow.from_arrow(table, batch_size=97).key_by("word")
         .agg(emit="final", count=("n", "count"), lo=("n", "min"), avg=("x", "mean"))
         .to_records().sink(sink))
    await flow.run(state_backend=RocksDBStateBackend(tmp_path / "work"))
    expected = table.group_by("word", use_threads=False).aggregate(
        [("n", "count"), ("n", "min"), ("x", "mean")]).to_pylist()
    got = {r["word"]: r for r in sink.records}
    assert len(got) == len(sink.records) == len(expected)
    for e in expected:
        r = got[e["word"]]
        assert (r["count"], r["lo"]) == (e["n_count"], e["n_min"])
        assert r["avg"] == pytest.approx(e["x_mean"])


@pytest.mark.parametrize("first_rocks", [True, False])
async def test_restoring_the_other_backends_columnar_snapshot_is_refused(tmp_path,
                                                                         first_rocks):
    table = words_table(6000, vocabulary=40)
    out, chk = tmp_path / "out", tmp_path / "chk"
    config = CheckpointConfig(interval=0.01, directory=chk)
    rocks, heap = RocksDBStateBackend(tmp_path / "work"), HeapStateBackend()
    first = agg_job("columnar-switch", table, 2, out, fail_at=3000, fail=True)
    with pytest.raises(JobFailedError):
        await first.run(checkpoints=config, restart=RestartStrategy.none(),
                        state_backend=rocks if first_rocks else heap)
    second = agg_job("columnar-switch", table, 2, out, fail_at=3000, fail=False)
    with pytest.raises(Exception) as info:
        await second.run(checkpoints=config, resume=True, restart=RestartStrategy.none(),
                         state_backend=heap if first_rocks else rocks)
    text = " ".join(str(e) for e in chain(info.value))
    assert "cannot be restored" in text or "cannot restore" in text
    assert "backend that took it" in text
    assert len(committed_rows(out)) < table.num_rows  # nothing was replayed past it
    assert Path(out).exists()


async def test_rocksdb_running_counts_with_dictionary_keys(tmp_path):
    # a batch's groups are the whole dictionary; the 8-slot cache is emptied between
    # batches, so each batch reads its keys' counts back from RocksDB
    table = words_table(4000, vocabulary=50)
    table = table.set_column(0, "word", table.column("word").dictionary_encode())
    flow = Dataflow("columnar-rocks-dictionary", parallelism=2, max_parallelism=32)
    sink = ListSink()
    (flow.from_arrow(table, batch_size=300).key_by("word")
         .agg(count=("word", "count")).to_records().sink(sink))
    await flow.run(state_backend=RocksDBStateBackend(tmp_path / "work"))
    per_word: dict[str, list[int]] = collections.defaultdict(list)
    for r in sink.records:
        per_word[r["word"]].append(r["count"])
    expected = collections.Counter(table.column("word").to_pylist())
    assert dict(per_word) == {w: list(range(1, n + 1)) for w, n in expected.items()}


async def test_a_snapshot_holds_the_rows_at_its_barrier_while_the_cache_moves_on(tmp_path):
    """The synchronous part hands the changed slots over as copies; the rows are built
    after it. Changes after the barrier, a cache emptied before the rows are built (its
    keys read back through the pending generation) and a second snapshot taken before the
    first is written must not leak into the first, nor be lost from the second."""
    import pyarrow as pa

    from reactive import KeyGroupRange
    from reactive.backends.rocksdb import read_rocksdb_snapshot
    from reactive.columnar.aggregates import parse_aggregates
    from reactive.columnar.slot_store import SlotCache
    from reactive.state.backend import SnapshotContext

    maxp = 16
    kb = RocksDBStateBackend(tmp_path / "state").columnar_state_backend() \
        .create_keyed_backend(job_name="j", operator_uid="agg", subtask=0,
                              key_group_range=KeyGroupRange(0, maxp - 1),
                              max_parallelism=maxp)
    schema = pa.schema([("word", pa.string()), ("n", pa.int64())])
    specs = parse_aggregates(schema, {"count": ("n", "count")})
    cache = SlotCache(kb, ["word"], specs, maxp, "agg", capacity=20)
    counts: collections.Counter[str] = collections.Counter()

    def count(words: list[str]) -> None:
        batch = pa.record_batch([pa.array(words), pa.array([1] * len(words))], schema=schema)
        keys = cache.lookup(batch)
        np_slots = keys.slots[keys.codes]
        for slot in np_slots.tolist():
            cache.arrays["count.n"][slot] += 1
        counts.update(words)

    def snapshot(cid: int) -> Any:
        job = tmp_path / "chk" / "j"
        return kb.snapshot(SnapshotContext(cid, job, job / f"chk-{cid}", job / "shared",
                                           "agg", 0))

    def stored(handle: dict[str, Any], cid: int) -> dict[str, int]:
        data = read_rocksdb_snapshot(handle, tmp_path / "chk" / "j", tmp_path / f"r{cid}")
        return {k: pickle.loads(v)[0] for k, v in data["_columnar"].items()}

    words = [f"w{i}" for i in range(30)]
    count(words[:15] * 3)
    first = snapshot(1)
    at_first = dict(counts)
    count(words[:10])        # changes after the barrier, in the cached slots
    count(words[15:] * 2)    # fills the cache: the next lookup empties it
    count(words[:15])        # reads the first snapshot's rows back, before they are built
    second = snapshot(2)
    at_second = dict(counts)
    count(words)
    assert stored(await first.write(), 1) == at_first
    assert stored(await second.write(), 2) == at_second
    kb.dispose()


@given(st.one_of(st.lists(st.text(max_size=300), min_size=1, max_size=30),
                 st.lists(st.integers(min_value=-(1 << 64), max_value=1 << 64), min_size=1,
                          max_size=30),
                 st.lists(st.one_of(st.text(max_size=4), st.integers(), st.booleans(),
                                    st.none(), st.binary(max_size=4)), min_size=1,
                          max_size=10)))
def test_stored_keys_built_by_kernels_equal_the_canonical_encoding(keys):
    """The barrier rows' stored keys, built with Arrow and numpy kernels, are the bytes the
    per-record API stores (``encode_key``) behind their prefix, or the kernels decline."""
    import pyarrow as pa

    from reactive.backends.rocksdb.columnar import stored_keys
    from reactive.key_encoding import encode_key

    prefixes = [bytes([i % 7, 3]) for i in range(len(keys))]
    got = stored_keys(pa.array(prefixes, pa.binary()), keys)
    want = [p + encode_key(k) for p, k in zip(prefixes, keys, strict=True)]
    if got is not None:
        assert got.to_pylist() == want
        # the same keys as the Arrow column a cache's key index holds
        column = pa.array(keys)
        for array in (column, column.cast(pa.int32()) if pa.types.is_int64(column.type)
                      and all(-(1 << 31) <= k < 1 << 31 for k in keys) else column):
            from_column = stored_keys(pa.array(prefixes, pa.binary()), array)
            assert from_column is not None and from_column.to_pylist() == want
    if all(type(k) is str and len(k.encode("utf-8", "surrogatepass")) < 256 for k in keys) \
            and all(k.isprintable() for k in keys):
        assert got is not None
    if all(type(k) is int and -(1 << 63) <= k < 1 << 63 for k in keys):
        assert got is not None


@given(st.lists(st.tuples(st.integers(-(1 << 63), (1 << 63) - 1),
                          st.floats(allow_nan=False), st.integers(-(1 << 63), (1 << 63) - 1)),
                min_size=1, max_size=20),
       st.sampled_from(["i", "if", "ifi", "iiii", "f"]))
def test_rows_pickled_by_numpy_load_as_the_rows(rows, kinds):
    """Barrier rows pickled as one byte matrix load back as ``pickle.dumps`` of each row
    would: the same Python ints and floats, whatever the number of columns."""
    import numpy as np

    from reactive.backends.rocksdb.columnar import pickled_rows

    columns = [np.array([r[0 if k == "i" else 1] for r in rows],
                        np.int64 if k == "i" else np.float64) for k in kinds]
    want = list(zip(*[c.tolist() for c in columns], strict=True))
    got = [pickle.loads(b) for b in pickled_rows(columns)]
    assert got == want
    assert [tuple(map(type, r)) for r in got] == [tuple(map(type, r)) for r in want]
    assert pickled_rows([np.array([True])]) is None


@pytest.mark.parametrize("keys", [[f"w{i}" for i in range(60)],
                                  [f"user-{i:012d}" for i in range(60)],
                                  list(range(-30, 30))],
                         ids=["short-words", "long-common-prefix", "ints"])
@pytest.mark.parametrize("drained", [False, True])
async def test_barrier_rows_planned_in_pieces_hold_every_row(tmp_path, monkeypatch, keys,
                                                             drained):
    """A part of barrier rows is planned in pieces by a worker thread and written in
    chunks on the loop: with pieces and chunks far smaller than the part, the snapshot
    (awaited in steps, or drained at once by a read of every row) holds every key's row at
    the barrier exactly once, whether the keys sort on their leading bytes or need the
    whole-key sort (long common prefixes, small integers)."""
    import pyarrow as pa

    from reactive import KeyGroupRange
    from reactive.backends.rocksdb import columnar as rocksdb_columnar
    from reactive.backends.rocksdb import read_rocksdb_snapshot
    from reactive.columnar.aggregates import parse_aggregates
    from reactive.columnar.slot_store import SlotCache
    from reactive.state.backend import SnapshotContext

    monkeypatch.setattr(rocksdb_columnar._BarrierWriter, "PIECE", 7)
    monkeypatch.setattr(rocksdb_columnar._BarrierWriter, "CHUNK", 3)
    maxp = 16
    kb = RocksDBStateBackend(tmp_path / "state").columnar_state_backend() \
        .create_keyed_backend(job_name="j", operator_uid="agg", subtask=0,
                              key_group_range=KeyGroupRange(0, maxp - 1),
                              max_parallelism=maxp)
    key_type = pa.int64() if type(keys[0]) is int else pa.string()
    schema = pa.schema([("k", key_type), ("n", pa.int64())])
    specs = parse_aggregates(schema, {"count": ("n", "count")})
    cache = SlotCache(kb, ["k"], specs, maxp, "agg", capacity=1 << 10)
    counts: collections.Counter[Any] = collections.Counter()
    rows = [k for i, k in enumerate(keys) for _ in range(1 + i % 3)]
    batch = pa.record_batch([pa.array(rows, key_type), pa.array([1] * len(rows))],
                            schema=schema)
    looked_up = cache.lookup(batch)
    for slot in looked_up.slots[looked_up.codes].tolist():
        cache.arrays["count.n"][slot] += 1
    counts.update(rows)
    job = tmp_path / "chk" / "j"
    snapshot = kb.snapshot(SnapshotContext(1, job, job / "chk-1", job / "shared", "agg", 0))
    if drained:
        assert {k: r[0] for k, r in kb.iter_rows()} == dict(counts)
    handle = await snapshot.write()
    data = read_rocksdb_snapshot(handle, job, tmp_path / "r")
    assert {k: pickle.loads(v)[0] for k, v in data["_columnar"].items()} == dict(counts)
    kb.dispose()


@given(st.lists(st.binary(min_size=6, max_size=20), min_size=1, max_size=200))
def test_key_order_sorts_stored_keys_by_their_leading_bytes(stored):
    """The planned pieces' order: a permutation of the keys, sorted by key group and the
    canonical key's first bytes (equal ones together), or wholly sorted."""
    import pyarrow as pa

    from reactive.backends.rocksdb.columnar import _LEADING, _key_order

    order = _key_order(pa.array(stored, pa.binary())).tolist()
    assert sorted(order) == list(range(len(stored)))

    def leading(key: bytes) -> bytes:
        return bytes(key[j] if j < len(key) else 0 for j in _LEADING)

    ordered = [stored[i] for i in order]
    assert [leading(k) for k in ordered] == sorted(leading(k) for k in ordered)
