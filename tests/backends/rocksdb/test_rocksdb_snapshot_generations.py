"""RocksDB snapshots off the task's critical path: the synchronous part only freezes the
write-back cache, and a checkpoint still holds exactly the state as of its barrier while the
task keeps changing the same keys during the asynchronous part, with overlapping and
discarded snapshots (model-based, seeded), in a running job, and after a restore."""

from __future__ import annotations

import asyncio
import copy
import pickle
import random
import threading
from pathlib import Path
from typing import Any

import pytest

import reactive.backends.rocksdb.generations as generations
import reactive.backends.rocksdb.snapshot as rocksdb_snapshot
import reactive.backends.rocksdb.state as rocksdb_state_module
from reactive import (
    CheckpointConfig,
    CheckpointStorage,
    KeyGroupRange,
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
)
from reactive.backends.rocksdb import (
    RocksDBKeyedStateBackend,
    RocksDBStateBackend,
    read_rocksdb_snapshot,
)
from reactive.errors import StateSerializationError
from reactive.state.backend import SnapshotContext
from tests.backends.rocksdb.test_rocksdb_backend import MAX_PARALLELISM, Pipeline, rocksdb_state

KEYS = 150


def make_backend(tmp_path: Path, **kw: Any) -> RocksDBKeyedStateBackend:
    kb = RocksDBStateBackend(path=tmp_path / "state", **kw).create_keyed_backend(
        job_name="gen", operator_uid="op", subtask=0,
        key_group_range=KeyGroupRange(0, MAX_PARALLELISM - 1), max_parallelism=MAX_PARALLELISM)
    assert isinstance(kb, RocksDBKeyedStateBackend)
    return kb


def context(tmp_path: Path, cid: int) -> SnapshotContext:
    job_dir = tmp_path / "chk" / "gen"
    return SnapshotContext(cid, job_dir, job_dir / f"chk-{cid}", job_dir / "shared", "op", 0)


def read_handle(handle: dict[str, Any], tmp_path: Path, cid: int) -> dict[str, dict[Any, Any]]:
    data = read_rocksdb_snapshot(handle, tmp_path / "chk" / "gen", tmp_path / f"read-{cid}")
    return {name: {k: pickle.loads(v) for k, v in entries.items()}
            for name, entries in data.items() if entries}


class Model:
    """Value, list and map state of one backend, mirrored in plain dicts."""

    def __init__(self, kb: RocksDBKeyedStateBackend, rng: random.Random) -> None:
        self.kb = kb
        self.rng = rng
        self.v = kb.get_state(ValueStateDescriptor("v"))
        self.l = kb.get_state(ListStateDescriptor("l"))
        self.m = kb.get_state(MapStateDescriptor("m"))
        self.data: dict[str, dict[Any, Any]] = {"v": {}, "l": {}, "m": {}}

    def step(self) -> None:
        """One random update of a random key (read-modify-write, in-place list/map
        changes, clears), applied to the backend and to the model."""
        rng, d = self.rng, self.data
        key = rng.randrange(KEYS)
        self.kb.set_current_key(key)
        r = rng.random()
        if r < 0.3:
            n = (self.v.value() or 0) + 1
            assert n == d["v"].get(key, 0) + 1
            self.v.update(n)
            d["v"][key] = n
        elif r < 0.35:
            self.v.clear()
            d["v"].pop(key, None)
        elif r < 0.6:
            x = rng.randrange(1000)
            self.l.add(x)  # appends to the cached list in place
            d["l"].setdefault(key, []).append(x)
        elif r < 0.65:
            xs = [rng.randrange(1000) for _ in range(rng.randrange(3))]
            self.l.update(xs)
            if xs:
                d["l"][key] = xs
            else:
                d["l"].pop(key, None)
        elif r < 0.9:
            uk, x = rng.randrange(5), rng.randrange(1000)
            self.m.put(uk, x)  # changes the cached dict in place
            d["m"].setdefault(key, {})[uk] = x
        else:
            uk = rng.randrange(5)
            self.m.remove(uk)
            if uk in d["m"].get(key, {}):
                del d["m"][key][uk]
                if not d["m"][key]:
                    del d["m"][key]

    def check_live(self) -> None:
        for key in range(KEYS):
            self.kb.set_current_key(key)
            assert self.v.value() == self.data["v"].get(key)
            assert self.l.get() == self.data["l"].get(key, [])
            assert dict(self.m.items()) == self.data["m"].get(key, {})

    def expected(self) -> dict[str, dict[Any, Any]]:
        return {name: copy.deepcopy(entries) for name, entries in self.data.items() if entries}


async def run_model(tmp_path: Path, seed: int, steps: int) -> None:
    """Random updates with snapshots taken, overlapping, discarded and written while the
    updates go on; every written snapshot must hold exactly the model at its barrier."""
    rng = random.Random(seed)
    kb = make_backend(tmp_path, cache_entries=40, write_batch_entries=7)
    model = Model(kb, rng)
    writes: list[tuple[int, asyncio.Task[dict[str, Any]], dict[str, Any]]] = []
    cid = 0
    try:
        for _ in range(steps):
            r = rng.random()
            if r < 0.02:
                cid += 1
                snap = kb.snapshot(context(tmp_path, cid))
                if rng.random() < 0.2:
                    snap.discard()  # aborted before its asynchronous part: state stays live
                else:
                    writes.append((cid, asyncio.create_task(snap.write()), model.expected()))
            elif r < 0.08:
                await asyncio.sleep(0)  # the asynchronous parts make progress meanwhile
            elif r < 0.085:
                assert sorted(kb.keys("v")) == sorted(model.data["v"])
            else:
                model.step()
        model.check_live()
        cid += 1
        final = kb.snapshot(context(tmp_path, cid))
        writes.append((cid, asyncio.create_task(final.write()), model.expected()))
        for n, task, expected in writes:
            assert read_handle(await task, tmp_path, n) == expected, f"checkpoint {n}"
        model.check_live()
    finally:
        kb.dispose()


@pytest.mark.parametrize("seed", range(4))
async def test_snapshots_hold_exactly_the_barrier_state(
        tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # tiny steps: the task's updates interleave with every few frozen entries written and
    # every few entries refilled into the cache
    monkeypatch.setattr(generations, "STEP_SECONDS", 0.0)
    monkeypatch.setattr(generations, "CLOCK_EVERY", 3)
    monkeypatch.setattr(rocksdb_state_module, "REFILL_CHUNK", 2 + seed)
    await run_model(tmp_path, seed, 3_000)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4, 40))
async def test_snapshots_hold_exactly_the_barrier_state_many_seeds(
        tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(generations, "STEP_SECONDS", 0.0)
    monkeypatch.setattr(generations, "CLOCK_EVERY", 1 + seed % 5)
    monkeypatch.setattr(rocksdb_state_module, "REFILL_CHUNK", 1 + seed % 7)
    await run_model(tmp_path, seed, 6_000)


def test_synchronous_part_writes_nothing_to_rocksdb(tmp_path: Path) -> None:
    """The synchronous part is O(number of states): no WriteBatch, memtable flush or
    RocksDB checkpoint happens in it (they run in the asynchronous part)."""
    kb = make_backend(tmp_path, write_batch_entries=1_000_000)
    try:
        count = kb.get_state(ValueStateDescriptor("count", default=0))
        for i in range(5_000):
            kb.set_current_key(i)
            count.update(i)
        before = kb._db.latest_sequence_number()
        snap = kb.snapshot(context(tmp_path, 1))
        assert kb._db.latest_sequence_number() == before
        assert not list(kb.directory.glob("chk-*"))  # no local checkpoint yet
        snap.discard()
    finally:
        kb.dispose()


async def test_frozen_value_changed_in_place_keeps_its_barrier_bytes(tmp_path: Path) -> None:
    kb = make_backend(tmp_path)
    try:
        log = kb.get_state(ListStateDescriptor("log"))
        kb.set_current_key("k")
        log.add(1)
        snap = kb.snapshot(context(tmp_path, 1))
        log.add(2)  # takes the list over from the frozen generation, then appends in place
        assert log.get() == [1, 2]
        assert read_handle(await snap.write(), tmp_path, 1) == {"log": {"k": [1]}}
        assert log.get() == [1, 2]
    finally:
        kb.dispose()


async def test_discarded_snapshot_state_still_reaches_rocksdb(tmp_path: Path) -> None:
    kb = make_backend(tmp_path, cache_entries=10, write_batch_entries=5)
    try:
        count = kb.get_state(ValueStateDescriptor("count", default=0))
        for i in range(8):
            kb.set_current_key(i)
            count.update(i)
        kb.snapshot(context(tmp_path, 1)).discard()
        assert kb._gens.pending  # still frozen, still read through
        kb.set_current_key(3)
        assert count.value() == 3
        snap = kb.snapshot(context(tmp_path, 2))
        state = read_handle(await snap.write(), tmp_path, 2)
        assert state == {"count": {i: i for i in range(8)}}
        assert not kb._gens.pending
        assert not list(kb.directory.glob("chk-1-*"))  # no local checkpoint was made for 1
    finally:
        kb.dispose()


def test_cache_past_the_pending_bound_drains_the_generation_in_the_task(tmp_path: Path) -> None:
    kb = make_backend(tmp_path, cache_entries=10, write_batch_entries=5)
    try:
        count = kb.get_state(ValueStateDescriptor("count", default=0))
        for i in range(10):
            kb.set_current_key(i)
            count.update(i)
        snap = kb.snapshot(context(tmp_path, 1))
        seq = kb._db.latest_sequence_number()
        table = kb._tables["count"]
        i = 10
        while kb._gens.pending:
            # nothing newer than the frozen generation is written while it is pending: the
            # cache evicts clean entries, then grows up to the bound
            assert kb._db.latest_sequence_number() == seq
            assert len(table.cache) <= kb._pending_limit
            kb.set_current_key(i)
            count.update(i)
            i += 1
        # back-pressure only once the dirty entries filled the cache up to the bound
        assert i - 10 >= kb._pending_limit // 2
        assert snap.gen.checkpointed and snap.gen.local is not None and snap.gen.local.is_dir()
        for k in range(i):
            kb.set_current_key(k)
            assert count.value() == k
        snap.discard()
    finally:
        kb.dispose()


async def test_unserializable_frozen_value_fails_the_checkpoint_and_the_task(
        tmp_path: Path) -> None:
    kb = make_backend(tmp_path)
    try:
        v = kb.get_state(ValueStateDescriptor("v"))
        kb.set_current_key("bad")
        v.update(lambda: None)  # pickle refuses a lambda
        snap = kb.snapshot(context(tmp_path, 1))
        with pytest.raises(StateSerializationError):
            await snap.write()
        with pytest.raises(StateSerializationError):
            list(kb.keys("v"))  # the live state can never reach RocksDB either
    finally:
        kb.dispose()


async def test_flush_checkpoint_and_upload_run_in_worker_threads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    threads: dict[str, str] = {}
    flush_and_checkpoint = generations.flush_and_checkpoint
    copy_hashed = rocksdb_snapshot._copy_hashed

    def flush_spy(*args: Any) -> None:
        threads["flush"] = threading.current_thread().name
        flush_and_checkpoint(*args)

    def copy_spy(*args: Any) -> Any:
        threads["copy"] = threading.current_thread().name
        return copy_hashed(*args)

    monkeypatch.setattr(generations, "flush_and_checkpoint", flush_spy)
    monkeypatch.setattr(rocksdb_snapshot, "_copy_hashed", copy_spy)
    kb = make_backend(tmp_path)
    try:
        count = kb.get_state(ValueStateDescriptor("count", default=0))
        kb.set_current_key("k")
        count.update(1)
        await kb.snapshot(context(tmp_path, 1)).write()
    finally:
        kb.dispose()
    main = threading.main_thread().name
    assert set(threads) == {"flush", "copy"} and main not in threads.values()


async def test_dispose_waits_for_a_running_checkpoint_job(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gate, started = threading.Event(), threading.Event()
    flush_and_checkpoint = generations.flush_and_checkpoint

    def gated(*args: Any) -> None:
        started.set()
        assert gate.wait(30)
        flush_and_checkpoint(*args)

    monkeypatch.setattr(generations, "flush_and_checkpoint", gated)
    kb = make_backend(tmp_path)
    count = kb.get_state(ValueStateDescriptor("count", default=0))
    kb.set_current_key("k")
    count.update(1)
    task = asyncio.create_task(kb.snapshot(context(tmp_path, 1)).write())
    while not started.is_set():
        await asyncio.sleep(0.001)
    kb.dispose()  # the job still uses the database: it is closed when the job ends
    assert kb.directory.exists()
    gate.set()
    with pytest.raises(OSError):
        await task
    job = generations.run_in_worker(lambda: None)
    await asyncio.wrap_future(job)
    for _ in range(1000):
        if not kb.directory.exists():
            break
        await asyncio.sleep(0.01)
    assert not kb.directory.exists()


# ---------------------------------------------------------------------- in a job
async def test_checkpoint_taken_while_the_same_keys_keep_changing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job keeps counting the same keys while a checkpoint's local phase is held back in
    its worker thread: the task is not blocked, the checkpoint holds the counts at its
    barrier, and the job restored from it continues exactly."""
    gate = threading.Event()
    flush_and_checkpoint = generations.flush_and_checkpoint

    def gated(*args: Any) -> None:
        assert gate.wait(60)
        flush_and_checkpoint(*args)

    pipe = Pipeline("busy")
    job = await pipe.flow.start(
        checkpoints=CheckpointConfig(interval=None, directory=tmp_path / "chk"),
        state_backend=RocksDBStateBackend(path=tmp_path / "state", cache_entries=500,
                                          write_batch_entries=100))
    words = [f"w{i % 700}" for i in range(7_000)]
    await pipe.feed(words)
    monkeypatch.setattr(generations, "flush_and_checkpoint", gated)
    pending = asyncio.create_task(job.checkpoint())
    at_barrier = dict(pipe.truth)
    # the same keys change again while the checkpoint's flush and checkpoint wait: the
    # tasks keep processing (feed returns once every record went through the count)
    await pipe.feed(words[::3])
    gate.set()
    chk = await pending
    assert rocksdb_state(chk, "count", "count", tmp_path) == at_barrier
    monkeypatch.setattr(generations, "flush_and_checkpoint", flush_and_checkpoint)
    await pipe.feed(words[::7])
    final = await job.checkpoint()
    assert rocksdb_state(final, "count", "count", tmp_path) == dict(pipe.truth)
    pipe.source.close()
    await job.wait()

    # a new job restored from the first checkpoint counts on from the barrier's state
    again = Pipeline("busy")
    again.truth.update(at_barrier)
    job2 = await again.flow.start(
        checkpoints=CheckpointConfig(interval=None, directory=tmp_path / "chk2"),
        state_backend=RocksDBStateBackend(path=tmp_path / "state2"), restore_from=chk.path)
    await again.feed(words[::5])
    restored = await job2.checkpoint()
    assert rocksdb_state(restored, "count", "count", tmp_path) == dict(again.truth)
    again.source.close()
    await job2.wait()
    assert CheckpointStorage(tmp_path / "chk2", "busy").completed()
