"""The keyed-state API that user functions see (Flink's ``ValueState``, ``ListState`` ...).

Every call is scoped to the *current key*: the key of the record being processed. Values
returned by ``value()``/``get()`` may be the stored objects themselves; change state only
through ``update``/``add``/``put`` so that snapshots see a consistent view.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["ListState", "MapState", "ReducingState", "State", "ValueState"]


class State(ABC):
    """Base of all keyed state."""

    @abstractmethod
    def clear(self) -> None:
        """Remove the current key's value."""


class ValueState(State):
    """One value per key."""

    @abstractmethod
    def value(self) -> Any:
        """Return the current key's value, or the descriptor's default."""

    @abstractmethod
    def update(self, value: Any) -> None:
        """Set the current key's value."""


class ListState(State):
    """A list of elements per key."""

    @abstractmethod
    def get(self) -> list[Any]:
        """Return the current key's elements (an empty list when there are none)."""

    @abstractmethod
    def add(self, value: Any) -> None:
        """Append one element."""

    def add_all(self, values: Iterable[Any]) -> None:
        """Append several elements."""
        for v in values:
            self.add(v)

    @abstractmethod
    def update(self, values: Iterable[Any]) -> None:
        """Replace the current key's elements."""


class MapState(State):
    """A map of user keys to values per key."""

    @abstractmethod
    def get(self, user_key: Any, default: Any = None) -> Any:
        """Return the value of ``user_key`` or ``default``."""

    @abstractmethod
    def put(self, user_key: Any, value: Any) -> None:
        """Set the value of ``user_key``."""

    @abstractmethod
    def remove(self, user_key: Any) -> None:
        """Remove ``user_key`` (no error when absent)."""

    @abstractmethod
    def contains(self, user_key: Any) -> bool:
        """True when ``user_key`` has a value."""

    @abstractmethod
    def items(self) -> Iterator[tuple[Any, Any]]:
        """Iterate over a snapshot of the current key's (user key, value) pairs."""

    def keys(self) -> Iterator[Any]:
        """Iterate over the user keys."""
        return (k for k, _ in self.items())

    def values(self) -> Iterator[Any]:
        """Iterate over the values."""
        return (v for _, v in self.items())

    def is_empty(self) -> bool:
        """True when the current key has no entries."""
        return next(iter(self.items()), None) is None


class ReducingState(State):
    """A value per key folded with the descriptor's reduce function."""

    @abstractmethod
    def get(self) -> Any:
        """Return the folded value, or None when nothing was added."""

    @abstractmethod
    def add(self, value: Any) -> None:
        """Fold ``value`` into the current key's value."""
