"""Window assigners (Flink's ``WindowAssigner`` family): which windows a record belongs to.

Event-time windows are half-open intervals ``[start, end)`` of event-time seconds;
processing-time windows the same over the processing clock's seconds (the time a record
reaches the window operator). Count windows are intervals of a key's record positions (the
n-th record of a key is position n - 1): ``[start, end)`` holds records ``start .. end - 1``.
The global window (:data:`GLOBAL_WINDOW`) is ``[-inf, +inf)``: it never ends, so only its
trigger fires it (Flink's ``GlobalWindows``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, NamedTuple

from ..errors import ConfigurationError

__all__ = [
    "GLOBAL_WINDOW",
    "CountWindows",
    "DynamicEventTimeSessionWindows",
    "DynamicProcessingTimeSessionWindows",
    "EventTimeSessionWindows",
    "GlobalWindows",
    "PeriodicWindows",
    "ProcessingTimeSessionWindows",
    "SlidingEventTimeWindows",
    "SlidingProcessingTimeWindows",
    "TimeWindow",
    "TumblingEventTimeWindows",
    "TumblingProcessingTimeWindows",
    "WindowAssigner",
]


class TimeWindow(NamedTuple):
    """A window ``[start, end)`` (seconds, or positions for count windows)."""

    start: float
    end: float

    def intersects(self, other: TimeWindow) -> bool:
        """True when the windows overlap or touch (session merging)."""
        return self.start <= other.end and other.start <= self.end

    def cover(self, other: TimeWindow) -> TimeWindow:
        """The smallest window containing both."""
        return TimeWindow(min(self.start, other.start), max(self.end, other.end))


GLOBAL_WINDOW = TimeWindow(float("-inf"), float("inf"))
"""The one window of :class:`GlobalWindows`: it never ends (no cleanup, no end-of-window
firing; only its trigger fires it)."""


class WindowAssigner(ABC):
    """Assigns records to windows (Flink's ``WindowAssigner``).

    Subclasses implement :meth:`assign_windows` (by timestamp), or override :meth:`assign`
    to look at the record too (Flink's ``assignWindows(element, timestamp, context)``).
    """

    #: windows may merge (sessions)
    merging = False
    #: windows over record counts instead of event time
    count_based = False
    #: windows over event time (False: processing time, or the global window); event-time
    #: windows fire on watermarks and are cleaned up at ``end + allowed_lateness``
    is_event_time = True

    @abstractmethod
    def assign_windows(self, timestamp: float) -> list[TimeWindow]:
        """The windows of a record with this timestamp (seconds)."""

    def assign(self, element: Any, timestamp: float) -> list[TimeWindow]:
        """The windows of ``element`` with ``timestamp`` (seconds: event time, or the
        processing time for processing-time assigners). By default
        :meth:`assign_windows` of the timestamp.

        Raises:
            Exception: what the assigner raises fails the job, naming the record.
        """
        return self.assign_windows(timestamp)


class PeriodicWindows(WindowAssigner):
    """Windows of length ``size`` beginning every ``slide`` from ``offset`` (Cutty's periodic
    windows: range r = size, slide s).

    Raises:
        ConfigurationError: if size or slide is not positive, or offset is not in [0, slide).
    """

    def __init__(self, size: float, slide: float, offset: float = 0) -> None:
        if not size > 0 or not slide > 0:
            raise ConfigurationError(f"window size and slide must be > 0, got {size}, {slide}")
        if not 0 <= offset < slide:
            raise ConfigurationError(f"window offset must be in [0, slide), got {offset}")
        self.size = size
        self.slide = slide
        self.offset = offset

    def assign_windows(self, timestamp: float) -> list[TimeWindow]:
        size, slide = self.size, self.slide
        last = timestamp - (timestamp - self.offset) % slide
        out = []
        start = last
        while start > timestamp - size:
            out.append(TimeWindow(start, start + size))
            start -= slide
        return out

    def first_end_after(self, position: float) -> float:
        """The end of the earliest window that ends after ``position``."""
        k = (position - self.size - self.offset) // self.slide + 1
        return self.offset + k * self.slide + self.size

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self.size}, slide={self.slide}, offset={self.offset})"


class TumblingEventTimeWindows(PeriodicWindows):
    """Consecutive, non-overlapping event-time windows of ``size`` seconds."""

    @staticmethod
    def of(size: float, offset: float = 0) -> TumblingEventTimeWindows:
        """Windows ``[offset + k*size, offset + (k+1)*size)``.

        Raises:
            ConfigurationError: if size <= 0 or offset not in [0, size).
        """
        return TumblingEventTimeWindows(size, size, offset)

    def assign_windows(self, timestamp: float) -> list[TimeWindow]:
        start = timestamp - (timestamp - self.offset) % self.size
        return [TimeWindow(start, start + self.size)]


class SlidingEventTimeWindows(PeriodicWindows):
    """Event-time windows of ``size`` seconds beginning every ``slide`` seconds."""

    @staticmethod
    def of(size: float, slide: float, offset: float = 0) -> SlidingEventTimeWindows:
        """Windows ``[offset + k*slide, offset + k*slide + size)``.

        Raises:
            ConfigurationError: if size or slide <= 0 or offset not in [0, slide).
        """
        return SlidingEventTimeWindows(size, slide, offset)


class CountWindows(PeriodicWindows):
    """Windows over a key's record positions: ``size`` records, a new one every ``slide``
    records (``KeyedStream.count_window``).

    Two documented choices for sliding windows:

    * ``partial=False`` (the default): windows *begin* every ``slide`` records, at 0,
      slide, 2*slide ...; only complete windows fire (``[0, size)``, ``[slide, slide +
      size)`` ...).
    * ``partial=True``: as Flink's ``countWindow(size, slide)`` (global window +
      ``CountTrigger(slide)`` + ``CountEvictor(size)``): a window fires every ``slide``
      records with the key's last ``size`` records, so windows *end* at slide, 2*slide ...
      and the first ones are partial: ``[0, slide)``, ``[0, 2*slide)`` ... until ``size``
      records were seen.

    Args:
        size, slide: records per window and between windows.
        offset: the first window's begin (positions).
        partial: Flink's partial initial windows (above).
    """

    count_based = True

    def __init__(self, size: float, slide: float, offset: float = 0,
                 partial: bool = False) -> None:
        super().__init__(size, slide, offset)
        self.partial = partial

    @staticmethod
    def of(size: int, slide: int | None = None, partial: bool = False) -> CountWindows:
        """Tumbling (``slide=None``) or sliding count windows; ``partial=True`` fires as
        Flink's ``countWindow(size, slide)`` does, partial initial windows included.

        Raises:
            ConfigurationError: if size or slide is not a positive integer.
        """
        slide = size if slide is None else slide
        if int(size) != size or int(slide) != slide:
            raise ConfigurationError("count window size and slide must be integers")
        size, slide = int(size), int(slide)
        if partial:
            # full windows end at multiples of slide: they begin at (-size) mod slide
            return CountWindows(size, slide, (-size) % slide, partial=True)
        return CountWindows(size, slide)


class EventTimeSessionWindows(WindowAssigner):
    """Sessions: a record opens ``[ts, ts + gap)``; overlapping windows merge."""

    merging = True

    def __init__(self, gap: float) -> None:
        if not gap > 0:
            raise ConfigurationError(f"session gap must be > 0 seconds, got {gap}")
        self.gap = gap

    @staticmethod
    def with_gap(gap: float) -> EventTimeSessionWindows:
        """Sessions separated by at least ``gap`` seconds of inactivity.

        Raises:
            ConfigurationError: if gap <= 0.
        """
        return EventTimeSessionWindows(gap)

    @staticmethod
    def with_dynamic_gap(gap_of: Callable[[Any], float]) -> DynamicEventTimeSessionWindows:
        """Sessions whose gap (seconds, > 0) comes from each record: ``gap_of(record)``
        (Flink's ``EventTimeSessionWindows.withDynamicGap``)."""
        return DynamicEventTimeSessionWindows(gap_of)

    def assign_windows(self, timestamp: float) -> list[TimeWindow]:
        return [TimeWindow(timestamp, timestamp + self.gap)]


class DynamicEventTimeSessionWindows(WindowAssigner):
    """Sessions whose gap comes from each record (Flink's ``DynamicEventTimeSessionWindows``):
    a record opens ``[ts, ts + gap_of(record))``; overlapping windows merge.

    Args:
        gap_of: record -> gap in seconds (> 0).
    """

    merging = True

    def __init__(self, gap_of: Callable[[Any], float]) -> None:
        self.gap_of = gap_of

    def assign_windows(self, timestamp: float) -> list[TimeWindow]:
        raise TypeError("dynamic-gap session windows need the record: call assign()")

    def assign(self, element: Any, timestamp: float) -> list[TimeWindow]:
        """``[timestamp, timestamp + gap_of(element))``.

        Raises:
            ValueError: if the gap is not > 0 seconds (Flink's "Dynamic session time gap
                must satisfy 0 < gap").
        """
        gap = self.gap_of(element)
        if not gap > 0:
            raise ValueError(f"dynamic session gap must be > 0 seconds, got {gap!r}")
        return [TimeWindow(timestamp, timestamp + gap)]


class GlobalWindows(WindowAssigner):
    """One window per key, ``GLOBAL_WINDOW``, that never ends (Flink's ``GlobalWindows``).

    Its default trigger never fires: give ``trigger=`` (a :class:`~.triggers.CountTrigger`,
    a user trigger ...). With a trigger that only fires (does not purge) the window's
    contents grow without bound: use a purging trigger or an evictor.
    """

    is_event_time = False

    @staticmethod
    def create() -> GlobalWindows:
        """The global window assigner."""
        return GlobalWindows()

    def assign_windows(self, timestamp: float) -> list[TimeWindow]:
        return [GLOBAL_WINDOW]


class _ProcessingTimePeriodic(WindowAssigner):
    """Periodic windows over processing time (the clock when a record reaches the window)."""

    is_event_time = False

    def __init__(self, size: float, slide: float, offset: float = 0) -> None:
        self.periodic = PeriodicWindows(size, slide, offset)

    def assign_windows(self, timestamp: float) -> list[TimeWindow]:
        return self.periodic.assign_windows(timestamp)

    def __repr__(self) -> str:
        p = self.periodic
        return f"{type(self).__name__}(size={p.size}, slide={p.slide}, offset={p.offset})"


class TumblingProcessingTimeWindows(_ProcessingTimePeriodic):
    """Consecutive processing-time windows of ``size`` seconds (Flink's
    ``TumblingProcessingTimeWindows``)."""

    @staticmethod
    def of(size: float, offset: float = 0) -> TumblingProcessingTimeWindows:
        """Windows ``[offset + k*size, offset + (k+1)*size)`` of processing time.

        Raises:
            ConfigurationError: if size <= 0 or offset not in [0, size).
        """
        return TumblingProcessingTimeWindows(size, size, offset)


class SlidingProcessingTimeWindows(_ProcessingTimePeriodic):
    """Processing-time windows of ``size`` seconds every ``slide`` seconds."""

    @staticmethod
    def of(size: float, slide: float, offset: float = 0) -> SlidingProcessingTimeWindows:
        """Windows ``[offset + k*slide, offset + k*slide + size)`` of processing time.

        Raises:
            ConfigurationError: if size or slide <= 0 or offset not in [0, slide).
        """
        return SlidingProcessingTimeWindows(size, slide, offset)


class ProcessingTimeSessionWindows(WindowAssigner):
    """Sessions over processing time: a record arriving at ``now`` opens ``[now, now + gap)``
    (Flink's ``ProcessingTimeSessionWindows``).

    Raises:
        ConfigurationError: if gap <= 0.
    """

    merging = True
    is_event_time = False

    def __init__(self, gap: float) -> None:
        if not gap > 0:
            raise ConfigurationError(f"session gap must be > 0 seconds, got {gap}")
        self.gap = gap

    @staticmethod
    def with_gap(gap: float) -> ProcessingTimeSessionWindows:
        """Sessions separated by ``gap`` seconds of processing time without records."""
        return ProcessingTimeSessionWindows(gap)

    @staticmethod
    def with_dynamic_gap(gap_of: Callable[[Any], float]) -> DynamicProcessingTimeSessionWindows:
        """Sessions whose gap (seconds) comes from each record."""
        return DynamicProcessingTimeSessionWindows(gap_of)

    def assign_windows(self, timestamp: float) -> list[TimeWindow]:
        return [TimeWindow(timestamp, timestamp + self.gap)]


class DynamicProcessingTimeSessionWindows(DynamicEventTimeSessionWindows):
    """Processing-time sessions whose gap comes from each record (Flink's
    ``DynamicProcessingTimeSessionWindows``)."""

    is_event_time = False
