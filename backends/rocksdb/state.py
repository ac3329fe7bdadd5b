"""The RocksDB backend's write-back cache and the state objects that read and write through
it.

A RocksDB get + put per record costs microseconds from Python, so each instance keeps a
bounded *write-back cache* of deserialized values per state (:class:`StateTable`). Reads hit
the cache first (:meth:`WriteBackCache._load` on a miss: the frozen generations of pending
snapshots, then RocksDB); writes only mark the entry dirty (:meth:`WriteBackCache._store`).
Dirty entries go to RocksDB in one ``WriteBatch`` (:meth:`WriteBackCache._flush_dirty`) when
there are ``write_batch_entries`` of them, when the cache overflows ``cache_entries`` (it is
then emptied), and before ``keys()``. A snapshot freezes the cache instead
(:meth:`WriteBackCache._freeze`, :mod:`.generations`): while a frozen generation is not yet in
RocksDB nothing newer is written there, and the cache grows up to ``2 * cache_entries``
entries per state before the task writes the pending generations itself. A value its
serializer refuses fails that write with :class:`~reactive.errors.StateSerializationError`
naming the operator, the state and the key.

Every state kind stores one value per key (:mod:`.keys`): list and map state are serialized
as a whole by their descriptor's serializer (pickle by default).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rocksdict import Rdict, WriteBatch

from reactive.errors import StateAccessError, StateSerializationError
from reactive.state.api import ListState, MapState, ReducingState, State, ValueState
from reactive.state.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)

from .generations import ABSENT as _ABSENT
from .generations import MISS as _MISS
from .generations import FrozenTable, Generation, GenerationQueue
from .keys import state_id

__all__ = ["StateTable", "WriteBackCache", "create_state", "pickle_dumps"]


def pickle_dumps(value: Any) -> bytes:
    """The default value serializer (pickle, highest protocol)."""
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


class StateTable:
    """One named state: its id, kind, serializer and write-back cache.

    ``kind`` is None for a state restored from a snapshot that does not record kinds (a heap
    snapshot) until a descriptor binds it; ``custom`` says whether its stored values are a
    custom serializer's bytes (else pickles), known from the descriptor or the snapshot.
    """

    __slots__ = ("cache", "custom", "descriptor", "dirty", "dumps", "kind", "loads", "name",
                 "sid")

    def __init__(self, name: str, kind: str | None) -> None:
        self.name = name
        self.kind = kind
        self.custom = False
        self.sid = state_id(name)
        self.descriptor: StateDescriptor | None = None
        self.cache: dict[Any, Any] = {}
        # dirty key -> its key group's 2 bytes (known when the entry was written)
        self.dirty: dict[Any, bytes] = {}
        self.dumps: Callable[[Any], bytes] = pickle_dumps
        self.loads: Callable[[bytes], Any] = pickle.loads

    def bind(self, descriptor: StateDescriptor) -> None:
        """Use ``descriptor``'s serializer (and kind, if none was known)."""
        self.descriptor = descriptor
        ser = getattr(descriptor, "serializer", None)
        self.custom = ser is not None
        if self.kind is None:
            self.kind = descriptor.kind
        if ser is None:
            self.dumps, self.loads = pickle_dumps, pickle.loads
        else:
            self.dumps, self.loads = ser.serialize, ser.deserialize


class WriteBackCache:
    """The states of one instance, cached in front of its RocksDB (base of the keyed
    backend, which sets the current key and owns the database's lifecycle).

    Args:
        db: the instance's database.
        cache_entries: cached keys per state before the cache is emptied.
        write_batch_entries: dirty keys per state before they are written to RocksDB.
        encode_key: key -> stored key bytes.
        operator_uid: the operator's uid, named in errors (None: unnamed).

    Attributes:
        current_key: the key state calls are scoped to.
        _kgb: its key group's 2-byte prefix (None before any key is set).
        _gens: the frozen generations of pending snapshots (:mod:`.generations`).
    """

    def __init__(self, db: Rdict, cache_entries: int, write_batch_entries: int,
                 encode_key: Callable[[Any], bytes], operator_uid: str | None) -> None:
        self._db = db
        self.cache_entries = max(1, cache_entries)
        self.write_batch_entries = max(1, write_batch_entries)
        # entries per state the cache may hold while a generation is pending (nothing may
        # be written to RocksDB then); past it the task drains the pending generations
        self._pending_limit = 2 * max(self.cache_entries, self.write_batch_entries)
        self._encode_key = encode_key
        self.operator_uid = operator_uid
        self.current_key: Any = None
        self._kgb: bytes | None = None
        self._tables: dict[str, StateTable] = {}
        self._gens = GenerationQueue(lambda: self._db, lambda: self._encode_key,
                                     self._retired)

    def _require_key(self) -> bytes:
        kgb = self._kgb
        if kgb is None:
            raise StateAccessError("keyed state accessed without a current key (outside "
                                   "process_element of a keyed operator?)")
        return kgb

    def _table(self, name: str, kind: str | None) -> StateTable:
        """The table of state ``name`` (created with ``kind`` if new).

        Raises:
            StateAccessError: if the name's state id collides with another state's.
        """
        table = self._tables.get(name)
        if table is None:
            table = StateTable(name, kind)
            for other in self._tables.values():
                if other.sid == table.sid:
                    raise StateAccessError(
                        f"state names {name!r} and {other.name!r} have the same RocksDB id; "
                        "rename one of them"
                    )
            self._tables[name] = table
        return table

    def _load(self, table: StateTable, key: Any) -> Any:
        """Cache miss: read ``key`` of ``table`` from the newest frozen generation holding
        it, else from RocksDB, into the cache.

        Raises:
            StateSerializationError: if a frozen dirty value taken over cannot be
                serialized (:meth:`.generations.FrozenTable.promote`).
        """
        kgb = self._require_key()
        value = _MISS
        for gen in reversed(self._gens.pending):
            value = gen.lookup(table.name, key)
            if value is not _MISS:
                break
        if value is _MISS:
            raw = self._db.get(kgb + table.sid + self._encode_key(key))
            value = _ABSENT if raw is None else table.loads(raw)
        if len(table.cache) >= self.cache_entries:
            self._evict(table)
        table.cache[key] = value
        return value

    def _store(self, table: StateTable, key: Any, value: Any) -> None:
        """Write-back: cache ``value`` (``_ABSENT`` deletes) and mark it dirty."""
        kgb = self._require_key()
        if key not in table.cache and len(table.cache) >= self.cache_entries:
            self._evict(table)
        table.cache[key] = value
        dirty = table.dirty
        dirty[key] = kgb
        if len(dirty) >= self.write_batch_entries:
            self._flush_dirty(table)

    def _may_write(self, table: StateTable) -> bool:
        """Whether ``table``'s dirty entries may go to RocksDB now: no generation is
        pending, or the cache outgrew the pending bound (then drain the generations)."""
        if not self._gens.pending:
            return True
        if len(table.cache) < self._pending_limit:
            return False
        self._gens.drain()
        return True

    def _evict(self, table: StateTable) -> None:
        if self._may_write(table):
            self._flush_dirty(table)
            table.cache.clear()

    def _freeze(self, checkpoint_id: int, local: Path | None) -> Generation:
        """Synchronous part of a snapshot: the current cache of every state becomes a
        frozen generation (O(number of states)); the states continue in empty dicts."""
        tables = []
        for t in self._tables.values():
            if t.cache:
                tables.append(FrozenTable(t, self.operator_uid))
                t.cache = {}
                t.dirty = {}
        gen = Generation(checkpoint_id, tables, local)
        self._gens.add(gen)
        return gen

    def _retired(self, gen: Generation, last: bool) -> None:
        """``gen`` is in RocksDB: keep its values cached where the current generation has
        no newer ones, if it was the last frozen generation and the cache has room."""
        if not last:
            return
        for ft in gen.tables.values():
            t = self._tables.get(ft.name)
            if t is None or len(t.cache) + len(ft.values) > self.cache_entries:
                continue
            merged = ft.values | t.cache  # the current generation's values win
            t.cache.clear()
            t.cache.update(merged)

    def _flush_dirty(self, only: StateTable | None = None) -> None:
        """Write dirty cache entries to RocksDB in one WriteBatch (entries stay cached);
        nothing while a frozen generation is pending and the cache is within its bound.

        Raises:
            StateSerializationError: if a value's serializer refuses it (nothing of the
                batch is written; the entries stay dirty).
        """
        if only is not None:
            if not self._may_write(only):
                return
        elif self._gens.pending:
            self._gens.drain()
        tables = [only] if only is not None else list(self._tables.values())
        if not any(t.dirty for t in tables):
            return
        wb = WriteBatch(raw_mode=True)
        put = wb.put
        delete = wb.delete
        encode = self._encode_key
        for t in tables:
            if not t.dirty:
                continue
            sid = t.sid
            cache = t.cache
            dumps = t.dumps
            for key, kgb in t.dirty.items():
                value = cache.get(key, _ABSENT)
                if value is _ABSENT:
                    delete(kgb + sid + encode(key))
                else:
                    try:
                        data = dumps(value)
                    except Exception as exc:
                        raise StateSerializationError(
                            self.operator_uid or "?", t.name, key, exc) from exc
                    put(kgb + sid + encode(key), data)
        for t in tables:
            t.dirty.clear()
        self._db.write(wb)

    def _clear_cache(self) -> None:
        """Drop every cached and dirty entry (the instance is disposed)."""
        for t in self._tables.values():
            t.cache.clear()
            t.dirty.clear()


def create_state(backend: WriteBackCache, table: StateTable,
                 descriptor: StateDescriptor) -> State:
    """Return the state object of ``descriptor``'s kind over ``table``.

    Raises:
        StateAccessError: for a descriptor of an unsupported kind.
    """
    if isinstance(descriptor, ValueStateDescriptor):
        return _ValueState(backend, table, descriptor.default)
    if isinstance(descriptor, ListStateDescriptor):
        return _ListState(backend, table)
    if isinstance(descriptor, MapStateDescriptor):
        return _MapState(backend, table)
    if isinstance(descriptor, ReducingStateDescriptor):
        return _ReducingState(backend, table, descriptor.reduce_fn)
    raise StateAccessError(f"unsupported state descriptor {descriptor!r}")


class _CachedState:
    """Every state kind stores one value per key: reads go through the write-back cache,
    then RocksDB; writes go to the cache (``_store``); clearing stores ``_ABSENT``."""

    __slots__ = ("_b", "_t")

    def __init__(self, backend: WriteBackCache, table: StateTable) -> None:
        self._b = backend
        self._t = table

    def _get(self) -> Any:
        key = self._b.current_key
        # table.cache, not a reference kept here: a snapshot swaps in a new dict
        v = self._t.cache.get(key, _MISS)
        return self._b._load(self._t, key) if v is _MISS else v

    def clear(self) -> None:
        self._b._store(self._t, self._b.current_key, _ABSENT)


class _ValueState(_CachedState, ValueState):
    __slots__ = ("_default",)

    def __init__(self, backend: WriteBackCache, table: StateTable, default: Any) -> None:
        super().__init__(backend, table)
        self._default = default

    def value(self) -> Any:
        v = self._get()
        return self._default if v is _ABSENT else v

    def update(self, value: Any) -> None:
        self._b._store(self._t, self._b.current_key, value)


class _ListState(_CachedState, ListState):
    __slots__ = ()

    def get(self) -> list[Any]:
        v = self._get()
        return [] if v is _ABSENT else list(v)

    def add(self, value: Any) -> None:
        v = self._get()
        # appending in place is safe: a list taken over from a frozen generation was
        # serialized there first (FrozenTable.promote)
        if v is _ABSENT:
            v = [value]
        else:
            v.append(value)
        self._b._store(self._t, self._b.current_key, v)

    def add_all(self, values: Any) -> None:
        new = list(values)
        if new:
            v = self._get()
            if v is _ABSENT:
                v = new
            else:
                v.extend(new)
            self._b._store(self._t, self._b.current_key, v)

    def update(self, values: Any) -> None:
        new = list(values)
        self._b._store(self._t, self._b.current_key, new if new else _ABSENT)


class _MapState(_CachedState, MapState):
    __slots__ = ()

    def get(self, user_key: Any, default: Any = None) -> Any:
        m = self._get()
        return default if m is _ABSENT else m.get(user_key, default)

    def put(self, user_key: Any, value: Any) -> None:
        m = self._get()
        m = {} if m is _ABSENT else m
        m[user_key] = value
        self._b._store(self._t, self._b.current_key, m)

    def remove(self, user_key: Any) -> None:
        m = self._get()
        if m is not _ABSENT and user_key in m:
            del m[user_key]
            self._b._store(self._t, self._b.current_key, m if m else _ABSENT)

    def contains(self, user_key: Any) -> bool:
        m = self._get()
        return m is not _ABSENT and user_key in m

    def items(self) -> Iterator[tuple[Any, Any]]:
        m = self._get()
        return iter([] if m is _ABSENT else list(m.items()))


class _ReducingState(_CachedState, ReducingState):
    __slots__ = ("_fn",)

    def __init__(self, backend: WriteBackCache, table: StateTable,
                 fn: Callable[[Any, Any], Any]) -> None:
        super().__init__(backend, table)
        self._fn = fn

    def get(self) -> Any:
        v = self._get()
        return None if v is _ABSENT else v

    def add(self, value: Any) -> None:
        v = self._get()
        self._b._store(self._t, self._b.current_key,
                       value if v is _ABSENT else self._fn(v, value))
