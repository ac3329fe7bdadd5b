"""``key_by(...).process(fn)`` with timers: the keyed process operator plus a timer service.

``fn.on_timer(timestamp, ctx)`` runs with ``ctx.current_key`` set to the timer's key, for
event-time timers when a watermark reaches them and for processing-time timers from the
task's mailbox. The operator's event time (its last watermark) is kept as union operator
state so that, after a recovery, ``current_watermark()`` does not start again from -inf.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..functions import ProcessFunction
from ..runtime.operators import KeyedProcessOperator, checked_outputs
from .clock import ProcessingClock
from .timers import InternalTimerService, TimerService

__all__ = ["TimedKeyedProcessOperator"]

WATERMARK_STATE = "operator-watermark"


def restore_watermark(op: Any) -> float:
    """The restored event time of an operator: the minimum of its union entries (-inf)."""
    entries = op.operator_state.get_list_state(WATERMARK_STATE, "union").get()
    return min((float(x) for x in entries), default=float("-inf"))


def snapshot_watermark(op: Any, watermark: float) -> None:
    """Keep ``watermark`` (seconds) in the operator's union state."""
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
                                           self._fire, self._fire)
        self.timers.watermark = restore_watermark(self)
        self.timers.restore()
        self.ctx._timer_service = TimerService(self.timers)
        super().open()

    def _fire(self, timestamp: float, namespace: Any) -> list[Any]:
        on_timer = getattr(self.fn, "on_timer", None)
        if on_timer is None:
            return []
        try:
            res = on_timer(timestamp, self.ctx)
            return list(checked_outputs(res, "on_timer")) if res is not None else []
        except Exception as exc:
            raise self.fail(f"timer {timestamp} of key {self.ctx.current_key!r}", exc) from exc

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
