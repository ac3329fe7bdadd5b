"""Window operators (Flink's ``WindowOperator`` / ``EvictingWindowOperator``, thesis ch. 5).

- :class:`WindowOperator`: one event-time assigner (tumbling, sliding, session). Window
  contents (accumulators, or records for a ``ProcessWindowFunction``) are a map state
  ``{window: contents}`` per key; a window fires on an event-time timer at its end and its
  state is cleared by a timer at ``end + allowed_lateness``. Records for windows already
  fired but within the allowed lateness update the window and fire it again.
- :class:`CountWindowOperator`: count windows (one or several definitions, shared through
  :class:`~.cutty.CuttyAggregator`), per-key aggregator in a value state.
- :class:`SharedWindowOperator`: several periodic event-time windows over one measure
  (``KeyedStream.windows``), shared through :class:`~.cutty.EventTimeCuttyAggregator`.

A record none of whose windows can still fire (``end + allowed_lateness <= watermark``) is
*late*: it is emitted as a :class:`LateRecord` for the side output when the program asked
for one (``late_data()`` / ``side_output_late_data``), else counted in ``late_records`` and
reported with a warning -- never dropped without a trace.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..runtime.operators import StreamOperator, checked_outputs
from ..runtime.operators.process import restore_watermark, snapshot_watermark
from ..state.api import MapState, ValueState
from ..state.descriptors import MapStateDescriptor, ValueStateDescriptor
from ..time.clock import ProcessingClock
from ..time.timers import InternalTimerService
from .assigners import CountWindows, PeriodicWindows, TimeWindow, WindowAssigner
from .cutty import CuttyAggregator, EventTimeCuttyAggregator, WindowEmission
from .flatfat import AggregateStats
from .functions import AggregateFunction, ProcessWindowFunction, WindowResult

__all__ = ["CountWindowOperator", "LateRecord", "SharedWindowOperator", "WindowOperator"]

log = logging.getLogger(__name__)

_MISSING = object()


class LateRecord:
    """A late record on its way to the side output (unwrapped by ``late_data()``)."""

    __slots__ = ("record",)

    def __init__(self, record: Any) -> None:
        self.record = record

    def __reduce__(self) -> tuple[Any, ...]:
        return (LateRecord, (self.record,))


def is_window_output(record: Any) -> bool:
    """True for a main-output record (not a late record)."""
    return type(record) is not LateRecord


def unwrap_late(record: Any) -> tuple[Any, ...] | None:
    """The late record inside ``record``, as a one-element tuple (None otherwise)."""
    return (record.record,) if type(record) is LateRecord else None


class _EventTimeOperatorBase(StreamOperator):
    """Shared plumbing: key selector, timers, restored event time, late records."""

    keyed = True

    def __init__(self, name: str, uid: str, key_selector: Callable[[Any], Any],
                 clock: ProcessingClock, late_side_output: Callable[[], bool]) -> None:
        super().__init__(name, uid, key_selector)
        self.clock = clock
        self.late_side_output = late_side_output
        self.emit_late = False
        self.late_records = 0
        self.timers: InternalTimerService

    def _open_timers(self) -> None:
        assert self.keyed_backend is not None
        self.emit_late = self.late_side_output()
        self.timers = InternalTimerService(self.keyed_backend, self.clock, self.mailbox,
                                           self.on_event_time, lambda ts, ns: [])
        self.timers.watermark = restore_watermark(self)
        self.timers.restore()

    def on_event_time(self, timestamp: float, namespace: Any) -> list[Any]:
        raise NotImplementedError

    def _late(self, record: Any, out: list[Any]) -> None:
        if self.emit_late:
            out.append(LateRecord(record))
            return
        if not self.late_records:
            log.warning("operator %r got a late record (beyond the allowed lateness) and has no "
                        "side output: add .side_output_late_data(sink) or use late_data() to "
                        "receive late records; counting them in late_records", self.name)
        self.late_records += 1

    def process_watermark(self, timestamp: float) -> list[Any]:
        try:
            return self.timers.advance_watermark(timestamp)
        except Exception as exc:
            if isinstance(exc, AssertionError):
                raise
            raise self.fail(f"watermark {timestamp}", exc) from exc

    def snapshot_state(self, checkpoint_id: int) -> None:
        snapshot_watermark(self, self.timers.watermark)

    def close(self) -> None:
        if hasattr(self, "timers"):
            self.timers.close()
        super().close()


class WindowOperator(_EventTimeOperatorBase):
    """One event-time window definition with an aggregate or a process window function.

    Args:
        name, uid: operator identity.
        key_selector: record -> key.
        assigner: the window assigner (event time).
        timestamp_fn: record -> event timestamp (seconds).
        aggregate: incremental aggregate (``aggregate``/``reduce``), or None.
        process: whole-window function, or None (exactly one of the two).
        allowed_lateness: seconds after a window's end during which late records still
            update it (and fire it again).
        clock: processing-time clock.
        late_side_output: returns True when late records go to a side output.
    """

    def __init__(self, name: str, uid: str, key_selector: Callable[[Any], Any],
                 assigner: WindowAssigner, timestamp_fn: Callable[[Any], float], *,
                 aggregate: AggregateFunction | None, process: ProcessWindowFunction | None,
                 allowed_lateness: float, clock: ProcessingClock,
                 late_side_output: Callable[[], bool]) -> None:
        super().__init__(name, uid, key_selector, clock, late_side_output)
        assert (aggregate is None) != (process is None)
        self.assigner = assigner
        self.timestamp_fn = timestamp_fn
        self.agg = aggregate
        self.fn = process
        self.lateness = allowed_lateness
        self.contents: MapState

    def open(self) -> None:
        state = self.ctx.get_state(MapStateDescriptor("window-contents"))
        assert isinstance(state, MapState)
        self.contents = state
        self._open_timers()

    # ------------------------------------------------------------------ records
    def _add(self, window: TimeWindow, record: Any) -> None:
        contents = self.contents
        cur = contents.get(window, _MISSING)
        if self.agg is not None:
            agg = self.agg
            contents.put(window, agg.add(record, agg.create_accumulator()
                                         if cur is _MISSING else cur))
        else:
            if cur is _MISSING:
                contents.put(window, [record])
            else:
                cur.append(record)  # safe: state was captured when the key was set
                contents.put(window, cur)

    def _schedule(self, window: TimeWindow, out: list[Any]) -> None:
        """After ``window`` changed: fire it now if its end passed, else set its timers."""
        timers = self.timers
        if window.end <= timers.watermark:
            out.extend(self._emit(window))  # a late firing within the allowed lateness
        else:
            timers.register_event_time_timer(window.end, window)
        if self.lateness > 0:
            timers.register_event_time_timer(window.end + self.lateness, window)

    def process_batch(self, batch: list[Any]) -> list[Any]:
        assert self.keyed_backend is not None and self.key_selector is not None
        key_of, ts_fn = self.key_selector, self.timestamp_fn
        set_key = self.keyed_backend.set_current_key
        assign = self.assigner.assign_windows
        merging = self.assigner.merging
        lateness = self.lateness
        timers = self.timers
        out: list[Any] = []
        r = None
        try:
            for r in batch:
                set_key(key_of(r))
                ts = ts_fn(r)
                wm = timers.watermark
                if merging:
                    self._add_merging(assign(ts)[0], r, out)
                    continue
                placed = False
                for w in assign(ts):
                    if w.end + lateness <= wm:
                        continue  # this window is gone for good
                    placed = True
                    self._add(w, r)
                    self._schedule(w, out)
                if not placed:
                    self._late(r, out)
        except Exception as exc:
            raise self.fail(r, exc) from exc
        return out

    def _add_merging(self, window: TimeWindow, record: Any, out: list[Any]) -> None:
        timers = self.timers
        if window.end + self.lateness <= timers.watermark:
            self._late(record, out)
            return
        contents = self.contents
        merged = window
        absorbed = []
        for w, _ in contents.items():
            if w.intersects(window):
                absorbed.append(w)
                merged = merged.cover(w)
        if absorbed:
            absorbed.sort()
            acc: Any = _MISSING
            for w in absorbed:
                cur = contents.get(w)
                contents.remove(w)
                timers.delete_event_time_timer(w.end, w)
                if self.lateness > 0:
                    timers.delete_event_time_timer(w.end + self.lateness, w)
                if acc is _MISSING:
                    acc = cur
                elif self.agg is not None:
                    acc = self.agg.merge(acc, cur)
                else:
                    acc = [*acc, *cur]
            contents.put(merged, acc)
        self._add(merged, record)
        self._schedule(merged, out)

    # ------------------------------------------------------------------ firing
    def _emit(self, window: TimeWindow) -> list[Any]:
        cur = self.contents.get(window, _MISSING)
        if cur is _MISSING:
            return []
        assert self.keyed_backend is not None
        key = self.keyed_backend.current_key
        if self.agg is not None:
            return [WindowResult(key, window.start, window.end, self.agg.get_result(cur))]
        assert self.fn is not None
        res = self.fn.process(key, window, list(cur))
        return list(checked_outputs(res, "process")) if res is not None else []

    def on_event_time(self, timestamp: float, namespace: Any) -> list[Any]:
        window = TimeWindow(*namespace)
        if timestamp == window.end:
            out = self._emit(window)
            if self.lateness <= 0:
                self.contents.remove(window)
            return out
        self.contents.remove(window)  # cleanup at end + allowed lateness
        return []


class SharedWindowOperator(_EventTimeOperatorBase):
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


class CountWindowOperator(StreamOperator):
    """Count windows: ``count_window(size, slide)`` or several count definitions shared.

    With an aggregate, each key has a :class:`CuttyAggregator` (in a value state) fed with
    the key's records in order; with a process window function (one definition) each key
    keeps its last ``size`` records. Only complete windows fire.

    Args:
        name, uid: operator identity.
        key_selector: record -> key.
        queries: count window definitions.
        aggregate: the aggregate, or None.
        process: a process window function (one definition), or None.
    """

    keyed = True

    def __init__(self, name: str, uid: str, key_selector: Callable[[Any], Any],
                 queries: list[CountWindows], *, aggregate: AggregateFunction | None,
                 process: ProcessWindowFunction | None) -> None:
        super().__init__(name, uid, key_selector)
        assert (aggregate is None) != (process is None)
        assert process is None or len(queries) == 1
        self.queries = queries
        self.agg = aggregate
        self.fn = process
        self.stats = AggregateStats()
        self.state: ValueState

    def open(self) -> None:
        state = self.ctx.get_state(ValueStateDescriptor("count-windows"))
        assert isinstance(state, ValueState)
        self.state = state

    def process_batch(self, batch: list[Any]) -> list[Any]:
        assert self.keyed_backend is not None and self.key_selector is not None
        key_of = self.key_selector
        groups: dict[Any, list[Any]] = {}
        r = None
        try:
            for r in batch:
                k = key_of(r)
                g = groups.get(k)
                if g is None:
                    groups[k] = [r]
                else:
                    g.append(r)
        except Exception as exc:
            raise self.fail(r, exc) from exc
        set_key = self.keyed_backend.set_current_key
        out: list[Any] = []
        for k, records in groups.items():
            set_key(k)
            try:
                if self.agg is not None:
                    self._aggregate(k, records, out)
                else:
                    self._process(k, records, out)
            except Exception as exc:
                raise self.fail(records[0], exc) from exc
        return out

    def _aggregate(self, key: Any, records: list[Any], out: list[Any]) -> None:
        assert self.agg is not None
        aggr: CuttyAggregator | None = self.state.value()
        if aggr is None:
            aggr = CuttyAggregator(self.queries, self.agg, self.stats)
        elif aggr.agg is None:
            aggr.bind(self.agg, self.stats)
        emitted: list[WindowEmission] = aggr.add_all(records)
        self.state.update(aggr)
        get = self.agg.get_result
        out.extend(WindowResult(key, s, e, get(acc), q) for q, s, e, acc in emitted)

    def _process(self, key: Any, records: list[Any], out: list[Any]) -> None:
        assert self.fn is not None
        spec = self.queries[0]
        size, slide = int(spec.size), int(spec.slide)
        cur = self.state.value()
        position, recent = (0, []) if cur is None else cur
        recent = list(recent)
        for r in records:
            recent.append(r)
            position += 1
            if position >= size and (position - size) % slide == 0:
                window = TimeWindow(position - size, position)
                res = self.fn.process(key, window, recent[-size:])
                if res is not None:
                    out.extend(checked_outputs(res, "process"))
            if len(recent) > size:
                del recent[: len(recent) - size]
        self.state.update((position, recent))
