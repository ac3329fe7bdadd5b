"""Columnar keyed state kept in a key-value store (RocksDB) behind a bounded cache of slots.

:class:`SlotStore` is what a keyed backend offers a columnar operator whose state does not
live on the heap: per key, a row of the operator's state arrays, read and written for many
keys at once (a batched multi-get, a write batch), never one call per record.
:class:`SlotCache` is the operator's side: the cached keys mapped to dense slots
(:class:`~.key_index.KeyIndex`), their state in arrays, and the slots changed since they
were last written back. A batch's keys not cached are read from the store in one call; the
changed slots are written back in one call when the cache is full (then emptied), and at
every checkpoint's barrier as :class:`BarrierRows`: the synchronous part copies the changed
slots' values (a few numpy copies, no Python call per key) and the store turns them into
stored rows off the synchronous part, so its snapshot holds exactly the state at the
barrier (Flink's RocksDB backend with a write-back cache in front; the copy is the
copy-on-write of Carbone et al., "Lightweight Asynchronous Snapshots for Distributed
Dataflows", 2015, section 4).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterator
from typing import Any, cast

import numpy as np

from ..state.backend import KeyedStateBackend
from .aggregates import Spec
from .key_index import BatchKeys, KeyIndex
from .schema import pa
from .state import TTL_TIMESTAMP

__all__ = ["BarrierRows", "SlotCache", "SlotStore"]


class BarrierRows:
    """The changed slots of a :class:`SlotCache` at a barrier, copied: their keys, key
    groups and state values, turned into stored rows in chunks later (:meth:`take`).

    Args:
        keys: the cache's key of every slot (append-only: the cache starts a new list
            when it is emptied, so this one keeps the slots' keys).
        slots: the changed slots (``int64``).
        key_groups: their key groups (``int32``, a copy).
        columns: per state array, its values at ``slots`` (copies, the store's row order).
        key_chunks: for one key column, the ``pyarrow`` arrays of its values by slot
            (concatenated: the key of every slot), for a store that encodes keys with
            Arrow kernels; None otherwise.
    """

    __slots__ = ("columns", "done", "key_chunks", "key_groups", "keys", "slots")

    def __init__(self, keys: list[Any], slots: np.ndarray, key_groups: np.ndarray,
                 columns: list[np.ndarray], key_chunks: list[Any] | None = None) -> None:
        self.keys = keys
        self.key_chunks = key_chunks
        self.slots = slots
        self.key_groups = key_groups
        self.columns = columns
        #: rows already taken (the next :meth:`take` starts here)
        self.done = 0

    def __len__(self) -> int:
        return len(self.slots)

    def take(self, n: int) -> tuple[list[Any], np.ndarray, list[tuple[Any, ...]]]:
        """The next (at most) ``n`` rows: ``(keys, key_groups, rows)`` as
        :meth:`SlotStore.store_rows` takes them."""
        lo = self.done
        hi = min(lo + n, len(self.slots))
        self.done = hi
        keys = self.keys
        return ([keys[s] for s in self.slots[lo:hi].tolist()], self.key_groups[lo:hi],
                list(zip(*[c[lo:hi].tolist() for c in self.columns], strict=True)))


class SlotStore(KeyedStateBackend):
    """A keyed backend holding columnar state as one row (a tuple of the state arrays'
    values, in the order of the operator's array names) per key."""

    @abstractmethod
    def load_rows(self, keys: list[Any], key_groups: np.ndarray) -> list[tuple[Any, ...] | None]:
        """The stored rows of ``keys`` (None: never stored), in one batched read.

        Args:
            keys: the keys, as the per-record API sees them.
            key_groups: their key groups (``int32`` array of the same length).
        """

    @abstractmethod
    def store_rows(self, keys: list[Any], key_groups: np.ndarray,
                   rows: list[tuple[Any, ...]]) -> None:
        """Write ``rows`` of ``keys`` back (visible to the next snapshot); an empty row
        ``()`` deletes its key."""

    def store_barrier_rows(self, rows: BarrierRows) -> None:
        """Take the rows a cache had changed at a barrier (called in the synchronous part
        of a snapshot, by its :meth:`before_snapshot` hook): they belong to the snapshot
        being taken. This default writes them at once (:meth:`store_rows`); a store may
        keep them and write them in the asynchronous part."""
        self.store_rows(*rows.take(len(rows)))

    def sweep_rows(self, budget: int, column: int,
                   expired_before: float) -> tuple[int, int]:
        """Delete stored rows whose time to live ran out: the next (at most) ``budget``
        rows from where the last call stopped (the rows of keys cached by the store itself
        are left to their write-back). The default sweeps nothing.

        Args:
            budget: rows to check at most.
            column: the position of the last-write time (seconds) in a row.
            expired_before: a row last written at or before this time is expired.

        Returns:
            tuple[int, int]: the rows checked and the rows deleted.
        """
        return 0, 0

    def may_hold_rows(self) -> bool:
        """Whether the store may hold rows its caller has not written since the instance
        started (restored ones). When it cannot, a key absent from a cache that never
        dropped a row was never stored, and the cache reads no rows. This default answers
        True (always read)."""
        return True

    @abstractmethod
    def iter_rows(self) -> Iterator[tuple[Any, tuple[Any, ...]]]:
        """Every stored ``(key, row)`` of this instance, by key group."""

    @abstractmethod
    def before_snapshot(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` at the start of every snapshot's synchronous part."""


class SlotCache:
    """The operator's bounded cache of slots in front of a :class:`SlotStore`.

    Args:
        store: the keyed backend.
        key_columns: the key columns.
        specs: the aggregates (their arrays are ``"{output}.{part}"``).
        max_parallelism: the number of key groups.
        operator: the operator's uid (named in key errors).
        capacity: the slots cached (at the start of a batch) past which every changed
            one is written back and the cache emptied; the cache holds at most this many
            plus one batch's distinct keys.
        ttl: ``(seconds, clock)`` when the keys expire (``agg(ttl=...)``): each row ends
            with its key's last-write time (the array :data:`~.state.TTL_TIMESTAMP`, which
            the operator stamps); a changed slot expired when written back (or at a
            barrier) is written as a delete, :meth:`all_rows` leaves expired keys out and
            :meth:`sweep` deletes expired rows from the store.

    Attributes:
        dropped: changed slots written back as deletes because they had expired.
        swept: rows :meth:`sweep` deleted from the store.
    """

    #: stored rows a sweep checks per row processed, at least and at most
    MIN_RATE = 1 / 16
    MAX_RATE = 4.0

    def __init__(self, store: SlotStore, key_columns: list[str], specs: list[Spec],
                 max_parallelism: int, operator: str, capacity: int,
                 ttl: tuple[float, Callable[[], float]] | None = None) -> None:
        self.store = store
        self.specs = specs
        self.capacity = capacity
        self.ttl = ttl
        self.dropped = 0
        self.swept = 0
        self._rate = self.MIN_RATE  # stored rows checked per row processed
        self._found = 0.0  # moving average of the expired share of the rows checked
        self._credit = 0.0
        self.index = KeyIndex(key_columns, max_parallelism, operator)
        self.names = [f"{s.output}.{p}" for s in specs for p in s.state_columns()]
        self._initial = {f"{s.output}.{p}": (s.initial(p), s.dtype(p))
                         for s in specs for p in s.state_columns()}
        if ttl is not None:
            # +inf: a slot not yet written is not expired (its values are the initial ones)
            self.names.append(TTL_TIMESTAMP)
            self._initial[TTL_TIMESTAMP] = (np.inf, np.dtype(np.float64))
        self.arrays: dict[str, np.ndarray] = {}
        self.keys: list[Any] = []  # per slot, its key as the per-record API sees it
        self.dirty = np.zeros(0, bool)
        #: every key the store holds is cached (None: not known before the first batch, as
        #: a restore comes after setup): new keys then start from the initial values
        #: without a read; False once the cache dropped rows or the store was restored
        self.resident: bool | None = None
        self._reset(1024)
        store.before_snapshot(self._at_barrier)

    def _reset(self, capacity: int) -> None:
        self.arrays.clear()
        self.arrays.update({n: np.full(capacity, v, d) for n, (v, d) in self._initial.items()})
        self.dirty = np.zeros(capacity, bool)
        self.keys = []

    def _grow(self, size: int) -> None:
        first = self.arrays[self.names[0]]
        if size <= len(first):
            return
        capacity = max(size, 2 * len(first))
        for n, (v, d) in self._initial.items():
            grown = np.full(capacity, v, d)
            grown[:len(first)] = self.arrays[n]
            self.arrays[n] = grown
        dirty = np.zeros(capacity, bool)
        dirty[:len(self.dirty)] = self.dirty
        self.dirty = dirty

    def lookup(self, batch: Any) -> BatchKeys:
        """Map ``batch``'s keys to cached slots, reading the keys not cached from the store
        (one batched read), and mark the batch's slots changed."""
        index = self.index
        if self.resident is None:
            self.resident = not self.store.may_hold_rows()
        if index.size >= self.capacity:
            self.flush()
            index.clear()
            self._reset(len(self.dirty))
            self.resident = False
        before = index.size
        chunks_before = [len(c) for c in index.key_chunks]
        keys = index.lookup(batch)
        size = index.size
        self._grow(size)
        if size > before:
            self._load(chunks_before, before, size)
        slots = keys.slots
        if keys.num_groups > batch.num_rows // 4:
            # a batch's groups may be a whole dictionary: mark the slots its rows use only
            slots = slots[np.bincount(keys.codes, minlength=keys.num_groups) > 0]
        self.dirty[slots] = True
        return keys

    def _load(self, chunks_before: list[int], before: int, size: int) -> None:
        new_columns = []
        for chunks, n in zip(self.index.key_chunks, chunks_before, strict=True):
            added = chunks[n:]
            new_columns.append((pa.concat_arrays(added) if len(added) > 1 else added[0])
                               .to_pylist())
        new_keys = new_columns[0] if len(new_columns) == 1 else \
            list(zip(*new_columns, strict=True))
        self.keys.extend(new_keys)
        if self.resident:
            return
        rows = self.store.load_rows(new_keys, self.index.key_groups[before:size])
        found = [i for i, r in enumerate(rows) if r is not None]
        if not found:
            return
        at = np.asarray(found, np.int64) + before
        stored = [cast(tuple[Any, ...], rows[i]) for i in found]
        width = len(self.names)
        if self.ttl is not None and any(len(r) < width for r in stored):
            # a row stored without a ttl: its key counts as written now (as on the heap)
            now = self.ttl[1]()
            stored = [r if len(r) == width else (*r, now) for r in stored]
        for j, name in enumerate(self.names):
            array = self.arrays[name]
            array[at] = np.array([r[j] for r in stored], dtype=array.dtype)

    def _drop_expired(self, slots: np.ndarray) -> Any:
        """Write the expired ones of the changed ``slots`` to the store as deletes; return
        the others."""
        if self.ttl is None or not len(slots):
            return slots
        ttl, now = self.ttl
        expired = self.arrays[TTL_TIMESTAMP][slots] <= now() - ttl
        if not expired.any():
            return slots
        gone = slots[expired]
        keys = self.keys
        self.store.store_rows([keys[s] for s in gone.tolist()], self.index.key_groups[gone],
                              [()] * len(gone))
        self.dropped += len(gone)
        return slots[~expired]

    def sweep(self, rows: int) -> None:
        """The store's share of the cleanup after a batch of ``rows`` rows (Flink's
        incremental cleanup, paced as :class:`reactive.state.ttl.IncrementalCleanup`): check
        ``rows * rate`` stored rows from where the last sweep stopped and delete the
        expired ones; ``rate`` follows the expired share the recent sweeps found, from
        :data:`MIN_RATE` (nothing expires: a long-lived key set costs little) to
        :data:`MAX_RATE` (an ever-growing key space: rows are checked faster than new keys
        arrive, so the store stays within the live keys plus a pass)."""
        if self.ttl is None:
            return
        self._credit += rows * self._rate
        budget = int(self._credit)
        if budget <= 0:
            return
        self._credit = min(self._credit - budget, float(self.capacity))
        ttl, now = self.ttl
        checked, deleted = self.store.sweep_rows(budget, len(self.names) - 1, now() - ttl)
        self.swept += deleted
        if checked:
            self._found = 0.9 * self._found + 0.1 * deleted / checked
            self._rate = min(self.MAX_RATE, max(self.MIN_RATE, 2 * self.MAX_RATE * self._found))

    def flush(self) -> None:
        """Write every changed slot back to the store (one write) and mark it clean."""
        size = self.index.size
        slots = self._drop_expired(np.flatnonzero(self.dirty[:size]))
        if not len(slots):
            self.dirty[:size] = False
            return
        columns = [self.arrays[n][slots].tolist() for n in self.names]
        keys = self.keys
        self.store.store_rows([keys[s] for s in slots.tolist()], self.index.key_groups[slots],
                              list(zip(*columns, strict=True)))
        self.dirty[:size] = False

    def _at_barrier(self) -> None:
        """Synchronous part of a snapshot: hand the changed slots, copied, to the store
        (O(changed slots) numpy copies) and mark them clean."""
        size = self.index.size
        slots = self._drop_expired(np.flatnonzero(self.dirty[:size]))
        if not len(slots):
            self.dirty[:size] = False
            return
        chunks = self.index.key_chunks
        self.store.store_barrier_rows(BarrierRows(
            self.keys, slots, self.index.key_groups[slots],
            [self.arrays[n][slots] for n in self.names],
            list(chunks[0]) if len(chunks) == 1 else None))
        self.dirty[:size] = False

    def all_rows(self) -> tuple[list[Any], dict[str, np.ndarray]]:
        """Every key of the instance and its state arrays (after writing the cache back)."""
        self.flush()
        keys, rows = [], []
        for k, r in self.store.iter_rows():
            keys.append(k)
            rows.append(r)
        arrays = {n: np.array([r[j] for r in rows], dtype=self._initial[n][1])
                  for j, n in enumerate(self.names)}
        if self.ttl is not None and keys:  # an expired key's value is never returned
            ttl, now = self.ttl
            live = arrays[TTL_TIMESTAMP] > now() - ttl
            if not live.all():
                keys = [k for k, keep in zip(keys, live.tolist(), strict=True) if keep]
                arrays = {n: a[live] for n, a in arrays.items()}
        return keys, arrays
