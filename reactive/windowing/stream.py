"""The windowed-stream API: ``KeyedStream.window(...)``, ``.windows([...])`` and
``.count_window(...)`` return a :class:`WindowedStream`; ``aggregate``/``reduce``/``process``
end it.

Late records travel in band, wrapped, from the window operator: the stream that
``aggregate`` returns drops the wrappers (a chained filter) and ``late_data()`` is a second
consumer of the window operator that unwraps them, so a user can sink late records like any
stream.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, Literal, Protocol, TypeVar

from ..errors import ConfigurationError
from ..graph import Edge, GraphBuilder, Transformation
from ..runtime import operators as ops
from ..sinks import Sink
from .assigners import CountWindows, PeriodicWindows, WindowAssigner
from .count_window_operator import CountWindowOperator
from .evictors import Evictor
from .functions import AggregateFunction, ProcessWindowFunction, ReduceAggregate
from .shared_window_operator import SharedWindowOperator
from .triggers import Trigger
from .window_operator import WindowOperator
from .window_outputs import is_window_output, side_output_of, unwrap_late

__all__ = ["KeyedInput", "WindowedStream", "find_timestamp_fn"]


class _Sinkable(Protocol):
    def sink(self, sink: Any, name: str | None = None) -> Any: ...


S = TypeVar("S", bound=_Sinkable, covariant=True)


class KeyedInput(Protocol[S]):
    """What a windowed stream needs of the keyed stream it cuts into windows (the fluent
    API's ``KeyedStream``), so that this module does not depend on the API module: its
    dataflow, transformation and key selector, its edge, and how it makes a stream of
    another transformation (the type of the streams ``aggregate`` and ``late_data`` return).
    """

    @property
    def flow(self) -> GraphBuilder: ...

    @property
    def transformation(self) -> Transformation: ...

    @property
    def key_selector(self) -> Callable[[Any], Any]: ...

    def _edge(self) -> Edge: ...

    def _derive(self, transformation: Transformation,
                primary: Transformation | None = None) -> S: ...

# kinds that pass records through unchanged (the timestamp function still applies)
_PASS_THROUGH = {"filter", "union"}


def find_timestamp_fn(t: Transformation) -> Callable[[Any], float]:
    """The timestamp function of the nearest ``assign_timestamps`` upstream of ``t``.

    Raises:
        ConfigurationError: when there is none, or an operator that changes records (map,
            process ...) lies between, so the function would not apply any more.
    """
    if t.timestamp_fn is not None:
        return t.timestamp_fn
    if t.kind in _PASS_THROUGH and t.inputs:
        found = {id(fn): fn for fn in (find_timestamp_fn(e.upstream) for e in t.inputs)}
        if len(found) == 1:
            return next(iter(found.values()))
    raise ConfigurationError(
        f"event-time windows need record timestamps, but operator {t.name!r} ({t.kind}) "
        "has none: call assign_timestamps(...) after the last operator that changes the "
        "records, or pass window(..., timestamp=fn)"
    )


class WindowedStream(Generic[S]):
    """A keyed stream cut into windows; end it with :meth:`aggregate`, :meth:`reduce` or
    :meth:`process`.

    Args:
        keyed: the keyed stream.
        assigners: one assigner, or several periodic ones to share (``windows([...])``).
        timestamp: record -> event time (seconds); default: the ``assign_timestamps``
            function upstream (required by event-time assigners; processing-time and
            global windows use it for evictors when there is one).
        trigger: when windows fire (a :class:`~.triggers.Trigger`); default: the
            assigner's (event time, processing time, never for global windows).
        evictor: drops records of a window before/after it fires (windows then keep
            their records, also for ``aggregate``).

    Raises:
        ConfigurationError: for mixed count and time assigners, sessions among shared
            windows, event-time windows without timestamps, or a trigger or evictor on
            count or shared windows.
    """

    def __init__(self, keyed: KeyedInput[S], assigners: list[WindowAssigner],
                 timestamp: Callable[[Any], float] | None = None, *,
                 trigger: Trigger | None = None, evictor: Evictor | None = None) -> None:
        if not assigners:
            raise ConfigurationError("windows([...]) needs at least one window assigner")
        counts = [a.count_based for a in assigners]
        if any(counts) and not all(counts):
            raise ConfigurationError("windows([...]) cannot mix count and event-time windows")
        if len(assigners) > 1 and not all(isinstance(a, PeriodicWindows) for a in assigners):
            raise ConfigurationError("shared windows([...]) must be periodic (tumbling, "
                                     "sliding or count windows)")
        self.keyed = keyed
        self.assigners = assigners
        self.count_based = all(counts)
        self._trigger: Trigger | None = None
        self._evictor: Evictor | None = None
        if trigger is not None:
            self.trigger(trigger)
        if evictor is not None:
            self.evictor(evictor)
        self.timestamp_fn: Callable[[Any], float] | None = None
        if not self.count_based:
            if all(a.is_event_time for a in assigners):
                self.timestamp_fn = timestamp or find_timestamp_fn(keyed.transformation)
            elif timestamp is not None:
                self.timestamp_fn = timestamp
            else:
                try:
                    self.timestamp_fn = find_timestamp_fn(keyed.transformation)
                except ConfigurationError:
                    self.timestamp_fn = None  # processing time needs none
        self.discarding = False
        self.lateness = 0.0
        self.window_transformation: Transformation | None = None
        self._late_enabled = False
        self._late_stream: S | None = None
        self._late_target: Sink | Callable[[Any], Any] | None = None

    # ------------------------------------------------------------------ options
    def _single_window(self, what: str) -> None:
        if self.count_based or len(self.assigners) > 1:
            raise ConfigurationError(
                f"{what} applies to a single time or global window; for count windows with "
                "a trigger use window(GlobalWindows.create()).trigger(CountTrigger.of(n))")

    def trigger(self, trigger: Trigger) -> WindowedStream[S]:
        """Fire windows with ``trigger`` instead of the assigner's default (Flink's
        ``WindowedStream.trigger``); see :mod:`reactive.windowing.triggers`.

        Raises:
            ConfigurationError: for count or shared windows, or a trigger that cannot merge
                on session windows.
        """
        self._single_window("trigger")
        if self.assigners[0].merging and not trigger.can_merge():
            raise ConfigurationError(f"trigger {trigger!r} cannot merge windows (can_merge() "
                                     "is False), so it cannot fire session windows")
        self._trigger = trigger
        return self

    def evictor(self, evictor: Evictor) -> WindowedStream[S]:
        """Drop records of a window before/after it fires (Flink's
        ``WindowedStream.evictor``); the window keeps its records until then, also for
        ``aggregate`` and ``reduce``.

        Raises:
            ConfigurationError: for count or shared windows.
        """
        self._single_window("evictor")
        self._evictor = evictor
        return self

    def allowed_lateness(self, seconds: float,
                         firing: Literal["accumulating", "discarding"] = "accumulating"
                         ) -> WindowedStream[S]:
        """Keep window state ``seconds`` after the window's end: late records in that time
        update the window and fire it again (late firings).

        Args:
            seconds: the allowed lateness (event-time seconds, >= 0).
            firing: ``"accumulating"`` (the default, as Flink's default triggers): a late
                firing emits the whole window again, updated; downstream keeps the last
                result per window. ``"discarding"``: every firing purges the window, so a
                late firing emits only the late records' result (a delta).

        Raises:
            ConfigurationError: if negative, for an unknown mode, or for count, shared or
                processing-time windows.
        """
        if not seconds >= 0:
            raise ConfigurationError(f"allowed lateness must be >= 0 seconds, got {seconds}")
        if firing not in ("accumulating", "discarding"):
            raise ConfigurationError(
                f"firing must be 'accumulating' or 'discarding', got {firing!r}")
        if (seconds or firing != "accumulating") and (
                self.count_based or len(self.assigners) > 1
                or not self.assigners[0].is_event_time):
            raise ConfigurationError("allowed_lateness applies to a single event-time window")
        self.lateness = float(seconds)
        self.discarding = firing == "discarding"
        return self

    def side_output_late_data(self, target: Sink | Callable[[Any], Any] | None = None
                              ) -> WindowedStream[S]:
        """Send late records (beyond the allowed lateness) to ``target`` (a sink or a
        callback); without a target, take them with :meth:`late_data`."""
        self._late_enabled = True
        self._late_target = target
        return self

    # ------------------------------------------------------------------ terminals
    def aggregate(self, fn: AggregateFunction, name: str | None = None) -> S:
        """Incrementally aggregate each window; emits
        :class:`~reactive.windowing.functions.WindowResult` records."""
        return self._build(fn, None, name or f"window-{type(fn).__name__}")

    def reduce(self, fn: Callable[[Any, Any], Any], name: str | None = None) -> S:
        """``fn(a, b)`` over each window's records; emits ``WindowResult`` records."""
        return self._build(ReduceAggregate(fn), None, name or "window-reduce")

    def process(self, fn: ProcessWindowFunction, name: str | None = None) -> S:
        """Run ``fn.process(key, window, records)`` per fired window.

        Raises:
            ConfigurationError: for shared windows (several definitions).
        """
        if len(self.assigners) > 1:
            raise ConfigurationError("process() needs a single window definition; shared "
                                     "windows support aggregate() and reduce()")
        return self._build(None, fn, name or f"window-{type(fn).__name__}")

    def late_data(self) -> S:
        """The late records of this window operator, as a stream (after ``aggregate``,
        ``reduce`` or ``process``).

        Raises:
            ConfigurationError: before the window is built, or for count windows (they have
                no late records).
        """
        if self.window_transformation is None:
            raise ConfigurationError("late_data() comes after aggregate(), reduce() or process()")
        if self._late_stream is None:
            self._late_enabled = True
            t = self.window_transformation
            flow = self.keyed.flow
            late = flow._add("late", f"{t.name}-late",
                             lambda lt: ops.FlatMapOperator(lt.name, lt.resolved_uid,
                                                            unwrap_late),
                             [Edge(t, "forward")])
            self._late_stream = self.keyed._derive(late)
        return self._late_stream

    def side_output(self, tag: str) -> S:
        """The records a process window function sent with ``ctx.output(tag, value)``, as a
        stream (after ``process``).

        Raises:
            ConfigurationError: before the window is built.
        """
        if self.window_transformation is None:
            raise ConfigurationError("side_output() comes after process()")
        t = self.window_transformation
        unwrap = side_output_of(tag)
        out = self.keyed.flow._add(
            "side_output", f"{t.name}-{tag}",
            lambda st: ops.FlatMapOperator(st.name, st.resolved_uid, unwrap),
            [Edge(t, "forward")])
        return self.keyed._derive(out)

    def _build(self, agg: AggregateFunction | None, fn: ProcessWindowFunction | None,
               name: str) -> S:
        if self.window_transformation is not None:
            raise ConfigurationError("a WindowedStream can be ended only once")
        keyed = self.keyed
        flow = keyed.flow
        key_of = keyed.key_selector
        assigners = self.assigners
        clock = flow.processing_clock
        lateness = self.lateness
        ts_fn = self.timestamp_fn
        trigger, evictor, discarding = self._trigger, self._evictor, self.discarding

        def late_enabled() -> bool:
            return self._late_enabled

        def factory(t: Transformation) -> ops.StreamOperator:
            if self.count_based:
                return CountWindowOperator(t.name, t.resolved_uid, key_of,
                                           [a for a in assigners if isinstance(a, CountWindows)],
                                           aggregate=agg, process=fn)
            if len(assigners) > 1:
                assert agg is not None and ts_fn is not None
                return SharedWindowOperator(
                    t.name, t.resolved_uid, key_of,
                    [a for a in assigners if isinstance(a, PeriodicWindows)], ts_fn, agg,
                    clock, late_enabled)
            return WindowOperator(t.name, t.resolved_uid, key_of, assigners[0], ts_fn,
                                  aggregate=agg, process=fn, allowed_lateness=lateness,
                                  clock=clock, late_side_output=late_enabled,
                                  trigger=trigger, evictor=evictor, discarding=discarding)

        t = flow._add("window", name, factory, [keyed._edge()])
        self.window_transformation = t
        main = flow._add("window_results", f"{name}-results",
                         lambda mt: ops.FilterOperator(mt.name, mt.resolved_uid,
                                                       is_window_output),
                         [Edge(t, "forward")])
        if self._late_target is not None:
            self.late_data().sink(self._late_target)
        # uid/name/parallelism set on the result stream belong to the window operator
        return keyed._derive(main, primary=t)
