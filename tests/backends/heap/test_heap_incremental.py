"""Incremental heap snapshots (heap-v2): a model-based test of random state changes
interleaved with snapshots that complete, abort or fail, restored at the barrier state (also
rescaled, and into RocksDB); then the copy-on-write, changelog and materialization details."""

from __future__ import annotations

import asyncio
import copy
import pickle
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reactive.backends.heap import HeapKeyedStateBackend, iter_heap_key_groups, read_heap_snapshot
from reactive.backends.heap import backend as heap_backend
from reactive.backends.heap import snapshot as heap_snapshot
from reactive.errors import StateSerializationError
from reactive.key_encoding import encode_key
from reactive.keygroups import KeyGroupRange, key_group_of_bytes
from reactive.state.api import ListState, MapState, ReducingState, ValueState
from reactive.state.backend import KeyedStateBackend, SnapshotContext
from reactive.state.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)

MAX_PARALLELISM = 16
FULL_RANGE = KeyGroupRange(0, MAX_PARALLELISM - 1)
KEYS = [*range(40), *(f"k{i}" for i in range(20))]

VALUE = ValueStateDescriptor("value")
LIST = ListStateDescriptor("list")
MAP = MapStateDescriptor("map")
TOTAL = ReducingStateDescriptor("total", reduce_fn=lambda a, b: a + b)
NAMES = ("value", "list", "map", "total")

Model = dict[str, dict[Any, Any]]


class Instance:
    """A heap backend under test with its states, and the model of what it holds."""

    def __init__(self, job_dir: Path, incremental: bool = True, **options: Any) -> None:
        self.job_dir = job_dir
        self.kb = HeapKeyedStateBackend(FULL_RANGE, MAX_PARALLELISM, operator_uid="op",
                                        incremental=incremental, **options)
        self.value: ValueState = self.kb.get_state(VALUE)  # type: ignore[assignment]
        self.list: ListState = self.kb.get_state(LIST)  # type: ignore[assignment]
        self.map: MapState = self.kb.get_state(MAP)  # type: ignore[assignment]
        self.total: ReducingState = self.kb.get_state(TOTAL)  # type: ignore[assignment]
        self.model: Model = {name: {} for name in NAMES}

    def apply(self, op: str, key: Any, x: int) -> None:
        """One state change through the state API, mirrored in the model."""
        self.kb.set_current_key(key)
        m = self.model
        if op == "update":
            self.value.update([x])  # a mutable value: copy-on-write must protect it
            m["value"][key] = [x]
        elif op == "mutate":
            v = self.value.value()
            if v is not None:  # in place, then written back (the documented pattern)
                v.append(x)
                self.value.update(v)
                m["value"][key] = [*m["value"][key], x]
        elif op == "clear":
            self.value.clear()
            m["value"].pop(key, None)
        elif op == "add":
            self.list.add(x)
            m["list"].setdefault(key, []).append(x)
        elif op == "put":
            self.map.put(x % 3, x)
            m["map"].setdefault(key, {})[x % 3] = x
        elif op == "remove":
            self.map.remove(x % 3)
            entry = m["map"].get(key)
            if entry is not None:
                entry.pop(x % 3, None)
                if not entry:
                    del m["map"][key]
        elif op == "reduce":
            self.total.add(x)
            m["total"][key] = m["total"].get(key, 0) + x
        elif op == "clear_all":
            for s in (self.value, self.list, self.map, self.total):
                s.clear()
            for d in m.values():
                d.pop(key, None)
        else:
            raise AssertionError(op)

    def context(self, checkpoint_id: int) -> SnapshotContext:
        return SnapshotContext(checkpoint_id, self.job_dir, self.job_dir / f"chk-{checkpoint_id}",
                               self.job_dir / "shared", "op", 0)


def read_backend(kb: KeyedStateBackend) -> Model:
    """Everything a restored backend holds, through the state API."""
    states = {name: kb.get_state(d) for name, d in zip(NAMES, (VALUE, LIST, MAP, TOTAL),
                                                        strict=True)}
    out: Model = {name: {} for name in NAMES}
    for name, state in states.items():
        for key in list(kb.keys(name)):
            kb.set_current_key(key)
            if name == "value":
                out[name][key] = state.value()  # type: ignore[attr-defined]
            elif name == "map":
                out[name][key] = dict(state.items())  # type: ignore[attr-defined]
            else:
                out[name][key] = state.get()  # type: ignore[attr-defined]
    return out


def nonempty(model: Model) -> Model:
    return {name: d for name, d in model.items() if d}


def restore_heap(handles: list[dict[str, Any]], job_dir: Path,
                 kgr: KeyGroupRange = FULL_RANGE) -> HeapKeyedStateBackend:
    kb = HeapKeyedStateBackend(kgr, MAX_PARALLELISM, operator_uid="op")
    kb.restore(handles, job_dir)
    return kb


def check_restores(handle: dict[str, Any], job_dir: Path, expected: Model,
                   tmp: Path) -> None:
    """The handle gives back ``expected`` through the reader, a heap restore, a heap
    restore split in two ranges (rescaling), and a RocksDB restore where installed."""
    assert read_heap_snapshot(handle, job_dir) == nonempty(expected)
    assert nonempty(read_backend(restore_heap([handle], job_dir))) == nonempty(expected)
    merged: Model = {name: {} for name in NAMES}
    for kgr in (KeyGroupRange(0, 6), KeyGroupRange(7, MAX_PARALLELISM - 1)):
        part = read_backend(restore_heap([handle], job_dir, kgr))
        for name, d in part.items():
            merged[name].update(d)
    assert nonempty(merged) == nonempty(expected)
    try:
        from reactive.backends.rocksdb import RocksDBKeyedStateBackend
    except ImportError:
        return
    rocks = RocksDBKeyedStateBackend(tmp / f"rocks-{random.getrandbits(32):x}", FULL_RANGE,
                                     MAX_PARALLELISM, operator_uid="op")
    try:
        rocks.restore([handle], job_dir)
        assert nonempty(read_backend(rocks)) == nonempty(expected)
    finally:
        rocks.dispose()


OPS = ("update", "mutate", "clear", "add", "put", "remove", "reduce", "clear_all")
step = st.one_of(
    st.tuples(st.sampled_from(OPS), st.sampled_from(KEYS), st.integers(0, 9)),
    st.tuples(st.just("snapshot")),
    st.tuples(st.just("savepoint")),
    st.tuples(st.just("progress"), st.integers(1, 6)),
    st.tuples(st.just("finish"), st.sampled_from(["complete", "complete", "abort", "discard"])),
)


async def run_model(steps: list[tuple[Any, ...]], job_dir: Path,
                    incremental: bool = True) -> None:
    """Apply ``steps``; every completed checkpoint must restore the model at its barrier."""
    inst = Instance(job_dir, incremental, max_deltas=3)
    cid = 0
    # (checkpoint id, model at the barrier, snapshot, its write task (None: not started))
    pending: list[tuple[int, Model, Any, asyncio.Task[dict[str, Any]] | None]] = []
    completed: list[tuple[int, Model, dict[str, Any]]] = []

    async def finish(outcome: str) -> None:
        c, model, snap, task = pending.pop(0)
        if outcome == "discard" and task is None:
            snap.discard()
            return
        handle = await (task if task is not None else snap.write())
        if outcome == "complete":
            inst.kb.notify_checkpoint_complete(c)
            completed.append((c, model, handle))

    for s in steps:
        if s[0] in ("snapshot", "savepoint"):
            cid += 1
            ctx = inst.context(cid)
            if s[0] == "savepoint":  # self-contained, keeps the key memo, is no base
                ctx = SnapshotContext(cid, ctx.job_dir, ctx.checkpoint_dir, ctx.shared_dir,
                                      "op", 0, savepoint=True)
            snap = inst.kb.snapshot(ctx)
            # half the snapshots start writing at once: later steps interleave with them
            task = asyncio.ensure_future(snap.write()) if cid % 2 else None
            pending.append((cid, copy.deepcopy(inst.model), snap, task))
        elif s[0] == "progress":
            for _ in range(s[1]):
                await asyncio.sleep(0)
        elif s[0] == "finish":
            if pending:
                await finish(s[1])
        else:
            inst.apply(*s)
    while pending:
        await finish("complete")
    # and one more after everything, on top of the chains
    cid += 1
    handle = await inst.kb.snapshot(inst.context(cid)).write()
    completed.append((cid, copy.deepcopy(inst.model), handle))
    for _c, model, handle in completed:
        check_restores(handle, job_dir, model, job_dir.parent)


@pytest.fixture
def tiny_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer yields after every chunk, so the steps interleave with its pieces; a
    savepoint's memo of keys seen clears itself every few keys (touched again, a captured
    key must keep its capture from before)."""
    monkeypatch.setattr(heap_snapshot, "PIECE", 0.0)
    monkeypatch.setattr(heap_snapshot, "_MIN_CHUNK", 2)
    monkeypatch.setattr(heap_snapshot, "_WALK_CHUNK", 4)
    monkeypatch.setattr(heap_snapshot, "_SEEN_MAX", 3)


@pytest.fixture
def rolling_memo(monkeypatch: pytest.MonkeyPatch) -> None:
    """The backend's key memo rolls every 16 keys: a key misses it again while a checkpoint
    is written (touched again, a captured key must keep its capture from before). Not
    fewer: the changed-key set of a backend is bounded by 5 memos, beyond which every key
    group is written in full, and the model's 60 keys must still leave deltas."""
    monkeypatch.setattr(heap_backend, "_KEY_CACHE_SIZE", 16)


#: the model tests' settings: their examples run whole snapshot/restore cycles (~1 s each on a
#: busy machine); the default run tries a few, ``-m slow`` many more
MODEL = settings(deadline=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
steps_lists = st.lists(step, min_size=20, max_size=150)


@settings(MODEL, max_examples=8)
@given(steps_lists)
def test_model_restores_every_completed_checkpoint_at_its_barrier(
        tiny_pieces: None, rolling_memo: None, tmp_path_factory: pytest.TempPathFactory,
        steps: list[tuple[Any, ...]]) -> None:
    asyncio.run(run_model(steps, tmp_path_factory.mktemp("job")))


@pytest.mark.slow
@settings(MODEL, max_examples=40)
@given(steps_lists)
def test_model_restores_every_completed_checkpoint_at_its_barrier_more_examples(
        tiny_pieces: None, rolling_memo: None, tmp_path_factory: pytest.TempPathFactory,
        steps: list[tuple[Any, ...]]) -> None:
    asyncio.run(run_model(steps, tmp_path_factory.mktemp("job")))


@settings(MODEL, max_examples=5)
@given(steps_lists)
def test_model_full_checkpoints_carrying_chains_restore_at_their_barrier(
        tiny_pieces: None, rolling_memo: None, tmp_path_factory: pytest.TempPathFactory,
        steps: list[tuple[Any, ...]]) -> None:
    """Full (self-contained) checkpoints serialize the changes and copy the rest from the
    previous checkpoint's file: the same model test."""
    asyncio.run(run_model(steps, tmp_path_factory.mktemp("job"), incremental=False))


@pytest.mark.slow
@settings(MODEL, max_examples=25)
@given(steps_lists)
def test_model_full_checkpoints_carrying_chains_restore_more_examples(
        tiny_pieces: None, rolling_memo: None, tmp_path_factory: pytest.TempPathFactory,
        steps: list[tuple[Any, ...]]) -> None:
    asyncio.run(run_model(steps, tmp_path_factory.mktemp("job"), incremental=False))


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(40))
def test_model_long_random_runs(tiny_pieces: None, rolling_memo: None, tmp_path: Path,
                                seed: int) -> None:
    rnd = random.Random(seed)
    steps: list[tuple[Any, ...]] = []
    for _ in range(1500):
        r = rnd.random()
        if r < 0.04:
            steps.append(("snapshot",))
        elif r < 0.10:
            steps.append(("progress", rnd.randint(1, 6)))
        elif r < 0.14:
            steps.append(("finish", rnd.choice(["complete", "complete", "abort", "discard"])))
        else:
            steps.append((rnd.choice(OPS), rnd.choice(KEYS), rnd.randint(0, 9)))
    asyncio.run(run_model(steps, tmp_path / "job"))


# ---------------------------------------------------------------------- unit tests
def fill(inst: Instance, keys: list[Any]) -> None:
    for k in keys:
        inst.apply("update", k, 1)
        inst.apply("add", k, 2)


def chain_kinds(handle: dict[str, Any]) -> dict[str, list[str]]:
    return {kg: [e[3] for e in chain] for kg, chain in handle["key_groups"].items()}


def written_bytes(handle: dict[str, Any]) -> int:
    reused = {r["path"] for r in handle["shared_reused"]}
    return sum(r["size"] for r in handle["files"] if r["path"] not in reused)


async def test_deltas_hold_only_changed_keys_and_tombstones(tmp_path: Path) -> None:
    inst = Instance(tmp_path / "job")
    keys = list(range(2000))
    fill(inst, keys)
    h1 = await inst.kb.snapshot(inst.context(1)).write()
    inst.kb.notify_checkpoint_complete(1)
    assert all(kinds == ["f"] for kinds in chain_kinds(h1).values())
    inst.apply("update", 5, 9)
    inst.apply("clear_all", 6, 0)
    h2 = await inst.kb.snapshot(inst.context(2)).write()
    # two keys changed (and the key current at the first barrier counts as changed): at
    # most three deltas, every other key group reuses checkpoint 1's blob
    deltas = [kg for kg, kinds in chain_kinds(h2).items() if kinds == ["f", "d"]]
    assert 1 <= len(deltas) <= 3
    assert written_bytes(h2) * 50 < written_bytes(h1)
    assert {r["path"] for r in h2["shared"]} == {r["path"] for r in h2["files"]}
    assert all(r["path"].startswith("shared/") for r in h2["files"])
    assert read_heap_snapshot(h2, inst.job_dir) == nonempty(inst.model)
    assert 6 not in read_heap_snapshot(h2, inst.job_dir)["value"]
    inst.kb.notify_checkpoint_complete(2)
    # nothing changed since: only the key current at the barrier (it might have been
    # changed without a set_current_key) is written again
    h3 = await inst.kb.snapshot(inst.context(3)).write()
    changed = [kg for kg in h3["key_groups"] if h3["key_groups"][kg] != h2["key_groups"][kg]]
    assert len(changed) <= 1
    assert written_bytes(h3) * 500 < written_bytes(h1)


async def test_an_aborted_checkpoint_changes_reach_the_next_delta(tmp_path: Path) -> None:
    inst = Instance(tmp_path / "job")
    fill(inst, list(range(300)))
    await inst.kb.snapshot(inst.context(1)).write()
    inst.kb.notify_checkpoint_complete(1)
    inst.apply("update", 1, 100)
    await inst.kb.snapshot(inst.context(2)).write()  # written, but never completes
    inst.apply("update", 2, 200)
    discarded = inst.kb.snapshot(inst.context(3))
    discarded.discard()
    inst.apply("update", 3, 300)
    h4 = await inst.kb.snapshot(inst.context(4)).write()
    # built on checkpoint 1, with the keys of 2, 3 and 4
    assert read_heap_snapshot(h4, inst.job_dir) == nonempty(inst.model)
    assert not any(r["path"].startswith("shared/op/op-0-2-") for r in h4["files"])


async def test_materialization_bounds_and_staggers_the_chains(tmp_path: Path) -> None:
    inst = Instance(tmp_path / "job", max_deltas=4)
    keys = list(range(400))
    fill(inst, keys)
    lengths: list[int] = []
    materialized: list[int] = []
    previous: dict[str, list[Any]] = {}
    for cid in range(1, 16):
        for k in keys[::7]:  # every key group changes each time
            inst.apply("reduce", k, cid)
        handle = await inst.kb.snapshot(inst.context(cid)).write()
        inst.kb.notify_checkpoint_complete(cid)
        assert read_heap_snapshot(handle, inst.job_dir) == nonempty(inst.model)
        lengths.append(max(len(c) for c in handle["key_groups"].values()))
        materialized.append(sum(1 for kg, c in handle["key_groups"].items()
                                if len(c) == 1 and previous.get(kg) != c))
        previous = handle["key_groups"]
    assert max(lengths) <= 1 + 4  # a full blob and at most max_deltas deltas
    # after the first (all full), never every key group in the same checkpoint
    assert max(materialized[1:]) < MAX_PARALLELISM
    assert sum(1 for m in materialized[1:] if m) >= 3


class CountingSerializer:
    """A custom serializer that counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def serialize(self, value: Any) -> bytes:
        self.calls += 1
        return pickle.dumps(value)

    def deserialize(self, data: bytes) -> Any:
        return pickle.loads(data)


@pytest.mark.parametrize("incremental", [False, True])
async def test_touching_a_key_copies_that_key_only(tmp_path: Path, incremental: bool) -> None:
    """Copy-on-write is per key: the task pays O(1) per touched key, never a whole key group
    (the old snapshots serialized the touched key's whole key group inline)."""
    ser = CountingSerializer()
    kb = HeapKeyedStateBackend(KeyGroupRange(0, 0), 1, operator_uid="op",
                               incremental=incremental)
    state = kb.get_state(ValueStateDescriptor("v", serializer=ser))
    for k in range(5000):  # one key group
        kb.set_current_key(k)
        state.update(k)  # type: ignore[attr-defined]
    job_dir = tmp_path / "job"
    snap = kb.snapshot(SnapshotContext(1, job_dir, job_dir / "chk-1", job_dir / "shared", "op", 0))
    after_sync = ser.calls
    for k in (1, 2, 3):
        kb.set_current_key(k)
        state.update(-k)  # type: ignore[attr-defined]
    assert ser.calls - after_sync <= 3
    handle = await snap.write()
    got = read_heap_snapshot(handle, job_dir)["v"]
    assert {k: pickle.loads(v) for k, v in got.items()} == {k: k for k in range(5000)}


@pytest.mark.parametrize("freeze_max", [None, 50], ids=["freeze-all", "freeze-50"])
@pytest.mark.parametrize("incremental", [False, True])
async def test_values_changed_after_the_barrier_stay_out_while_and_after_it_freezes(
        tiny_pieces: None, tmp_path: Path, incremental: bool, freeze_max: int | None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Before it serializes, the asynchronous part takes what it writes out of reach of the
    records: the changed keys of delta key groups (captured as it sorts them by key group)
    and the dicts of key groups written in full (copied), when their values are immutable;
    those groups need no copy-on-write afterwards. A key group with a mutable value stays
    under copy-on-write. Changes made before the writing starts, while it prepares and while
    it writes, in place or not, never reach the snapshot: in the first checkpoint (every
    group in full) and in the next (deltas); also when the freeze's budget ends it early."""
    if freeze_max is not None:
        monkeypatch.setattr(heap_snapshot, "FREEZE_MAX", freeze_max)
    kb = HeapKeyedStateBackend(KeyGroupRange(0, 127), 128, operator_uid="op",
                               incremental=incremental)
    counts: ValueState = kb.get_state(ValueStateDescriptor("n", default=0))  # type: ignore[assignment]
    lists: ValueState = kb.get_state(ValueStateDescriptor("l"))  # type: ignore[assignment]
    keys = [f"k{i}" for i in range(2000)]
    model: dict[str, dict[str, Any]] = {"n": {}, "l": {}}  # what the states hold

    def count(key: str, x: int) -> None:
        kb.set_current_key(key)
        counts.update(counts.value() + x)
        model["n"][key] = model["n"].get(key, 0) + x

    def append(key: str, x: int) -> None:
        kb.set_current_key(key)
        v = lists.value() or []
        v.append(x)  # in place, then written back (the documented pattern)
        lists.update(v)
        model["l"][key] = [*model["l"].get(key, []), x]

    for k in keys:
        count(k, 1)
    append("m", 1)
    append("late", 1)
    late_group = kb._idx  # the key group index of "late"
    assert late_group < 100  # the snapshot goes on after writing it
    job_dir = tmp_path / "job"

    async def checkpoint(cid: int) -> None:
        kb.set_current_key(keys[1])  # not "late": the key current at the barrier is captured
        expected = copy.deepcopy(model)
        snap = kb.snapshot(SnapshotContext(cid, job_dir, job_dir / f"chk-{cid}",
                                           job_dir / "shared", "op", 0))
        for k in keys[:100:5]:  # before the writing starts: copied on write
            count(k, 100)
        task = asyncio.ensure_future(snap.write())
        steps = late_changes = 0
        while not task.done():
            steps += 1
            for k in keys[steps % 7:140:7]:  # a few keys per key group: deltas next time
                count(k, 1)
            append("m", steps)  # from the start: copied on write
            # first touched once the snapshot went past its key group: it must have
            # written the list by then, since a copy of the group would share the list
            if snap.next_idx > late_group:
                append("late", steps)
                late_changes += 1
            await asyncio.sleep(0)
        assert steps > 10 and late_changes > 0  # the changes interleaved with the writing
        assert read_heap_snapshot(task.result(), job_dir) == expected

    await checkpoint(1)
    kb.notify_checkpoint_complete(1)
    for k in keys[::20]:  # changed since checkpoint 1: checkpoint 2 writes deltas
        count(k, 1000)
    append("late", -1)
    await checkpoint(2)


@pytest.mark.parametrize("written", ["in full", "as deltas"])
@pytest.mark.parametrize("incremental", [False, True])
async def test_a_restored_state_bound_while_a_snapshot_is_written_keeps_its_format(
        tiny_pieces: None, tmp_path: Path, incremental: bool, written: str) -> None:
    """A restored state with a custom serializer holds its stored bytes until an operator
    asks for it (``get_state`` then decodes them in place). When that happens while a
    snapshot is written, the snapshot still writes each value once in the serializer's
    bytes: what it took before the binding was bytes already. The restored instance's
    first snapshot writes every key group in full; a later one, after keys were set
    current (the changed-key set), writes deltas and sorts those keys first."""
    job_dir = tmp_path / "job"
    ser = CountingSerializer()
    first = HeapKeyedStateBackend(KeyGroupRange(0, 127), 128, operator_uid="op")
    state = first.get_state(ValueStateDescriptor("v", serializer=ser))
    expected = {f"k{i}": i for i in range(3_000)}
    for k, v in expected.items():
        first.set_current_key(k)
        state.update(v)  # type: ignore[attr-defined]
    handle = await first.snapshot(SnapshotContext(1, job_dir, job_dir / "chk-1",
                                                  job_dir / "shared", "op", 0)).write()
    kb = HeapKeyedStateBackend(KeyGroupRange(0, 127), 128, operator_uid="op",
                               incremental=incremental)
    kb.restore([handle], job_dir)  # the state's values stay bytes: no descriptor yet
    cid = 2
    if written == "as deltas":
        await kb.snapshot(SnapshotContext(2, job_dir, job_dir / "chk-2", job_dir / "shared",
                                          "op", 0)).write()
        kb.notify_checkpoint_complete(2)
        for k in list(expected)[::4]:  # set current (no state call): changed-key set
            kb.set_current_key(k)
        kb.set_current_key("not-a-state-key")
        cid = 3
    snap = kb.snapshot(SnapshotContext(cid, job_dir, job_dir / f"chk-{cid}",
                                       job_dir / "shared", "op", 0))
    task = asyncio.ensure_future(snap.write())
    for _ in range(2):  # part of the way (the changed keys are sorted 4096 at a time)
        await asyncio.sleep(0)
    assert not task.done()
    kb.get_state(ValueStateDescriptor("v", serializer=ser))  # an operator opens the state
    got = read_heap_snapshot(await task, job_dir)["v"]
    assert {k: pickle.loads(v) for k, v in got.items()} == expected


async def test_the_current_key_at_the_barrier_is_captured(tmp_path: Path) -> None:
    """A change without a new set_current_key (the key current at the barrier) does not
    leak into the snapshot, and reaches the next one."""
    inst = Instance(tmp_path / "job")
    inst.apply("update", "k1", 1)
    snap = inst.kb.snapshot(inst.context(1))
    inst.value.update(["later"])  # no set_current_key in between
    h1 = await snap.write()
    inst.kb.notify_checkpoint_complete(1)
    assert read_heap_snapshot(h1, inst.job_dir)["value"] == {"k1": [1]}
    h2 = await inst.kb.snapshot(inst.context(2)).write()
    assert read_heap_snapshot(h2, inst.job_dir)["value"] == {"k1": ["later"]}


async def test_unserializable_value_fails_the_snapshot_and_the_next_delta_recovers(
        tmp_path: Path) -> None:
    inst = Instance(tmp_path / "job")
    fill(inst, list(range(50)))
    await inst.kb.snapshot(inst.context(1)).write()
    inst.kb.notify_checkpoint_complete(1)
    inst.kb.set_current_key("bad")
    inst.value.update(lambda: None)
    with pytest.raises(StateSerializationError) as info:
        await inst.kb.snapshot(inst.context(2)).write()
    assert (info.value.operator, info.value.state_name, info.value.key) == ("op", "value", "bad")
    assert not [p for p in (inst.job_dir / "shared").rglob("*") if p.name.endswith(".tmp")]
    inst.apply("update", "bad", 7)
    inst.apply("update", 3, 8)
    h3 = await inst.kb.snapshot(inst.context(3)).write()
    assert read_heap_snapshot(h3, inst.job_dir) == nonempty(inst.model)


@pytest.mark.parametrize("incremental", [True, False])
@pytest.mark.parametrize("checkpoint_in_flight", [False, True])
async def test_a_savepoint_holds_its_barrier_values_of_keys_set_current_before_it(
        tmp_path: Path, incremental: bool, checkpoint_in_flight: bool) -> None:
    """A checkpoint swaps in a fresh key memo, so a key's first use after its barrier
    misses it and is copied on write then; a savepoint keeps the memo (it closes no dirty
    interval). Keys set current before a savepoint's barrier are found in the memo after
    it, and must still be copied on write when records change them while it is written,
    alone or beside a checkpoint in flight."""
    inst = Instance(tmp_path / "job", incremental)
    keys = list(range(200))
    fill(inst, keys)
    await inst.kb.snapshot(inst.context(1)).write()
    inst.kb.notify_checkpoint_complete(1)
    for k in keys:  # every key set current again: in the memo
        inst.apply("put", k, 3)
    checkpoint = None
    if checkpoint_in_flight:
        checkpoint = inst.kb.snapshot(inst.context(2))
        at_checkpoint = copy.deepcopy(inst.model)
        inst.apply("put", 0, 4)  # the checkpoint's fresh memo now holds key 0 (touched)
    ctx = SnapshotContext(3, inst.job_dir, inst.job_dir / "chk-3", inst.job_dir / "shared",
                          "op", 0, savepoint=True)
    savepoint = inst.kb.snapshot(ctx)
    at_savepoint = copy.deepcopy(inst.model)
    for k in keys:  # changed in place and replaced, after the barriers
        inst.apply("mutate", k, 5)
        inst.apply("add", k, 6)
    assert read_heap_snapshot(await savepoint.write(), inst.job_dir) == nonempty(at_savepoint)
    if checkpoint is not None:
        assert read_heap_snapshot(await checkpoint.write(), inst.job_dir) == \
            nonempty(at_checkpoint)


async def test_savepoints_and_restored_instances_are_self_contained_then_full(
        tmp_path: Path) -> None:
    inst = Instance(tmp_path / "job")
    fill(inst, list(range(100)))
    await inst.kb.snapshot(inst.context(1)).write()
    inst.kb.notify_checkpoint_complete(1)
    inst.apply("update", 1, 5)
    ctx = SnapshotContext(2, inst.job_dir, inst.job_dir / "chk-2", inst.job_dir / "shared",
                          "op", 0, savepoint=True)
    sp = await inst.kb.snapshot(ctx).write()
    assert sp["shared"] == [] and all(r["path"].startswith("chk-2/") for r in sp["files"])
    inst.kb.notify_checkpoint_complete(2)
    # the savepoint is no base: the next delta still holds key 1
    inst.apply("update", 2, 6)
    h3 = await inst.kb.snapshot(inst.context(3)).write()
    assert read_heap_snapshot(h3, inst.job_dir) == nonempty(inst.model)
    restored = HeapKeyedStateBackend(FULL_RANGE, MAX_PARALLELISM, operator_uid="op",
                                     incremental=True)
    restored.restore([sp], inst.job_dir)
    h4 = await restored.snapshot(inst.context(4)).write()
    assert all(kinds == ["f"] for kinds in chain_kinds(h4).values())
    stream = iter_heap_key_groups(h4, inst.job_dir, KeyGroupRange(0, 3))
    assert all(kg <= 3 for kg, _, _ in stream)


async def test_full_checkpoints_serialize_only_changes_and_stay_self_contained(
        tmp_path: Path) -> None:
    """A full checkpoint after one completed serializes the changed keys only (the rest is
    copied from the previous file), yet restores alone once the previous one is gone."""
    ser = CountingSerializer()
    kb = HeapKeyedStateBackend(FULL_RANGE, MAX_PARALLELISM, operator_uid="op")
    state = kb.get_state(ValueStateDescriptor("v", serializer=ser))
    for k in range(5000):
        kb.set_current_key(k)
        state.update(k)  # type: ignore[attr-defined]
    job_dir = tmp_path / "job"

    def ctx(cid: int) -> SnapshotContext:
        return SnapshotContext(cid, job_dir, job_dir / f"chk-{cid}", job_dir / "shared", "op", 0)

    h1 = await kb.snapshot(ctx(1)).write()
    kb.notify_checkpoint_complete(1)
    assert ser.calls >= 5000
    before = ser.calls
    for k in (1, 2, 3):
        kb.set_current_key(k)
        state.update(-k)  # type: ignore[attr-defined]
    h2 = await kb.snapshot(ctx(2)).write()
    assert ser.calls - before <= 4 + 5000 // MAX_PARALLELISM  # changed keys (+ current key)
    assert h2["mode"] == "full" and h2["shared"] == []
    assert [r["path"] for r in h2["files"]] == ["chk-2/op-0.heap"]
    assert h2["files"][0]["size"] >= h1["files"][0]["size"]
    (job_dir / h1["files"][0]["path"]).unlink()
    got = read_heap_snapshot(h2, job_dir)["v"]
    expected = {k: (-k if k in (1, 2, 3) else k) for k in range(5000)}
    assert {k: pickle.loads(v) for k, v in got.items()} == expected


async def test_a_key_group_mostly_changed_is_written_in_full(tmp_path: Path) -> None:
    """When most of a key group's keys changed, it is materialized rather than given a
    delta larger than itself; key groups with a few changes get deltas."""
    inst = Instance(tmp_path / "job")
    keys = list(range(1600))
    fill(inst, keys)
    await inst.kb.snapshot(inst.context(1)).write()
    inst.kb.notify_checkpoint_complete(1)
    kg0 = [k for k in keys if key_group_of_bytes(encode_key(k), MAX_PARALLELISM) == 0]
    others = [k for k in keys if k not in set(kg0)]
    for k in kg0:
        inst.apply("reduce", k, 1)
    inst.apply("reduce", others[0], 1)
    h2 = await inst.kb.snapshot(inst.context(2)).write()
    kinds = chain_kinds(h2)
    assert kinds["0"] == ["f"]
    assert ["f", "d"] in kinds.values()
    assert read_heap_snapshot(h2, inst.job_dir) == nonempty(inst.model)
