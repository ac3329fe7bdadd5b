"""Barrier handling on a task's inputs (Flink's ``CheckpointBarrierHandler``).

:class:`SingleCheckpointBarrierHandler` implements the alignment of Algorithm 1 of "Lightweight
Asynchronous Snapshots for Distributed Dataflows" (Carbone et al., 2015): a channel that
delivered barrier n is blocked -- its later records stay queued, in order -- until barrier n
has arrived on every input; then the task snapshots, forwards the barrier and unblocks.
A barrier of a newer checkpoint that arrives while n is still aligning means n can no longer
complete at this task: the handler declines n at once (``on_decline``), as Flink's
``SingleCheckpointBarrierHandler`` does, instead of leaving it to the coordinator's timeout.
:class:`CheckpointBarrierTracker` is the at-least-once variant: it never blocks and triggers the
snapshot when the last barrier of n arrives.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from ..errors import CheckpointError
from .channel import InputGate
from .events import CheckpointBarrier

__all__ = ["BarrierHandler", "CheckpointBarrierTracker", "SingleCheckpointBarrierHandler"]

OnAligned = Callable[[CheckpointBarrier, float], Awaitable[None]]
OnDecline = Callable[[int, BaseException], None]
"""``on_decline(checkpoint_id, reason)``: this task gives up checkpoint ``checkpoint_id``."""


class BarrierHandler:
    """Base: tracks which channels are still live (have not ended).

    Args:
        gate: the task's input gate.
        on_aligned: ``await on_aligned(barrier, alignment_seconds)`` when the task must
            snapshot for ``barrier``.
        on_decline: ``on_decline(checkpoint_id, reason)`` when a checkpoint can no longer
            complete at this task because a newer one subsumed it; None to drop it silently
            (the coordinator's timeout then aborts it).
    """

    def __init__(self, gate: InputGate, on_aligned: OnAligned,
                 on_decline: OnDecline | None = None) -> None:
        self.gate = gate
        self.on_aligned = on_aligned
        self.on_decline = on_decline

    def live_channels(self) -> int:
        return sum(1 for ch in self.gate.channels if not ch.finished)

    async def on_barrier(self, channel: int, barrier: CheckpointBarrier) -> None:
        raise NotImplementedError

    async def on_end_of_input(self, channel: int) -> None:
        """Channel ``channel`` ended; a pending alignment may now be complete."""


class SingleCheckpointBarrierHandler(BarrierHandler):
    """Exactly-once alignment (``SingleCheckpointBarrierHandler`` in Flink).

    Barrier n blocks the channel it came on until barrier n has arrived on every live
    channel; then the task snapshots (``on_aligned``) and every channel is unblocked.
    When barrier m > n arrives before the alignment of n completed (an upstream task gave
    up n and never sent its barrier), n can never complete at this task: the channels are
    unblocked, alignment of m starts, and n is declined at once through ``on_decline``
    with a :class:`~reactive.errors.CheckpointError` saying it was subsumed (Flink's
    ``SingleCheckpointBarrierHandler.cancelSubsumedCheckpoint``, failure reason
    ``CHECKPOINT_DECLINED_SUBSUMED``), so the coordinator aborts it now rather than after
    its timeout, and without counting a failure.
    """

    def __init__(self, gate: InputGate, on_aligned: OnAligned,
                 on_decline: OnDecline | None = None) -> None:
        super().__init__(gate, on_aligned, on_decline)
        self.current = 0
        self.aligning: CheckpointBarrier | None = None
        self.arrived: set[int] = set()
        self.started = 0.0

    async def on_barrier(self, channel: int, barrier: CheckpointBarrier) -> None:
        n = barrier.checkpoint_id
        if n < self.current or (n == self.current and self.aligning is None):
            return  # a barrier of a checkpoint this task already passed
        if n > self.current:
            if self.aligning is not None:
                self._cancel_subsumed(self.aligning.checkpoint_id, n)
            self.current = n
            self.aligning = barrier
            self.arrived = set()
            self.started = time.perf_counter()
        self.arrived.add(channel)
        if len(self.arrived) >= self.live_channels():
            await self._complete()
        else:
            self.gate.block(channel)

    def _cancel_subsumed(self, subsumed: int, newer: int) -> None:
        # the older checkpoint cannot complete here any more: release the channels it
        # blocked and tell the coordinator now, so it does not wait for the timeout
        self.aligning = None
        self.gate.unblock_all()
        if self.on_decline is not None:
            self.on_decline(subsumed, CheckpointError(
                f"checkpoint {subsumed} subsumed: the barrier of checkpoint {newer} arrived "
                f"before the alignment of checkpoint {subsumed} completed "
                "(CHECKPOINT_DECLINED_SUBSUMED)"))

    async def _complete(self) -> None:
        barrier = self.aligning
        assert barrier is not None
        self.aligning = None
        alignment = time.perf_counter() - self.started
        await self.on_aligned(barrier, alignment)
        self.gate.unblock_all()

    async def on_end_of_input(self, channel: int) -> None:
        if self.aligning is not None and len(self.arrived - {channel}) >= self.live_channels():
            await self._complete()


class CheckpointBarrierTracker(BarrierHandler):
    """At-least-once: snapshot when barrier n has arrived on all live channels; no blocking
    (Flink's ``CheckpointBarrierTracker``).

    When checkpoint n triggers, older checkpoints still counting barriers are dropped
    without declining them, as Flink's tracker does (``processBarrier`` polls them off its
    queue and notifies nothing). Unlike the aligned handler, which gives up n when the
    *first* barrier of a newer checkpoint arrives (its alignment may take long), the
    tracker drops them only when this task snapshots the newer checkpoint, whose
    completion at the coordinator aborts every older pending checkpoint as subsumed
    (``CheckpointCoordinator._complete``, as Flink's ``dropSubsumedCheckpoints``).
    ``on_decline`` is accepted for a uniform interface and not called.
    """

    def __init__(self, gate: InputGate, on_aligned: OnAligned,
                 on_decline: OnDecline | None = None) -> None:
        super().__init__(gate, on_aligned, on_decline)
        self.counts: dict[int, tuple[CheckpointBarrier, set[int], float]] = {}
        self.completed = 0

    async def on_barrier(self, channel: int, barrier: CheckpointBarrier) -> None:
        n = barrier.checkpoint_id
        if n <= self.completed:
            return
        entry = self.counts.setdefault(n, (barrier, set(), time.perf_counter()))
        entry[1].add(channel)
        if len(entry[1]) >= self.live_channels():
            await self._trigger(n)

    async def _trigger(self, n: int) -> None:
        barrier, _, started = self.counts.pop(n)
        for older in [k for k in self.counts if k < n]:
            del self.counts[older]
        self.completed = n
        await self.on_aligned(barrier, time.perf_counter() - started)

    async def on_end_of_input(self, channel: int) -> None:
        for n in sorted(self.counts):
            if len(self.counts[n][1] - {channel}) >= self.live_channels():
                await self._trigger(n)
                return
