"""The heap keyed state backend of one operator instance, and its factory.

:class:`HeapKeyedStateBackend` keeps keyed state in Python dicts, one per (state, key group)
(:mod:`.state`); it finds the current key's key group, takes copy-on-write snapshots
(:mod:`.snapshot`) and restores the key groups of its range from any snapshot handle that a
key-group reader is registered for: its own ``heap-v1`` files (:mod:`.format`), and those of
other backends (RocksDB) through :func:`reactive.state.key_group_stream.read_key_groups`, so a
job moves between backends through any completed checkpoint or savepoint, at any parallelism
(rescaling, thesis section 4.2).

Keys are stored as the Python objects themselves; only their key group comes from their
bytes (:mod:`reactive.key_encoding`, or the ``key_by`` key serializer), which handles record
as ``key_encoding``. A value that cannot be serialized fails the snapshot with
:class:`~reactive.errors.StateSerializationError` naming the state and the key.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from reactive.errors import (
    RestoreError,
    StateAccessError,
    StateSerializationError,
    UnsupportedKeyError,
)
from reactive.key_encoding import (
    check_key_encoding,
    decode_key,
    encode_key,
    key_encoding_name,
    unhashable_key_error,
)
from reactive.keygroups import KeyGroupRange, key_group_of_bytes
from reactive.serialization import Serializer
from reactive.state.api import State
from reactive.state.backend import (
    KeyedStateBackend,
    KeyedStateSnapshot,
    SnapshotContext,
    StateBackend,
)
from reactive.state.descriptors import StateDescriptor
from reactive.state.key_group_stream import (
    KeyGroupStream,
    find_key_group_reader,
    read_key_groups,
)

from .format import BACKEND, FORMAT, iter_heap_key_groups
from .snapshot import HeapSnapshot, serialize_key_group
from .state import Table, create_state, descriptor_serializer

__all__ = ["HeapKeyedStateBackend", "HeapStateBackend"]

_KEY_CACHE_SIZE = 200_000  # keys whose key group is memoized per instance


class HeapKeyedStateBackend(KeyedStateBackend):
    """Keyed state of one operator instance in dicts per key group.

    Args:
        key_group_range: the key groups this instance owns.
        max_parallelism: the job's number of key groups.
        operator_uid: the operator's uid, named in errors (None: unnamed).
    """

    def __init__(self, key_group_range: KeyGroupRange, max_parallelism: int, *,
                 operator_uid: str | None = None) -> None:
        self.key_group_range = key_group_range
        self.max_parallelism = max_parallelism
        self.operator_uid = operator_uid
        self._key_serializer: Serializer | None = None
        self._encode_key: Callable[[Any], bytes] = encode_key
        self._start = key_group_range.start
        self._n = len(key_group_range)
        # key -> index of its key group in this instance's range (bounded memo)
        self._idx_cache: dict[Any, int] = {}
        self._tables: dict[str, Table] = {}
        self.current_key: Any = None
        self._idx = self._n  # the _NoKey sentinel until a key is set
        self._snapshots: list[HeapSnapshot] = []
        self._pending: set[int] = set()

    # ------------------------------------------------------------------ keys
    def set_key_serializer(self, serializer: Serializer | None) -> None:
        """Compute key groups from ``serializer.serialize(key)`` instead of the canonical key
        encoding (``key_by(selector, key_serializer=...)``); call before any key is set or
        state restored. None restores the canonical encoding."""
        self._key_serializer = serializer
        self._encode_key = encode_key if serializer is None else serializer.serialize
        self._idx_cache.clear()

    def set_current_key(self, key: Any) -> None:
        """Scope state calls to ``key``.

        Raises:
            UnsupportedKeyError: if ``key`` is not hashable, or has no canonical encoding
                and no key serializer was set (naming the operator).
            StateAccessError: if ``key`` belongs to another instance's key groups.
        """
        # hot path: one dict hit for a known key; hashing and the range check only on a miss
        try:
            idx = self._idx_cache.get(key)
        except TypeError:
            raise unhashable_key_error(key, self.operator_uid) from None
        if idx is None:
            idx = self._index_of(key)
        if self._pending and idx in self._pending:
            self._capture(idx)
        self.current_key = key
        self._idx = idx

    def _index_of(self, key: Any) -> int:
        try:
            data = self._encode_key(key)
        except UnsupportedKeyError as exc:
            raise exc.for_operator(self.operator_uid) from None
        idx = key_group_of_bytes(data, self.max_parallelism) - self._start
        if not 0 <= idx < self._n:
            raise StateAccessError(
                f"key {key!r} belongs to key group {idx + self._start}, outside this "
                f"instance's range {self.key_group_range.to_list()}: is the key selector "
                "deterministic?"
            )
        if len(self._idx_cache) >= _KEY_CACHE_SIZE:
            self._idx_cache.clear()
        self._idx_cache[key] = idx
        return idx

    # ------------------------------------------------------------------ states
    def _table(self, name: str) -> Table:
        table = self._tables.get(name)
        if table is None:
            table = self._tables[name] = Table(self._n)
        return table

    def get_state(self, descriptor: StateDescriptor) -> State:
        table = self._table(descriptor.name)
        if table.descriptor is not None and table.descriptor.kind != descriptor.kind:
            raise StateAccessError(
                f"state {descriptor.name!r} is registered as {table.descriptor.kind} state, "
                f"requested as {descriptor.kind}"
            )
        if table.serialized:
            ser = descriptor_serializer(descriptor)
            if ser is not None:
                for d in table.maps[: self._n]:
                    for k, v in d.items():
                        d[k] = ser.deserialize(v)
            table.serialized = False
        table.descriptor = descriptor
        return create_state(self, table, descriptor)

    def keys(self, state_name: str) -> Iterator[Any]:
        table = self._tables.get(state_name)
        if table is None:
            return iter(())
        return iter([k for d in table.maps[: self._n] for k in d])

    # ------------------------------------------------------------------ snapshots
    def _capture(self, idx: int) -> None:
        """Copy-on-write: serialize key group index ``idx`` for every snapshot that still
        needs it, before the task changes it."""
        blob: bytes | None = None
        failure: StateSerializationError | None = None
        done = False
        for snap in self._snapshots:
            if idx in snap.pending:
                if not done:
                    try:
                        blob = serialize_key_group(self._tables, idx, snap.ctx.operator_uid)
                    except StateSerializationError as exc:
                        # copy-on-write runs on the data path: the snapshot fails, not the
                        # record that touched the key group
                        failure = exc
                    done = True
                snap.pending.discard(idx)
                snap.blobs[idx] = blob
                if failure is not None and snap.failure is None:
                    snap.failure = failure
        self._recompute_pending()

    def _recompute_pending(self) -> None:
        if len(self._snapshots) == 1:
            self._pending = self._snapshots[0].pending
        else:
            self._pending = set().union(*(s.pending for s in self._snapshots))

    def snapshot(self, ctx: SnapshotContext) -> KeyedStateSnapshot:
        tables = list(self._tables.values())
        pending = {i for i in range(self._n) if any(t.maps[i] for t in tables)}
        snap = HeapSnapshot(ctx, pending, tables=self._tables, start=self._start, n=self._n,
                            key_encoding=key_encoding_name(self._key_serializer),
                            release=self._release)
        self._snapshots.append(snap)
        self._recompute_pending()
        return snap

    def _release(self, snap: HeapSnapshot) -> None:
        if snap in self._snapshots:
            self._snapshots.remove(snap)
            self._recompute_pending()

    # ------------------------------------------------------------------ restore
    def restore(self, handles: list[dict[str, Any]], job_dir: Path) -> None:
        """Load the key groups of this instance's range from ``handles``: heap snapshots,
        or any backend's whose key-group reader is registered (RocksDB: only the key range
        of this instance's key groups is read).

        Raises:
            RestoreError: for a handle no reader is registered for, of another heap format,
                with another key encoding, or unreadable.
        """
        ser = self._key_serializer
        decoder = decode_key if ser is None else ser.deserialize
        for handle in handles:
            check_key_encoding(handle, ser, self.operator_uid)
            backend = handle.get("backend")
            if backend == BACKEND and handle.get("format") == FORMAT:
                stream = iter_heap_key_groups(handle, job_dir, self.key_group_range)
            elif backend != BACKEND and find_key_group_reader(str(backend)) is not None:
                stream = read_key_groups(handle, job_dir, key_group_range=self.key_group_range,
                                         key_decoder=decoder)
            else:
                raise RestoreError(
                    f"cannot restore a {backend!r} snapshot ({handle.get('format')}) "
                    "into the heap backend"
                )
            self._install(stream)

    def _install(self, stream: KeyGroupStream) -> None:
        with stream:
            for kg, serialized, states in stream:
                idx = kg - self._start
                for name, d in states.items():
                    table = self._table(name)
                    if name in serialized:
                        ser = descriptor_serializer(table.descriptor)
                        if ser is not None:
                            d = {k: ser.deserialize(v) for k, v in d.items()}
                        else:
                            table.serialized = True
                    table.maps[idx].update(d)

    def dispose(self) -> None:
        for snap in list(self._snapshots):
            snap.discard()
        self._tables.clear()


class HeapStateBackend(StateBackend):
    """Keyed state in Python dicts; full asynchronous snapshots with copy-on-write (see
    :mod:`reactive.backends.heap`).

    State must fit in memory. Values returned by ``value()``/``get()`` are the stored
    objects: mutate them only through the state API (or after reading them in the same
    ``process_element`` call), never between records.
    """

    name = BACKEND

    def create_keyed_backend(
        self,
        *,
        job_name: str,
        operator_uid: str,
        subtask: int,
        key_group_range: KeyGroupRange,
        max_parallelism: int,
    ) -> KeyedStateBackend:
        return HeapKeyedStateBackend(key_group_range, max_parallelism, operator_uid=operator_uid)
