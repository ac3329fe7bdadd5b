"""Processing-time clocks: the system clock and a manual clock for tests.

Operators never block on processing time: they ask the clock to call back at a time, and the
callback posts an action into the task's mailbox (Flink's ``ProcessingTimeService`` and its
``TestProcessingTimeService``).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["Cancellable", "ManualClock", "ProcessingClock", "SystemClock"]


class Cancellable(Protocol):
    """A scheduled callback that can be cancelled."""

    def cancel(self) -> None: ...


class ProcessingClock(Protocol):
    """Where operators read processing time and schedule callbacks at processing times."""

    def now(self) -> float:
        """Current processing time (seconds since the epoch)."""
        ...

    def call_at(self, timestamp: float, callback: Callable[[], None]) -> Cancellable:
        """Call ``callback()`` once at or after ``timestamp`` (seconds), on the event loop."""
        ...


class SystemClock:
    """Wall-clock time (``time.time``); callbacks run through ``loop.call_later``."""

    def now(self) -> float:
        """Seconds since the epoch."""
        return time.time()

    def call_at(self, timestamp: float, callback: Callable[[], None]) -> Cancellable:
        """Schedule ``callback`` on the running loop ``timestamp - now()`` seconds from now.

        Raises:
            RuntimeError: outside a running event loop.
        """
        delay = max(0.0, timestamp - time.time())
        return asyncio.get_running_loop().call_later(delay, callback)


class _Scheduled:
    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """A clock that moves only when told to (tests): :meth:`advance` runs the callbacks
    that became due, in time order, synchronously (they post to task mailboxes).

    Args:
        start: initial time (seconds).
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._queue: list[tuple[float, int, _Scheduled]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        """The manual time (seconds)."""
        return self._now

    def call_at(self, timestamp: float, callback: Callable[[], None]) -> Cancellable:
        """Queue ``callback`` for ``timestamp``; it runs in the :meth:`advance` that reaches it."""
        entry = _Scheduled(callback)
        heapq.heappush(self._queue, (timestamp, next(self._seq), entry))
        return entry

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` and run every callback that became due."""
        self.advance_to(self._now + seconds)

    def advance_to(self, timestamp: float) -> None:
        """Move time to ``timestamp`` (never backwards) and run the due callbacks."""
        self._now = max(self._now, timestamp)
        q = self._queue
        while q and q[0][0] <= self._now:
            _, _, entry = heapq.heappop(q)
            if not entry.cancelled:
                entry.callback()
