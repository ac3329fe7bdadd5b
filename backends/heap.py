"""The heap state backend: keyed state in Python dicts, one dict per (state, key group).

Snapshots are full and asynchronous, with copy-on-write at key-group granularity:

- *synchronous part*: mark every non-empty key group of the instance as pending for the
  snapshot -- O(number of key groups), independent of the state's size;
- *asynchronous part*: serialize the pending key groups one at a time (pickle, C speed),
  yielding to the event loop between them, and write them to one checksummed file with an
  index ``key group -> (offset, length)``;
- *copy-on-write*: when the task touches a key group that is still pending (any state access
  goes through ``set_current_key``), that key group is serialized first, so the snapshot
  holds exactly the state as of the barrier, even if values are mutated in place later.

Each key group is serialized once per snapshot, by whichever side reaches it first. This is
the heap backend's analogue of Flink's copy-on-write state table (thesis section 4.5.1).

Restore loads only the key groups of the instance's range (rescaling, thesis 4.2), from heap
snapshots or from RocksDB snapshots (``backends.rocksdb.iter_rocksdb_key_groups`` yields the
same per-key-group form), so a job can move between the two backends through any completed
checkpoint or savepoint.

Keys are stored as the Python objects themselves; only their key group comes from their
bytes (:mod:`reactive.key_encoding`, or the ``key_by`` key serializer), which handles record
as ``key_encoding``. A value that cannot be serialized fails the snapshot with
:class:`~reactive.errors.StateSerializationError` naming the state and the key.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import pickle
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from reactive.checkpoint.files import write_atomic
from reactive.errors import (
    RestoreError,
    StateAccessError,
    StateSerializationError,
    UnsupportedKeyError,
)
from reactive.key_encoding import (
    KEY_ENCODING,
    check_key_encoding,
    decode_key,
    encode_key,
    key_encoding_name,
    unhashable_key_error,
)
from reactive.keygroups import KeyGroupRange, key_group_of_bytes
from reactive.serialization import Serializer
from reactive.state.api import ListState, MapState, ReducingState, State, ValueState
from reactive.state.backend import (
    KeyedStateBackend,
    KeyedStateSnapshot,
    SnapshotContext,
    StateBackend,
)
from reactive.state.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)

__all__ = [
    "HeapKeyedStateBackend",
    "HeapStateBackend",
    "iter_heap_key_groups",
    "read_heap_snapshot",
    "write_heap_snapshot",
]

FORMAT = "heap-v1"
_KEY_CACHE_SIZE = 200_000  # keys whose key group is memoized per instance
_YIELD_EVERY = 0.002  # seconds of serialization between two yields to the event loop


class _NoKey(dict):  # type: ignore[type-arg]
    """Stands at index ``len(range)`` so a state call before any key fails clearly."""

    def _fail(self, *_: Any) -> Any:
        raise StateAccessError("keyed state accessed without a current key (outside "
                               "process_element of a keyed operator?)")

    get = __getitem__ = __setitem__ = __contains__ = pop = setdefault = _fail


class _Table:
    """One named state: ``maps[kg - start]`` is the dict of that key group."""

    __slots__ = ("descriptor", "maps", "serialized")

    def __init__(self, n: int) -> None:
        self.maps: list[dict[Any, Any]] = [{} for _ in range(n)]
        self.maps.append(_NoKey())
        self.descriptor: StateDescriptor | None = None
        # values restored in a custom serializer's bytes, not yet bound to a descriptor
        self.serialized = False


def _serializer(d: StateDescriptor | None) -> Serializer | None:
    return getattr(d, "serializer", None) if d is not None else None


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
        self._tables: dict[str, _Table] = {}
        self.current_key: Any = None
        self._idx = self._n  # the _NoKey sentinel until a key is set
        self._snapshots: list[_HeapSnapshot] = []
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

    def _table(self, name: str) -> _Table:
        table = self._tables.get(name)
        if table is None:
            table = self._tables[name] = _Table(self._n)
        return table

    def get_state(self, descriptor: StateDescriptor) -> State:
        table = self._table(descriptor.name)
        if table.descriptor is not None and table.descriptor.kind != descriptor.kind:
            raise StateAccessError(
                f"state {descriptor.name!r} is registered as {table.descriptor.kind} state, "
                f"requested as {descriptor.kind}"
            )
        if table.serialized:
            ser = _serializer(descriptor)
            if ser is not None:
                for d in table.maps[: self._n]:
                    for k, v in d.items():
                        d[k] = ser.deserialize(v)
            table.serialized = False
        table.descriptor = descriptor
        if isinstance(descriptor, ValueStateDescriptor):
            return _HeapValueState(self, table, descriptor.default)
        if isinstance(descriptor, ListStateDescriptor):
            return _HeapListState(self, table)
        if isinstance(descriptor, MapStateDescriptor):
            return _HeapMapState(self, table)
        if isinstance(descriptor, ReducingStateDescriptor):
            return _HeapReducingState(self, table, descriptor.reduce_fn)
        raise StateAccessError(f"unsupported state descriptor {descriptor!r}")

    def keys(self, state_name: str) -> Iterator[Any]:
        table = self._tables.get(state_name)
        if table is None:
            return iter(())
        return iter([k for d in table.maps[: self._n] for k in d])

    # ------------------------------------------------------------------ snapshots
    def _serialize_key_group(self, idx: int, operator: str) -> bytes | None:
        """Return the snapshot bytes of key group ``idx`` (None when it holds no state).

        Raises:
            StateSerializationError: if a value (or key) cannot be serialized, naming
                ``operator``, the state and the key.
        """
        try:
            data: dict[str, dict[Any, Any]] = {}
            for name, table in self._tables.items():
                d = table.maps[idx]
                if not d:
                    continue
                ser = None if table.serialized else _serializer(table.descriptor)
                data[name] = {k: ser.serialize(v) for k, v in d.items()} if ser else d
            if not data:
                return None
            serialized = [name for name, t in self._tables.items() if name in data and
                          (t.serialized or _serializer(t.descriptor) is not None)]
            return pickle.dumps((serialized, data), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            # the fast path pickles whole key groups at C speed; only now look entry by
            # entry for the one to name
            error = self._unserializable(idx, operator)
            if error is None:  # no entry fails on its own: not a value's fault
                raise
            raise error from exc

    def _unserializable(self, idx: int, operator: str) -> StateSerializationError | None:
        """Return the error naming the first entry of key group ``idx`` that cannot be
        serialized (None when every entry can on its own)."""
        for name, table in self._tables.items():
            ser = None if table.serialized else _serializer(table.descriptor)
            for k, v in table.maps[idx].items():
                try:
                    pickle.dumps((k, ser.serialize(v) if ser else v),
                                 protocol=pickle.HIGHEST_PROTOCOL)
                except Exception as exc:
                    return StateSerializationError(operator, name, k, exc)
        return None

    def _capture(self, idx: int) -> None:
        blob: bytes | None = None
        failure: StateSerializationError | None = None
        done = False
        for snap in self._snapshots:
            if idx in snap.pending:
                if not done:
                    try:
                        blob = self._serialize_key_group(idx, snap.ctx.operator_uid)
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
        snap = _HeapSnapshot(self, ctx, pending)
        self._snapshots.append(snap)
        self._recompute_pending()
        return snap

    def _release(self, snap: _HeapSnapshot) -> None:
        if snap in self._snapshots:
            self._snapshots.remove(snap)
            self._recompute_pending()

    def restore(self, handles: list[dict[str, Any]], job_dir: Path) -> None:
        for handle in handles:
            check_key_encoding(handle, self._key_serializer, self.operator_uid)
            if handle.get("backend") == "rocksdb":
                self._restore_rocksdb(handle, job_dir)
                continue
            if handle.get("backend") != "heap" or handle.get("format") != FORMAT:
                raise RestoreError(
                    f"cannot restore a {handle.get('backend')!r} snapshot "
                    f"({handle.get('format')}) into the heap backend"
                )
            path = job_dir / handle["files"][0]["path"]
            try:
                with open(path, "rb") as f:
                    for kg_str, (offset, length) in handle["key_groups"].items():
                        kg = int(kg_str)
                        if kg not in self.key_group_range:
                            continue
                        f.seek(offset)
                        serialized, data = pickle.loads(f.read(length))
                        self._install(kg - self._start, serialized, data)
            except (OSError, pickle.UnpicklingError, EOFError, ValueError) as exc:
                raise RestoreError(f"cannot read heap snapshot {path}: {exc}") from exc

    def _restore_rocksdb(self, handle: dict[str, Any], job_dir: Path) -> None:
        """Load the key groups of this instance's range from a RocksDB snapshot handle (a
        heap <-> RocksDB restore); only their key range of the RocksDB files is read."""
        try:
            from backends.rocksdb import iter_rocksdb_key_groups
        except ImportError as exc:  # rocksdict not installed
            raise RestoreError(f"cannot restore a RocksDB snapshot: {exc}") from exc
        scratch = Path(tempfile.mkdtemp(prefix="reactive-restore-")) / "db"
        ser = self._key_serializer
        try:
            for kg, serialized, data in iter_rocksdb_key_groups(
                    handle, job_dir, scratch, self.key_group_range,
                    key_decoder=decode_key if ser is None else ser.deserialize):
                self._install(kg - self._start, serialized, data)
        finally:
            shutil.rmtree(scratch.parent, ignore_errors=True)

    def _install(self, idx: int, serialized: list[str], data: dict[str, dict[Any, Any]]) -> None:
        for name, d in data.items():
            table = self._table(name)
            if name in serialized:
                ser = _serializer(table.descriptor)
                if ser is not None:
                    d = {k: ser.deserialize(v) for k, v in d.items()}
                else:
                    table.serialized = True
            table.maps[idx].update(d)

    def dispose(self) -> None:
        for snap in list(self._snapshots):
            snap.discard()
        self._tables.clear()


class _HeapSnapshot(KeyedStateSnapshot):
    def __init__(self, backend: HeapKeyedStateBackend, ctx: SnapshotContext,
                 pending: set[int]) -> None:
        self.backend = backend
        self.ctx = ctx
        self.pending = pending
        self.blobs: dict[int, bytes | None] = {}
        # set when copy-on-write met a value that cannot be serialized
        self.failure: StateSerializationError | None = None

    async def write(self) -> dict[str, Any]:
        """Write the snapshot file and return its handle.

        Raises:
            StateSerializationError: if a value or key cannot be serialized (naming the
                operator, the state and the key).
            OSError: if the file cannot be written.
        """
        b = self.backend
        ctx = self.ctx
        if self.failure is not None:
            b._release(self)
            raise self.failure
        path = ctx.exclusive_path(".heap")
        tmp = path.with_name("." + path.name + ".tmp")
        index: dict[str, list[int]] = {}
        h = hashlib.sha256()
        offset = 0
        try:
            with open(tmp, "wb") as f:
                last_yield = time.perf_counter()
                for idx in range(b._n):
                    if idx in self.blobs:
                        blob = self.blobs.pop(idx)
                    elif idx in self.pending:
                        blob = b._serialize_key_group(idx, ctx.operator_uid)
                        self.pending.discard(idx)
                    else:
                        continue
                    if self.failure is not None:
                        raise self.failure
                    if blob:
                        f.write(blob)
                        h.update(blob)
                        index[str(idx + b._start)] = [offset, len(blob)]
                        offset += len(blob)
                    if time.perf_counter() - last_yield > _YIELD_EVERY:
                        await asyncio.sleep(0)
                        last_yield = time.perf_counter()
                b._release(self)
                if self.failure is not None:
                    raise self.failure
                f.flush()
                # inline: fsync takes < 1 ms here, a worker thread would first wait for the GIL
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        finally:
            b._release(self)
        return {
            "backend": "heap",
            "format": FORMAT,
            "files": [{"path": ctx.relative(path), "size": offset, "sha256": h.hexdigest()}],
            "key_groups": index,
            "key_encoding": key_encoding_name(b._key_serializer),
        }

    def discard(self) -> None:
        self.backend._release(self)
        self.blobs.clear()


# ---------------------------------------------------------------------- state objects
class _HeapValueState(ValueState):
    __slots__ = ("_b", "_default", "_maps")

    def __init__(self, backend: HeapKeyedStateBackend, table: _Table, default: Any) -> None:
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
        self._maps[b._idx].pop(b.current_key, None)


class _HeapListState(ListState):
    __slots__ = ("_b", "_maps")

    def __init__(self, backend: HeapKeyedStateBackend, table: _Table) -> None:
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
        self._maps[b._idx].pop(b.current_key, None)


class _HeapMapState(MapState):
    __slots__ = ("_b", "_maps")

    def __init__(self, backend: HeapKeyedStateBackend, table: _Table) -> None:
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
        self._maps[b._idx].pop(b.current_key, None)


class _HeapReducingState(ReducingState):
    __slots__ = ("_b", "_fn", "_maps")

    def __init__(self, backend: HeapKeyedStateBackend, table: _Table,
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
        self._maps[b._idx].pop(b.current_key, None)


_MISSING = object()


def read_heap_snapshot(handle: dict[str, Any], job_dir: Path) -> dict[str, dict[Any, Any]]:
    """Read a heap snapshot handle into ``{state name: {key: value}}`` (all key groups).

    Values written with a descriptor's custom serializer stay bytes. Used by tools that
    inspect checkpoints (and tests that compare a checkpoint with the expected state).

    Raises:
        RestoreError: if the handle is not a heap snapshot or its file is unreadable.
    """
    if handle.get("backend") != "heap" or handle.get("format") != FORMAT:
        raise RestoreError(f"not a heap snapshot handle: {handle.get('backend')!r}")
    path = job_dir / handle["files"][0]["path"]
    out: dict[str, dict[Any, Any]] = {}
    try:
        with open(path, "rb") as f:
            for offset, length in handle["key_groups"].values():
                f.seek(offset)
                _, data = pickle.loads(f.read(length))
                for name, d in data.items():
                    out.setdefault(name, {}).update(d)
    except (OSError, pickle.UnpicklingError, EOFError) as exc:
        raise RestoreError(f"cannot read heap snapshot {path}: {exc}") from exc
    return out


def iter_heap_key_groups(
    handle: dict[str, Any], job_dir: Path, key_group_range: KeyGroupRange | None = None
) -> Iterator[tuple[int, list[str], dict[str, dict[Any, Any]]]]:
    """Yield ``(key group, serialized state names, {state name: {key: value}})`` for each key
    group of a heap snapshot handle (in ``key_group_range`` when given: the others are not
    read), one key group in memory at a time.

    Values of the states named in the second item are still in their descriptor's custom
    serializer's bytes. Used by tools that need the key group of each entry (the PySpark
    bridge's ``CheckpointReader``, like Flink's State Processor API).

    Raises:
        RestoreError: if the handle is not a heap snapshot or its file is unreadable.
    """
    if handle.get("backend") != "heap" or handle.get("format") != FORMAT:
        raise RestoreError(f"not a heap snapshot handle: {handle.get('backend')!r}")
    path = job_dir / handle["files"][0]["path"]
    try:
        with open(path, "rb") as f:
            for kg_str, (offset, length) in handle["key_groups"].items():
                kg = int(kg_str)
                if key_group_range is not None and kg not in key_group_range:
                    continue
                f.seek(offset)
                serialized, data = pickle.loads(f.read(length))
                yield kg, serialized, data
    except (OSError, pickle.UnpicklingError, EOFError, ValueError) as exc:
        raise RestoreError(f"cannot read heap snapshot {path}: {exc}") from exc


def write_heap_snapshot(
    path: Path, job_dir: Path, key_groups: Iterable[tuple[int, dict[str, dict[Any, Any]]]],
    key_encoding: str = KEY_ENCODING,
) -> dict[str, Any]:
    """Write keyed state as a heap snapshot file (atomically) and return its handle, the
    same ``keyed_state`` handle a checkpoint of this backend holds (for savepoints written
    outside a running job, e.g. the PySpark bridge's ``SavepointWriter``).

    Args:
        path: the file to write, inside ``job_dir`` (e.g. ``<job_dir>/chk-1/uid-0.heap``).
        job_dir: the job directory the handle's path is relative to.
        key_groups: ``(key group, {state name: {key: value}})`` pairs, each key group at most
            once; values are stored as given (restored as is, whatever the descriptor's
            serializer); key groups without entries are skipped.
        key_encoding: how the key groups were computed from the keys (see
            :func:`reactive.key_encoding.key_encoding_name`); a restore checks it.

    Returns:
        ``{"backend": "heap", "format": "heap-v1", "files": [{path, size, sha256}],
        "key_groups": {kg: [offset, length]}, "key_encoding": key_encoding}``.
    """
    index: dict[str, list[int]] = {}

    def blobs() -> Iterator[bytes]:
        offset = 0
        for kg, data in key_groups:
            data = {name: d for name, d in data.items() if d}
            if not data:
                continue
            blob = pickle.dumps(([], data), protocol=pickle.HIGHEST_PROTOCOL)
            index[str(kg)] = [offset, len(blob)]
            offset += len(blob)
            yield blob

    size, sha = write_atomic(path, blobs())
    return {
        "backend": "heap",
        "format": FORMAT,
        "files": [{"path": path.relative_to(job_dir).as_posix(), "size": size, "sha256": sha}],
        "key_groups": index,
        "key_encoding": key_encoding,
    }


class HeapStateBackend(StateBackend):
    """Keyed state in Python dicts; full asynchronous snapshots (see the module docstring).

    State must fit in memory. Values returned by ``value()``/``get()`` are the stored
    objects: mutate them only through the state API (or after reading them in the same
    ``process_element`` call), never between records.
    """

    name = "heap"

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
