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
    return _take_over_parts([b.hand_over() for b in olds], p)


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


def test_a_part_of_another_backend_is_refused():
    b = HeapKeyedStateBackend(KeyGroupRange(0, MAXP - 1), MAXP, operator_uid="count")

    class Foreign:
        key_group_range = KeyGroupRange(0, 3)

    with pytest.raises(RestoreError, match=r"operator 'count'.*Foreign"):
        b.take_over([Foreign()])
    assert isinstance(_old_instances(1)[0][0].hand_over(), HeapKeyGroups)


def _key_group(key: Any) -> int:
    return assign_to_key_group(key, MAXP)


def _ctx(tmp_path: Path, checkpoint_id: int, subtask: int) -> SnapshotContext:
    return SnapshotContext(checkpoint_id, tmp_path, tmp_path / f"chk-{checkpoint_id}",
                           tmp_path / "shared", "op", subtask)


@pytest.mark.parametrize("incremental", [False, True])
async def test_the_checkpoint_after_a_take_over_builds_on_the_barrier_checkpoint(
        tmp_path: Path, incremental: bool):
    """Handed over at checkpoint 5's barrier (completed, nothing changed since), the new
    instances start from its chains: checkpoint 6 serializes only the key changed after
    the switch, and restoring checkpoint 6 alone gives the whole state."""
    olds, _ = _old_instances(2)
    for b in olds:
        b.incremental = incremental
    parts, snaps = [], []
    for i, b in enumerate(olds):
        snaps.append(b.snapshot(_ctx(tmp_path, 5, i)))
        parts.append(b.hand_over())  # at the snapshot instant, as the runtime does
    for snap in snaps:
        await snap.write()
    for b in olds:
        b.notify_checkpoint_complete(5)
    news = _take_over_parts(parts, 3, incremental)
    changed = KEYS[7]
    owner = next(b for b in news if b.key_group_range.start <= _key_group(changed)
                 <= b.key_group_range.end)
    owner.get_state(COUNT)
    owner.set_current_key(changed)
    owner.get_state(COUNT).update(1000)
    handles = []
    for i, b in enumerate(news):
        b.get_state(COUNT)
        b.get_state(SEEN)
        snap = b.snapshot(_ctx(tmp_path, 6, i))
        # a base: only the changed key's key group may be written in full, none elsewhere
        assert snap.plan.base is not None
        assert snap.plan.full is not None and len(snap.plan.full) <= 1
        handles.append(await snap.write())
    restored = HeapKeyedStateBackend(KeyGroupRange(0, MAXP - 1), MAXP)
    restored.restore(handles, tmp_path)
    count, seen = restored.get_state(COUNT), restored.get_state(SEEN)
    for n, k in enumerate(KEYS):
        restored.set_current_key(k)
        assert count.value() == (1000 if k == changed else n)
        assert list(seen.get()) == [k, n]


async def test_without_a_completed_barrier_checkpoint_the_next_one_is_full(tmp_path: Path):
    olds, _ = _old_instances(2)
    parts = []
    for i, b in enumerate(olds):
        snap = b.snapshot(_ctx(tmp_path, 5, i))
        parts.append(b.hand_over())
        await snap.write()  # written, never completed
    news = _take_over_parts(parts, 3)
    for i, b in enumerate(news):
        assert b.snapshot(_ctx(tmp_path, 6, i)).plan.full is None


def _take_over_parts(parts: list[Any], p: int,
                     incremental: bool = False) -> list[HeapKeyedStateBackend]:
    news = []
    for i in range(p):
        b = HeapKeyedStateBackend(key_group_range_for_operator(i, p, MAXP), MAXP,
                                  incremental=incremental)
        r = b.key_group_range
        b.take_over([x for x in parts if x is not None and x.key_group_range.start <= r.end
                     and r.start <= x.key_group_range.end])
        news.append(b)
    return news
