"""Event-time and processing-time timers kept as keyed state (Flink's ``InternalTimerService``
and ``TimerService``).

A timer is ``(timestamp, namespace)`` for the current key; the namespace tells owners apart
(``None`` for a ``KeyedProcessFunction``, the window for a window operator). The set of
timers of a key is a map state of the operator, so every state backend snapshots it per key
group with the rest of the keyed state: timers survive recovery and rescaling. The priority
queue that finds the next due timer is an in-memory index over that state, rebuilt on
``open`` after a restore; deletions are lazy (a popped entry whose state entry is gone is
skipped), so the state is the only truth and a timer fires at most once per registration.
Processing-time timers are scheduled on a :class:`~.clock.ProcessingClock` whose callback
posts into the task's mailbox: nothing blocks.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

from ..state.api import MapState
from ..state.backend import KeyedStateBackend
from ..state.descriptors import MapStateDescriptor
from .clock import Cancellable, ProcessingClock
from .mailbox import OperatorMailbox

__all__ = ["InternalTimerService", "TimerService"]

EVENT_TIMERS = "_timers/event"
PROCESSING_TIMERS = "_timers/processing"

Fire = Callable[[float, Any], list[Any]]
"""``fire(timestamp, namespace) -> outputs``, called with the timer's key as current key."""


class _TimerQueue:
    """Timers of one time domain: map state ``{(ts, namespace): True}`` per key plus a heap."""

    def __init__(self, backend: KeyedStateBackend, name: str) -> None:
        self.backend = backend
        self.name = name
        state = backend.get_state(MapStateDescriptor(name))
        assert isinstance(state, MapState)
        self.state = state
        self.heap: list[tuple[float, int, Any, Any]] = []
        self.seq = itertools.count()

    def rebuild(self) -> None:
        """Index the timers of every key in the state (after a restore)."""
        backend, state = self.backend, self.state
        heap: list[tuple[float, int, Any, Any]] = []
        for key in backend.keys(self.name):
            backend.set_current_key(key)
            for (ts, ns), _ in state.items():
                heap.append((ts, next(self.seq), key, ns))
        heapq.heapify(heap)
        self.heap = heap

    def register(self, timestamp: float, namespace: Any) -> bool:
        """Add a timer for the current key; False when it already exists."""
        entry = (timestamp, namespace)
        state = self.state
        if state.contains(entry):
            return False
        state.put(entry, True)
        heapq.heappush(self.heap, (timestamp, next(self.seq), self.backend.current_key, namespace))
        return True

    def delete(self, timestamp: float, namespace: Any) -> None:
        """Remove a timer of the current key (its heap entry is skipped later)."""
        self.state.remove((timestamp, namespace))

    def next_time(self) -> float | None:
        """Timestamp of the earliest heap entry (possibly a deleted one)."""
        return self.heap[0][0] if self.heap else None

    def fire_until(self, timestamp: float, fire: Fire) -> list[Any]:
        """Fire every timer with a time <= ``timestamp``, in time order."""
        heap, backend, state = self.heap, self.backend, self.state
        out: list[Any] = []
        while heap and heap[0][0] <= timestamp:
            ts, _, key, ns = heapq.heappop(heap)
            backend.set_current_key(key)
            entry = (ts, ns)
            if state.contains(entry):
                state.remove(entry)
                res = fire(ts, ns)
                if res:
                    out.extend(res)
        return out


class InternalTimerService:
    """The timers of one keyed operator instance.

    Args:
        backend: the operator's keyed state backend (timers are stored in it).
        clock: processing-time clock.
        mailbox: the task's mailbox (processing-time timers fire through it); None in
            harness tests that fire processing time by hand.
        on_event_time: ``fire(ts, namespace)`` for event-time timers.
        on_processing_time: ``fire(ts, namespace)`` for processing-time timers.
    """

    def __init__(self, backend: KeyedStateBackend, clock: ProcessingClock,
                 mailbox: OperatorMailbox | None, on_event_time: Fire,
                 on_processing_time: Fire) -> None:
        self.backend = backend
        self.clock = clock
        self.mailbox = mailbox
        self.event = _TimerQueue(backend, EVENT_TIMERS)
        self.processing = _TimerQueue(backend, PROCESSING_TIMERS)
        self.on_event_time = on_event_time
        self.on_processing_time = on_processing_time
        self.watermark = float("-inf")
        self._scheduled_at: float | None = None
        self._scheduled: Cancellable | None = None
        self._closed = False

    def restore(self) -> None:
        """Rebuild the queues from the state and schedule the next processing-time timer."""
        key = self.backend.current_key
        self.event.rebuild()
        self.processing.rebuild()
        if key is not None:
            self.backend.set_current_key(key)
        self._schedule()

    # ------------------------------------------------------------------ registration
    def register_event_time_timer(self, timestamp: float, namespace: Any = None) -> None:
        """Fire ``on_event_time`` for the current key once the watermark is >= ``timestamp``."""
        self.event.register(timestamp, namespace)

    def delete_event_time_timer(self, timestamp: float, namespace: Any = None) -> None:
        """Cancel an event-time timer of the current key (no error when absent)."""
        self.event.delete(timestamp, namespace)

    def register_processing_time_timer(self, timestamp: float, namespace: Any = None) -> None:
        """Fire ``on_processing_time`` for the current key at processing time ``timestamp``."""
        if self.processing.register(timestamp, namespace):
            self._schedule()

    def delete_processing_time_timer(self, timestamp: float, namespace: Any = None) -> None:
        """Cancel a processing-time timer of the current key (no error when absent)."""
        self.processing.delete(timestamp, namespace)

    # ------------------------------------------------------------------ firing
    def advance_watermark(self, watermark: float) -> list[Any]:
        """Event time moved to ``watermark`` (seconds): fire the due event-time timers."""
        if watermark <= self.watermark:
            return []
        self.watermark = watermark
        return self.event.fire_until(watermark, self.on_event_time)

    def fire_processing_timers(self) -> list[Any]:
        """Fire the processing-time timers due at ``clock.now()`` and reschedule."""
        if self._closed:
            return []
        self._scheduled_at = None
        out = self.processing.fire_until(self.clock.now(), self.on_processing_time)
        self._schedule()
        return out

    def _schedule(self) -> None:
        nxt = self.processing.next_time()
        if nxt is None or self._closed or self.mailbox is None:
            return
        if self._scheduled_at is not None and self._scheduled_at <= nxt:
            return
        if self._scheduled is not None:
            self._scheduled.cancel()
        self._scheduled_at = nxt
        mailbox = self.mailbox
        self._scheduled = self.clock.call_at(
            nxt, lambda: mailbox.post_emitting(self.fire_processing_timers))

    def close(self) -> None:
        """Stop scheduling (timers stay in the state for the next attempt)."""
        self._closed = True
        if self._scheduled is not None:
            self._scheduled.cancel()


class TimerService:
    """What a ``KeyedProcessFunction`` sees as ``ctx.timer_service`` (Flink's ``TimerService``).

    Timestamps are seconds: event time for event-time timers, the clock's time (seconds
    since the epoch by default) for processing-time timers. Timers are per key: they belong
    to the key being processed (``ctx.current_key``) and fire ``on_timer`` with it.
    """

    __slots__ = ("_internal",)

    def __init__(self, internal: InternalTimerService) -> None:
        self._internal = internal

    def current_processing_time(self) -> float:
        """Processing time now (seconds)."""
        return self._internal.clock.now()

    def current_watermark(self) -> float:
        """The operator's event time: the last watermark it received (seconds, -inf first)."""
        return self._internal.watermark

    def register_event_time_timer(self, timestamp: float) -> None:
        """Call ``on_timer(timestamp, ctx)`` once the watermark reaches ``timestamp``."""
        self._internal.register_event_time_timer(timestamp)

    def register_processing_time_timer(self, timestamp: float) -> None:
        """Call ``on_timer(timestamp, ctx)`` once processing time reaches ``timestamp``."""
        self._internal.register_processing_time_timer(timestamp)

    def delete_event_time_timer(self, timestamp: float) -> None:
        """Cancel the current key's event-time timer at ``timestamp``."""
        self._internal.delete_event_time_timer(timestamp)

    def delete_processing_time_timer(self, timestamp: float) -> None:
        """Cancel the current key's processing-time timer at ``timestamp``."""
        self._internal.delete_processing_time_timer(timestamp)
