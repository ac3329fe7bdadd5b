"""The heap backend's in-memory hand-over (``hand_over`` / ``take_over``, used by
``job.rescale``): the new instances adopt the old instances' key-group dicts themselves, so
values, timers and object identity carry over, and a snapshot after the take-over restores
the same state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reactive import ManualClock, key_group_range_for_operator
from reactive.backends.heap import HeapKeyedStateBackend
from reactive.backends.heap.backend import HeapKeyGroups
from reactive.errors import RestoreError
from reactive.keygroups import KeyGroupRange, assign_to_key_group
from reactive.state.backend import SnapshotContext
from reactive.state.descriptors import ListStateDescriptor, ValueStateDescriptor
from reactive.time.timers import InternalTimerService

MAXP = 16
KEYS = [f"key{i}" for i in range(60)]
COUNT = ValueStateDescriptor("count", default=0)
SEEN = ListStateDescriptor("seen")


def _old_instances(p: int) -> tuple[list[HeapKeyedStateBackend], dict[Any, Any]]:
    """``p`` instances holding a count, a list and an event-time timer per key; returns
    them and each key's list object."""
    olds, lists = [], {}
    for i in range(p):
        b = HeapKeyedStateBackend(key_group_range_for_operator(i, p, MAXP), MAXP)
        count, seen = b.get_state(COUNT), b.get_state(SEEN)
        timers = InternalTimerService(b, ManualClock(), None, lambda ts, ns: [],
                                      lambda ts, ns: [])
        for n, k in enumerate(KEYS):
            try:
                b.set_current_key(k)
            except Exception:
                continue  # another instance owns it
            count.update(n)
            seen.add(k)
            seen.add(n)
            lists[k] = b._tables["seen"].maps[b._idx][k]
            timers.register_event_time_timer(float(n))
        olds.append(b)
    return olds, lists


def _take_over(olds: list[HeapKeyedStateBackend], p: int) -> list[HeapKeyedStateBackend]:
    parts = [b.hand_over() for b in olds]
    news = []
    for i in range(p):
        b = HeapKeyedStateBackend(key_group_range_for_operator(i, p, MAXP), MAXP)
        r = b.key_group_range
        b.take_over([x for x in parts if x is not None and x.key_group_range.start <= r.end
                     and r.start <= x.key_group_range.end])
        news.append(b)
    return news


@pytest.mark.parametrize("old_p, new_p", [(2, 3), (3, 1), (1, 4)])
def test_new_instances_adopt_the_key_groups_and_their_timers(old_p, new_p):
    olds, lists = _old_instances(old_p)
    news = _take_over(olds, new_p)
    fired: list[tuple[Any, float]] = []
    for b in news:
        count, seen = b.get_state(COUNT), b.get_state(SEEN)
        for n, k in enumerate(KEYS):
            if b.key_group_range.start <= _key_group(k) <= b.key_group_range.end:
                b.set_current_key(k)
                assert count.value() == n
                assert list(seen.get()) == [k, n]
                # the same object: moved, not copied or serialized
                assert b._tables["seen"].maps[b._idx][k] is lists[k]
        timers = InternalTimerService(
            b, ManualClock(), None,
            lambda ts, ns, b=b: fired.append((b.current_key, ts)) or [],
            lambda ts, ns: [])
        timers.restore()
        timers.advance_watermark(float("inf"))
    assert sorted(fired) == sorted((k, float(n)) for n, k in enumerate(KEYS))


async def test_a_snapshot_after_a_take_over_restores_the_same_state(tmp_path: Path):
    olds, _ = _old_instances(2)
    news = _take_over(olds, 3)
    handles = []
    for i, b in enumerate(news):
        ctx = SnapshotContext(7, tmp_path, tmp_path / "chk-7", tmp_path / "shared", "op", i)
        handles.append(await b.snapshot(ctx).write())
    restored = HeapKeyedStateBackend(KeyGroupRange(0, MAXP - 1), MAXP)
    restored.restore(handles, tmp_path)
    count = restored.get_state(COUNT)
    for n, k in enumerate(KEYS):
        restored.set_current_key(k)
        assert count.value() == n


@pytest.mark.parametrize("incremental", [False, True])
async def test_old_snapshots_written_after_the_take_over_hold_the_state_at_the_barrier(
        tmp_path: Path, incremental: bool):
    """The new instances may take over and change the state while the old instances'
    snapshots of the barrier are still to be written (a rescale that switches at its
    barrier): the old snapshots see each key first (copy-on-write across the hand-over)."""
    olds, _ = _old_instances(2)
    for b in olds:
        b.incremental = incremental
    snaps = [b.snapshot(SnapshotContext(7, tmp_path, tmp_path / "chk-7", tmp_path / "shared",
                                        "op", i)) for i, b in enumerate(olds)]
    news = _take_over(olds, 3)
    for b in news:
        count, seen = b.get_state(COUNT), b.get_state(SEEN)
        for k in KEYS:
            try:
                b.set_current_key(k)
            except Exception:
                continue  # another instance owns it
            count.update(-1)
            seen.add("after")
    handles = [await s.write() for s in snaps]
    restored = HeapKeyedStateBackend(KeyGroupRange(0, MAXP - 1), MAXP)
    restored.restore(handles, tmp_path)
    count, seen = restored.get_state(COUNT), restored.get_state(SEEN)
    for n, k in enumerate(KEYS):
        restored.set_current_key(k)
        assert (count.value(), list(seen.get())) == (n, [k, n])


def test_a_part_of_another_backend_is_refused():
    b = HeapKeyedStateBackend(KeyGroupRange(0, MAXP - 1), MAXP, operator_uid="count")

    class Foreign:
        key_group_range = KeyGroupRange(0, 3)

    with pytest.raises(RestoreError, match=r"operator 'count'.*Foreign"):
        b.take_over([Foreign()])
    assert isinstance(_old_instances(1)[0][0].hand_over(), HeapKeyGroups)


def _key_group(key: Any) -> int:
    return assign_to_key_group(key, MAXP)
