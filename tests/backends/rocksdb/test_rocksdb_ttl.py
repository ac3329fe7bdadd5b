"""Time-to-live on the RocksDB backend: a checkpoint's local phase does not write what
expired by its TTL time, and the sweep deletes expired entries from the store, so neither
the database nor the next checkpoint's files hold them; a restore never resurrects them and
never expires a live value early. Driven by a manual processing-time clock (the harness's)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from reactive import KeyedProcessFunction, ListStateDescriptor, ValueStateDescriptor
from reactive.backends.heap import HeapStateBackend
from reactive.backends.rocksdb import RocksDBStateBackend
from reactive.backends.rocksdb.keys import PREFIX_BYTES, state_id
from reactive.backends.rocksdb.reader import iter_rocksdb_entries
from reactive.key_encoding import decode_key
from reactive.testing.operator_harness import OperatorTestHarness
from reactive.testing.operator_snapshot import OperatorSnapshot

TTL = 10.0


class Sessions(KeyedProcessFunction):
    """``(key, op, arg)``: ``set`` the key's value, ``add`` to its list, ``get`` both."""

    def open(self, ctx: Any) -> None:
        self.value = ctx.get_state(ValueStateDescriptor("value", default="none", ttl=TTL))
        self.list = ctx.get_state(ListStateDescriptor("list", ttl=TTL))

    def process_element(self, record: Any, ctx: Any) -> Iterable[Any]:
        key, op, arg = record
        if op == "set":
            self.value.update(arg)
        elif op == "add":
            self.list.add(arg)
        else:
            yield (key, self.value.value(), self.list.get())


def rocksdb_harness(where: Path, chk: Path, **options: Any) -> OperatorTestHarness:
    h = OperatorTestHarness.for_keyed_process(
        Sessions(), key_selector=lambda r: r[0], max_parallelism=16,
        state_backend=RocksDBStateBackend(path=where, incremental=True, **options),
        directory=chk)
    return h


def stored_keys(h: OperatorTestHarness, state: str) -> set[Any]:
    """The keys of ``state`` in the instance's working RocksDB (not its cache)."""
    db = h.keyed_backend._db  # type: ignore[union-attr]
    sid = state_id(state)
    return {decode_key(k[PREFIX_BYTES:]) for k in db.keys(from_key=b"")
            if k[2:PREFIX_BYTES] == sid}


def checkpoint_keys(snapshot: OperatorSnapshot, state: str, scratch: Path) -> set[Any]:
    """The keys of ``state`` in the checkpoint's files."""
    handle = snapshot.subtasks[0].keyed_state
    assert handle is not None
    return {decode_key(k) for _, name, k, _ in
            iter_rocksdb_entries(handle.to_json(), snapshot.job_dir, scratch)
            if name == state}


async def test_the_local_phase_writes_expired_dirty_entries_as_deletes(tmp_path: Path):
    """Keys written before a checkpoint and written again (dirty in the cache) expire
    before the next barrier: the next checkpoint's local phase deletes them from RocksDB
    instead of writing them, so they are in neither the database nor that checkpoint. An
    expired entry not written since the last checkpoint (the a-keys' lists) is not the local
    phase's: it stays for the sweep."""
    h = rocksdb_harness(tmp_path / "db", tmp_path / "chk")
    h.open()
    h.set_processing_time(0.0)
    h.process_elements([(f"a{i}", "set", i) for i in range(300)])
    h.process_elements([(f"a{i}", "add", i) for i in range(300)])
    first = await h.snapshot()
    await h.notify_checkpoint_complete(first.checkpoint_id)
    assert len(stored_keys(h, "value")) == 300
    h.set_processing_time(3.0)
    # written again (dirty, expiring at 13) and new keys (dirty, never in RocksDB)
    h.process_elements([(f"a{i}", "set", -i) for i in range(300)])
    h.process_elements([(f"b{i}", "add", i) for i in range(200)])
    h.set_processing_time(20.0)  # no record until the barrier: only the local phase cleans
    second = await h.snapshot()
    a_keys = {f"a{i}" for i in range(300)}
    assert stored_keys(h, "value") == set() and stored_keys(h, "list") == a_keys
    assert checkpoint_keys(second, "value", tmp_path / "s1") == set()
    assert checkpoint_keys(second, "list", tmp_path / "s2") == a_keys
    h.close()


async def test_the_sweep_empties_the_store_and_a_restore_neither_resurrects_nor_expires_early(
        tmp_path: Path):
    """2,000 keys in RocksDB expire; records of new keys drive the sweep, which deletes the
    expired keys from the store (live keys stay), so the next checkpoint holds the live keys
    only. Restored (into RocksDB and into the heap) just before the live keys expire, they
    are all there, the expired ones are not; a little later the live ones expire too."""
    h = rocksdb_harness(tmp_path / "db", tmp_path / "chk", cache_entries=500,
                        write_batch_entries=200)
    h.open()
    h.set_processing_time(0.0)
    h.process_elements([(f"old{i}", "set", i) for i in range(2_000)])
    h.set_processing_time(8.0)
    h.process_elements([(f"mid{i}", "set", i) for i in range(20)])  # live until 18
    first = await h.snapshot()
    await h.notify_checkpoint_complete(first.checkpoint_id)
    assert len(stored_keys(h, "value")) == 2_020
    h.set_processing_time(15.0)  # the old keys expired at 10
    for i in range(3_000):  # new keys, a record at a time (as batches of one)
        h.process_element((f"new{i}", "set", i))
    fn = h.operator.fn  # type: ignore[attr-defined]
    assert fn.value.expired >= 2_000  # every old key, found by the sweep (nobody read them)
    stored = stored_keys(h, "value")
    assert not any(k.startswith("old") for k in stored), sorted(stored)[:5]
    assert {f"mid{i}" for i in range(20)} <= stored
    second = await h.snapshot()
    await h.notify_checkpoint_complete(second.checkpoint_id)
    in_checkpoint = checkpoint_keys(second, "value", tmp_path / "s")
    assert in_checkpoint == {f"mid{i}" for i in range(20)} | {f"new{i}" for i in range(3_000)}
    h.close()

    for backend in (RocksDBStateBackend(path=tmp_path / "r"), HeapStateBackend()):
        r = OperatorTestHarness.for_keyed_process(
            Sessions(), key_selector=lambda rec: rec[0], max_parallelism=16,
            state_backend=backend)
        r.open(restore_from=second)
        r.set_processing_time(17.9)  # mid keys live until 18, new ones until 25
        assert r.process_element(("mid3", "get", None)) == [("mid3", 3, [])]
        assert r.process_element(("new7", "get", None)) == [("new7", 7, [])]
        assert r.process_element(("old5", "get", None)) == [("old5", "none", [])]
        r.set_processing_time(18.0)
        assert r.process_element(("mid4", "get", None)) == [("mid4", "none", [])]
        r.close()


async def test_the_sweep_writes_nothing_out_of_the_cache(tmp_path: Path):
    """The sweep reads RocksDB from its cursor and purges cached keys through the cache: it
    never writes the cache's dirty entries out to look at the store (a pause as long as the
    dirty set), so the new keys stay in the cache until the checkpoint, which then writes
    the expired old keys' deletes and the new keys."""
    h = rocksdb_harness(tmp_path / "db", tmp_path / "chk")
    h.open()
    h.set_processing_time(0.0)
    h.process_elements([(f"old{i}", "set", i) for i in range(1_000)])
    first = await h.snapshot()
    await h.notify_checkpoint_complete(first.checkpoint_id)
    h.set_processing_time(15.0)
    for i in range(2_000):
        h.process_element((f"new{i}", "set", i))
    assert h.operator.fn.value.expired == 1_000  # type: ignore[attr-defined]
    assert not any(k.startswith("new") for k in stored_keys(h, "value"))
    second = await h.snapshot()
    assert stored_keys(h, "value") == {f"new{i}" for i in range(2_000)}
    assert checkpoint_keys(second, "value", tmp_path / "s") == {f"new{i}" for i in range(2_000)}
    h.close()
