"""Process operators: ``process(ProcessFunction)`` on a stream, and
``key_by(...).process(KeyedProcessFunction)`` with keyed state and timers.

``fn.on_timer(timestamp, ctx)`` runs with ``ctx.current_key`` set to the timer's key, for
event-time timers when a watermark reaches them and for processing-time timers from the
task's mailbox; ``ctx.timestamp()`` and ``ctx.time_domain()`` name the firing timer (Flink's
``OnTimerContext``). The operator's event time (its last watermark) is kept as union
operator state so that, after a recovery, ``current_watermark()`` does not start again from
-inf (Flink's ``KeyedProcessOperator`` with its ``InternalTimerService``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...functions import ProcessFunction, TimeDomain
from ...time.clock import ProcessingClock
from ...time.timers import InternalTimers, TimerService
from .base import StreamOperator, instance_copy, restore_watermark, snapshot_watermark
from .record_calls import OutputConvention, call_once, call_per_record, output_convention

__all__ = ["KeyedProcessOperator", "ProcessOperator", "TimedKeyedProcessOperator",
           "restore_watermark", "snapshot_watermark"]


class ProcessOperator(StreamOperator):
    """``process(fn)`` on a non-keyed stream.

    ``fn.process_element(value, ctx)`` yields its outputs, or returns None or a list of
    them; any other return value (a tuple, a string, ...) fails the job (see
    :func:`checked_outputs`). Declared with a third parameter, ``process_element(value, ctx,
    out)`` appends its outputs to ``out`` instead (see :mod:`.record_calls`).
    """

    def __init__(self, name: str, uid: str, fn: ProcessFunction):
        super().__init__(name, uid)
        self.fn = instance_copy(fn)
        self.conventions = self._output_conventions()

    per_record_methods: tuple[str, ...] = ("process_element",)
    """The function's methods called per record, ``method(value, ctx[, out])``."""

    def _output_conventions(self) -> dict[str, OutputConvention]:
        """How each per-record method hands back its outputs, decided once, not per
        record (raises TypeError for a method that both collects and yields)."""
        return {m: output_convention(getattr(self.fn, m, None), 2, m)
                for m in self.per_record_methods}

    def open(self) -> None:
        self.fn.open(self.ctx)
        self.conventions = self._output_conventions()  # open() may have replaced them

    def process_batch(self, batch: list[Any]) -> list[Any]:
        return call_per_record(self, self.fn.process_element,
                               self.conventions["process_element"], batch, self.ctx,
                               "process_element")

    def close(self) -> None:
        try:
            self.fn.close()
        finally:
            super().close()


class KeyedProcessOperator(ProcessOperator):
    """``key_by(k).process(fn)``: state calls are scoped to each record's key."""

    keyed = True

    def __init__(self, name: str, uid: str, fn: ProcessFunction,
                 key_selector: Callable[[Any], Any]):
        super().__init__(name, uid, fn)
        self.key_selector = key_selector

    def process_batch(self, batch: list[Any]) -> list[Any]:
        return call_per_record(self, self.fn.process_element,
                               self.conventions["process_element"], batch, self.ctx,
                               "process_element", self.key_selector)


class TimedKeyedProcessOperator(KeyedProcessOperator):
    """A :class:`KeyedProcessOperator` whose function may use ``ctx.timer_service``.

    Args:
        name, uid: operator identity.
        fn: the ``KeyedProcessFunction``.
        key_selector: record -> key.
        clock: processing-time clock.
    """

    def __init__(self, name: str, uid: str, fn: ProcessFunction,
                 key_selector: Callable[[Any], Any], clock: ProcessingClock) -> None:
        super().__init__(name, uid, fn, key_selector)
        self.clock = clock
        self.timers: InternalTimers
        self._timer_convention = OutputConvention.RETURNS

    def open(self) -> None:
        self.timers = self.create_timer_service(self.clock, self._fire_event_time,
                                                self._fire_processing_time)
        self.ctx._timer_service = TimerService(self.timers)
        super().open()
        self._timer_convention = output_convention(getattr(self.fn, "on_timer", None), 2,
                                                   "on_timer")

    def _fire_event_time(self, timestamp: float, namespace: Any) -> list[Any]:
        return self._fire(timestamp, TimeDomain.EVENT_TIME)

    def _fire_processing_time(self, timestamp: float, namespace: Any) -> list[Any]:
        return self._fire(timestamp, TimeDomain.PROCESSING_TIME)

    def _fire(self, timestamp: float, domain: TimeDomain) -> list[Any]:
        on_timer = getattr(self.fn, "on_timer", None)
        if on_timer is None:
            return []
        ctx = self.ctx
        ctx._firing = (timestamp, domain)
        try:
            out = call_once(on_timer, self._timer_convention, (timestamp, ctx), "on_timer")
            if ctx.ttl_cleanup is not None:
                ctx.ttl_cleanup.advance(1)  # a timer's share of the TTL cleanup
            return out
        except Exception as exc:
            raise self.fail(f"{domain.value} timer {timestamp} of key {ctx.current_key!r}",
                            exc) from exc
        finally:
            ctx._firing = None

    def process_watermark(self, timestamp: float) -> list[Any]:
        return self.timers.advance_watermark(timestamp)

    def end_input(self) -> list[Any]:
        # due processing-time timers fire; later ones stay in the state (as in Flink)
        out = self.timers.fire_processing_timers()
        self.timers.close()
        return out

    def snapshot_state(self, checkpoint_id: int) -> None:
        self.snapshot_timers(self.timers)

    def close(self) -> None:
        if hasattr(self, "timers"):
            self.timers.close()
        super().close()
