"""Window evictors (Flink's ``Evictor`` family): drop records from a window's contents
before and/or after its window function runs.

A window with an evictor keeps every record (with its timestamp) until the window fires,
as Flink's ``EvictingWindowOperator`` does, even for ``aggregate``/``reduce``: the
aggregate is computed at firing time over the records the evictor kept. What an evictor
keeps after a firing stays in the window for the next firing (a sliding count window over
the global window is ``CountTrigger`` + ``CountEvictor``).

Evictors return the records they keep (Flink's evictors remove them through an iterator).
"""

from __future__ import annotations

from abc import ABC
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from .assigners import TimeWindow

__all__ = ["CountEvictor", "DeltaEvictor", "Evictor", "EvictorContext", "TimeEvictor",
           "TimestampedValue"]


class TimestampedValue(NamedTuple):
    """A record in an evicting window with its event time (seconds; None when the stream
    has no timestamps, e.g. processing-time windows without ``assign_timestamps``)."""

    value: Any
    timestamp: float | None


class EvictorContext(Protocol):
    """What an evictor sees of its operator (Flink's ``Evictor.EvictorContext``)."""

    def current_watermark(self) -> float:
        """The operator's event time (seconds)."""
        ...

    def current_processing_time(self) -> float:
        """Processing time now (seconds)."""
        ...


class Evictor(ABC):  # noqa: B024 - both hooks default to keeping everything
    """Base of evictors; subclass it for a user evictor (Flink's ``Evictor``)."""

    def evict_before(self, elements: list[TimestampedValue], window: TimeWindow,
                     ctx: EvictorContext) -> list[TimestampedValue]:
        """The records to keep before the window function runs (default: all)."""
        return elements

    def evict_after(self, elements: list[TimestampedValue], window: TimeWindow,
                    ctx: EvictorContext) -> list[TimestampedValue]:
        """The records to keep after the window function ran (default: all)."""
        return elements


class CountEvictor(Evictor):
    """Keeps the last ``max_count`` records (Flink's ``CountEvictor``).

    Args:
        max_count: records to keep (>= 1).
        do_evict_after: evict after the window function instead of before.

    Raises:
        ValueError: if max_count < 1.
    """

    def __init__(self, max_count: int, do_evict_after: bool = False) -> None:
        if int(max_count) != max_count or max_count < 1:
            raise ValueError(f"CountEvictor needs max_count >= 1, got {max_count!r}")
        self.max_count = int(max_count)
        self.do_evict_after = do_evict_after

    @staticmethod
    def of(max_count: int, do_evict_after: bool = False) -> CountEvictor:
        """Keep the last ``max_count`` records."""
        return CountEvictor(max_count, do_evict_after)

    def _evict(self, elements: list[TimestampedValue]) -> list[TimestampedValue]:
        return elements[-self.max_count:] if len(elements) > self.max_count else elements

    def evict_before(self, elements: list[TimestampedValue], window: TimeWindow,
                     ctx: EvictorContext) -> list[TimestampedValue]:
        return elements if self.do_evict_after else self._evict(elements)

    def evict_after(self, elements: list[TimestampedValue], window: TimeWindow,
                    ctx: EvictorContext) -> list[TimestampedValue]:
        return self._evict(elements) if self.do_evict_after else elements


class TimeEvictor(Evictor):
    """Keeps the records less than ``window_size`` seconds older than the newest one
    (Flink's ``TimeEvictor``: a record with ``timestamp <= max - window_size`` goes). Does
    nothing when a record has no timestamp.

    Args:
        window_size: seconds of event time to keep (> 0).
        do_evict_after: evict after the window function instead of before.

    Raises:
        ValueError: if window_size <= 0.
    """

    def __init__(self, window_size: float, do_evict_after: bool = False) -> None:
        if not window_size > 0:
            raise ValueError(f"TimeEvictor needs window_size > 0 seconds, got {window_size}")
        self.window_size = window_size
        self.do_evict_after = do_evict_after

    @staticmethod
    def of(window_size: float, do_evict_after: bool = False) -> TimeEvictor:
        """Keep the last ``window_size`` seconds of records."""
        return TimeEvictor(window_size, do_evict_after)

    def _evict(self, elements: list[TimestampedValue]) -> list[TimestampedValue]:
        stamps = [e.timestamp for e in elements]
        if not elements or any(t is None for t in stamps):
            return elements
        cutoff = max(t for t in stamps if t is not None) - self.window_size
        return [e for e in elements if e.timestamp is not None and e.timestamp > cutoff]

    def evict_before(self, elements: list[TimestampedValue], window: TimeWindow,
                     ctx: EvictorContext) -> list[TimestampedValue]:
        return elements if self.do_evict_after else self._evict(elements)

    def evict_after(self, elements: list[TimestampedValue], window: TimeWindow,
                    ctx: EvictorContext) -> list[TimestampedValue]:
        return self._evict(elements) if self.do_evict_after else elements


class DeltaEvictor(Evictor):
    """Keeps the records whose ``delta(record, last)`` to the window's last record is
    below ``threshold`` (Flink's ``DeltaEvictor``).

    Args:
        threshold: records with ``delta >= threshold`` go.
        delta: ``(record, last record) -> float``.
        do_evict_after: evict after the window function instead of before.
    """

    def __init__(self, threshold: float, delta: Callable[[Any, Any], float],
                 do_evict_after: bool = False) -> None:
        self.threshold = threshold
        self.delta = delta
        self.do_evict_after = do_evict_after

    @staticmethod
    def of(threshold: float, delta: Callable[[Any, Any], float],
           do_evict_after: bool = False) -> DeltaEvictor:
        """Keep the records within ``threshold`` of the last one."""
        return DeltaEvictor(threshold, delta, do_evict_after)

    def _evict(self, elements: list[TimestampedValue]) -> list[TimestampedValue]:
        if not elements:
            return elements
        last = elements[-1].value
        return [e for e in elements if self.delta(e.value, last) < self.threshold]

    def evict_before(self, elements: list[TimestampedValue], window: TimeWindow,
                     ctx: EvictorContext) -> list[TimestampedValue]:
        return elements if self.do_evict_after else self._evict(elements)

    def evict_after(self, elements: list[TimestampedValue], window: TimeWindow,
                    ctx: EvictorContext) -> list[TimestampedValue]:
        return self._evict(elements) if self.do_evict_after else elements
