"""Barrier handling on a task's inputs (Flink's ``CheckpointBarrierHandler``).

:class:`AlignedBarrierHandler` implements the alignment of Algorithm 1 of "Lightweight
Asynchronous Snapshots for Distributed Dataflows" (Carbone et al., 2015): a channel that
delivered barrier n is blocked -- its later records stay queued, in order -- until barrier n
has arrived on every input; then the task snapshots, forwards the barrier and unblocks.
:class:`BarrierTracker` is the at-least-once variant: it never blocks and triggers the
snapshot when the last barrier of n arrives.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from .channel import InputGate
from .events import CheckpointBarrier

__all__ = ["AlignedBarrierHandler", "BarrierHandler", "BarrierTracker"]

OnAligned = Callable[[CheckpointBarrier, float], Awaitable[None]]


class BarrierHandler:
    """Base: tracks which channels are still live (have not ended).

    Args:
        gate: the task's input gate.
        on_aligned: ``await on_aligned(barrier, alignment_seconds)`` when the task must
            snapshot for ``barrier``.
    """

    def __init__(self, gate: InputGate, on_aligned: OnAligned) -> None:
        self.gate = gate
        self.on_aligned = on_aligned

    def live_channels(self) -> int:
        return sum(1 for ch in self.gate.channels if not ch.finished)

    async def on_barrier(self, channel: int, barrier: CheckpointBarrier) -> None:
        raise NotImplementedError

    async def on_end_of_input(self, channel: int) -> None:
        """Channel ``channel`` ended; a pending alignment may now be complete."""


class AlignedBarrierHandler(BarrierHandler):
    """Exactly-once alignment (``SingleCheckpointBarrierHandler`` in Flink)."""

    def __init__(self, gate: InputGate, on_aligned: OnAligned) -> None:
        super().__init__(gate, on_aligned)
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
                # a newer barrier overtook the pending one: that checkpoint cannot complete
                # at this task any more (it is subsumed), so release the blocked channels
                self.gate.unblock_all()
            self.current = n
            self.aligning = barrier
            self.arrived = set()
            self.started = time.perf_counter()
        self.arrived.add(channel)
        if len(self.arrived) >= self.live_channels():
            await self._complete()
        else:
            self.gate.block(channel)

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


class BarrierTracker(BarrierHandler):
    """At-least-once: snapshot when barrier n has arrived on all live channels; no blocking."""

    def __init__(self, gate: InputGate, on_aligned: OnAligned) -> None:
        super().__init__(gate, on_aligned)
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
