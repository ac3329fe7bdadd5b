"""Broadcast state: a map that every instance of an operator holds the same copy of (Flink's
broadcast state pattern, ``BroadcastState`` / ``ReadOnlyBroadcastState``).

It lives in operator state: every instance snapshots its copy, tagged with its index and
parallelism, as a ``union`` list, so a restore at any parallelism hands every new instance
all copies; each keeps the copy of old instance ``subtask % old_parallelism`` (the copies
are equal when updates are deterministic), as Flink's broadcast redistribution does.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..errors import StateAccessError
from .descriptors import MapStateDescriptor
from .operator_state import OperatorStateStore

__all__ = ["BroadcastState", "BroadcastStateStore", "ReadOnlyBroadcastState"]


class ReadOnlyBroadcastState:
    """A read-only view of a broadcast state (what ``process_element`` sees).

    Args:
        name: the state's name (its descriptor's).
        entries: the map (shared with the writable view).
    """

    __slots__ = ("_entries", "name")

    def __init__(self, name: str, entries: dict[Any, Any]) -> None:
        self.name = name
        self._entries = entries

    def get(self, key: Any, default: Any = None) -> Any:
        """The value of ``key``, or ``default``."""
        return self._entries.get(key, default)

    def contains(self, key: Any) -> bool:
        """True when ``key`` has a value."""
        return key in self._entries

    def items(self) -> Iterator[tuple[Any, Any]]:
        """The (key, value) pairs, in insertion order."""
        return iter(list(self._entries.items()))

    def keys(self) -> Iterator[Any]:
        """The keys, in insertion order."""
        return iter(list(self._entries))

    def values(self) -> Iterator[Any]:
        """The values, in insertion order."""
        return iter(list(self._entries.values()))

    def is_empty(self) -> bool:
        """True when the map holds nothing."""
        return not self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, key: Any, value: Any) -> None:
        """Refused: only ``process_broadcast_element`` changes broadcast state.

        Raises:
            StateAccessError: always.
        """
        raise self._refuse("put")

    def remove(self, key: Any) -> None:
        """Refused (see :meth:`put`).

        Raises:
            StateAccessError: always.
        """
        raise self._refuse("remove")

    def clear(self) -> None:
        """Refused (see :meth:`put`).

        Raises:
            StateAccessError: always.
        """
        raise self._refuse("clear")

    def _refuse(self, what: str) -> StateAccessError:
        return StateAccessError(
            f"broadcast state {self.name!r} is read-only in process_element and on_timer: "
            f"{what}() it in process_broadcast_element, which every instance runs for every "
            "broadcast record (so all instances keep the same state)")


class BroadcastState(ReadOnlyBroadcastState):
    """The writable view of a broadcast state (what ``process_broadcast_element`` sees)."""

    __slots__ = ()

    def put(self, key: Any, value: Any) -> None:
        """Set the value of ``key``."""
        self._entries[key] = value

    def remove(self, key: Any) -> None:
        """Remove ``key`` (no error when absent)."""
        self._entries.pop(key, None)

    def clear(self) -> None:
        """Remove every entry."""
        self._entries.clear()


_PREFIX = "broadcast-state/"


class BroadcastStateStore:
    """The broadcast states of one operator instance, snapshotted into its operator state.

    Args:
        operator_state: the instance's operator state store.
        subtask: the instance's index; ``parallelism``: the operator's parallelism.
    """

    def __init__(self, operator_state: OperatorStateStore, subtask: int,
                 parallelism: int) -> None:
        self._operator_state = operator_state
        self._subtask = subtask
        self._parallelism = parallelism
        self._maps: dict[str, dict[Any, Any]] = {}
        self._descriptors: dict[str, MapStateDescriptor] = {}

    def declare(self, descriptors: list[MapStateDescriptor]) -> None:
        """Create (or restore) the states of ``descriptors``.

        Raises:
            StateAccessError: when a descriptor is not a ``MapStateDescriptor``.
        """
        for d in descriptors:
            if not isinstance(d, MapStateDescriptor):
                raise StateAccessError(
                    f"broadcast state needs a MapStateDescriptor, got {type(d).__name__} "
                    f"{getattr(d, 'name', d)!r}")
            if d.name in self._maps:
                continue
            self._descriptors[d.name] = d
            self._maps[d.name] = self._restored(d.name)

    def _restored(self, name: str) -> dict[Any, Any]:
        entries = self._operator_state.get_list_state(_PREFIX + name, "union").get()
        if not entries:
            return {}
        # every old instance wrote its copy, tagged (subtask, parallelism, items)
        old_parallelism = entries[0][1]
        wanted = self._subtask % old_parallelism
        for subtask, _, items in entries:
            if subtask == wanted:
                return dict(items)
        return dict(entries[0][2])

    def get(self, descriptor: MapStateDescriptor, writable: bool) -> ReadOnlyBroadcastState:
        """The state of ``descriptor``: the writable view or the read-only one.

        Raises:
            StateAccessError: for a descriptor the operator was not built with (Flink's
                rule: the broadcast states are those given to ``broadcast(...)``).
        """
        entries = self._maps.get(descriptor.name)
        if entries is None:
            raise StateAccessError(
                f"no broadcast state {descriptor.name!r}: the broadcast states are the "
                f"descriptors given to broadcast(...) ({sorted(self._maps)})")
        cls = BroadcastState if writable else ReadOnlyBroadcastState
        return cls(descriptor.name, entries)

    def snapshot(self) -> None:
        """Copy every state into operator state (the synchronous part of a checkpoint)."""
        for name, entries in self._maps.items():
            self._operator_state.get_list_state(_PREFIX + name, "union").update(
                [(self._subtask, self._parallelism, list(entries.items()))])
