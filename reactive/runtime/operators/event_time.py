"""What every keyed operator with event-time timers and late records shares (the window
operators and the joins): its timer service, its event time restored from operator state,
watermarks that fire timers, and the count of late records nobody takes (Flink's
``AbstractStreamOperator`` timer plumbing and ``numLateRecordsDropped``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ...time.clock import ProcessingClock
from ...time.timers import InternalTimers
from .base import StreamOperator

__all__ = ["EventTimeOperator"]

log = logging.getLogger(__name__)


class EventTimeOperator(StreamOperator):
    """A keyed operator with a timer service and a late output.

    Args:
        name, uid: operator identity.
        key_selector: record -> key (of the first input, for two-input operators).
        clock: processing-time clock (timers).
        late_output: whether late records go to a late output; asked once, at ``open``
            (the output may be requested after the operator was added).
    """

    keyed = True

    def __init__(self, name: str, uid: str, key_selector: Callable[[Any], Any],
                 clock: ProcessingClock, late_output: Callable[[], bool]) -> None:
        super().__init__(name, uid, key_selector)
        self.clock = clock
        self.late_output = late_output
        self.emit_late = False
        self.late_records = 0
        self.timers: InternalTimers

    def _open_timers(self) -> None:
        """Create the timer service, with its restored event time and timers (in
        ``open``)."""
        self.emit_late = self.late_output()
        self.timers = self.create_timer_service(self.clock, self.on_event_time,
                                                self.on_processing_time)

    def on_event_time(self, timestamp: float, namespace: Any) -> list[Any]:
        """An event-time timer of the current key fired; return the records to emit."""
        raise NotImplementedError

    def on_processing_time(self, timestamp: float, namespace: Any) -> list[Any]:
        """A processing-time timer of the current key fired (none by default)."""
        return []

    def _count_late(self, warning: str, *args: Any) -> None:
        """A late record nobody receives: count it, and say so the first time."""
        if not self.late_records:
            log.warning(warning, *args)
        self.late_records += 1

    def process_watermark(self, timestamp: float) -> list[Any]:
        try:
            return self.timers.advance_watermark(timestamp)
        except Exception as exc:
            if isinstance(exc, AssertionError):
                raise
            raise self.fail(f"watermark {timestamp}", exc) from exc

    def snapshot_state(self, checkpoint_id: int) -> None:
        self.snapshot_timers(self.timers)

    def close(self) -> None:
        if hasattr(self, "timers"):
            self.timers.close()
        super().close()
