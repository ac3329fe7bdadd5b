"""The RocksDB backend's write-back cache and the state objects that read and write through
it.

A RocksDB get + put per record costs microseconds from Python, so each instance keeps a
bounded *write-back cache* of deserialized values per state (:class:`StateTable`). Reads hit
the cache first (:meth:`WriteBackCache._load` on a miss: the frozen generations of pending
snapshots, then RocksDB); writes only mark the entry dirty (:meth:`WriteBackCache._store`).

Every piece of this work that runs on the task is bounded by time, not by entry count
(:data:`.generations.STEP_SECONDS`, a few ms), since it holds the event loop that an
application may share (the target: an application task's p99 delay under 10 ms):

- once a state has ``write_batch_entries`` dirty keys, each further write out writes the
  oldest dirty entries in one ``WriteBatch`` for one step (:meth:`WriteBackCache._write_dirty`);
  they stay cached, clean;
- once the cache holds ``cache_entries`` keys, a new key first evicts the oldest entries (a
  64th of the capacity at most; :meth:`WriteBackCache._evict`), writing the dirty ones among
  them first;
- a snapshot freezes the cache in O(1) (:meth:`WriteBackCache._freeze`,
  :mod:`.generations`) and its asynchronous part copies the frozen entries back in steps
  (:meth:`WriteBackCache._refill`): the hot keys stay cached across checkpoints. While a
  frozen generation is not yet in RocksDB nothing newer is written there, and the cache
  grows up to ``2 * cache_entries`` entries per state before the task writes the pending
  generations itself (back-pressure).

Only ``keys()`` writes every dirty entry at once. A value its serializer refuses fails that
write with :class:`~reactive.errors.StateSerializationError` naming the operator, the state
and the key.

Every state kind stores one value per key (:mod:`.keys`): list and map state are serialized
as a whole by their descriptor's serializer (pickle by default).
"""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Callable, Iterator
from itertools import islice
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
from .generations import IMMUTABLE as _IMMUTABLE
from .generations import MISS as _MISS
from .generations import FrozenTable, Generation, GenerationQueue, step_budget
from .keys import state_id
from .ttl import barrier_times

__all__ = ["REFILL_CHUNK", "StateTable", "WriteBackCache", "create_state", "pickle_dumps"]

# dirty values the current generation may share with a frozen one: immutable ones, and
# ABSENT (a bare object)
_SHAREABLE = _IMMUTABLE | {object}

#: entries copied from a frozen generation back into the cache between two looks at the
#: clock (~0.1 us each: a look per ~0.1 ms; the steps end by time, see ``_refill_step``)
REFILL_CHUNK = 1_024


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
                 "sid", "staged")

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
        # key -> its stored bytes as restored, for keys not read or written since the
        # restore (:mod:`.restore` stages the state when it fits in the cache): a cache miss
        # takes them from here instead of a RocksDB read; every write of a key to RocksDB
        # drops its entry (never replaced: frozen generations share it)
        self.staged: dict[Any, bytes] = {}

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
        cache_entries: cached keys per state before the oldest clean ones are evicted.
        write_batch_entries: dirty keys per state before they are written to RocksDB.
        encode_key: key -> stored key bytes.
        operator_uid: the operator's uid, named in errors (None: unnamed).

    Attributes:
        current_key: the key state calls are scoped to.
        kgb_memo_size: keys memoized with their key group before the memo is emptied.
        _kgb: its key group's 2-byte prefix (None before any key is set).
        _gens: the frozen generations of pending snapshots (:mod:`.generations`).
    """

    kgb_memo_size = 200_000

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
        # key -> its key group's 2-byte prefix, for keys known to be in this instance's
        # range (the keyed backend's set_current_key; a restore fills it with the keys it
        # warms the cache with): a known key costs one dict hit
        self._kgb_memo: dict[Any, bytes] = {}
        self._tables: dict[str, StateTable] = {}
        # TTL state name -> (kind, its clock's now): a snapshot's synchronous part reads
        # the clocks once, and its local phase leaves out what expired by then (:mod:`.ttl`)
        self._ttl_times: dict[str, tuple[str, Callable[[], float]]] = {}
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
            raw = table.staged.pop(key, None) if table.staged else None
            if raw is None:
                raw = self._db.get(kgb + table.sid + self._encode_key(key))
            value = _ABSENT if raw is None else table.loads(raw)
        if len(table.cache) >= self.cache_entries:
            self._evict(table)
        table.cache[key] = value
        return value

    def _store(self, table: StateTable, key: Any, value: Any) -> None:
        """Write-back: cache ``value`` (``_ABSENT`` deletes) and mark it dirty."""
        kgb = self._kgb
        if kgb is None:
            kgb = self._require_key()  # raises
        cache = table.cache
        cache[key] = value
        dirty = table.dirty
        dirty[key] = kgb
        if len(cache) > self.cache_entries or len(dirty) >= self.write_batch_entries:
            self._make_room(table)

    def _make_room(self, table: StateTable) -> None:
        """After a write: evict when the cache outgrew ``cache_entries``; write a step of
        the oldest dirty entries when there are ``write_batch_entries`` of them and no
        generation is pending.

        Raises:
            StateSerializationError: if a dirty value's serializer refuses it.
        """
        if len(table.cache) > self.cache_entries:
            self._evict(table)
        if len(table.dirty) >= self.write_batch_entries and not self._gens.pending:
            self._write_dirty(table)

    def _evict(self, table: StateTable) -> None:
        """Make room in a full cache (before a load, or after a write): drop its oldest
        entries (at most a 64th of the
        capacity, and at most one step's worth of writing: :data:`.generations.STEP_SECONDS`),
        writing the dirty ones among them to RocksDB first in one ``WriteBatch``.

        While a generation is pending nothing may be written to RocksDB: the cache then
        grows, and past the pending bound the task finishes the pending generations
        (back-pressure, :meth:`.generations.GenerationQueue.drain`).

        Raises:
            StateSerializationError: if a dirty value's serializer refuses it (nothing is
                dropped then).
        """
        cache = table.cache
        if self._gens.pending:
            if len(cache) < self._pending_limit:
                return
            self._gens.drain()
        dirty = table.dirty
        want = max(1, self.cache_entries >> 6)
        victims = []
        wb: WriteBatch | None = None
        clock, step, _ = step_budget()
        deadline = clock() + step / 2
        for key in cache:  # insertion order: the oldest first
            victims.append(key)
            kgb = dirty.get(key)
            if kgb is not None:
                if wb is None:
                    wb = WriteBatch(raw_mode=True)
                self._put(wb, table, key, kgb, cache[key])
                if not len(victims) % 16 and clock() >= deadline:
                    break
            if len(victims) >= want:
                break
        if wb is not None:
            self._db.write(wb)
        for key in victims:
            del cache[key]
            dirty.pop(key, None)

    def _put(self, wb: WriteBatch, table: StateTable, key: Any, kgb: bytes,
             value: Any) -> None:
        """Add ``key``'s ``value`` (``_ABSENT``: a delete) to ``wb``.

        Raises:
            StateSerializationError: if the serializer refuses the value.
        """
        stored = kgb + table.sid + self._encode_key(key)
        if table.staged:
            table.staged.pop(key, None)  # RocksDB gets a newer value
        if value is _ABSENT:
            wb.delete(stored)
            return
        try:
            data = table.dumps(value)
        except Exception as exc:
            raise StateSerializationError(self.operator_uid or "?", table.name, key,
                                          exc) from exc
        wb.put(stored, data)

    def _freeze(self, checkpoint_id: int, local: Path | None) -> Generation:
        """Synchronous part of a snapshot: the current cache of every state becomes a frozen
        generation (O(number of states)); the states continue in empty dicts, refilled by
        :meth:`_refill` in the asynchronous part."""
        tables = []
        ttl = barrier_times(self._ttl_times) if self._ttl_times else {}
        for t in self._tables.values():
            if t.cache:
                ft = FrozenTable(t, self.operator_uid)
                ft.ttl = ttl.get(t.name)
                tables.append(ft)
                t.cache = {}
                t.dirty = {}
        gen = Generation(checkpoint_id, tables, local)
        self._gens.add(gen)
        return gen

    async def _refill(self, gen: Generation) -> None:
        """Asynchronous part, first step: while ``gen`` is the newest generation, copy its
        frozen entries back into the current cache where the cache has no entry for the key
        and has room, so the hot keys do not each take the slow path (:meth:`_load`) after
        every checkpoint.

        In place, in steps that end by time (:meth:`_refill_step`, yielding to the loop
        between them), like every other step of this backend on the loop. A key the task
        cached since the barrier holds its newest value already, so only absent keys are
        copied, and between two steps the task reads and writes the cache as usual. (Building
        the copy aside in steps of a fixed entry count and merging the live cache into it at
        the end would hold the loop 10-30 ms per step on W1, measured.) A key absent from
        the cache reads ``gen``'s value (the newest generation holding it), so copying that
        value in changes no read. Dirty values of mutable types are left out: the task may
        change a cached object in place, so only :meth:`.generations.FrozenTable.promote`
        hands them over (serialized first), or :meth:`_retired` once ``gen`` is in RocksDB.
        """
        gens = self._gens
        for ft in list(gen.tables.values()):
            items = iter(ft.values.items())
            held: list[Any] = []
            while True:
                if gens.closed or not gens.pending or gens.pending[-1] is not gen:
                    return  # a newer generation shadows this one (or the backend is gone)
                t = self._tables.get(ft.name)
                if t is None:
                    break
                if self._refill_step(t.cache, items, ft.dirty, held):
                    ft.held_back = held
                    break
                await asyncio.sleep(0)  # the task runs between two steps

    def _refill_step(self, cache: dict[Any, Any], items: Iterator[tuple[Any, Any]],
                     dirty: dict[Any, bytes], held: list[Any]) -> bool:
        """One step of :meth:`_refill`: copy the next frozen ``items`` into ``cache`` where
        it has no entry, for about :data:`.generations.STEP_SECONDS` (looking at the clock
        every :data:`REFILL_CHUNK` entries); dirty keys of mutable values go to ``held``
        instead. Returns True when done (``items`` exhausted, or the cache full)."""
        clock, step, _ = step_budget()
        deadline = clock() + step
        limit = self.cache_entries
        shareable = _SHAREABLE
        while True:
            want = min(limit - len(cache), REFILL_CHUNK)
            if want <= 0:
                return True
            n = 0
            for key, value in islice(items, want):
                n += 1
                if key in cache:
                    continue  # the task's newer value, or an entry it took already
                if type(value) not in shareable and key in dirty:
                    held.append(key)
                    continue
                cache[key] = value
            if n < want:
                return True
            if clock() >= deadline:
                return False

    def _retired(self, gen: Generation, last: bool) -> None:
        """``gen`` is in RocksDB: if it was the last frozen generation, the dirty values of
        mutable types that :meth:`_refill` held back and the task did not take return to
        the cache as clean entries while there is room (were a newer generation pending,
        they could shadow its values)."""
        if not last:
            return
        for ft in gen.tables.values():
            t = self._tables.get(ft.name)
            if t is None or not ft.held_back:
                continue
            cache, values, serialized = t.cache, ft.values, ft.serialized
            room = self.cache_entries - len(cache)
            for key in ft.held_back:
                if room <= 0:
                    break
                if key not in cache and key not in serialized:
                    cache[key] = values[key]
                    room -= 1

    def _write_dirty(self, table: StateTable) -> None:
        """Write the oldest dirty entries of ``table`` to RocksDB in one ``WriteBatch``, for
        one step (:data:`.generations.STEP_SECONDS`); they stay cached, clean. Only when no
        generation is pending.

        Raises:
            StateSerializationError: if a value's serializer refuses it (nothing of the
                batch is written; the entries stay dirty).
        """
        dirty = table.dirty
        if not dirty:
            return
        wb = WriteBatch(raw_mode=True)
        put = self._put
        cache = table.cache
        clock, step, every = step_budget()
        # writing the batch costs about as much as building it: half the step for each
        deadline = clock() + step / 2
        written = []
        for key, kgb in dirty.items():
            put(wb, table, key, kgb, cache.get(key, _ABSENT))
            written.append(key)
            if not len(written) % every and clock() >= deadline:
                break
        self._db.write(wb)
        for key in written:
            del dirty[key]

    def _flush_dirty(self) -> None:
        """Write every dirty entry of every state to RocksDB (before ``keys()`` reads
        RocksDB), after finishing the pending generations; blocking.

        Raises:
            StateSerializationError: if a value's serializer refuses it.
        """
        if self._gens.pending:
            self._gens.drain()
        for t in self._tables.values():
            while t.dirty:
                self._write_dirty(t)

    def _clear_cache(self) -> None:
        """Drop every cached and dirty entry (the instance is disposed)."""
        for t in self._tables.values():
            t.cache.clear()
            t.staged.clear()
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
        b = self._b
        key = b.current_key
        b._store(self._t, key, _ABSENT)
        # a key whose state goes may never come back (a TTL'd key space): the key-group memo
        # does not keep it (a later use computes it again)
        b._kgb_memo.pop(key, None)


class _ValueState(_CachedState, ValueState):
    __slots__ = ("_default",)

    def __init__(self, backend: WriteBackCache, table: StateTable, default: Any) -> None:
        super().__init__(backend, table)
        self._default = default

    def value(self) -> Any:
        # _get inlined: the hot path of every keyed count
        key = self._b.current_key
        v = self._t.cache.get(key, _MISS)
        if v is _MISS:
            v = self._b._load(self._t, key)
        return self._default if v is _ABSENT else v

    def update(self, value: Any) -> None:
        # _store inlined (the hot path of every keyed count)
        b = self._b
        kgb = b._kgb
        if kgb is None:
            b._store(self._t, b.current_key, value)  # raises: no current key
            return
        t = self._t
        key = b.current_key
        cache = t.cache
        cache[key] = value
        dirty = t.dirty
        dirty[key] = kgb
        if len(cache) > b.cache_entries or len(dirty) >= b.write_batch_entries:
            b._make_room(t)


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
