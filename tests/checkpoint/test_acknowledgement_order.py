"""A task acknowledges its checkpoints in the order it took them.

Two checkpoints may be in flight at once (``max_concurrent_checkpoints``). Their
asynchronous parts run concurrently, and a later one can finish writing first (a smaller
delta, a worker thread scheduled earlier). If a task acknowledged it first, checkpoint n+1
could complete before n, which the coordinator then aborts as subsumed: the job loses a
checkpoint it had fully written, and a two-phase-commit sink commits n's transaction with
n+1's notification. So the task holds n+1's acknowledgement until n's part has ended
(acknowledged or declined); the write itself is not held back.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from reactive.checkpoint.storage import CheckpointStorage
from reactive.runtime.events import CheckpointBarrier
from reactive.runtime.subtask_checkpoint_coordinator import SubtaskCheckpointCoordinator
from reactive.state.backend import KeyedStateSnapshot


class GatedSnapshot(KeyedStateSnapshot):
    """A keyed snapshot whose asynchronous part ends when the test says so."""

    def __init__(self, gate: asyncio.Future[None]) -> None:
        self.gate = gate
        self.discarded = False

    async def write(self) -> dict[str, Any]:
        await self.gate
        return {"backend": "gated", "files": []}

    def discard(self) -> None:
        self.discarded = True


class Acks:
    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []

    async def acknowledge(self, checkpoint_id: int, task: Any, states: Any, stats: Any) -> None:
        self.events.append(("ack", checkpoint_id))

    def decline(self, checkpoint_id: int, task: Any, reason: BaseException,
                failure_reason: Any = None) -> None:
        self.events.append(("decline", checkpoint_id))


def _operator(gates: dict[int, asyncio.Future[None]]) -> Any:
    backend = SimpleNamespace(
        key_group_range=SimpleNamespace(to_list=lambda: [0, 127]),
        snapshot=lambda ctx: GatedSnapshot(gates[ctx.checkpoint_id]),
    )
    return SimpleNamespace(
        uid="count", keyed_backend=backend,
        operator_state=SimpleNamespace(is_empty=lambda: True),
        snapshot_state=lambda cid: None,
    )


async def _two_in_flight(tmp_path: Path) -> tuple[dict[int, asyncio.Future[None]], Acks,
                                                  list[asyncio.Task[None]]]:
    """Checkpoints 1 and 2 taken at one task, both asynchronous parts waiting on their gate."""
    loop = asyncio.get_running_loop()
    gates: dict[int, asyncio.Future[None]] = {1: loop.create_future(), 2: loop.create_future()}
    acks = Acks()
    parts: list[asyncio.Task[None]] = []

    async def broadcast(event: Any) -> None:
        return None

    coordinator = SubtaskCheckpointCoordinator(
        SimpleNamespace(task_id="count (1/1)", subtask=0), [_operator(gates)],
        CheckpointStorage(tmp_path, "job"), acks,
        lambda coro: parts.append(asyncio.ensure_future(coro)), broadcast, lambda: False)
    for cid in (1, 2):
        await coordinator.checkpoint_state(CheckpointBarrier(cid, 0.0, "checkpoint"), 0.0)
    return gates, acks, parts


async def _settle() -> None:
    # every spawned part runs until it waits on something the test has not released
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_later_checkpoint_that_finishes_writing_first_is_acknowledged_second(tmp_path):
    gates, acks, parts = await _two_in_flight(tmp_path)
    gates[2].set_result(None)
    await _settle()
    assert acks.events == []  # 2 is written, but waits for 1
    gates[1].set_result(None)
    await asyncio.gather(*parts)
    assert acks.events == [("ack", 1), ("ack", 2)]


async def test_a_declined_earlier_checkpoint_releases_the_later_one(tmp_path):
    gates, acks, parts = await _two_in_flight(tmp_path)
    gates[2].set_result(None)
    gates[1].set_exception(OSError("disk full"))
    await asyncio.gather(*parts)
    assert acks.events == [("decline", 1), ("ack", 2)]


async def test_a_cancelled_earlier_part_releases_the_later_one(tmp_path):
    gates, acks, parts = await _two_in_flight(tmp_path)
    await _settle()
    parts[0].cancel()
    gates[2].set_result(None)
    await asyncio.gather(*parts, return_exceptions=True)
    assert acks.events == [("ack", 2)]
