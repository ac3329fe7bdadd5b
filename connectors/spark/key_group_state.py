"""The keyed state of every key of one key group, held in Python dicts for one call of a
Spark stateful processor: loaded from one serialized value at the start of the call,
written back as one value at its end (a write-back cache over the whole key group).

The state objects are the heap backend's (:mod:`reactive.backends.heap.state`: a dict per
named state, indexed by the current key), so a function sees exactly what it sees
embedded on the heap backend. What travels to Spark's state store is one ``bytes`` value
per key group: the pickle of ``{state name: (serialized, {key: value})}``, with each key's
value as stored (``serialized`` False) or, for a descriptor with a custom serializer, that
serializer's bytes of it (``serialized`` True), as the heap backend's snapshots store them.
Flink's key groups are the unit of state here as in its snapshots (Carbone et al.,
"State Management in Apache Flink", VLDB 2017, section 3.2).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from reactive.backends.heap.state import Table, create_state, descriptor_serializer
from reactive.errors import StateAccessError
from reactive.keygroups import KeyGroupRange
from reactive.state.api import State
from reactive.state.backend import KeyedStateBackend, KeyedStateSnapshot, SnapshotContext
from reactive.state.descriptors import StateDescriptor

__all__ = ["KeyGroupStateBackend"]

_Stored = tuple[bool, dict[Any, Any]]  # (values in a custom serializer's bytes, key -> value)


class KeyGroupStateBackend(KeyedStateBackend):
    """The keyed state of one operator for the key group of the call being processed.

    :meth:`load` replaces the state by a key group's (its serialized value from Spark's
    state store, or None for a key group without state); the operator then runs its
    records, each setting its key (:meth:`set_current_key`); :meth:`dump` serializes what
    the key group holds afterwards. Between the two, every state access is a dict
    operation: Spark's state store is touched once to read and once to write per key
    group and call.

    Args:
        max_parallelism: the dataflow's number of key groups (``ctx.max_parallelism``).
    """

    def __init__(self, max_parallelism: int) -> None:
        self.max_parallelism = max_parallelism
        self.key_group_range = KeyGroupRange(0, max_parallelism - 1)
        self.current_key: Any = None
        # the heap state objects' KeyScope: dict index 0 once a key is set (each Table holds
        # one dict, this key group's); index 1, the heap's failing sentinel, before that
        self._idx = 1
        self._known: dict[Any, int] = {}
        self._tables: dict[str, Table] = {}
        self._states: dict[str, State] = {}
        # states of the loaded key group no descriptor asked for yet in this process: kept
        # as loaded (and written back as they are) until one does
        self._unbound: dict[str, _Stored] = {}

    def set_current_key(self, key: Any) -> None:
        """Scope state calls to ``key`` (a key of the loaded key group)."""
        self.current_key = key
        self._idx = 0

    def get_state(self, descriptor: StateDescriptor) -> State:
        """The state ``descriptor`` names, over the loaded key group's values.

        Raises:
            StateAccessError: for a name used with two kinds of state, or a kind the heap
                backend does not have.
        """
        name = descriptor.name
        table = self._tables.get(name)
        if table is not None:
            known = table.descriptor
            if known is not None and known.kind != descriptor.kind:
                raise StateAccessError(f"state {name!r} is used as {descriptor.kind} and as "
                                       f"{known.kind}")
            table.descriptor = descriptor
            return self._states[name]
        table = Table(1)
        table.descriptor = descriptor
        state: State = create_state(self, table, descriptor)
        self._tables[name] = table
        self._states[name] = state
        stored = self._unbound.pop(name, None)
        if stored is not None:
            table.maps[0] = _decode(stored, descriptor)
        return state

    def load(self, data: bytes | None) -> None:
        """Replace every state by the key group's: ``data`` as :meth:`dump` wrote it, or
        None (a key group without state)."""
        self.current_key = None
        self._idx = 1
        self._known.clear()
        loaded: dict[str, _Stored] = pickle.loads(data) if data else {}
        for name, table in self._tables.items():
            stored = loaded.pop(name, None)
            table.maps[0] = {} if stored is None else _decode(stored, table.descriptor)
        self._unbound = loaded

    def dump(self) -> bytes | None:
        """The key group's state, serialized (None: no key has any state).

        Raises:
            StateAccessError: naming the state and key whose value its descriptor's
                serializer cannot write.
        """
        out: dict[str, _Stored] = dict(self._unbound)
        for name, table in self._tables.items():
            values = table.maps[0]
            if not values:
                continue
            ser = descriptor_serializer(table.descriptor)
            if ser is None:
                out[name] = (False, values)
                continue
            encoded: dict[Any, Any] = {}
            for key, value in values.items():
                try:
                    encoded[key] = ser.serialize(value)
                except Exception as exc:
                    raise StateAccessError(f"state {name!r} of key {key!r}: its serializer "
                                           f"failed: {exc}") from exc
            out[name] = (True, encoded)
        return pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL) if out else None

    def keys(self, state_name: str) -> Iterator[Any]:
        """The keys of the loaded key group with a value in ``state_name`` (a copy)."""
        table = self._tables.get(state_name)
        return iter(list(table.maps[0]) if table is not None else [])

    def snapshot(self, ctx: SnapshotContext) -> KeyedStateSnapshot:
        """Not used: Spark checkpoints its state store with each micro-batch."""
        raise StateAccessError("Spark checkpoints the state of its stateful processors itself")

    def restore(self, handles: list[dict[str, Any]], job_dir: Path) -> None:
        """Not used: Spark restores its state store from the checkpoint location."""
        raise StateAccessError("Spark restores the state of its stateful processors itself")


def _decode(stored: _Stored, descriptor: StateDescriptor | None) -> dict[Any, Any]:
    serialized, values = stored
    if not serialized:
        return values
    ser = descriptor_serializer(descriptor)
    if ser is None:  # bytes a custom serializer wrote, read without it: refuse, not guess
        raise StateAccessError(f"state {getattr(descriptor, 'name', '?')!r} was written with a "
                               "custom serializer its descriptor no longer has")
    return {key: ser.deserialize(value) for key, value in values.items()}
