"""Window assigners (Flink's ``WindowAssigner`` family): which windows a record belongs to.

Event-time windows are half-open intervals ``[start, end)`` of event-time seconds. Count
windows are intervals of a key's record positions (the n-th record of a key is position
n - 1): ``[start, end)`` holds records ``start .. end - 1``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple

from ..errors import ConfigurationError

__all__ = [
    "CountWindows",
    "EventTimeSessionWindows",
    "PeriodicWindows",
    "SlidingEventTimeWindows",
    "TimeWindow",
    "TumblingEventTimeWindows",
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


class WindowAssigner(ABC):
    """Assigns records to windows by their timestamp."""

    #: windows may merge (sessions)
    merging = False
    #: windows over record counts instead of event time
    count_based = False

    @abstractmethod
    def assign_windows(self, timestamp: float) -> list[TimeWindow]:
        """The windows of a record with this timestamp (seconds)."""


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
    records (``KeyedStream.count_window``). Only complete windows fire."""

    count_based = True

    @staticmethod
    def of(size: int, slide: int | None = None) -> CountWindows:
        """Tumbling (``slide=None``) or sliding count windows.

        Raises:
            ConfigurationError: if size or slide is not a positive integer.
        """
        slide = size if slide is None else slide
        if int(size) != size or int(slide) != slide:
            raise ConfigurationError("count window size and slide must be integers")
        return CountWindows(int(size), int(slide))


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

    def assign_windows(self, timestamp: float) -> list[TimeWindow]:
        return [TimeWindow(timestamp, timestamp + self.gap)]
