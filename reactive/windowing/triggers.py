"""Window triggers (Flink's ``Trigger`` family): when a window's contents are emitted, and
when they are purged.

A trigger is called for every record added to a window (:meth:`Trigger.on_element`) and for
every timer it registered (:meth:`Trigger.on_event_time`, :meth:`Trigger.on_processing_time`),
and answers with a :class:`TriggerResult`: ``FIRE`` emits the window's contents (the window
function runs), ``PURGE`` drops them, ``FIRE_AND_PURGE`` does both, ``CONTINUE`` nothing. A
trigger keeps what it must remember (a count, the next firing time) in *trigger state*,
``ctx.get_partitioned_state(descriptor)``: keyed state scoped to the key and the window,
snapshotted and restored (and rescaled) with the job's other keyed state on every backend.
Trigger objects themselves hold no per-key data (one object serves every key and window).

Times are seconds (event time, or the processing clock's time). In this runtime's watermark
convention a window ``[start, end)`` is complete when the watermark reaches ``end``, so the
built-in event-time triggers register their timers at ``window.end`` (Flink's
``window.maxTimestamp()``, which is ``end - 1`` in its millisecond convention).
"""

from __future__ import annotations

from abc import ABC
from enum import Enum
from typing import Any, Protocol

from ..state.descriptors import ReducingStateDescriptor, StateDescriptor
from .assigners import GlobalWindows, TimeWindow, WindowAssigner

__all__ = [
    "ContinuousEventTimeTrigger",
    "CountTrigger",
    "EventTimeTrigger",
    "NeverTrigger",
    "OnMergeContext",
    "ProcessingTimeTrigger",
    "PurgingTrigger",
    "Trigger",
    "TriggerContext",
    "TriggerResult",
    "default_trigger",
]


class TriggerResult(Enum):
    """What a trigger asks of the window operator (Flink's ``TriggerResult``)."""

    CONTINUE = (False, False)
    FIRE = (True, False)
    PURGE = (False, True)
    FIRE_AND_PURGE = (True, True)

    @property
    def is_fire(self) -> bool:
        """True for FIRE and FIRE_AND_PURGE: the window function runs."""
        return bool(self.value[0])

    @property
    def is_purge(self) -> bool:
        """True for PURGE and FIRE_AND_PURGE: the window's contents are dropped."""
        return bool(self.value[1])


class TriggerContext(Protocol):
    """What a trigger sees of its window operator (Flink's ``Trigger.TriggerContext``);
    timers and state belong to the current key and window."""

    def current_watermark(self) -> float:
        """The operator's event time: its last watermark (seconds, -inf before one)."""
        ...

    def current_processing_time(self) -> float:
        """Processing time now (seconds)."""
        ...

    def register_event_time_timer(self, timestamp: float) -> None:
        """Call ``on_event_time(timestamp, window, ctx)`` once the watermark is >= it."""
        ...

    def register_processing_time_timer(self, timestamp: float) -> None:
        """Call ``on_processing_time(timestamp, window, ctx)`` at that processing time."""
        ...

    def delete_event_time_timer(self, timestamp: float) -> None:
        """Cancel this window's event-time timer at ``timestamp`` (no error when absent)."""
        ...

    def delete_processing_time_timer(self, timestamp: float) -> None:
        """Cancel this window's processing-time timer at ``timestamp``."""
        ...

    def get_partitioned_state(self, descriptor: StateDescriptor) -> Any:
        """Trigger state of the current key and window (value, list or reducing state).

        Raises:
            StateAccessError: for map state, or a name reused with another kind.
        """
        ...


class OnMergeContext(TriggerContext, Protocol):
    """The context of :meth:`Trigger.on_merge` (Flink's ``Trigger.OnMergeContext``)."""

    def merge_partitioned_state(self, descriptor: StateDescriptor) -> None:
        """Fold the trigger state ``descriptor`` of the merged windows into the new window.

        Raises:
            StateAccessError: for value or map state (only reducing and list state merge).
        """
        ...


class Trigger(ABC):  # noqa: B024 - every hook has a default: subclasses override some
    """Base of window triggers; subclass it for a user trigger (Flink's ``Trigger``).

    Every hook returns CONTINUE by default. A trigger for merging (session) windows
    returns True from :meth:`can_merge` and implements :meth:`on_merge`.
    """

    def on_element(self, element: Any, timestamp: float, window: TimeWindow,
                   ctx: TriggerContext) -> TriggerResult:
        """A record was added to ``window`` (``timestamp``: its event time in seconds, or
        the processing time for processing-time windows)."""
        return TriggerResult.CONTINUE

    def on_event_time(self, time: float, window: TimeWindow,
                      ctx: TriggerContext) -> TriggerResult:
        """An event-time timer of this trigger for ``window`` fired (watermark >= time)."""
        return TriggerResult.CONTINUE

    def on_processing_time(self, time: float, window: TimeWindow,
                           ctx: TriggerContext) -> TriggerResult:
        """A processing-time timer of this trigger for ``window`` fired."""
        return TriggerResult.CONTINUE

    def can_merge(self) -> bool:
        """True when the trigger supports merging windows (sessions)."""
        return False

    def on_merge(self, window: TimeWindow, ctx: OnMergeContext) -> None:
        """Windows merged into ``window``: merge the trigger state, re-register timers.

        Raises:
            NotImplementedError: unless overridden (with :meth:`can_merge`).
        """
        raise NotImplementedError(f"{type(self).__name__} does not support merging windows")

    def clear(self, window: TimeWindow, ctx: TriggerContext) -> None:  # noqa: B027
        """The window is gone (cleaned up or merged away): delete its timers and state."""


class EventTimeTrigger(Trigger):
    """Fires once the watermark passes the window's end (Flink's ``EventTimeTrigger``; the
    default of event-time windows). A record added after that, within the allowed
    lateness, fires the window again at once (a late firing)."""

    def on_element(self, element: Any, timestamp: float, window: TimeWindow,
                   ctx: TriggerContext) -> TriggerResult:
        if window.end <= ctx.current_watermark():
            return TriggerResult.FIRE
        ctx.register_event_time_timer(window.end)
        return TriggerResult.CONTINUE

    def on_event_time(self, time: float, window: TimeWindow,
                      ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.FIRE if time == window.end else TriggerResult.CONTINUE

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: TimeWindow, ctx: OnMergeContext) -> None:
        if window.end > ctx.current_watermark():
            ctx.register_event_time_timer(window.end)

    def clear(self, window: TimeWindow, ctx: TriggerContext) -> None:
        ctx.delete_event_time_timer(window.end)

    def __repr__(self) -> str:
        return "EventTimeTrigger()"


class ProcessingTimeTrigger(Trigger):
    """Fires when processing time reaches the window's end (Flink's
    ``ProcessingTimeTrigger``; the default of processing-time windows)."""

    def on_element(self, element: Any, timestamp: float, window: TimeWindow,
                   ctx: TriggerContext) -> TriggerResult:
        ctx.register_processing_time_timer(window.end)
        return TriggerResult.CONTINUE

    def on_processing_time(self, time: float, window: TimeWindow,
                           ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.FIRE if time == window.end else TriggerResult.CONTINUE

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: TimeWindow, ctx: OnMergeContext) -> None:
        if window.end > ctx.current_processing_time():
            ctx.register_processing_time_timer(window.end)

    def clear(self, window: TimeWindow, ctx: TriggerContext) -> None:
        ctx.delete_processing_time_timer(window.end)

    def __repr__(self) -> str:
        return "ProcessingTimeTrigger()"


class NeverTrigger(Trigger):
    """Never fires (the default of :class:`~.assigners.GlobalWindows`, as Flink's
    ``GlobalWindows.NeverTrigger``)."""

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: TimeWindow, ctx: OnMergeContext) -> None:
        return None


def _add(a: int, b: int) -> int:
    return a + b


def _min(a: float, b: float) -> float:
    return a if a <= b else b


class CountTrigger(Trigger):
    """Fires each time the window has received ``count`` more records (Flink's
    ``CountTrigger``); the count is trigger state, merged when sessions merge.

    Args:
        count: records per firing (>= 1).

    Raises:
        ValueError: if count < 1.
    """

    def __init__(self, count: int) -> None:
        if int(count) != count or count < 1:
            raise ValueError(f"CountTrigger needs a count >= 1, got {count!r}")
        self.count = int(count)
        self.state = ReducingStateDescriptor("count", _add)

    @staticmethod
    def of(count: int) -> CountTrigger:
        """Fire every ``count`` records."""
        return CountTrigger(count)

    def on_element(self, element: Any, timestamp: float, window: TimeWindow,
                   ctx: TriggerContext) -> TriggerResult:
        seen = ctx.get_partitioned_state(self.state)
        seen.add(1)
        if seen.get() >= self.count:
            seen.clear()
            return TriggerResult.FIRE
        return TriggerResult.CONTINUE

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: TimeWindow, ctx: OnMergeContext) -> None:
        ctx.merge_partitioned_state(self.state)

    def clear(self, window: TimeWindow, ctx: TriggerContext) -> None:
        ctx.get_partitioned_state(self.state).clear()

    def __repr__(self) -> str:
        return f"CountTrigger({self.count})"


class ContinuousEventTimeTrigger(Trigger):
    """Fires every ``interval`` seconds of event time while the window is open, and at its
    end (Flink's ``ContinuousEventTimeTrigger``): early results of long windows. The next
    firing time is trigger state.

    Args:
        interval: seconds of event time between firings (> 0).

    Raises:
        ValueError: if interval <= 0.
    """

    def __init__(self, interval: float) -> None:
        if not interval > 0:
            raise ValueError(f"ContinuousEventTimeTrigger needs an interval > 0, got {interval}")
        self.interval = interval
        self.state = ReducingStateDescriptor("fire-time", _min)

    @staticmethod
    def of(interval: float) -> ContinuousEventTimeTrigger:
        """Fire every ``interval`` seconds of event time."""
        return ContinuousEventTimeTrigger(interval)

    def on_element(self, element: Any, timestamp: float, window: TimeWindow,
                   ctx: TriggerContext) -> TriggerResult:
        if window.end <= ctx.current_watermark():
            return TriggerResult.FIRE
        ctx.register_event_time_timer(window.end)
        if ctx.get_partitioned_state(self.state).get() is None:
            self._register_next(timestamp - timestamp % self.interval, window, ctx)
        return TriggerResult.CONTINUE

    def _register_next(self, time: float, window: TimeWindow, ctx: TriggerContext) -> None:
        nxt = min(time + self.interval, window.end)
        ctx.get_partitioned_state(self.state).add(nxt)
        ctx.register_event_time_timer(nxt)

    def on_event_time(self, time: float, window: TimeWindow,
                      ctx: TriggerContext) -> TriggerResult:
        if time == window.end:
            return TriggerResult.FIRE
        fire_time = ctx.get_partitioned_state(self.state)
        if fire_time.get() == time:
            fire_time.clear()
            self._register_next(time, window, ctx)
            return TriggerResult.FIRE
        return TriggerResult.CONTINUE

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: TimeWindow, ctx: OnMergeContext) -> None:
        ctx.merge_partitioned_state(self.state)
        nxt = ctx.get_partitioned_state(self.state).get()
        if nxt is not None:
            ctx.register_event_time_timer(nxt)

    def clear(self, window: TimeWindow, ctx: TriggerContext) -> None:
        fire_time = ctx.get_partitioned_state(self.state)
        nxt = fire_time.get()
        if nxt is not None:
            ctx.delete_event_time_timer(nxt)
        fire_time.clear()

    def __repr__(self) -> str:
        return f"ContinuousEventTimeTrigger({self.interval})"


class PurgingTrigger(Trigger):
    """Turns every FIRE of ``nested`` into FIRE_AND_PURGE (Flink's ``PurgingTrigger``):
    each firing emits only what arrived since the previous one.

    Args:
        nested: the trigger that decides when to fire.
    """

    def __init__(self, nested: Trigger) -> None:
        self.nested = nested

    @staticmethod
    def of(nested: Trigger) -> PurgingTrigger:
        """Purge on every firing of ``nested``."""
        return PurgingTrigger(nested)

    @staticmethod
    def _purging(result: TriggerResult) -> TriggerResult:
        return TriggerResult.FIRE_AND_PURGE if result.is_fire else result

    def on_element(self, element: Any, timestamp: float, window: TimeWindow,
                   ctx: TriggerContext) -> TriggerResult:
        return self._purging(self.nested.on_element(element, timestamp, window, ctx))

    def on_event_time(self, time: float, window: TimeWindow,
                      ctx: TriggerContext) -> TriggerResult:
        return self._purging(self.nested.on_event_time(time, window, ctx))

    def on_processing_time(self, time: float, window: TimeWindow,
                           ctx: TriggerContext) -> TriggerResult:
        return self._purging(self.nested.on_processing_time(time, window, ctx))

    def can_merge(self) -> bool:
        return self.nested.can_merge()

    def on_merge(self, window: TimeWindow, ctx: OnMergeContext) -> None:
        self.nested.on_merge(window, ctx)

    def clear(self, window: TimeWindow, ctx: TriggerContext) -> None:
        self.nested.clear(window, ctx)

    def __repr__(self) -> str:
        return f"PurgingTrigger({self.nested!r})"


def default_trigger(assigner: WindowAssigner) -> Trigger:
    """The trigger a window assigner fires with when none is given (Flink's
    ``WindowAssigner.getDefaultTrigger``): event time for event-time windows, processing
    time for processing-time windows, never for the global window."""
    if isinstance(assigner, GlobalWindows):
        return NeverTrigger()
    return EventTimeTrigger() if assigner.is_event_time else ProcessingTimeTrigger()
