"""The shared event-time window operator: several periodic windows over one measure
(``KeyedStream.windows([...])``), sharing partial aggregates through Cutty (Carbone et al.,
"Cutty: Aggregate Sharing for User-Defined Windows", CIKM 2016), whose window queries can be
added and removed while the job runs (:mod:`reactive.runtime.window_queries`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..errors import IncompatibleUpdateError
from ..runtime.window_queries import WindowQueryChange
from ..state.api import ValueState
from ..state.descriptors import ValueStateDescriptor
from ..time.clock import ProcessingClock
from .assigners import PeriodicWindows
from .cutty import EventTimeCuttyAggregator
from .flatfat import AggregateStats
from .functions import AggregateFunction, WindowResult
from .window_outputs import EventTimeWindowOperatorBase

__all__ = ["SharedWindowOperator"]

QUERIES_STATE = "shared-window-queries"
"""Operator state (union: every instance's entry to every instance):
``(subtask, parallelism, version, next id, queries, horizon)`` with queries
``(id, name, assigner, start)`` and horizon the latest event time the instance had seen
(records and watermark) at the checkpoint. A restore at the same parallelism takes its own
entry's horizon (so a change re-applied there starts where it started live); a rescaled one
takes the latest of all."""

_Query = tuple[int, str, PeriodicWindows, float]


def first_begin_after(assigner: PeriodicWindows, horizon: float) -> float:
    """The earliest window begin of ``assigner`` strictly after ``horizon`` (-inf stays
    -inf: nothing seen yet, the query runs from the beginning)."""
    if horizon == -math.inf:
        return horizon
    k = math.floor((horizon - assigner.offset) / assigner.slide) + 1
    return assigner.offset + k * assigner.slide


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
        # the queries in force, named by their index unless added at runtime
        self.query_set: list[_Query] = [(i, str(i), q, -math.inf)
                                        for i, q in enumerate(queries)]
        self.query_version = 0
        self.next_id = len(queries)
        self.max_timestamp = -math.inf
        self._horizon = -math.inf  # event time seen at the last snapshot's synchronous part
        self._restored_changes: list[WindowQueryChange] = []

    def open(self) -> None:
        state = self.ctx.get_state(ValueStateDescriptor("shared-windows"))
        assert isinstance(state, ValueState)
        self.state = state
        self._open_timers()
        entries = self.operator_state.get_list_state(QUERIES_STATE, "union").get()
        if entries:
            here = (self.ctx.subtask_index, self.ctx.parallelism)
            own = [e for e in entries if (e[0], e[1]) == here]
            _, _, version, next_id, queries, _ = max(own or entries, key=lambda e: e[2])
            self.query_version, self.next_id = version, next_id
            self.query_set = list(queries)
            self._horizon = self.max_timestamp = max(e[5] for e in own or entries)
        for change in self._restored_changes:
            self._apply(change)
        self._restored_changes.clear()

    def snapshot_state(self, checkpoint_id: int) -> None:
        super().snapshot_state(checkpoint_id)
        watermark = self.timers.watermark
        self._horizon = max(self.max_timestamp,
                            watermark if watermark < math.inf else -math.inf)
        self.operator_state.get_list_state(QUERIES_STATE, "union").update(
            [(self.ctx.subtask_index, self.ctx.parallelism, self.query_version, self.next_id,
              tuple(self.query_set), self._horizon)])

    # ------------------------------------------------------------------ window queries
    def window_queries(self) -> dict[str, tuple[int, Any]]:
        """The queries in force: ``{name: (query id, assigner)}``."""
        return {name: (i, q) for i, name, q, _ in self.query_set}

    def next_query_id(self) -> int:
        """The id the next query added gets."""
        return self.next_id

    def window_query_version(self) -> int:
        """How many changes of its queries this instance applied."""
        return self.query_version

    def check_window_query(self, assigner: Any) -> None:
        """Refuse what is not a periodic event-time window definition.

        Raises:
            IncompatibleUpdateError: with the reason.
        """
        if (not isinstance(assigner, PeriodicWindows) or assigner.count_based
                or not assigner.is_event_time):
            raise IncompatibleUpdateError(
                f"operator {self.uid!r} shares periodic event-time windows (tumbling or "
                f"sliding event-time windows); {assigner!r} is not one")

    def change_window_queries(self, change: WindowQueryChange, opened: bool) -> None:
        """Apply ``change`` at the barrier's snapshot instant (``opened``: an added query
        begins at its first window begin after the event time the snapshot recorded), or
        keep it for ``open`` (a restore: then applied from the restored queries)."""
        if opened:
            self._apply(change)
        else:
            self._restored_changes.append(change)

    def _apply(self, change: WindowQueryChange) -> None:
        if change.version <= self.query_version:
            return  # the restored queries hold it already
        if change.action == "add":
            start = first_begin_after(change.assigner, self._horizon)
            self.query_set.append((change.query, change.name, change.assigner, start))
            self.next_id = max(self.next_id, change.query + 1)
        else:
            self.query_set = [q for q in self.query_set if q[1] != change.name]
        self.query_version = change.version

    def _aggregator(self) -> EventTimeCuttyAggregator:
        aggr: EventTimeCuttyAggregator | None = self.state.value()
        if aggr is None:
            aggr = EventTimeCuttyAggregator([q for _, _, q, _ in self.query_set], self.agg,
                                            self.stats)
            aggr.ids = [i for i, *_ in self.query_set]
            aggr.starts = [start for *_, start in self.query_set]
            aggr.version = self.query_version
        else:
            if aggr.agg is None:
                aggr.bind(self.agg, self.stats)
            if aggr.version != self.query_version:
                self._follow(aggr)
        return aggr

    def _follow(self, aggr: EventTimeCuttyAggregator) -> None:
        """Bring a key's aggregator to the queries in force. It is reached first after the
        change, before any record after the barrier, so it holds only records older than
        every added query's start (the invariant ``add_query`` needs)."""
        ids = {i for i, *_ in self.query_set}
        known = set(aggr.ids)
        for i, _, q, start in self.query_set:
            if i not in known:
                aggr.add_query(i, q, start)
        for i in known - ids:
            aggr.retire_query(i)
        aggr.version = self.query_version

    def process_batch(self, batch: list[Any]) -> list[Any]:
        assert self.keyed_backend is not None and self.key_selector is not None
        key_of, ts_fn = self.key_selector, self.timestamp_fn
        set_key = self.keyed_backend.set_current_key
        timers = self.timers
        update = self.state.update
        out: list[Any] = []
        r = None
        max_ts = self.max_timestamp
        try:
            for r in batch:
                set_key(key_of(r))
                ts = ts_fn(r)
                if ts > max_ts:
                    max_ts = ts
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
        finally:
            self.max_timestamp = max_ts
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
