"""A barrier that overtakes an unfinished alignment declines the older checkpoint at once
(Flink's ``SingleCheckpointBarrierHandler.cancelSubsumedCheckpoint``,
``CHECKPOINT_DECLINED_SUBSUMED``), so the coordinator aborts it now instead of after its
timeout, without counting a failure; the at-least-once tracker drops older checkpoints
without declining them, as Flink's ``CheckpointBarrierTracker`` does.

With every source injecting every barrier over FIFO channels, barrier n+1 overtakes n at a
task only when an upstream task gave n up without sending its barrier; the tests force
that by feeding the task's channels directly.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from reactive import CheckpointConfig, CheckpointError, CheckpointStorage
from reactive.checkpoint.coordinator import CheckpointCoordinator, OperatorInfo
from reactive.runtime.barrier_handler import CheckpointBarrierTracker, SingleCheckpointBarrierHandler
from reactive.runtime.channel import Channel, InputGate
from reactive.runtime.events import END_OF_DATA, END_OF_INPUT, CheckpointBarrier
from reactive.runtime.operators import MapOperator
from reactive.runtime.task import StreamTask, TaskEnvironment


class Recorder:
    def __init__(self) -> None:
        self.aligned: list[int] = []
        self.declined: list[tuple[int, BaseException]] = []

    async def on_aligned(self, barrier: CheckpointBarrier, alignment: float) -> None:
        self.aligned.append(barrier.checkpoint_id)

    def on_decline(self, checkpoint_id: int, reason: BaseException) -> None:
        self.declined.append((checkpoint_id, reason))


async def _drain(gate: InputGate, handler: Any, items: int) -> list[Any]:
    """Deliver ``items`` channel items to ``handler``; return the records seen."""
    seen = []
    for _ in range(items):
        idx, item = await gate.get()
        if isinstance(item, CheckpointBarrier):
            await handler.on_barrier(idx, item)
        else:
            seen.append(item[0])
    return seen


async def test_newer_barrier_declines_the_aligning_checkpoint():
    ch0, ch1 = Channel(10), Channel(10)
    gate = InputGate([ch0, ch1])
    rec = Recorder()
    handler = SingleCheckpointBarrierHandler(gate, rec.on_aligned, rec.on_decline)
    await ch0.put(CheckpointBarrier(1, 0.0))
    await ch0.put(["after-1"])
    await ch0.put(CheckpointBarrier(2, 0.0))
    await ch1.put(CheckpointBarrier(2, 0.0))  # channel 1's upstream never sent barrier 1
    await ch1.put(CheckpointBarrier(1, 0.0))  # a straggler of the subsumed checkpoint

    await _drain(gate, handler, 2)  # barrier 1 on 0 (blocks it), barrier 2 on 1
    assert [cid for cid, _ in rec.declined] == [1]
    reason = rec.declined[0][1]
    assert isinstance(reason, CheckpointError) and "subsumed" in str(reason)
    assert "checkpoint 2" in str(reason)
    # checkpoint 1 released channel 0; checkpoint 2 now blocks channel 1
    assert not ch0.blocked and ch1.blocked
    assert await _drain(gate, handler, 2) == ["after-1"]
    assert rec.aligned == [2]
    assert not ch0.blocked and not ch1.blocked
    await _drain(gate, handler, 1)  # the straggler: ignored, not declined again
    assert rec.aligned == [2] and len(rec.declined) == 1


async def test_completed_alignment_is_not_declined():
    ch0, ch1 = Channel(10), Channel(10)
    gate = InputGate([ch0, ch1])
    rec = Recorder()
    handler = SingleCheckpointBarrierHandler(gate, rec.on_aligned, rec.on_decline)
    for cid in (1, 2):
        await ch0.put(CheckpointBarrier(cid, 0.0))
        await ch1.put(CheckpointBarrier(cid, 0.0))
    await _drain(gate, handler, 4)
    assert rec.aligned == [1, 2] and rec.declined == []


async def test_barrier_tracker_drops_older_checkpoints_without_declining():
    ch0, ch1 = Channel(10), Channel(10)
    gate = InputGate([ch0, ch1])
    rec = Recorder()
    tracker = CheckpointBarrierTracker(gate, rec.on_aligned, rec.on_decline)
    await ch0.put(CheckpointBarrier(1, 0.0))
    await ch0.put(CheckpointBarrier(2, 0.0))
    await ch1.put(CheckpointBarrier(2, 0.0))
    await ch1.put(CheckpointBarrier(1, 0.0))
    await _drain(gate, tracker, 4)
    assert rec.aligned == [2]
    assert rec.declined == []  # the coordinator subsumes 1 when 2 completes (as in Flink)
    assert tracker.counts == {}


async def test_task_declines_subsumed_checkpoint_without_waiting_for_the_timeout(
        tmp_path: Path) -> None:
    """A real two-input task and coordinator (timeout 60 s, two concurrent checkpoints):
    barrier 2 reaches the second input before barrier 1 did; checkpoint 1 is aborted at
    once as subsumed (not a counted failure) and checkpoint 2 completes."""
    storage = CheckpointStorage(tmp_path, "subsume")
    coordinator = CheckpointCoordinator(
        CheckpointConfig(interval=None, directory=tmp_path, max_concurrent=2, timeout=60),
        storage, "subsume", 16, [OperatorInfo("upper", "upper", 1, False)], 1, [])
    background: set[asyncio.Task[None]] = set()

    def spawn(coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        background.add(task)
        task.add_done_callback(background.discard)

    env = TaskEnvironment(
        job_name="subsume", max_parallelism=16, batch_size=16, buffer_timeout=0.01,
        exactly_once=True, storage=storage, coordinator=coordinator, spawn=spawn,
        on_source_finished=lambda task: None,
    )
    ch0, ch1 = Channel(16, "a->upper"), Channel(16, "b->upper")
    task = StreamTask(env, "upper", 0, 1, [MapOperator("upper", "upper", str.upper)],
                      InputGate([ch0, ch1]), [])
    coordinator.attach([task])
    first, second = coordinator.trigger(), coordinator.trigger()
    for item in (["a"], CheckpointBarrier(1, 0.0), ["b"]):
        await ch0.put(item)
    # channel 1's upstream gave checkpoint 1 up: its barrier 1 never comes
    for item in (["x"], CheckpointBarrier(2, 0.0)):
        await ch1.put(item)

    runner = asyncio.create_task(task.run())
    # checkpoint 2 is still aligning (channel 0 has not delivered its barrier), so nothing
    # but the decline can end checkpoint 1 before its 60 s timeout (which would say so)
    with pytest.raises(CheckpointError, match="subsumed"):
        await asyncio.wait_for(asyncio.shield(first.done), 10)
    assert not second.done.done()
    await ch0.put(CheckpointBarrier(2, 0.0))
    completed = await asyncio.wait_for(asyncio.shield(second.done), 10)
    for ch in (ch0, ch1):  # end the task only now: its asynchronous part has acknowledged
        await ch.put(END_OF_DATA)
        await ch.put(END_OF_INPUT)
    await runner
    assert completed.checkpoint_id == 2
    assert first.stats.status == "aborted"
    assert "declined by upper (1/1)" in (first.stats.failure or "")
    assert "subsumed" in (first.stats.failure or "")
    assert first.stats.failure_reason == "CHECKPOINT_DECLINED_SUBSUMED"
    assert coordinator.consecutive_failures == 0  # a subsumed checkpoint is no failure
    assert 1 not in coordinator.pending and 2 not in coordinator.pending
    assert [c.checkpoint_id for c in storage.completed()] == [2]
