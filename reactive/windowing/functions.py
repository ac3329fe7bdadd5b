"""Window functions: incremental aggregation, reduce, and whole-window processing."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, overload

from typing_extensions import TypeVar

from .assigners import TimeWindow

if TYPE_CHECKING:
    from ..functions import RuntimeContext
    from ..state.api import ListState, MapState, ReducingState, State, ValueState
    from ..state.descriptors import (
        ListStateDescriptor,
        MapStateDescriptor,
        ReducingStateDescriptor,
        StateDescriptor,
        ValueStateDescriptor,
    )

__all__ = ["AggregateFunction", "ProcessWindowContext", "ProcessWindowFunction",
           "ReduceAggregate", "WindowResult"]


@dataclass(frozen=True, slots=True)
class WindowResult:
    """One result of ``aggregate``/``reduce``.

    Attributes:
        key: the window's key.
        start, end: the window ``[start, end)`` (event-time seconds; positions for count
            windows).
        value: ``get_result`` of the window's accumulator.
        query: index of the window definition in ``KeyedStream.windows([...])`` (0 otherwise).
    """

    key: Any
    start: float
    end: float
    value: Any
    query: int = 0


_new_object = object.__new__
_set_key, _set_start, _set_end, _set_value, _set_query = (
    WindowResult.__dict__[name].__set__ for name in ("key", "start", "end", "value", "query"))


def window_result(key: Any, start: float, end: float, value: Any) -> WindowResult:
    """``WindowResult(key, start, end, value)``, built without the frozen dataclass's
    ``__init__`` (one ``object.__setattr__`` call per field): half the cost, once per fired
    window."""
    r = _new_object(WindowResult)
    _set_key(r, key)
    _set_start(r, start)
    _set_end(r, end)
    _set_value(r, value)
    _set_query(r, 0)
    return r


# input, accumulator and result types; Any by default (PEP 696)
T = TypeVar("T", default=Any)
K = TypeVar("K", default=Any)
V = TypeVar("V", default=Any)
IN = TypeVar("IN", default=Any)
ACC = TypeVar("ACC", default=Any)
OUT = TypeVar("OUT", default=Any)


class AggregateFunction(ABC, Generic[IN, ACC, OUT]):
    """An incremental aggregate (Flink's ``AggregateFunction<IN, ACC, OUT>``; lift / combine /
    lower in Carbone 2018 (PhD thesis), chapter 5): folds records of type ``IN`` into
    accumulators of type ``ACC`` and reads a result of type ``OUT``. ``merge`` must be
    associative: windows share partial aggregates through it. Accumulators are stored in
    keyed state (picklable values)."""

    @abstractmethod
    def create_accumulator(self) -> ACC:
        """A new, empty accumulator."""

    @abstractmethod
    def add(self, value: IN, accumulator: ACC) -> ACC:
        """Fold one record into ``accumulator``; return the accumulator."""

    @abstractmethod
    def get_result(self, accumulator: ACC) -> OUT:
        """The window's value from its accumulator."""

    @abstractmethod
    def merge(self, a: ACC, b: ACC) -> ACC:
        """Combine two accumulators (``a`` covers records before ``b``'s)."""


class ReduceAggregate(AggregateFunction):
    """``reduce(fn)`` as an aggregate: the accumulator is ``()`` or ``(value,)``."""

    def __init__(self, fn: Callable[[Any, Any], Any]) -> None:
        self.fn = fn

    def create_accumulator(self) -> Any:
        return ()

    def add(self, value: Any, accumulator: Any) -> Any:
        return (self.fn(accumulator[0], value),) if accumulator else (value,)

    def get_result(self, accumulator: Any) -> Any:
        return accumulator[0] if accumulator else None

    def merge(self, a: Any, b: Any) -> Any:
        if not a:
            return b
        if not b:
            return a
        return (self.fn(a[0], b[0]),)


class ProcessWindowContext(Protocol):
    """What a :class:`ProcessWindowFunction` sees of its window and operator (Flink's
    ``ProcessWindowFunction.Context``)."""

    @property
    def window(self) -> TimeWindow:
        """The window being processed (or cleared)."""
        ...

    def current_watermark(self) -> float:
        """The operator's event time: its last watermark (seconds)."""
        ...

    def current_processing_time(self) -> float:
        """Processing time now (seconds)."""
        ...

    @overload
    def window_state(self, descriptor: ValueStateDescriptor[T]) -> ValueState[T]: ...

    @overload
    def window_state(self, descriptor: ListStateDescriptor[T]) -> ListState[T]: ...

    @overload
    def window_state(self, descriptor: ReducingStateDescriptor[T]) -> ReducingState[T]: ...

    @overload
    def window_state(self, descriptor: StateDescriptor) -> State: ...

    def window_state(self, descriptor: StateDescriptor) -> State:
        """Keyed state of the current key *and window* (value, list or reducing state):
        kept across the firings of one window; clear it in
        :meth:`ProcessWindowFunction.clear` (Flink's ``windowState()``).

        Raises:
            StateAccessError: for merging (session) windows, or map state.
        """
        ...

    @overload
    def global_state(self, descriptor: ValueStateDescriptor[T]) -> ValueState[T]: ...

    @overload
    def global_state(self, descriptor: ListStateDescriptor[T]) -> ListState[T]: ...

    @overload
    def global_state(self, descriptor: MapStateDescriptor[K, V]) -> MapState[K, V]: ...

    @overload
    def global_state(self, descriptor: ReducingStateDescriptor[T]) -> ReducingState[T]: ...

    @overload
    def global_state(self, descriptor: StateDescriptor) -> State: ...

    def global_state(self, descriptor: StateDescriptor) -> State:
        """Keyed state of the current key, shared by all its windows (``globalState()``)."""
        ...

    def output(self, tag: str, value: Any) -> None:
        """Send ``value`` to the side output ``tag`` (read it with
        ``WindowedStream.side_output(tag)``)."""
        ...


class ProcessWindowFunction:
    """Whole-window processing (Flink's ``ProcessWindowFunction``): sees every record of
    the window at once (the records are kept in keyed state until the window fires).

    ``process`` takes ``(key, window, elements)``, or ``(key, window, elements, ctx)`` to get
    a :class:`ProcessWindowContext` (watermark, processing time, per-window and per-key
    state, side outputs). It runs at every firing of the window: once with the default
    trigger, again for each late firing within the allowed lateness, and as often as a
    user trigger fires.
    """

    def open(self, ctx: RuntimeContext) -> None:
        """Called once per operator instance before the first record (and after a restore)."""

    def process(self, key: Any, window: TimeWindow, elements: list[Any]
                ) -> Iterable[Any] | None:
        """Return (or yield) the outputs of the window ``[window.start, window.end)``."""
        raise NotImplementedError

    def clear(self, ctx: ProcessWindowContext) -> None:
        """The window ``ctx.window`` is cleaned up (after its allowed lateness): delete
        its per-window state (Flink's ``ProcessWindowFunction.clear``)."""

    def close(self) -> None:
        """Called once when the operator instance stops."""
