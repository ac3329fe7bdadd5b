"""The RocksDB backend's work on the event loop comes in steps bounded by the clock, and its
write-back cache stays warm: across a checkpoint (the frozen generation is copied back) and
across a restart (the restored state is loaded into the cache).

No wall-clock assertion: a fake clock (:data:`generations.clock`) that advances one whole
step per read makes each step's size a count of entries, and reads from RocksDB are counted
through :meth:`WriteBackCache._load`.
"""

from __future__ import annotations

import asyncio
import collections
import pickle
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from rocksdict import WriteBatch

import reactive.backends.rocksdb.generations as generations
import reactive.backends.rocksdb.state as state_module
from reactive import (
    CheckpointConfig,
    Dataflow,
    KeyedProcessFunction,
    KeyGroupRange,
    ListStateDescriptor,
    RestartStrategy,
    ValueStateDescriptor,
)
from reactive.backends.rocksdb import RocksDBKeyedStateBackend, RocksDBStateBackend
from reactive.backends.rocksdb.state import WriteBackCache
from reactive.connectors.collections import ListSink
from reactive.state.backend import SnapshotContext
from tests.support import FailureInjector, failing_count, final_counts, paced, zipf_words

MAX_PARALLELISM = 128


class FakeClock:
    """A clock that advances one whole step (:data:`generations.STEP_SECONDS`) per read: a
    step then ends at its first look at the clock, after a fixed number of entries."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += generations.STEP_SECONDS
        return self.now


class CountingSerializer:
    """Pickle, counting the values it serializes (shared by every copy of the function)."""

    calls = [0]

    def serialize(self, value: Any) -> bytes:
        CountingSerializer.calls[0] += 1
        return pickle.dumps(value)

    def deserialize(self, data: bytes) -> Any:
        return pickle.loads(data)


class Batches:
    """The ``WriteBatch`` es the cache and the local phases build, and how many values each
    holds: the values serialized from its creation to the next one's (a batch is built
    within one step, without an await; the counted state holds ints, which the task never
    serializes outside a batch). A written batch cannot be read back, hence the counting."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self._start: int | None = None

    def __call__(self, raw_mode: bool = True) -> WriteBatch:
        self._close()
        self._start = CountingSerializer.calls[0]
        return WriteBatch(raw_mode=raw_mode)

    def _close(self) -> None:
        if self._start is not None:
            self.sizes.append(CountingSerializer.calls[0] - self._start)

    def largest(self) -> int:
        self._close()
        self._start = None
        return max(self.sizes, default=0)


class CountingCount(KeyedProcessFunction):
    """Keyed count whose state values go through :class:`CountingSerializer`."""

    inj: FailureInjector

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0,
                                                        serializer=CountingSerializer()))

    def process_element(self, value: Any, ctx: Any) -> Iterable[Any]:
        self.inj.tick()
        n = self.count.value() + 1
        self.count.update(n)
        yield (ctx.current_key, n)


def make_backend(tmp_path: Path, name: str = "op", **kw: Any) -> RocksDBKeyedStateBackend:
    kb = RocksDBStateBackend(path=tmp_path / f"state-{name}", **kw).create_keyed_backend(
        job_name="steps", operator_uid=name, subtask=0,
        key_group_range=KeyGroupRange(0, MAX_PARALLELISM - 1), max_parallelism=MAX_PARALLELISM)
    assert isinstance(kb, RocksDBKeyedStateBackend)
    return kb


def context(tmp_path: Path, cid: int, uid: str = "op") -> SnapshotContext:
    job_dir = tmp_path / "chk" / "steps"
    return SnapshotContext(cid, job_dir, job_dir / f"chk-{cid}", job_dir / "shared", uid, 0)


class LoadCounter:
    """Counts the cache misses that read RocksDB (:meth:`WriteBackCache._load` calls for a
    key that no pending frozen generation holds and that a restore did not stage) per
    backend instance."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: collections.Counter[int] = collections.Counter()
        original = WriteBackCache._load

        def counted(cache: WriteBackCache, table: Any, key: Any) -> Any:
            frozen = (g.tables.get(table.name) for g in cache._gens.pending)
            if not any(ft is not None and key in ft.values for ft in frozen) \
                    and key not in table.staged:
                self.calls[id(cache)] += 1
            return original(cache, table, key)

        monkeypatch.setattr(WriteBackCache, "_load", counted)


# ---------------------------------------------------------------------- jobs
@pytest.mark.parametrize("cache_entries", [5_000, 1_024], ids=["fits", "evicts"])
async def test_keyed_count_is_exact_after_failures_and_every_write_step_is_bounded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache_entries: int) -> None:
    """A keyed count with failures ends with the batch counts, and no write of cached
    entries to RocksDB on the loop (dirty write-out, eviction, a frozen generation's local
    phase) holds more than one clock check's worth of entries: the steps end by time."""
    batches = Batches()
    monkeypatch.setattr(state_module, "WriteBatch", batches)
    monkeypatch.setattr(generations, "WriteBatch", batches)
    monkeypatch.setattr(generations, "clock", FakeClock(), raising=False)
    # fewer distinct keys than the pending bound (2 * cache_entries): the task never has to
    # finish a pending generation itself (that back-pressure writes it whole)
    words = zipf_words(60_000, 1_000, seed=5)
    truth = collections.Counter(words)
    rnd = random.Random(5)
    injector = FailureInjector([15_000 + 20_000 * i + rnd.randrange(1_000, 15_000)
                                for i in range(2)])
    sink = ListSink()
    flow = Dataflow("steps", parallelism=2, max_parallelism=MAX_PARALLELISM, batch_size=256)
    CountingCount.inj = injector
    (flow.source(paced(words, every=5_000)).uid("words")
         .key_by(lambda w: w)
         .process(CountingCount()).uid("count")
         .sink(sink))
    backend = RocksDBStateBackend(path=tmp_path / "state", cache_entries=cache_entries,
                                  write_batch_entries=300)
    job = await flow.run(checkpoints=CheckpointConfig(interval=0.05, directory=tmp_path / "chk"),
                         restart=RestartStrategy.fixed(5, 0.0), state_backend=backend)
    assert injector.failures == 2 and job.metrics.restored_checkpoints
    assert final_counts(sink.records) == truth
    largest = batches.largest()
    assert len(batches.sizes) > 10  # dirty entries and frozen generations were written
    assert 0 < largest <= getattr(generations, "CLOCK_EVERY", 64)


async def test_restarted_job_finds_its_restored_state_in_the_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a failure, the restored instances read none of the keys of their checkpoint
    from RocksDB again (every key appeared before the first checkpoint), and the counts
    equal the batch counts."""
    loads = LoadCounter(monkeypatch)
    restored: set[int] = set()
    original_restore = RocksDBKeyedStateBackend.restore

    def restore(kb: RocksDBKeyedStateBackend, handles: list[dict[str, Any]],
                job_dir: Path) -> None:
        original_restore(kb, handles, job_dir)
        restored.add(id(kb))
        loads.calls[id(kb)] = 0  # count the misses of the restored attempt only

    monkeypatch.setattr(RocksDBKeyedStateBackend, "restore", restore)
    vocabulary = [f"w{i}" for i in range(400)]
    words = vocabulary + zipf_words(12_000, 400, seed=9)
    truth = collections.Counter(words)
    injector = FailureInjector([7_000])  # after the checkpoints at 2,000, 4,000, 6,000
    sink = ListSink()
    flow = Dataflow("warm", parallelism=2, max_parallelism=MAX_PARALLELISM, batch_size=128)
    (flow.source(paced(words, every=2_000)).uid("words")
         .key_by(lambda w: w)
         .process(failing_count(injector)).uid("count")
         .sink(sink))
    job = await flow.run(checkpoints=CheckpointConfig(interval=0.05, directory=tmp_path / "chk"),
                         restart=RestartStrategy.fixed(2, 0.0),
                         state_backend=RocksDBStateBackend(path=tmp_path / "state"))
    assert injector.failures == 1 and job.metrics.restored_checkpoints
    assert final_counts(sink.records) == truth
    assert len(restored) == 2
    assert sum(loads.calls[i] for i in restored) == 0


# ---------------------------------------------------------------------- one backend
async def test_hot_keys_stay_cached_across_a_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full cache is not thrown away by a snapshot: after its asynchronous part every key
    is still cached (value and list state: list values are handed back when the generation
    is in RocksDB), while the task changed some keys meanwhile."""
    kb = make_backend(tmp_path, cache_entries=500, write_batch_entries=100_000)
    try:
        count = kb.get_state(ValueStateDescriptor("count", default=0))
        log = kb.get_state(ListStateDescriptor("log"))
        for i in range(500):
            kb.set_current_key(i)
            count.update(i)
            log.add(i)
        snap = kb.snapshot(context(tmp_path, 1))
        for i in range(0, 500, 50):  # the task goes on during the asynchronous part
            kb.set_current_key(i)
            count.update(count.value() + 1000)
        await snap.write()
        loads = LoadCounter(monkeypatch)
        for i in range(500):
            kb.set_current_key(i)
            assert count.value() == i + (1000 if i % 50 == 0 else 0)
            assert log.get() == [i]
        assert sum(loads.calls.values()) == 0
    finally:
        kb.dispose()


async def test_the_cache_refill_after_a_barrier_ends_its_steps_by_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The asynchronous part copies the frozen cache back into the live one (the hot keys
    stay cached) in steps that end by time: with a clock that advances a whole step per
    read, no step between two yields to the loop adds more than one clock check's worth of
    entries. (The refill used to copy 16,384 entries per step whatever they cost, then merge
    the live cache in: 10-30 ms stalls of the loop after every RocksDB checkpoint of W1.)"""
    kb = make_backend(tmp_path, cache_entries=20_000, write_batch_entries=100_000)
    try:
        count = kb.get_state(ValueStateDescriptor("count", default=0))
        for i in range(20_000):
            kb.set_current_key(i)
            count.update(i)
        table = kb._tables["count"]
        cached: list[int] = []  # the live cache's size at each yield of the refill
        yield_ = asyncio.sleep

        class Yields:
            @staticmethod
            async def sleep(delay: float) -> None:
                cached.append(len(table.cache))
                await yield_(delay)

        monkeypatch.setattr(state_module, "asyncio", Yields)
        monkeypatch.setattr(generations, "clock", FakeClock(), raising=False)
        await kb.snapshot(context(tmp_path, 1)).write()
        cached.append(len(table.cache))
        steps = [b - a for a, b in zip([0, *cached], cached, strict=False)]
        assert cached[-1] == 20_000
        assert len(steps) > 10 and max(steps) <= state_module.REFILL_CHUNK
        for i in range(0, 20_000, 997):
            kb.set_current_key(i)
            assert count.value() == i
    finally:
        kb.dispose()


def test_a_full_cache_evicts_its_oldest_entries_in_small_steps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    batches = Batches()
    monkeypatch.setattr(state_module, "WriteBatch", batches)
    kb = make_backend(tmp_path, cache_entries=640, write_batch_entries=100_000)
    try:
        count = kb.get_state(ValueStateDescriptor("count", default=0,
                                                  serializer=CountingSerializer()))
        for i in range(3_000):
            kb.set_current_key(i % 2_000)
            count.update(count.value() + 1)
            assert len(kb._tables["count"].cache) <= 640
        # each eviction writes at most a 64th of the capacity (its dirty victims)
        assert 0 < batches.largest() <= 640 // 64
        for i in range(2_000):
            kb.set_current_key(i)
            assert count.value() == (2 if i < 1_000 else 1)
    finally:
        kb.dispose()


@pytest.mark.parametrize("cache_entries,warm", [(1_000, True), (100, False)])
async def test_restore_stages_the_state_only_when_it_fits(
        tmp_path: Path, cache_entries: int, warm: bool) -> None:
    source = make_backend(tmp_path, "a")
    try:
        count = source.get_state(ValueStateDescriptor("count", default=0))
        for i in range(300):
            source.set_current_key(f"k{i}")
            count.update(i)
        handle = await source.snapshot(context(tmp_path, 1, "a")).write()
    finally:
        source.dispose()
    kb = make_backend(tmp_path, "b", cache_entries=cache_entries)
    try:
        kb.restore([handle], tmp_path / "chk" / "steps")
        staged = kb._tables["count"].staged
        assert {k: pickle.loads(v) for k, v in staged.items()} == (
            {f"k{i}": i for i in range(300)} if warm else {})
        count = kb.get_state(ValueStateDescriptor("count", default=0))
        for i in range(300):
            kb.set_current_key(f"k{i}")
            assert count.value() == i
        assert not staged  # each read took its entry
    finally:
        kb.dispose()


def test_restore_stages_custom_serialized_states_as_stored(tmp_path: Path) -> None:
    """Their deserializer is known only once a descriptor binds them: the bytes are staged,
    and deserialized when read."""

    class Tagged:
        def serialize(self, value: Any) -> bytes:
            return b"t" + pickle.dumps(value)

        def deserialize(self, data: bytes) -> Any:
            return pickle.loads(data[1:])

    async def snapshot() -> dict[str, Any]:
        kb = make_backend(tmp_path, "c")
        try:
            state = kb.get_state(ValueStateDescriptor("tagged", serializer=Tagged()))
            kb.set_current_key("x")
            state.update(7)
            return await kb.snapshot(context(tmp_path, 1, "c")).write()
        finally:
            kb.dispose()

    from reactive.runtime.loop import run_coroutine

    handle = run_coroutine(snapshot())
    kb = make_backend(tmp_path, "d")
    try:
        kb.restore([handle], tmp_path / "chk" / "steps")
        assert kb._tables["tagged"].cache == {}
        assert kb._tables["tagged"].staged == {"x": Tagged().serialize(7)}
        state = kb.get_state(ValueStateDescriptor("tagged", serializer=Tagged()))
        kb.set_current_key("x")
        assert state.value() == 7
    finally:
        kb.dispose()


async def test_a_staged_key_written_before_it_is_read_reads_back_its_new_value(
        tmp_path: Path) -> None:
    """Blind writes of restored keys reach RocksDB by a dirty write-out (the first 40 keys)
    or by a snapshot's frozen generation (the next 40); once they are out of the cache, a
    read must find the new value, not the one staged at the restore."""
    source = make_backend(tmp_path, "a")
    try:
        count = source.get_state(ValueStateDescriptor("count", default=0))
        for i in range(100):
            source.set_current_key(i)
            count.update(i)
        handle = await source.snapshot(context(tmp_path, 1, "a")).write()
    finally:
        source.dispose()
    kb = make_backend(tmp_path, "b", cache_entries=1_000, write_batch_entries=10)
    try:
        kb.restore([handle], tmp_path / "chk" / "steps")
        count = kb.get_state(ValueStateDescriptor("count", default=0))
        table = kb._tables["count"]
        assert len(table.staged) == 100
        for i in range(40):  # written out 10 at a time as they become dirty
            kb.set_current_key(i)
            count.update(1_000 + i)
        snap = kb.snapshot(context(tmp_path, 2, "b"))
        for i in range(40, 80):  # dirty while the generation is pending: frozen next time
            kb.set_current_key(i)
            count.update(1_000 + i)
        await snap.write()
        await kb.snapshot(context(tmp_path, 3, "b")).write()
        table.cache.clear()  # as if evicted: the next reads miss the cache
        for i in range(100):
            kb.set_current_key(i)
            assert count.value() == (1_000 + i if i < 80 else i)
    finally:
        kb.dispose()
