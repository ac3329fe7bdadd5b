"""Operator state: non-keyed lists of entries per operator instance (e.g. source offsets).

Each list declares how it is redistributed when the parallelism changes (Carbone 2018 (PhD
thesis), section 4.2): ``"split"`` deals the entries of all old instances round robin over the
new ones, ``"union"`` gives every new instance all entries.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Literal

__all__ = ["OperatorListState", "OperatorStateStore", "RedistributionMode"]

RedistributionMode = Literal["split", "union"]


class OperatorListState:
    """A list of entries belonging to one operator instance."""

    def __init__(self, mode: RedistributionMode) -> None:
        self.mode = mode
        self._entries: list[Any] = []

    def get(self) -> list[Any]:
        """Return the entries (restored ones after a restore)."""
        return list(self._entries)

    def add(self, entry: Any) -> None:
        """Append an entry."""
        self._entries.append(entry)

    def update(self, entries: Iterable[Any]) -> None:
        """Replace all entries."""
        self._entries = list(entries)

    def clear(self) -> None:
        """Remove all entries."""
        self._entries = []

    def __iter__(self) -> Iterator[Any]:
        return iter(self._entries)


class OperatorStateStore:
    """The operator states of one instance, by name."""

    def __init__(self) -> None:
        self._states: dict[str, OperatorListState] = {}
        self._restored: dict[str, tuple[str, list[Any]]] = {}

    def get_list_state(self, name: str, mode: RedistributionMode = "split") -> OperatorListState:
        """Return the list state ``name``, holding its restored entries if any."""
        state = self._states.get(name)
        if state is None:
            state = OperatorListState(mode)
            if name in self._restored:
                state.update(self._restored.pop(name)[1])
            self._states[name] = state
        return state

    def snapshot(self) -> dict[str, tuple[str, list[Any]]]:
        """Return ``{name: (mode, entries)}`` (copies), including unclaimed restored state."""
        out = {name: (mode, list(entries)) for name, (mode, entries) in self._restored.items()}
        out.update({name: (s.mode, s.get()) for name, s in self._states.items()})
        return out

    def restore(self, states: dict[str, tuple[str, list[Any]]]) -> None:
        """Install entries (already redistributed for this instance)."""
        for name, (mode, entries) in states.items():
            if name in self._states:
                self._states[name].update(entries)
            else:
                self._restored[name] = (mode, list(entries))

    def is_empty(self) -> bool:
        """True when there is nothing to snapshot."""
        return not self._states and not self._restored
