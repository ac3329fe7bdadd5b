"""The heap backend's state tables and the state objects that read and write them.

A :class:`Table` holds one named state as one dict per key group of the instance's range
(``maps[key group - start]``); the state objects (value, list, map, reducing) index it with
the current key's key group and key, which they read from their backend on every call (the
:class:`KeyScope`). These calls are the per-record hot path: each is one list index and one
dict operation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

from reactive.errors import StateAccessError
from reactive.serialization import Serializer
from reactive.state.api import ListState, MapState, ReducingState, State, ValueState
from reactive.state.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)

__all__ = [
    "KeyScope",
    "Table",
    "create_state",
    "descriptor_serializer",
]


class KeyScope(Protocol):
    """What the state objects read from their backend on every call.

    Attributes:
        current_key: the key state calls are scoped to.
        _idx: its key group's index in the instance's range (``len(range)`` before any key is
            set: the index of the :class:`_NoKey` map, which fails every access).
        _known: the backend's long-lived key -> key-group-index memo (a cleared key leaves
            it).
    """

    current_key: Any
    _idx: int
    _known: dict[Any, int]


class _NoKey(dict):  # type: ignore[type-arg]
    """Stands at index ``len(range)`` so a state call before any key fails clearly."""

    def _fail(self, *_: Any) -> Any:
        raise StateAccessError("keyed state accessed without a current key (outside "
                               "process_element of a keyed operator?)")

    get = __getitem__ = __setitem__ = __contains__ = pop = setdefault = _fail


class Table:
    """One named state: ``maps[kg - start]`` is the dict of that key group.

    Attributes:
        maps: one dict per key group of the range, then the :class:`_NoKey` sentinel.
        descriptor: the descriptor the state was last requested with (None: only restored).
        serialized: whether the values are restored in a custom serializer's bytes, not yet
            bound to a descriptor that can decode them.
    """

    __slots__ = ("descriptor", "maps", "serialized")

    def __init__(self, n: int) -> None:
        self.maps: list[dict[Any, Any]] = [{} for _ in range(n)]
        self.maps.append(_NoKey())
        self.descriptor: StateDescriptor | None = None
        self.serialized = False


def descriptor_serializer(d: StateDescriptor | None) -> Serializer | None:
    """The custom serializer of descriptor ``d`` (None: values are stored as objects)."""
    return getattr(d, "serializer", None) if d is not None else None


def create_state(backend: KeyScope, table: Table, descriptor: StateDescriptor) -> State:
    """Return the state object of ``descriptor``'s kind over ``table``.

    Raises:
        StateAccessError: for a descriptor of an unsupported kind.
    """
    if isinstance(descriptor, ValueStateDescriptor):
        return _HeapValueState(backend, table, descriptor.default)
    if isinstance(descriptor, ListStateDescriptor):
        return _HeapListState(backend, table)
    if isinstance(descriptor, MapStateDescriptor):
        return _HeapMapState(backend, table)
    if isinstance(descriptor, ReducingStateDescriptor):
        return _HeapReducingState(backend, table, descriptor.reduce_fn)
    raise StateAccessError(f"unsupported state descriptor {descriptor!r}")


class _HeapValueState(ValueState):
    __slots__ = ("_b", "_default", "_maps")

    def __init__(self, backend: KeyScope, table: Table, default: Any) -> None:
        self._b = backend
        self._maps = table.maps
        self._default = default

    def value(self) -> Any:
        b = self._b
        return self._maps[b._idx].get(b.current_key, self._default)

    def update(self, value: Any) -> None:
        b = self._b
        self._maps[b._idx][b.current_key] = value

    def clear(self) -> None:
        b = self._b
        key = b.current_key
        self._maps[b._idx].pop(key, None)
        # a key whose state goes may never come back (a TTL'd key space): the long-lived memo
        # does not keep it (a later use hashes it again)
        b._known.pop(key, None)


class _HeapListState(ListState):
    __slots__ = ("_b", "_maps")

    def __init__(self, backend: KeyScope, table: Table) -> None:
        self._b = backend
        self._maps = table.maps

    def get(self) -> list[Any]:
        b = self._b
        return list(self._maps[b._idx].get(b.current_key, ()))

    def add(self, value: Any) -> None:
        b = self._b
        d = self._maps[b._idx]
        lst = d.get(b.current_key)
        if lst is None:
            d[b.current_key] = [value]
        else:
            lst.append(value)

    def add_all(self, values: Any) -> None:
        b = self._b
        d = self._maps[b._idx]
        new = list(values)
        if new:
            d.setdefault(b.current_key, []).extend(new)

    def update(self, values: Any) -> None:
        b = self._b
        new = list(values)
        if new:
            self._maps[b._idx][b.current_key] = new
        else:
            self._maps[b._idx].pop(b.current_key, None)

    def clear(self) -> None:
        b = self._b
        key = b.current_key
        self._maps[b._idx].pop(key, None)
        # a key whose state goes may never come back (a TTL'd key space): the long-lived memo
        # does not keep it (a later use hashes it again)
        b._known.pop(key, None)


class _HeapMapState(MapState):
    __slots__ = ("_b", "_maps")

    def __init__(self, backend: KeyScope, table: Table) -> None:
        self._b = backend
        self._maps = table.maps

    def _map(self, create: bool) -> dict[Any, Any] | None:
        b = self._b
        d = self._maps[b._idx]
        m = d.get(b.current_key)
        if m is None and create:
            m = d[b.current_key] = {}
        return m

    def get(self, user_key: Any, default: Any = None) -> Any:
        m = self._map(False)
        return default if m is None else m.get(user_key, default)

    def put(self, user_key: Any, value: Any) -> None:
        m = self._map(True)
        assert m is not None
        m[user_key] = value

    def remove(self, user_key: Any) -> None:
        m = self._map(False)
        if m is not None:
            m.pop(user_key, None)
            if not m:
                self.clear()

    def contains(self, user_key: Any) -> bool:
        m = self._map(False)
        return m is not None and user_key in m

    def items(self) -> Iterator[tuple[Any, Any]]:
        m = self._map(False)
        return iter(list(m.items()) if m else [])

    def clear(self) -> None:
        b = self._b
        key = b.current_key
        self._maps[b._idx].pop(key, None)
        # a key whose state goes may never come back (a TTL'd key space): the long-lived memo
        # does not keep it (a later use hashes it again)
        b._known.pop(key, None)


class _HeapReducingState(ReducingState):
    __slots__ = ("_b", "_fn", "_maps")

    def __init__(self, backend: KeyScope, table: Table,
                 fn: Callable[[Any, Any], Any]) -> None:
        self._b = backend
        self._maps = table.maps
        self._fn = fn

    def get(self) -> Any:
        b = self._b
        return self._maps[b._idx].get(b.current_key)

    def add(self, value: Any) -> None:
        b = self._b
        d = self._maps[b._idx]
        key = b.current_key
        old = d.get(key, _MISSING)
        d[key] = value if old is _MISSING else self._fn(old, value)

    def clear(self) -> None:
        b = self._b
        key = b.current_key
        self._maps[b._idx].pop(key, None)
        # a key whose state goes may never come back (a TTL'd key space): the long-lived memo
        # does not keep it (a later use hashes it again)
        b._known.pop(key, None)


_MISSING = object()
