"""Window functions: incremental aggregation, reduce, and whole-window processing."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .assigners import TimeWindow

__all__ = ["AggregateFunction", "ProcessWindowFunction", "ReduceAggregate", "WindowResult"]


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


class AggregateFunction(ABC):
    """An incremental aggregate (Flink's ``AggregateFunction``; the thesis's lift / combine /
    lower). ``merge`` must be associative: windows share partial aggregates through it.
    Accumulators are stored in keyed state (picklable values)."""

    @abstractmethod
    def create_accumulator(self) -> Any:
        """A new, empty accumulator."""

    @abstractmethod
    def add(self, value: Any, accumulator: Any) -> Any:
        """Fold one record into ``accumulator``; return the accumulator."""

    @abstractmethod
    def get_result(self, accumulator: Any) -> Any:
        """The window's value from its accumulator."""

    @abstractmethod
    def merge(self, a: Any, b: Any) -> Any:
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


class ProcessWindowFunction:
    """Whole-window processing (Flink's ``ProcessWindowFunction``): sees every record of
    the window at once (the records are kept in keyed state until the window fires)."""

    def process(self, key: Any, window: TimeWindow, elements: list[Any]
                ) -> Iterable[Any] | None:
        """Return (or yield) the outputs of the window ``[window.start, window.end)``."""
        raise NotImplementedError
