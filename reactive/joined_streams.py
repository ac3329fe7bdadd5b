"""The fluent API of event-time joins: the window join
``a.join(b).where(f).equal_to(g).window(assigner).apply(fn)`` and the interval join
``a.key_by(f).interval_join(b.key_by(g)).between(lower, upper).process(fn)`` (Flink's
``JoinedStreams`` and ``KeyedStream.IntervalJoin``).

Both read each input's event time from the ``assign_timestamps`` (or timestamped source)
upstream of it. Late inputs travel in band from the join operator, wrapped: the stream the
join returns drops them (a chained filter) and ``late_data()`` is a second consumer that
unwraps them into :class:`~reactive.runtime.operators.event_time_joins.LateJoinInput`
records (``side``, ``record``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .connected_streams import (
    KeyedStreamInput,
    StreamInput,
    check_compatible_keys,
    is_keyed,
    two_input_edges,
)
from .errors import ConfigurationError
from .graph import Edge, Transformation
from .runtime import operators as ops
from .runtime.operators.event_time_joins import (
    IntervalJoinOperator,
    WindowJoinOperator,
    is_join_output,
    unwrap_late_join_input,
)
from .two_input_functions import ProcessJoinFunction

if TYPE_CHECKING:
    from .windowing.assigners import WindowAssigner

__all__ = ["IntervalJoin", "IntervalJoined", "JoinedStreams", "WindowedJoin"]

S = TypeVar("S", covariant=True)


def _timestamps(first: StreamInput[Any], second: StreamInput[Any], what: str
                ) -> tuple[Callable[[Any], float], Callable[[Any], float]]:
    from .windowing.stream import find_timestamp_fn

    try:
        return (find_timestamp_fn(first.transformation),
                find_timestamp_fn(second.transformation))
    except ConfigurationError as exc:
        raise ConfigurationError(f"{what} needs the event time of both inputs: {exc}") from None


class _JoinResult(Generic[S]):
    """The join operator's outputs: results (the stream returned) and late inputs."""

    def __init__(self, first: StreamInput[S]) -> None:
        self._first = first
        self._transformation: Transformation | None = None
        self._late_enabled = False
        self._late: S | None = None

    def _late_output(self) -> bool:
        return self._late_enabled

    def _build(self, kind: str, name: str, edges: list[Edge],
               factory: Callable[[Transformation], ops.StreamOperator]) -> S:
        if self._transformation is not None:
            raise ConfigurationError(f"a {kind} can be ended only once")
        flow = self._first.flow
        t = flow._add(kind, name, factory, edges)
        self._transformation = t
        main = flow._add(f"{kind}_results", f"{name}-results",
                         lambda mt: ops.FilterOperator(mt.name, mt.resolved_uid,
                                                       is_join_output),
                         [Edge(t, "forward")])
        # uid/name/parallelism set on the result stream belong to the join operator
        return self._first._derive(main, primary=t)

    def late_data(self) -> S:
        """The late inputs of the join (``LateJoinInput(side, record)``), as a stream; after
        ``apply``/``process``.

        Raises:
            ConfigurationError: before the join is built.
        """
        t = self._transformation
        if t is None:
            raise ConfigurationError("late_data() comes after apply() or process()")
        if self._late is None:
            self._late_enabled = True
            late = self._first.flow._add(
                "join_late", f"{t.name}-late",
                lambda lt: ops.FlatMapOperator(lt.name, lt.resolved_uid,
                                               unwrap_late_join_input),
                [Edge(t, "forward")])
            self._late = self._first._derive(late)
        return self._late


class JoinedStreams(Generic[S]):
    """``a.join(b)``: name the keys with :meth:`where` and :meth:`equal_to`, then the
    windows with :meth:`window`.

    Args:
        first: the left input.
        second: the right input.
    """

    def __init__(self, first: StreamInput[S], second: StreamInput[Any]) -> None:
        self.first = first
        self.second = second
        self._key1: Callable[[Any], Any] | None = None
        self._key2: Callable[[Any], Any] | None = None

    def where(self, key_selector: Callable[[Any], Any]) -> JoinedStreams[S]:
        """The key of the left records."""
        self._key1 = key_selector
        return self

    def equal_to(self, key_selector: Callable[[Any], Any]) -> JoinedStreams[S]:
        """The key of the right records (joined with left records of an equal key)."""
        self._key2 = key_selector
        return self

    def window(self, assigner: WindowAssigner) -> WindowedJoin[S]:
        """Join within each window of ``assigner`` (tumbling or sliding event time).

        Raises:
            ConfigurationError: without ``where``/``equal_to``, or for merging (session),
                count or processing-time windows.
        """
        if self._key1 is None or self._key2 is None:
            raise ConfigurationError("join(...) needs where(key) and equal_to(key) before "
                                     "window(...)")
        if (getattr(assigner, "merging", False) or getattr(assigner, "count_based", False)
                or not getattr(assigner, "is_event_time", True)):
            raise ConfigurationError(
                f"a window join needs tumbling or sliding event-time windows, got "
                f"{type(assigner).__name__} (sessions merge, count windows count each "
                "input's records apart, processing-time windows would make the pairs "
                "depend on timing)")
        return WindowedJoin(self.first.key_by(self._key1), self.second.key_by(self._key2),
                            assigner)


class WindowedJoin(_JoinResult[S]):
    """A window join ready to apply its function.

    Args:
        first, second: the keyed inputs.
        assigner: the windows.
    """

    def __init__(self, first: KeyedStreamInput[S], second: KeyedStreamInput[Any],
                 assigner: WindowAssigner) -> None:
        super().__init__(first)
        check_compatible_keys(first, second, "join")
        self.first = first
        self.second = second
        self.assigner = assigner
        self.timestamp_fns = _timestamps(first, second, "a window join")

    def apply(self, fn: Callable[[Any, Any], Any], name: str | None = None) -> S:
        """``fn(left, right)`` for every pair of records of a key in a window, emitted when
        the window ends; one output per pair."""
        keys = (self.first.key_selector, self.second.key_selector)
        ts, assigner = self.timestamp_fns, self.assigner
        clock = self.first.flow.processing_clock
        return self._build(
            "window_join", name or "window-join", two_input_edges(self.first, self.second),
            lambda t: WindowJoinOperator(t.name, t.resolved_uid, fn, keys, ts, assigner,
                                         clock, self._late_output))


class IntervalJoin(Generic[S]):
    """``a.key_by(f).interval_join(b.key_by(g))``: give the bounds with :meth:`between`.

    Args:
        first, second: the keyed left and right inputs.

    Raises:
        ConfigurationError: for unkeyed inputs or different key encodings.
    """

    def __init__(self, first: StreamInput[S], second: StreamInput[Any]) -> None:
        if not is_keyed(first) or not is_keyed(second):
            raise ConfigurationError(
                "interval_join joins two keyed streams: a.key_by(f).interval_join(b.key_by(g))")
        check_compatible_keys(first, second, "interval_join")
        self.first = first
        self.second = second

    def between(self, lower: float, upper: float, lower_inclusive: bool = True,
                upper_inclusive: bool = True) -> IntervalJoined[S]:
        """Join a left record at ``t`` with the right records of its key at
        ``t + lower <= t' <= t + upper`` (seconds; either bound may be exclusive).

        Raises:
            ConfigurationError: if ``lower > upper``, or the inputs have no event time.
        """
        if not lower <= upper:
            raise ConfigurationError(f"interval join bounds need lower <= upper, got "
                                     f"{lower} > {upper}")
        return IntervalJoined(self.first, self.second, float(lower), float(upper),
                              lower_inclusive, upper_inclusive)


class IntervalJoined(_JoinResult[S]):
    """An interval join with its bounds, ready for its function."""

    def __init__(self, first: KeyedStreamInput[S], second: KeyedStreamInput[Any], lower: float,
                 upper: float,
                 lower_inclusive: bool, upper_inclusive: bool) -> None:
        super().__init__(first)
        self.first = first
        self.second = second
        self.bounds = (lower, upper, lower_inclusive, upper_inclusive)
        self.timestamp_fns = _timestamps(first, second, "an interval join")

    def process(self, fn: ProcessJoinFunction | Callable[[Any, Any], Any],
                name: str | None = None) -> S:
        """Run ``fn`` per joined pair: a ``ProcessJoinFunction`` (outputs yielded, both
        timestamps in its context) or ``fn(left, right) -> result`` (one output per pair).

        Raises:
            ConfigurationError: when ``fn`` is neither.
        """
        if not isinstance(fn, ProcessJoinFunction) and not callable(fn):
            raise ConfigurationError(
                f"interval_join(...).process() takes a ProcessJoinFunction or a function "
                f"(left, right) -> result, got {type(fn).__name__}")
        keys = (self.first.key_selector, self.second.key_selector)
        ts = self.timestamp_fns
        lower, upper, lower_inclusive, upper_inclusive = self.bounds
        clock = self.first.flow.processing_clock
        label = name or (type(fn).__name__ if isinstance(fn, ProcessJoinFunction)
                         else "interval-join")
        return self._build(
            "interval_join", label, two_input_edges(self.first, self.second),
            lambda t: IntervalJoinOperator(t.name, t.resolved_uid, fn, keys, ts, lower,
                                           upper, lower_inclusive, upper_inclusive, clock,
                                           self._late_output))
