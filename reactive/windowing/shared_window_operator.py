"""The shared event-time window operator: several periodic windows over one measure
(``KeyedStream.windows([...])``), sharing partial aggregates through Cutty (Carbone et al.,
"Cutty: Aggregate Sharing for User-Defined Windows", CIKM 2016)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..state.api import ValueState
from ..state.descriptors import ValueStateDescriptor
from ..time.clock import ProcessingClock
from .assigners import PeriodicWindows
from .cutty import EventTimeCuttyAggregator
from .flatfat import AggregateStats
from .functions import AggregateFunction, WindowResult
from .window_outputs import EventTimeWindowOperatorBase

__all__ = ["SharedWindowOperator"]


class SharedWindowOperator(EventTimeWindowOperatorBase):
    """Several periodic event-time windows over one measure, sharing partial aggregates
    (``KeyedStream.windows([...])``). Per key, an :class:`EventTimeCuttyAggregator` in a
    value state; a timer at each new slice's end seals slices and emits windows.

    Args:
        name, uid: operator identity.
        key_selector: record -> key.
        queries: the periodic window definitions.
        timestamp_fn: record -> event timestamp (seconds).
        aggregate: the shared aggregate.
        clock: processing-time clock.
        late_side_output: returns True when late records go to a side output.
    """

    def __init__(self, name: str, uid: str, key_selector: Callable[[Any], Any],
                 queries: list[PeriodicWindows], timestamp_fn: Callable[[Any], float],
                 aggregate: AggregateFunction, clock: ProcessingClock,
                 late_side_output: Callable[[], bool]) -> None:
        super().__init__(name, uid, key_selector, clock, late_side_output)
        self.queries = queries
        self.timestamp_fn = timestamp_fn
        self.agg = aggregate
        self.stats = AggregateStats()
        self.state: ValueState

    def open(self) -> None:
        state = self.ctx.get_state(ValueStateDescriptor("shared-windows"))
        assert isinstance(state, ValueState)
        self.state = state
        self._open_timers()

    def _aggregator(self) -> EventTimeCuttyAggregator:
        aggr: EventTimeCuttyAggregator | None = self.state.value()
        if aggr is None:
            aggr = EventTimeCuttyAggregator(self.queries, self.agg, self.stats)
        elif aggr.agg is None:
            aggr.bind(self.agg, self.stats)
        return aggr

    def process_batch(self, batch: list[Any]) -> list[Any]:
        assert self.keyed_backend is not None and self.key_selector is not None
        key_of, ts_fn = self.key_selector, self.timestamp_fn
        set_key = self.keyed_backend.set_current_key
        timers = self.timers
        update = self.state.update
        out: list[Any] = []
        r = None
        try:
            for r in batch:
                set_key(key_of(r))
                ts = ts_fn(r)
                aggr = self._aggregator()
                if aggr.slice_of(ts)[1] <= timers.watermark:
                    self._late(r, out)
                    continue
                end = aggr.add(ts, r)
                if end is not None:
                    timers.register_event_time_timer(end)
                update(aggr)
        except Exception as exc:
            raise self.fail(r, exc) from exc
        return out

    def on_event_time(self, timestamp: float, namespace: Any) -> list[Any]:
        assert self.keyed_backend is not None
        aggr = self._aggregator()
        emitted = aggr.advance(self.timers.watermark)
        if aggr.is_empty():
            self.state.clear()
        else:
            self.state.update(aggr)
        key = self.keyed_backend.current_key
        get = self.agg.get_result
        return [WindowResult(key, s, e, get(acc), q) for q, s, e, acc in emitted]
