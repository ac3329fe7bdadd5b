"""Keyed state scoped to a window (Flink's namespaced state): what triggers and process
window functions keep per (key, window).

The state backends know keys, not namespaces, so each piece of window-scoped state is one
map state of the operator, ``{window: value}`` per key, named ``<prefix><descriptor name>``.
It is keyed state like any other: snapshotted per key group by every backend, restored and
rescaled with the key. The views below give it the usual :class:`~reactive.state.api.State`
API for the window their owner points them at.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from ..errors import StateAccessError
from ..state.api import ListState, MapState, ReducingState, State, ValueState
from ..state.backend import KeyedStateBackend
from ..state.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from .assigners import TimeWindow

__all__ = ["WindowScope", "WindowStates"]

_MISSING = object()


class WindowScope(Protocol):
    """Whose window a view reads: the trigger or process context the operator moves from
    window to window."""

    @property
    def window(self) -> TimeWindow: ...


class _WindowValueState(ValueState):
    __slots__ = ("default", "map", "scope")

    def __init__(self, map_state: MapState, scope: WindowScope, default: Any) -> None:
        self.map, self.scope, self.default = map_state, scope, default

    def value(self) -> Any:
        return self.map.get(self.scope.window, self.default)

    def update(self, value: Any) -> None:
        self.map.put(self.scope.window, value)

    def clear(self) -> None:
        self.map.remove(self.scope.window)


class _WindowListState(ListState):
    __slots__ = ("map", "scope")

    def __init__(self, map_state: MapState, scope: WindowScope) -> None:
        self.map, self.scope = map_state, scope

    def get(self) -> list[Any]:
        return list(self.map.get(self.scope.window, ()))

    def add(self, value: Any) -> None:
        self.map.put(self.scope.window, [*self.map.get(self.scope.window, ()), value])

    def update(self, values: Iterable[Any]) -> None:
        self.map.put(self.scope.window, list(values))

    def clear(self) -> None:
        self.map.remove(self.scope.window)


class _WindowReducingState(ReducingState):
    __slots__ = ("fn", "map", "scope")

    def __init__(self, map_state: MapState, scope: WindowScope, fn: Any) -> None:
        self.map, self.scope, self.fn = map_state, scope, fn

    def get(self) -> Any:
        return self.map.get(self.scope.window)

    def add(self, value: Any) -> None:
        cur = self.map.get(self.scope.window, _MISSING)
        self.map.put(self.scope.window, value if cur is _MISSING else self.fn(cur, value))

    def clear(self) -> None:
        self.map.remove(self.scope.window)


class WindowStates:
    """The window-scoped states of one operator instance under one name prefix.

    Args:
        backend: the operator's keyed state backend.
        prefix: prefix of the map states' names (``"_trigger/"`` for trigger state,
            ``"_window/"`` for a process window function's per-window state), so that the
            two never collide with each other or with the operator's own state.
        scope: the context whose ``window`` the views read.
    """

    def __init__(self, backend: KeyedStateBackend, prefix: str, scope: WindowScope) -> None:
        self.backend = backend
        self.prefix = prefix
        self.scope = scope
        self._maps: dict[str, MapState] = {}
        self._views: dict[str, State] = {}
        self._descriptors: dict[str, StateDescriptor] = {}

    def _map(self, name: str) -> MapState:
        m = self._maps.get(name)
        if m is None:
            state = self.backend.get_state(MapStateDescriptor(self.prefix + name))
            assert isinstance(state, MapState)
            m = self._maps[name] = state
        return m

    def get(self, descriptor: StateDescriptor) -> State:
        """The state ``descriptor`` of the current key and the scope's window.

        Raises:
            StateAccessError: for a map-state descriptor (not supported per window), or a
                name used before with another kind.
        """
        name = descriptor.name
        view = self._views.get(name)
        if view is not None:
            if type(self._descriptors[name]) is not type(descriptor):
                raise StateAccessError(
                    f"window state {name!r} was declared as {self._descriptors[name].kind} "
                    f"state, now as {descriptor.kind} state")
            return view
        m = self._map(name)
        if isinstance(descriptor, ValueStateDescriptor):
            view = _WindowValueState(m, self.scope, descriptor.default)
        elif isinstance(descriptor, ListStateDescriptor):
            view = _WindowListState(m, self.scope)
        elif isinstance(descriptor, ReducingStateDescriptor):
            view = _WindowReducingState(m, self.scope, descriptor.reduce_fn)
        else:
            raise StateAccessError(
                f"window state {name!r}: {descriptor.kind} state is not supported per window; "
                "use value, list or reducing state")
        self._views[name] = view
        self._descriptors[name] = descriptor
        return view

    def merge(self, descriptor: StateDescriptor, target: TimeWindow,
              sources: Iterable[TimeWindow]) -> None:
        """Fold the state of windows ``sources`` into ``target`` and clear theirs (Flink's
        ``mergePartitionedState`` when session windows merge).

        Raises:
            StateAccessError: for a value-state descriptor (values do not merge; Flink's
                ``mergePartitionedState`` takes mergeable state only).
        """
        if not isinstance(descriptor, ReducingStateDescriptor | ListStateDescriptor):
            raise StateAccessError(
                f"window state {descriptor.name!r}: only reducing and list state merge")
        m = self._map(descriptor.name)
        acc = m.get(target, _MISSING)
        for w in sources:
            if w == target:
                continue
            cur = m.get(w, _MISSING)
            if cur is _MISSING:
                continue
            m.remove(w)
            if acc is _MISSING:
                acc = cur
            elif isinstance(descriptor, ReducingStateDescriptor):
                acc = descriptor.reduce_fn(acc, cur)
            else:
                acc = [*acc, *cur]
        if acc is not _MISSING:
            m.put(target, acc)
