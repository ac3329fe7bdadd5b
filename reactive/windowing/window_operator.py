"""The window operator (Flink's ``WindowOperator`` / ``EvictingWindowOperator``; Carbone
2018 (PhD thesis), chapter 5): one assigner (event-time or processing-time tumbling,
sliding, session with a fixed or dynamic gap; the global window) with a trigger and an
optional evictor.

Window contents (accumulators, or records for a ``ProcessWindowFunction`` or an evictor) are
a map state ``{window: contents}`` per key; the trigger (default: at the window's end) fires
it, and its state is cleared by a timer at ``end + allowed_lateness``. Records for windows
already fired but within the allowed lateness update the window and fire it again (late
firings, accumulating by default); records later than that are late records
(:mod:`.window_outputs`). Count windows are :mod:`.count_window_operator`'s, several periodic
windows sharing slices :mod:`.shared_window_operator`'s.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

from ..errors import ConfigurationError, StateAccessError, UserFunctionError
from ..runtime.operators import checked_outputs
from ..runtime.operators.base import instance_copy
from ..state.api import MapState
from ..state.descriptors import MapStateDescriptor, StateDescriptor
from ..time.clock import ProcessingClock
from .assigners import (
    GLOBAL_WINDOW,
    TimeWindow,
    TumblingEventTimeWindows,
    WindowAssigner,
)
from .evictors import Evictor, TimestampedValue
from .functions import AggregateFunction, ProcessWindowFunction, WindowResult, window_result
from .triggers import EventTimeTrigger, Trigger, TriggerResult, default_trigger
from .window_outputs import EventTimeWindowOperatorBase, LateRecord, SideOutput
from .window_state import WindowStates

__all__ = ["LateRecord", "SideOutput", "WindowOperator"]

log = logging.getLogger(__name__)

_MISSING = object()
_INF = float("inf")
_WINDOW_CACHE_SIZE = 4096  # window objects kept by start (tumbling windows, grouped path)


class _WindowContext:
    """The one context object a window operator hands its trigger (Flink's
    ``TriggerContext``/``OnMergeContext``), its evictor (``EvictorContext``) and its process
    window function (``ProcessWindowFunction.Context``), pointed at one window at a time."""

    __slots__ = ("merged_windows", "op", "window")

    def __init__(self, op: WindowOperator) -> None:
        self.op = op
        self.window = GLOBAL_WINDOW
        self.merged_windows: list[TimeWindow] = []

    # time
    def current_watermark(self) -> float:
        return self.op.timers.watermark

    def current_processing_time(self) -> float:
        return self.op.clock.now()

    # timers of the current key and window
    def register_event_time_timer(self, timestamp: float) -> None:
        self.op.timers.register_event_time_timer(timestamp, self.window)

    def register_processing_time_timer(self, timestamp: float) -> None:
        self.op.timers.register_processing_time_timer(timestamp, self.window)

    def delete_event_time_timer(self, timestamp: float) -> None:
        self.op.timers.delete_event_time_timer(timestamp, self.window)

    def delete_processing_time_timer(self, timestamp: float) -> None:
        self.op.timers.delete_processing_time_timer(timestamp, self.window)

    # state
    def get_partitioned_state(self, descriptor: StateDescriptor) -> Any:
        return self.op.trigger_states.get(descriptor)

    def merge_partitioned_state(self, descriptor: StateDescriptor) -> None:
        self.op.trigger_states.merge(descriptor, self.window, self.merged_windows)

    def window_state(self, descriptor: StateDescriptor) -> Any:
        if self.op.merging:
            raise StateAccessError(
                f"operator {self.op.name!r}: per-window state is not supported for merging "
                "(session) windows, as in Flink; use global_state")
        return self.op.window_states.get(descriptor)

    def global_state(self, descriptor: StateDescriptor) -> Any:
        return self.op.ctx.get_state(descriptor)

    def output(self, tag: str, value: Any) -> None:
        self.op.side_out.append(SideOutput(tag, value))


def _as_window(namespace: Any) -> TimeWindow:
    return namespace if type(namespace) is TimeWindow else TimeWindow(*namespace)


def _takes_context(fn: Any) -> bool:
    """True when ``fn.process`` accepts a fourth argument (the window context)."""
    try:
        params = list(inspect.signature(fn.process).parameters.values())
    except (TypeError, ValueError):
        return False
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return True
    return len([p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]) >= 4


class WindowOperator(EventTimeWindowOperatorBase):
    """One window definition with a trigger, an optional evictor, and an aggregate or a
    process window function (Flink's ``WindowOperator`` / ``EvictingWindowOperator``).

    Per key, the operator keeps in keyed state: the contents of each window (a map state
    ``{window: accumulator}``, or ``{window: records}`` for a process window function or
    an evictor; ``(record, timestamp)`` pairs with an evictor), the trigger's state per
    window (:mod:`.window_state`), the timers (namespace: the window), and for merging
    (session) windows the set of the key's windows. No user function is ever stored.

    Semantics, as Flink's:

    * A record's windows come from the assigner (event time, or the processing clock for
      processing-time assigners). Session windows are merged *first*; lateness is tested
      on the merged window: a window is late when ``end + allowed_lateness <= watermark``
      (event time only). A record all of whose windows are late is a late record (side
      output or counted), never dropped silently.
    * The trigger decides: FIRE emits the window's contents, PURGE drops them. The default
      trigger fires at the window's end (event or processing time); a record for a fired
      window within the allowed lateness fires it again at once (a *late firing*).
    * Firing mode: *accumulating* (the default, Flink's): a late firing emits the whole
      window again, updated. *Discarding*: every firing purges the contents, so a later
      firing emits only the records that came after the previous one.
    * A window's state is cleaned up at ``end + allowed_lateness`` (event time) or at its
      end (processing time); the global window is never cleaned up.

    Args:
        name, uid: operator identity.
        key_selector: record -> key.
        assigner: the window assigner.
        timestamp_fn: record -> event timestamp (seconds); None for processing-time or
            global windows over a stream without timestamps.
        aggregate: incremental aggregate (``aggregate``/``reduce``), or None.
        process: whole-window function, or None (exactly one of the two).
        allowed_lateness: seconds after a window's end during which late records still
            update it (event time).
        clock: processing-time clock.
        late_side_output: returns True when late records go to a side output.
        trigger: the trigger (None: the assigner's default, :func:`.triggers.default_trigger`).
        evictor: an evictor, or None.
        discarding: discarding firing mode (see above).

    Raises:
        ConfigurationError: for a merging assigner with a trigger that cannot merge.
    """

    def __init__(self, name: str, uid: str, key_selector: Callable[[Any], Any],
                 assigner: WindowAssigner, timestamp_fn: Callable[[Any], float] | None, *,
                 aggregate: AggregateFunction | None, process: ProcessWindowFunction | None,
                 allowed_lateness: float, clock: ProcessingClock,
                 late_side_output: Callable[[], bool], trigger: Trigger | None = None,
                 evictor: Evictor | None = None, discarding: bool = False) -> None:
        super().__init__(name, uid, key_selector, clock, late_side_output)
        assert (aggregate is None) != (process is None)
        self.assigner = assigner
        self.timestamp_fn = timestamp_fn
        self.agg = aggregate
        self.fn = instance_copy(process) if process is not None else None
        self.lateness = allowed_lateness
        self.trigger = trigger if trigger is not None else default_trigger(assigner)
        self.evictor = evictor
        self.discarding = discarding
        self.merging = assigner.merging
        self.event_time = assigner.is_event_time
        if self.event_time and timestamp_fn is None:
            raise ConfigurationError(f"operator {name!r}: event-time windows need timestamps")
        if self.merging and not self.trigger.can_merge():
            raise ConfigurationError(
                f"operator {name!r}: trigger {self.trigger!r} cannot merge windows, so it "
                "cannot be used with session windows (can_merge() is False)")
        # accumulators in the contents (else lists of records)
        self.accumulating = aggregate is not None and evictor is None
        # the common case (default event-time trigger, no merging, no evictor) runs the
        # trigger's logic inline: a trigger call per record and window cost ~35 % of the
        # throughput of a tumbling-window job
        self.inline_event_trigger = (type(self.trigger) is EventTimeTrigger and not self.merging
                                     and evictor is None and not discarding)
        self.assign_by_time = type(assigner).assign is WindowAssigner.assign
        # tumbling event-time windows aggregated incrementally under the default trigger:
        # a batch is folded per (key, window) run (see _process_grouped)
        self.grouped = (self.inline_event_trigger and self.accumulating
                        and type(assigner) is TumblingEventTimeWindows)
        self._windows_by_start: dict[float, TimeWindow] = {}
        self.fn_takes_context = self.fn is not None and _takes_context(self.fn)
        self.side_out: list[Any] = []
        self.contents: MapState
        self.windows: MapState
        self.trigger_states: WindowStates
        self.window_states: WindowStates
        self.wctx = _WindowContext(self)

    def open(self) -> None:
        assert self.keyed_backend is not None
        state = self.ctx.get_state(MapStateDescriptor("window-contents"))
        assert isinstance(state, MapState)
        self.contents = state
        if self.merging:
            windows = self.keyed_backend.get_state(MapStateDescriptor("merging-windows"))
            assert isinstance(windows, MapState)
            self.windows = windows
        self.trigger_states = WindowStates(self.keyed_backend, "_trigger/", self.wctx)
        self.window_states = WindowStates(self.keyed_backend, "_window/", self.wctx)
        self._open_timers()
        if self.fn is not None:
            open_fn = getattr(self.fn, "open", None)
            if open_fn is not None:
                open_fn(self.ctx)

    def close(self) -> None:
        try:
            close_fn = getattr(self.fn, "close", None)
            if close_fn is not None:
                close_fn()
        finally:
            super().close()

    # ------------------------------------------------------------------ lateness
    def _window_late(self, window: TimeWindow) -> bool:
        return self.event_time and window.end + self.lateness <= self.timers.watermark

    def _element_late(self, timestamp: float) -> bool:
        return self.event_time and timestamp + self.lateness < self.timers.watermark

    # ------------------------------------------------------------------ records
    def _add(self, window: TimeWindow, record: Any, timestamp: float | None) -> None:
        contents = self.contents
        cur = contents.get(window, _MISSING)
        if self.accumulating:
            agg = self.agg
            assert agg is not None
            contents.put(window, agg.add(record, agg.create_accumulator()
                                         if cur is _MISSING else cur))
            return
        item = record if self.evictor is None else (record, timestamp)
        if cur is _MISSING:
            contents.put(window, [item])
        else:
            cur.append(item)  # safe: state was captured when the key was set
            contents.put(window, cur)

    def _process_inline(self, batch: list[Any]) -> list[Any]:
        """:meth:`process_batch` with :class:`EventTimeTrigger`'s logic inline (same
        results: fire at once when the window's end passed, else a timer at the end)."""
        assert self.keyed_backend is not None and self.key_selector is not None
        assert self.timestamp_fn is not None
        key_of, ts_fn = self.key_selector, self.timestamp_fn
        set_key = self.keyed_backend.set_current_key
        assigner = self.assigner
        assign = assigner.assign_windows if self.assign_by_time else None
        lateness = self.lateness
        timers = self.timers
        register = timers.register_event_time_timer
        add = self._add
        fire = TriggerResult.FIRE
        out: list[Any] = []
        self.side_out = out
        r = None
        try:
            for r in batch:
                set_key(key_of(r))
                ts = ts_fn(r)
                wm = timers.watermark
                placed = False
                for w in (assign(ts) if assign is not None else assigner.assign(r, ts)):
                    end = w.end
                    if end + lateness <= wm:
                        continue  # this window is gone for good
                    placed = True
                    add(w, r, ts)
                    if end <= wm:
                        self._act(fire, w, out)  # a late firing within the lateness
                    else:
                        register(end, w)
                    if lateness > 0 and end != _INF:
                        register(end + lateness, w)
                if not placed and ts + lateness < wm:
                    self._late(r, out)
        except Exception as exc:
            raise self.fail(r, exc) from exc
        return out

    def _process_grouped(self, batch: list[Any]) -> list[Any]:
        """:meth:`_process_inline` for tumbling event-time windows with an aggregate: the
        records of the batch are grouped by (key, window) in arrival order, and each group
        is folded into its accumulator with one state read and one write and registers its
        timers once (Flink SQL's mini-batch aggregation, within one batch).

        The results are those of the per-record path: the watermark does not move within
        a batch, so a record's window is late or not for the whole batch; a group's records
        are added in arrival order; groups register their timers in the order their first
        records came, so timers due at the same time fire in the same order. A record whose
        window has ended (a late firing or a late record) first folds the groups before it,
        then goes through the per-record path, so outputs keep the order of the records.
        """
        assert self.key_selector is not None and self.timestamp_fn is not None
        key_of, ts_fn = self.key_selector, self.timestamp_fn
        assigner = self.assigner
        assert isinstance(assigner, TumblingEventTimeWindows)
        size, offset = assigner.size, assigner.offset
        wm = self.timers.watermark
        out: list[Any] = []
        groups: dict[tuple[Any, float], list[Any]] = {}
        r = None
        try:
            for r in batch:
                k = key_of(r)
                ts = ts_fn(r)
                start = ts - (ts - offset) % size  # TumblingEventTimeWindows.assign_windows
                if start + size <= wm:  # the window has ended: in record order
                    if groups:
                        self._fold(groups)
                        groups = {}
                    out.extend(self._process_inline([r]))
                    continue
                group = groups.get((k, start))
                if group is None:
                    groups[(k, start)] = [r]
                else:
                    group.append(r)
        except UserFunctionError:
            raise  # from a fold or a record of an ended window: it names its record
        except Exception as exc:
            raise self.fail(r, exc) from exc
        if groups:
            self._fold(groups)
        self.side_out = out
        return out

    def _fold(self, groups: dict[tuple[Any, float], list[Any]]) -> None:
        """Add each group's records to its window's accumulator (one state read and write
        per group) and register the window's timers (its end, and the cleanup at ``end +
        allowed_lateness``) once per group.

        Raises:
            UserFunctionError: naming the record the aggregate failed on.
        """
        assert self.keyed_backend is not None and self.agg is not None
        set_key = self.keyed_backend.set_current_key
        contents = self.contents
        get, put = contents.get, contents.put
        add, create = self.agg.add, self.agg.create_accumulator
        register = self.timers.register_event_time_timer
        lateness = self.lateness
        size = self.assigner.size  # type: ignore[attr-defined]
        windows = self._windows_by_start
        if len(windows) > _WINDOW_CACHE_SIZE:
            windows.clear()
        r = None
        try:
            for (k, start), records in groups.items():
                # one window object per start, shared by every key (fewer allocations, and
                # dict lookups of an identical key skip the comparison)
                w = windows.get(start)
                if w is None or type(w.start) is not type(start):
                    w = windows[start] = TimeWindow(start, start + size)
                r = records[0]
                set_key(k)
                acc = get(w, _MISSING)
                # no contents: no timer of this window either (both are written together
                # and a timer at or after the end drops the contents), so no lookup
                new = acc is _MISSING
                if new:
                    acc = create()
                for r in records:
                    acc = add(r, acc)
                put(w, acc)
                end = w.end
                register(end, w, new=new)
                if lateness > 0:
                    register(end + lateness, w, new=new)
        except Exception as exc:
            raise self.fail(r, exc) from exc

    def process_batch(self, batch: list[Any]) -> list[Any]:
        if self.grouped:
            return self._process_grouped(batch)
        if self.inline_event_trigger:
            return self._process_inline(batch)
        assert self.keyed_backend is not None and self.key_selector is not None
        key_of, ts_fn = self.key_selector, self.timestamp_fn
        set_key = self.keyed_backend.set_current_key
        assign = self.assigner.assign
        trigger, ctx = self.trigger, self.wctx
        event_time, merging = self.event_time, self.merging
        continue_ = TriggerResult.CONTINUE
        now = 0.0 if event_time else self.clock.now()
        out: list[Any] = []
        self.side_out = out
        r = None
        try:
            for r in batch:
                set_key(key_of(r))
                ts = ts_fn(r) if ts_fn is not None else None
                at = ts if event_time else now
                assert at is not None
                windows = assign(r, at)
                if merging:
                    windows = [self._merge_into_windows(w) for w in windows]
                skipped = True
                for w in windows:
                    if self._window_late(w):
                        if merging:
                            self.windows.remove(w)  # Flink's retireWindow
                        continue
                    skipped = False
                    self._add(w, r, ts)
                    ctx.window = w
                    res = trigger.on_element(r, at if ts is None else ts, w, ctx)
                    if res is not continue_:
                        self._act(res, w, out)
                    self._register_cleanup(w)
                if skipped and self._element_late(at):
                    self._late(r, out)
        except Exception as exc:
            raise self.fail(r, exc) from exc
        return out

    def _merge_into_windows(self, new: TimeWindow) -> TimeWindow:
        """Add ``new`` to the key's session windows, merging the ones it overlaps (Flink's
        ``MergingWindowSet.addWindow`` with the operator's merge callback: the trigger's
        ``on_merge``, ``clear`` of the merged windows, their contents merged). Returns the
        window the record belongs to."""
        windows = self.windows
        overlapping = sorted(_as_window(w) for w, _ in windows.items()
                             if _as_window(w).intersects(new))
        if not overlapping:
            windows.put(new, True)
            return new
        merged = new
        for w in overlapping:
            merged = merged.cover(w)
        if len(overlapping) == 1 and overlapping[0] == merged:
            return merged  # inside an existing window: nothing merges
        ctx, trigger = self.wctx, self.trigger
        ctx.window, ctx.merged_windows = merged, overlapping
        trigger.on_merge(merged, ctx)
        for m in overlapping:
            ctx.window = m
            trigger.clear(m, ctx)
            self._delete_cleanup(m)
            windows.remove(m)
        ctx.merged_windows = []
        contents = self.contents
        acc: Any = _MISSING
        for m in overlapping:
            cur = contents.get(m, _MISSING)
            if cur is _MISSING:
                continue
            contents.remove(m)
            if acc is _MISSING:
                acc = cur
            elif self.accumulating:
                assert self.agg is not None
                acc = self.agg.merge(acc, cur)
            else:
                acc = [*acc, *cur]
        if acc is not _MISSING:
            contents.put(merged, acc)
        windows.put(merged, True)
        ctx.window = merged
        return merged

    def _register_cleanup(self, window: TimeWindow) -> None:
        if window.end == _INF:
            return  # the global window is never cleaned up
        if self.event_time:
            self.timers.register_event_time_timer(window.end + self.lateness, window)
        else:
            self.timers.register_processing_time_timer(window.end, window)

    def _delete_cleanup(self, window: TimeWindow) -> None:
        if window.end == _INF:
            return
        if self.event_time:
            self.timers.delete_event_time_timer(window.end + self.lateness, window)
        else:
            self.timers.delete_processing_time_timer(window.end, window)

    # ------------------------------------------------------------------ firing
    def _act(self, result: TriggerResult, window: TimeWindow, out: list[Any]) -> None:
        if result.is_fire:
            cur = self.contents.get(window, _MISSING)
            if cur is not _MISSING:
                out.extend(self._emit(window, cur))
        if result.is_purge or (self.discarding and result.is_fire):
            self.contents.remove(window)

    def _emit(self, window: TimeWindow, cur: Any) -> list[Any]:
        assert self.keyed_backend is not None
        key = self.keyed_backend.current_key
        ctx = self.wctx
        ctx.window = window
        evictor = self.evictor
        if evictor is not None:
            elements = [TimestampedValue(v, t) for v, t in cur]
            kept = evictor.evict_before(elements, window, ctx)
            values = [e.value for e in kept]
        elif self.accumulating:
            assert self.agg is not None
            return [window_result(key, window.start, window.end, self.agg.get_result(cur))]
        else:
            values = list(cur)
        if self.agg is not None:
            agg = self.agg
            acc = agg.create_accumulator()
            for v in values:
                acc = agg.add(v, acc)
            out: list[Any] = [WindowResult(key, window.start, window.end, agg.get_result(acc))]
        else:
            assert self.fn is not None
            res = (self.fn.process(key, window, values, ctx) if self.fn_takes_context
                   else self.fn.process(key, window, values))
            out = list(checked_outputs(res, "process")) if res is not None else []
        if evictor is not None:
            after = evictor.evict_after(kept, window, ctx)
            if after is not elements:
                if after:
                    self.contents.put(window, [(e.value, e.timestamp) for e in after])
                else:
                    self.contents.remove(window)
        return out

    def _on_timer(self, timestamp: float, namespace: Any, event_time: bool) -> list[Any]:
        window = _as_window(namespace)
        if self.merging and not self.windows.contains(window):
            return []  # a timer of a window merged away
        out: list[Any] = []
        self.side_out = out
        ctx, trigger = self.wctx, self.trigger
        ctx.window = window
        try:
            res = (trigger.on_event_time(timestamp, window, ctx) if event_time
                   else trigger.on_processing_time(timestamp, window, ctx))
            if res is not TriggerResult.CONTINUE:
                self._act(res, window, out)
            if event_time == self.event_time and window.end != _INF and timestamp == (
                    window.end + self.lateness if event_time else window.end):
                self._clear_all(window)
        except Exception as exc:
            if isinstance(exc, AssertionError):
                raise
            raise self._timer_failed(timestamp, window, exc) from exc
        return out

    def on_event_time(self, timestamp: float, namespace: Any) -> list[Any]:
        if self.grouped and not self.lateness:
            return self._fire_and_clear(timestamp, namespace)
        if not self.inline_event_trigger or self.fn is not None:
            return self._on_timer(timestamp, namespace, True)
        # EventTimeTrigger inline (see _process_inline): fire at the end, clean up at end +
        # lateness; its clear() would delete the timer at the end, which has fired by then
        window = namespace if type(namespace) is TimeWindow else TimeWindow(*namespace)
        out: list[Any] = []
        end = window.end
        try:
            if timestamp == end:
                cur = self.contents.get(window, _MISSING)
                if cur is not _MISSING:
                    out = self._emit(window, cur)
            if timestamp == end + self.lateness:
                self.contents.remove(window)
        except Exception as exc:
            if isinstance(exc, AssertionError):
                raise
            raise self._timer_failed(timestamp, window, exc) from exc
        return out

    def _fire_and_clear(self, timestamp: float, namespace: Any) -> list[Any]:
        """:meth:`on_event_time` of the grouped path without allowed lateness: the one timer
        of a window, at its end, emits the accumulator's result and drops it (what the
        inline path does with ``end == end + lateness``, in fewer steps)."""
        window = namespace if type(namespace) is TimeWindow else TimeWindow(*namespace)
        if timestamp != window.end:
            return []
        contents = self.contents
        try:
            acc = contents.get(window, _MISSING)
            if acc is _MISSING:
                return []
            assert self.agg is not None and self.keyed_backend is not None
            out = [window_result(self.keyed_backend.current_key, window.start, window.end,
                                 self.agg.get_result(acc))]
            contents.remove(window)
        except Exception as exc:
            if isinstance(exc, AssertionError):
                raise
            raise self._timer_failed(timestamp, window, exc) from exc
        return out

    def _timer_failed(self, timestamp: float, window: TimeWindow,
                      exc: BaseException) -> UserFunctionError:
        """The error for ``exc`` raised while the timer at ``timestamp`` of ``window`` fired
        for the current key (it names the timer, the window and the key)."""
        assert self.keyed_backend is not None
        return self.fail(f"timer {timestamp} of window [{window.start}, {window.end}) of "
                         f"key {self.keyed_backend.current_key!r}", exc)

    def on_processing_time(self, timestamp: float, namespace: Any) -> list[Any]:
        return self._on_timer(timestamp, namespace, False)

    def _clear_all(self, window: TimeWindow) -> None:
        """The window's time is over: drop its contents, let the trigger and the process
        window function clear their state (Flink's ``clearAllState``)."""
        self.contents.remove(window)
        ctx = self.wctx
        ctx.window = window
        self.trigger.clear(window, ctx)
        clear = getattr(self.fn, "clear", None)
        if clear is not None:
            clear(ctx)
        if self.merging:
            self.windows.remove(window)

    def end_input(self) -> list[Any]:
        # due processing-time timers fire; later ones stay in the state (as in Flink)
        if self.event_time:
            return []
        return self.timers.fire_processing_timers()
