"""Heap snapshots leave expired time-to-live entries out (Flink's cleanup in full snapshot):
what a checkpoint's files hold, read back with the key-group reader, is only the entries
live at the checkpoint's TTL time, in full and incremental checkpoints; a restore returns
exactly the live values."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import pytest

from reactive import (
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from reactive.backends.heap import HeapStateBackend
from reactive.backends.heap.fork_snapshot import fork_supported
from reactive.backends.heap.ttl_filter import DROP, TtlFilter
from reactive.state.key_group_stream import merge_key_groups, read_key_groups
from reactive.testing.operator_harness import OperatorSnapshot, OperatorTestHarness

TTL = 10.0


class Probe(KeyedProcessFunction):
    """Commands ``(key, op, arg)`` on TTL states of each kind (``short``: TTL 10 s,
    ``long``: 100 s); answers ``(key, op, result)``."""

    def open(self, ctx: Any) -> None:
        self.short = ctx.get_state(ValueStateDescriptor("short", default="none", ttl=TTL))
        self.long = ctx.get_state(ValueStateDescriptor("long", default="none", ttl=10 * TTL))
        self.list = ctx.get_state(ListStateDescriptor("list", ttl=TTL))
        self.map = ctx.get_state(MapStateDescriptor("map", ttl=TTL))
        self.sum = ctx.get_state(ReducingStateDescriptor(
            "sum", reduce_fn=lambda a, b: a + b, ttl=TTL))

    def process_element(self, record: Any, ctx: Any) -> Iterable[Any]:
        key, op, arg = record
        result: Any = None
        if op == "short":
            self.short.update(arg)
        elif op == "long":
            self.long.update(arg)
        elif op == "add":
            self.list.add(arg)
        elif op == "put":
            self.map.put(*arg)
        elif op == "sum+":
            self.sum.add(arg)
        elif op == "read":
            result = (self.short.value(), self.long.value(), self.list.get(),
                      dict(self.map.items()), self.sum.get())
        yield (key, op, result)


def harness(tmp_path: Path, incremental: bool, rewrite_expired: bool = False,
            restore_from: OperatorSnapshot | None = None,
            snapshot: Literal["paced", "fork"] = "paced") -> OperatorTestHarness:
    h = OperatorTestHarness.for_keyed_process(
        Probe(), key_selector=lambda r: r[0], max_parallelism=16, directory=tmp_path,
        state_backend=HeapStateBackend(incremental=incremental, snapshot=snapshot,
                                       rewrite_expired=rewrite_expired))
    h.open(restore_from=restore_from)
    return h


def ask(h: OperatorTestHarness, key: str, op: str, arg: Any = None) -> Any:
    (out,) = h.process_element((key, op, arg))
    return out[2]


def written(snapshot: OperatorSnapshot) -> dict[str, dict[Any, Any]]:
    """What the snapshot's files hold: ``{state: {key: stored value}}`` (TTL states store
    ``(value, expires_at)`` pairs)."""
    keyed = snapshot.subtasks[0].keyed_state
    assert keyed is not None
    with read_key_groups(keyed.to_json(), snapshot.job_dir) as stream:
        return merge_key_groups(stream)


@pytest.mark.parametrize(("incremental", "snapshot"), [
    (False, "paced"), (True, "paced"),
    # the child process forked at the barrier runs the same writer, with the same TTL times
    pytest.param(True, "fork", marks=[
        pytest.mark.e2e, pytest.mark.skipif(fork_supported() is not None,
                                            reason="os.fork() is not usable here")]),
])
async def test_a_snapshot_holds_only_the_entries_live_at_its_ttl_time(
        tmp_path: Path, incremental: bool, snapshot: Literal["paced", "fork"]):
    """Keys written at 0 expire at 10, keys written at 6 at 16: a snapshot at 12 holds the
    second ones only, and of a list or map written at both times only the later elements."""
    h = harness(tmp_path, incremental, snapshot=snapshot)
    h.set_processing_time(0.0)
    old, new = [f"a{i}" for i in range(10)], [f"b{i}" for i in range(10)]
    for k in old:
        ask(h, k, "short", k)
        ask(h, k, "add", 0)
        ask(h, k, "put", ("x", 0))
        ask(h, k, "sum+", 1)
    h.set_processing_time(6.0)
    for k in new:
        ask(h, k, "short", k)
        ask(h, k, "add", 6)
        ask(h, k, "put", ("y", 6))
        ask(h, k, "sum+", 2)
    for k in old[:5]:  # half the old keys get a live element and entry too
        ask(h, k, "add", 6)
        ask(h, k, "put", ("y", 6))
    h.set_processing_time(12.0)
    snapshot = await h.snapshot()
    h.close()

    files = written(snapshot)
    assert files["short"] == {k: (k, 16.0) for k in new}
    assert files["sum"] == {k: (2, 16.0) for k in new}
    live = new + old[:5]
    assert files["list"] == {k: [(6, 16.0)] for k in live}
    assert files["map"] == {k: {"y": (6, 16.0)} for k in live}

    r = harness(tmp_path, incremental, restore_from=snapshot)
    r.set_processing_time(12.0)
    answers = {k: ask(r, k, "read") for k in old + new}
    assert answers == {
        **{k: ("none", "none", [6], {"y": 6}, None) for k in old[:5]},
        **{k: ("none", "none", [], {}, None) for k in old[5:]},
        **{k: (k, "none", [6], {"y": 6}, 2) for k in new},
    }
    r.close()


@pytest.mark.parametrize("incremental", [False, True])
@pytest.mark.parametrize("rewrite_expired", [False, True])
async def test_deltas_and_carried_key_groups_with_expired_entries(
        tmp_path: Path, incremental: bool, rewrite_expired: bool):
    """After a base checkpoint, a key changed and expired by the next checkpoint is not
    written (its delta holds a tombstone). Unchanged keys that expired stay in the key
    group's blobs carried over from the base until an access (or the incremental cleanup)
    removes them, or, with ``rewrite_expired``, their key group is written again without
    them; a restore returns none of them either way."""
    h = harness(tmp_path, incremental, rewrite_expired)
    h.set_processing_time(0.0)
    old = [f"a{i}" for i in range(500)]  # ~30 a key group: a changed key goes in a delta
    lasting = [f"l{i}" for i in range(500)]
    for k in old:
        ask(h, k, "short", k)
    for k in lasting:
        ask(h, k, "long", k)
    base = await h.snapshot()
    await h.notify_checkpoint_complete(base.checkpoint_id)
    assert set(written(base)["short"]) == set(old)
    h.set_processing_time(2.0)
    changed = [f"c{i}" for i in range(8)]
    for k in changed:
        ask(h, k, "short", k)  # expires at 12
    h.set_processing_time(20.0)
    second = await h.snapshot()
    await h.notify_checkpoint_complete(second.checkpoint_id)

    files = written(second)
    assert files["long"] == {k: (k, 100.0) for k in lasting}
    # the changed keys expired: not written, whether in a delta or a rewritten key group
    assert not set(files.get("short", {})) & set(changed)
    # the unchanged expired keys: carried over, unless their key groups are rewritten
    assert set(files.get("short", {})) == (set() if rewrite_expired else set(old))

    r = harness(tmp_path / "restored", incremental, restore_from=second)
    r.set_processing_time(20.0)
    assert {k: ask(r, k, "read")[:2] for k in old + changed + lasting} == {
        **{k: ("none", "none") for k in old + changed},
        **{k: ("none", k) for k in lasting},
    }
    r.close()

    # an access removes an expired value: the next checkpoint writes its tombstone
    for k in old:
        ask(h, k, "read")
    third = await h.snapshot()
    assert "short" not in written(third) or written(third)["short"] == {}
    assert written(third)["long"] == {k: (k, 100.0) for k in lasting}
    h.close()


class Upper:
    """A custom serializer (to see the filter decode and encode a captured value)."""

    def serialize(self, value: Any) -> bytes:
        return repr(value).encode()

    def deserialize(self, data: bytes) -> Any:
        import ast
        return ast.literal_eval(data.decode())


def test_a_captured_value_is_filtered_through_its_serializer():
    """A copy-on-write capture of a state with a custom serializer holds the serializer's
    bytes: the filter decodes them to decide, and answers bytes again."""
    ttl = TtlFilter({"v": ("value", 12.0, 10.0), "l": ("list", 12.0, 10.0)})
    ser = Upper()
    assert ttl.value("v", ser.serialize(("x", 10.0)), ser) is DROP
    assert ttl.value("v", ser.serialize(("x", 15.0)), ser) == ser.serialize(("x", 15.0))
    both = ser.serialize([("x", 10.0), ("y", 15.0)])
    assert ser.deserialize(ttl.value("l", both, ser)) == [("y", 15.0)]
    assert ttl.value("other", ("x", 1.0)) == ("x", 1.0)  # not a TTL state: as it is
    assert ttl.dropped == 2
    # written: the earliest live expiry; the table: the earliest of all, the dropped included
    assert ttl.take_earliest() == ((("v", 15.0), ("l", 15.0)), (("v", 10.0), ("l", 10.0)))


async def _savepoint(kb: Any, job: Path, cid: int) -> dict[str, dict[Any, Any]]:
    """A savepoint of keyed backend ``kb``, read back: ``{state: {key: stored value}}``."""
    from reactive.state.backend import SnapshotContext

    ctx = SnapshotContext(cid, job, job / f"chk-{cid}", job / "shared", "op", 0,
                          savepoint=True)
    handle = await kb.snapshot(ctx).write()
    with read_key_groups(handle, job) as stream:
        return merge_key_groups(stream)


def _ttl_backend() -> tuple[Any, list[float], Any, Any]:
    """A heap keyed backend with a TTL value and list state on a manual clock."""
    from reactive.keygroups import KeyGroupRange
    from reactive.state.ttl_clock import TtlClock
    from reactive.state.ttl_config import StateTtlConfig

    now = [0.0]
    clock = TtlClock(lambda: now[0])
    kb = HeapStateBackend().create_keyed_backend(
        job_name="j", operator_uid="op", subtask=0, key_group_range=KeyGroupRange(0, 15),
        max_parallelism=16)
    config = StateTtlConfig(TTL)
    value = kb.get_ttl_state(ValueStateDescriptor("v", ttl=TTL), config, clock)
    lst = kb.get_ttl_state(ListStateDescriptor("l", ttl=TTL), config, clock)
    return kb, now, value, lst


async def test_a_floor_never_lets_an_expired_entry_into_a_savepoint(tmp_path: Path):
    """The states' floors (the earliest expiry they wrote) spare a savepoint the search for
    expired entries only while none can have expired: an entry written by another state
    object, or restored, makes the floor unknown, and the savepoint still leaves the
    expired entries out."""
    from reactive.state.ttl import backend_descriptor
    from reactive.state.ttl_config import StateTtlConfig

    kb, now, value, lst = _ttl_backend()
    keys = [f"k{i}" for i in range(40)]
    now[0] = 20.0
    for k in keys:
        kb.set_current_key(k)
        value.update(k)
        lst.add(k)
    assert value.floor == lst.floor == 30.0
    now[0] = 25.0  # before the floor: nothing to look for, everything written
    files = await _savepoint(kb, tmp_path / "a", 1)
    assert files == {"v": {k: (k, 30.0) for k in keys}, "l": {k: [(k, 30.0)] for k in keys}}

    # a pair expired at 12 written past the TTL state (the backend descriptor's state)
    raw = kb.get_state(backend_descriptor(ValueStateDescriptor("v", ttl=TTL),
                                          StateTtlConfig(TTL)))
    kb.set_current_key("old")
    raw.update(("old", 12.0))
    kb.set_current_key(keys[0])  # (the barrier's current key is checked on its own)
    files = await _savepoint(kb, tmp_path / "b", 2)
    assert files["v"] == {k: (k, 30.0) for k in keys}  # "old" left out

    # restored entries (expiring at 30) into states created before the restore
    handle = (await _savepoint_handle(kb, tmp_path / "c", 3))
    kb.dispose()
    kb2, now2, value2, lst2 = _ttl_backend()
    assert value2.floor == lst2.floor == float("inf")  # empty tables
    kb2.restore([handle], tmp_path / "c")
    now2[0] = 35.0
    assert await _savepoint(kb2, tmp_path / "d", 4) == {}
    kb2.dispose()


async def _savepoint_handle(kb: Any, job: Path, cid: int) -> dict[str, Any]:
    from reactive.state.backend import SnapshotContext

    ctx = SnapshotContext(cid, job, job / f"chk-{cid}", job / "shared", "op", 0,
                          savepoint=True)
    return await kb.snapshot(ctx).write()  # type: ignore[no-any-return]
