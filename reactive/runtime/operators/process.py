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

import inspect
from collections.abc import Callable
from typing import Any

from ...functions import ProcessFunction, TimeDomain
from ...time.clock import ProcessingClock
from ...time.timers import InternalTimerService, TimerService
from .base import GENERATOR, StreamOperator, checked_outputs, instance_copy

__all__ = ["KeyedProcessOperator", "ProcessOperator", "TimedKeyedProcessOperator",
           "restore_watermark", "snapshot_watermark"]


class ProcessOperator(StreamOperator):
    """``process(fn)`` on a non-keyed stream.

    ``fn.process_element`` yields its outputs, or returns None or a list of them; any other
    return value (a tuple, a string, ...) fails the job (see :func:`checked_outputs`).
    """

    def __init__(self, name: str, uid: str, fn: ProcessFunction):
        super().__init__(name, uid)
        self.fn = instance_copy(fn)
        self._yields = self._is_generator_function()

    def _is_generator_function(self) -> bool:
        """True when ``process_element`` is a generator function: every call then returns a
        generator, and the per-record loop needs no check of what it returned."""
        return inspect.isgeneratorfunction(getattr(self.fn, "process_element", None))

    def open(self) -> None:
        self.fn.open(self.ctx)
        self._yields = self._is_generator_function()  # open() may have replaced it

    def process_batch(self, batch: list[Any]) -> list[Any]:
        fn = self.fn.process_element
        ctx = self.ctx
        out: list[Any] = []
        extend = out.extend
        r = None
        try:
            if self._yields:
                for r in batch:
                    extend(fn(r, ctx))
            else:
                generator = GENERATOR
                for r in batch:
                    res = fn(r, ctx)
                    # identity checks for the common cases (a list; a generator from a
                    # wrapped generator function); anything else but None is checked before
                    # it is taken apart into records
                    t = type(res)
                    if t is list or t is generator:
                        extend(res)
                    elif res is not None:
                        extend(checked_outputs(res, "process_element"))
        except Exception as exc:
            raise self.fail(r, exc) from exc
        return out

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
        fn = self.fn.process_element
        ctx = self.ctx
        key_of = self.key_selector
        assert key_of is not None and self.keyed_backend is not None
        set_key = self.keyed_backend.set_current_key
        out: list[Any] = []
        extend = out.extend
        r = None
        try:
            if self._yields:  # see ProcessOperator.process_batch
                for r in batch:
                    set_key(key_of(r))
                    extend(fn(r, ctx))
            else:
                generator = GENERATOR
                for r in batch:
                    set_key(key_of(r))
                    res = fn(r, ctx)
                    t = type(res)
                    if t is list or t is generator:
                        extend(res)
                    elif res is not None:
                        extend(checked_outputs(res, "process_element"))
        except Exception as exc:
            raise self.fail(r, exc) from exc
        return out


WATERMARK_STATE = "operator-watermark"


def restore_watermark(op: Any) -> float:
    """The restored event time of an operator: the minimum of its union entries (-inf)."""
    entries = op.operator_state.get_list_state(WATERMARK_STATE, "union").get()
    return min((float(x) for x in entries), default=float("-inf"))


def snapshot_watermark(op: Any, watermark: float) -> None:
    """Keep ``watermark`` (seconds) in the operator's union state.

    The final watermark of a bounded input (+inf, end of input, not event time) is not
    kept: the entry stays at the last event time an earlier checkpoint recorded, so a run
    that resumes the job's final checkpoint with more input (a source that continues after
    its end, a file that grew) goes on from real event time instead of finding every record
    late.
    """
    if watermark == float("inf"):
        return
    op.operator_state.get_list_state(WATERMARK_STATE, "union").update(
        [watermark] if watermark > float("-inf") else [])


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
        self.timers: InternalTimerService

    def open(self) -> None:
        assert self.keyed_backend is not None
        self.timers = InternalTimerService(self.keyed_backend, self.clock, self.mailbox,
                                           self._fire_event_time, self._fire_processing_time)
        self.timers.watermark = restore_watermark(self)
        self.timers.restore()
        self.ctx._timer_service = TimerService(self.timers)
        super().open()

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
            res = on_timer(timestamp, ctx)
            return list(checked_outputs(res, "on_timer")) if res is not None else []
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
        snapshot_watermark(self, self.timers.watermark)

    def close(self) -> None:
        if hasattr(self, "timers"):
            self.timers.close()
        super().close()
