"""Pacing background work on the event loop thread to a bounded share of the loop, so that
the tasks sharing the loop keep most of their throughput while it runs.

A heap snapshot's asynchronous part serializes live Python objects, which needs the GIL
wherever it runs: in a worker thread it would take the interpreter from the task just the
same (and in slices the task cannot choose). So it runs on the loop thread in short pieces,
and :class:`LoopShare` decides how long it stays away after each piece: until the other
callbacks of the loop have run for ``(1 - share) / share`` times the piece's duration. While
the tasks are busy the work then takes at most ``share`` of the loop thread; when a round of
the loop finds nothing else to run (a round shorter than ``idle_round``), the work goes on at
once, so on an idle loop it runs at full speed. Work that is still running after
``patience`` seconds gets a doubled share for each further ``patience`` seconds (up to the
whole loop): a large snapshot (the first one, or after a load of new keys) must not run for
many intervals, since while it runs the task pays copy-on-write on every key it touches.

This is a CPU-time form of RocksDB's rate limiter for background flushes and compactions
(``GenericRateLimiter``: background I/O gets a bounded budget per refill period, foreground
writes the rest), and of Flink's asynchronous snapshot threads, which take a bounded part of
the TaskManager's CPU while the task thread goes on; the cost is that a snapshot takes about
``1 / share`` times its serialization time on a saturated loop.
"""

from __future__ import annotations

import asyncio
import time

__all__ = ["LoopShare"]


class LoopShare:
    """A bounded share of the event loop thread for work done in pieces.

    Use: :meth:`start` once, then after each small unit of work ``if pacer.due():
    await pacer.pause()``.

    Args:
        share: the fraction of the loop thread's time (0 < share <= 1) the work may take
            while other callbacks are ready; 1 yields once per piece and never waits more.
        piece: seconds of work between two pauses.
        idle_round: a loop round (all callbacks ready at that moment) shorter than this,
            in seconds, means the loop is idle: the pause ends and the debt is forgiven.
        patience: seconds after :meth:`start` from which the share doubles every
            ``patience`` seconds (None: never).

    Attributes:
        busy: seconds of work done so far (between :meth:`start` and the last pause).
        paused: seconds spent in pauses so far.

    Raises:
        ValueError: if ``share`` is not in (0, 1] or ``piece`` is negative.
    """

    __slots__ = ("_debt", "_piece_start", "_started", "busy", "idle_round", "patience",
                 "paused", "piece", "share")

    def __init__(self, share: float, piece: float, idle_round: float = 50e-6,
                 patience: float | None = None) -> None:
        if not 0.0 < share <= 1.0 or piece < 0:
            raise ValueError(f"share must be in (0, 1] and piece >= 0, not {share}, {piece}")
        self.share = share
        self.piece = piece
        self.idle_round = idle_round
        self.patience = patience
        self.busy = 0.0
        self.paused = 0.0
        self._debt = 0.0
        self._piece_start = self._started = time.perf_counter()

    def start(self) -> None:
        """Start the first piece now."""
        self._debt = 0.0
        self._piece_start = self._started = time.perf_counter()

    def current_share(self, now: float) -> float:
        """The share at time ``now`` (``time.perf_counter()`` seconds)."""
        if self.patience is None:
            return self.share
        doublings = int((now - self._started) / self.patience)
        return 1.0 if doublings >= 8 else min(1.0, self.share * (1 << doublings))

    def due(self) -> bool:
        """Whether the current piece has used up its ``piece`` seconds."""
        return time.perf_counter() - self._piece_start >= self.piece

    async def pause(self) -> None:
        """End the current piece: let the loop run the other callbacks until they had
        ``(1 - share) / share`` times its duration (at least one round; less when the loop
        turns idle), then start the next piece.

        Raises:
            asyncio.CancelledError: if the awaiting task is cancelled meanwhile.
        """
        t = time.perf_counter()
        used = t - self._piece_start
        self.busy += used
        share = self.current_share(t)
        self._debt += used * (1.0 - share) / share
        while True:
            r0 = time.perf_counter()
            await asyncio.sleep(0)
            r1 = time.perf_counter()
            round_ = r1 - r0
            self._debt -= round_
            if self._debt <= 0.0 or round_ < self.idle_round:
                # no credit banked for long rounds (a burst later would stall the tasks),
                # and an idle loop owes nobody anything
                self._debt = 0.0
                break
        self.paused += r1 - t
        self._piece_start = r1
