"""What a window operator emits besides its windows' results: late records for the late
output (:class:`LateRecord`) and a process window function's side outputs
(:class:`SideOutput`), the functions that pick them out of the operator's output, and the
base of the event-time window operators that wraps or counts late records.

A record none of whose windows can still fire (``end + allowed_lateness <= watermark``) is
*late*: it is emitted as a :class:`LateRecord` for the side output when the program asked
for one (``late_data()`` / ``side_output_late_data``), else counted in ``late_records`` and
reported with a warning -- never dropped without a trace.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..runtime.operators.event_time import EventTimeOperator

__all__ = ["EventTimeWindowOperatorBase", "LateRecord", "SideOutput", "is_window_output",
           "side_output_of", "unwrap_late"]


class LateRecord:
    """A late record on its way to the side output (unwrapped by ``late_data()``)."""

    __slots__ = ("record",)

    def __init__(self, record: Any) -> None:
        self.record = record

    def __reduce__(self) -> tuple[Any, ...]:
        return (LateRecord, (self.record,))


class SideOutput:
    """A record a process window function sent to side output ``tag`` (``ctx.output``), on
    its way to ``WindowedStream.side_output(tag)``."""

    __slots__ = ("tag", "value")

    def __init__(self, tag: str, value: Any) -> None:
        self.tag = tag
        self.value = value

    def __reduce__(self) -> tuple[Any, ...]:
        return (SideOutput, (self.tag, self.value))


def is_window_output(record: Any) -> bool:
    """True for a main-output record (not a late record or a side output)."""
    t = type(record)
    return t is not LateRecord and t is not SideOutput


def side_output_of(tag: str) -> Callable[[Any], tuple[Any, ...] | None]:
    """A flat-map function that unwraps the side outputs tagged ``tag`` (None otherwise)."""
    def unwrap(record: Any) -> tuple[Any, ...] | None:
        return (record.value,) if type(record) is SideOutput and record.tag == tag else None
    return unwrap


def unwrap_late(record: Any) -> tuple[Any, ...] | None:
    """The late record inside ``record``, as a one-element tuple (None otherwise)."""
    return (record.record,) if type(record) is LateRecord else None


class EventTimeWindowOperatorBase(EventTimeOperator):
    """A window operator's late records: wrapped for the late output, or counted."""

    def _late(self, record: Any, out: list[Any]) -> None:
        if self.emit_late:
            out.append(LateRecord(record))
            return
        self._count_late(
            "operator %r got a late record (beyond the allowed lateness) and has no side "
            "output: add .side_output_late_data(sink) or use late_data() to receive late "
            "records; counting them in late_records", self.name)
