"""The keyed-state API that user functions see (Flink's ``ValueState``, ``ListState`` ...).

Every call is scoped to the *current key*: the key of the record being processed. Values
returned by ``value()``/``get()`` may be the stored objects themselves; change state only
through ``update``/``add``/``put`` so that snapshots see a consistent view.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Generic, overload

from typing_extensions import TypeVar

if TYPE_CHECKING:
    from .descriptors import Aggregation

__all__ = ["AccumulatorState", "AggregatingState", "ListState", "MapState", "ReducingState",
           "State", "ValueState"]

# The type parameters default to Any, so a plain ``ValueState`` annotation (a backend's
# subclass, an older program) still means "a value state of anything" (PEP 696).
T = TypeVar("T", default=Any)
K = TypeVar("K", default=Any)
V = TypeVar("V", default=Any)
IN = TypeVar("IN", default=Any)
ACC = TypeVar("ACC", default=Any)
OUT = TypeVar("OUT", default=Any)


class State(ABC):
    """Base of all keyed state."""

    @abstractmethod
    def clear(self) -> None:
        """Remove the current key's value."""


class ValueState(State, Generic[T]):
    """One value per key, of type ``T``."""

    @abstractmethod
    def value(self) -> T:
        """Return the current key's value, or the descriptor's default (None when it has
        none: declare ``T`` as ``X | None`` then)."""

    @abstractmethod
    def update(self, value: T) -> None:
        """Set the current key's value."""


class ListState(State, Generic[T]):
    """A list of elements of type ``T`` per key."""

    @abstractmethod
    def get(self) -> list[T]:
        """Return the current key's elements (an empty list when there are none)."""

    @abstractmethod
    def add(self, value: T) -> None:
        """Append one element."""

    def add_all(self, values: Iterable[T]) -> None:
        """Append several elements."""
        for v in values:
            self.add(v)

    @abstractmethod
    def update(self, values: Iterable[T]) -> None:
        """Replace the current key's elements."""


class MapState(State, Generic[K, V]):
    """A map of user keys of type ``K`` to values of type ``V`` per key."""

    @overload
    def get(self, user_key: K) -> V | None: ...

    @overload
    def get(self, user_key: K, default: V) -> V: ...

    @abstractmethod
    def get(self, user_key: K, default: V | None = None) -> V | None:
        """Return the value of ``user_key`` or ``default``."""

    @abstractmethod
    def put(self, user_key: K, value: V) -> None:
        """Set the value of ``user_key``."""

    @abstractmethod
    def remove(self, user_key: K) -> None:
        """Remove ``user_key`` (no error when absent)."""

    @abstractmethod
    def contains(self, user_key: K) -> bool:
        """True when ``user_key`` has a value."""

    @abstractmethod
    def items(self) -> Iterator[tuple[K, V]]:
        """Iterate over a snapshot of the current key's (user key, value) pairs."""

    def keys(self) -> Iterator[K]:
        """Iterate over the user keys."""
        return (k for k, _ in self.items())

    def values(self) -> Iterator[V]:
        """Iterate over the values."""
        return (v for _, v in self.items())

    def is_empty(self) -> bool:
        """True when the current key has no entries."""
        return next(iter(self.items()), None) is None


class ReducingState(State, Generic[T]):
    """A value of type ``T`` per key folded with the descriptor's reduce function."""

    @abstractmethod
    def get(self) -> T | None:
        """Return the folded value, or None when nothing was added."""

    @abstractmethod
    def add(self, value: T) -> None:
        """Fold ``value`` into the current key's value."""


class AggregatingState(State, Generic[IN, OUT]):
    """An accumulator per key that ``add`` folds inputs of type ``IN`` into and ``get``
    reads as a result of type ``OUT`` (Flink's ``AggregatingState``, with the descriptor's
    ``AggregateFunction``)."""

    @abstractmethod
    def get(self) -> OUT | None:
        """Return ``get_result`` of the current key's accumulator, or None when nothing
        was added."""

    @abstractmethod
    def add(self, value: IN) -> None:
        """Fold ``value`` into the current key's accumulator."""


class AccumulatorState(AggregatingState[IN, OUT], Generic[IN, ACC, OUT]):
    """An :class:`AggregatingState` whose accumulator lives in ``inner``, a value state of
    the descriptor's name: every backend, snapshot format, time-to-live and rescaling path
    that serves value state serves aggregating state unchanged.

    Invariant: ``inner`` holds None for a key without input, else the accumulator after
    every ``add`` so far (an accumulator is never None).

    Args:
        inner: the value state of the accumulators, scoped to the current key.
        function: ``create_accumulator`` / ``add`` / ``get_result``.
    """

    __slots__ = ("_function", "_inner")

    def __init__(self, inner: ValueState[ACC | None], function: Aggregation[IN, ACC, OUT]
                 ) -> None:
        self._inner = inner
        self._function = function

    def get(self) -> OUT | None:
        accumulator = self._inner.value()
        return None if accumulator is None else self._function.get_result(accumulator)

    def add(self, value: IN) -> None:
        accumulator = self._inner.value()
        if accumulator is None:
            accumulator = self._function.create_accumulator()
        self._inner.update(self._function.add(value, accumulator))

    def clear(self) -> None:
        self._inner.clear()
