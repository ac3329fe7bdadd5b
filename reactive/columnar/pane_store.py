"""The panes of a columnar window operator kept in a :class:`~.slot_store.SlotStore`
(RocksDB) behind a bounded cache of keys, with the keys' window timers on the heap.

The store holds per key one row: all of the key's open panes, ``(starts, ends, *values)``
(a list per pane array, in the order of the operator's arrays); a key whose panes are all
gone is deleted (an empty row), so keys that come and go leave nothing behind. The
operator works on the cached keys' panes in its usual arrays (:mod:`.panes`);
:class:`PaneCache` moves them between the arrays and the store:

* a batch's keys that are not cached are read with one multi-get (:meth:`PaneCache.lookup`),
  and every key the batch or a firing touches is marked changed;
* the changed keys' rows are written back with one write at every checkpoint's synchronous
  part (so RocksDB's incremental checkpoint holds them) and when the cache is full, which
  then empties it (an *eviction*);
* an evicted key leaves a timer on the heap: the earliest time its panes need the
  watermark (a window's end to fire, or ``end + allowed lateness`` to be dropped). When the
  watermark reaches it, the key is read back before the operator fires its windows
  (Flink's RocksDB state backend with heap timers, ``state.backend.rocksdb.timer-service.
  factory: HEAP``). After a restore the timers are rebuilt from one scan of the restored
  key groups.

A timer may be stale (the key was read back by a batch and evicted again, leaving a newer
timer): reading back a key that is cached is skipped, so a stale timer costs one lookup
and never duplicates a pane.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .key_index import BatchKeys, KeyIndex
from .panes import META, PaneTable
from .schema import pa
from .slot_store import SlotStore

__all__ = ["PaneCache"]


class PaneCache:
    """A window operator's cache of keys (and their panes) in front of a :class:`SlotStore`.

    Args:
        store: the keyed backend.
        index: the operator's key index (cleared at an eviction).
        panes: the operator's pane table over its arrays.
        key_types: the Arrow type of each key column (to read timer keys back).
        lateness: the allowed lateness (seconds).
        watermark: returns the operator's current watermark.
        capacity: the cached keys (at the start of a batch) past which the changed ones are
            written back and the cache emptied.
        sessions: the operator's windows are sessions (its panes are not looked up by
            window start).

    Attributes:
        evictions: how many times the cache was emptied.
    """

    def __init__(self, store: SlotStore, index: KeyIndex, panes: PaneTable,
                 key_types: list[Any], lateness: float, watermark: Callable[[], float],
                 capacity: int, sessions: bool) -> None:
        self.sessions = sessions
        self.store = store
        self.index = index
        self.panes = panes
        self.key_types = [t.value_type if pa.types.is_dictionary(t) else t for t in key_types]
        self.lateness = lateness
        self.watermark = watermark
        self.capacity = capacity
        self.names = [n for n in panes.arrays if n not in META]
        self.keys: list[Any] = []  # per slot, its key as the per-record API sees it
        self.dirty = np.zeros(1024, bool)
        self.evictions = 0
        # the timers of evicted keys: parallel lists, appended at evictions
        self._timer_keys: list[Any] = []
        self._timer_times = np.zeros(0, np.float64)
        store.before_snapshot(self.flush)

    # ------------------------------------------------------------------ keys in
    def lookup(self, batch: Any) -> BatchKeys:
        """Map ``batch``'s keys to slots, reading the panes of keys not cached from the
        store (one read), and mark the batch's keys changed."""
        if self.index.size >= self.capacity:
            self.evict()
        before = self.index.size
        chunks_before = [len(c) for c in self.index.key_chunks]
        keys = self.index.lookup(batch)
        if self.index.size > before:
            self._load(self._new_keys(chunks_before), before)
        self.mark(keys.slots)
        return keys

    def _new_keys(self, chunks_before: list[int]) -> list[Any]:
        columns = []
        for chunks, n in zip(self.index.key_chunks, chunks_before, strict=True):
            added = chunks[n:]
            columns.append((pa.concat_arrays(added) if len(added) > 1 else added[0])
                           .to_pylist())
        return columns[0] if len(columns) == 1 else list(zip(*columns, strict=True))

    def _load(self, new_keys: list[Any], before: int) -> None:
        """Append the stored panes of the keys of slots ``[before, size)``."""
        size = self.index.size
        self.keys.extend(new_keys)
        self._grow(size)
        rows = self.store.load_rows(new_keys, self.index.key_groups[before:size])
        slots: list[int] = []
        starts: list[float] = []
        ends: list[float] = []
        values: list[list[Any]] = [[] for _ in self.names]
        for i, row in enumerate(rows):
            if not row:
                continue
            slots.extend([before + i] * len(row[0]))
            starts.extend(row[0])
            ends.extend(row[1])
            for column, stored in zip(values, row[2:], strict=True):
                column.extend(stored)
        if not slots:
            return
        pane_args = (np.asarray(slots, np.int64), np.asarray(starts, np.float64),
                     np.asarray(ends, np.float64))
        # periodic windows are found by (slot, start): the loaded panes join the pane table's
        # lookup; sessions are found by scanning a key's panes
        ids = self.panes._append(*pane_args) if self.sessions \
            else self.panes.add_restored(*pane_args)
        arrays = self.panes.arrays
        for name, column in zip(self.names, values, strict=True):
            arrays[name][ids] = np.asarray(column, arrays[name].dtype)

    def mark(self, slots: np.ndarray) -> None:
        """Mark the keys of ``slots`` changed (written back at the next flush)."""
        self._grow(self.index.size)
        self.dirty[slots] = True

    def _grow(self, size: int) -> None:
        if size > len(self.dirty):
            dirty = np.zeros(max(size, 2 * len(self.dirty)), bool)
            dirty[:len(self.dirty)] = self.dirty
            self.dirty = dirty

    # ------------------------------------------------------------------ timers
    def fire_timers(self, watermark: float) -> None:
        """Read back the evicted keys whose timer ``watermark`` reached (one read), before
        the operator fires and drops windows at ``watermark``."""
        due = np.flatnonzero(self._timer_times <= watermark)
        if not len(due):
            return
        keys = list(dict.fromkeys(self._timer_keys[i] for i in due.tolist()))
        keep = np.ones(len(self._timer_times), bool)
        keep[due] = False
        self._timer_keys = [k for k, kept in zip(self._timer_keys, keep.tolist(),
                                                 strict=True) if kept]
        self._timer_times = self._timer_times[keep]
        before = self.index.size
        if len(self.key_types) == 1:
            columns = [pa.array(keys, self.key_types[0])]
        else:
            columns = [pa.array(list(c), t) for c, t in zip(zip(*keys, strict=True),
                                                            self.key_types, strict=True)]
        slots = self.index.install(columns)
        fresh = slots >= before  # a cached key's panes are here already
        if fresh.any():
            self._load([k for k, f in zip(keys, fresh.tolist(), strict=True) if f], before)
        self.mark(slots)

    def _add_timers(self, keys: list[Any], times: np.ndarray) -> None:
        self._timer_keys.extend(keys)
        self._timer_times = np.concatenate([self._timer_times, times])

    def _next_times(self, slots: np.ndarray, ends: np.ndarray, n_slots: int) -> np.ndarray:
        """Per slot, the earliest watermark its panes (``slots``, ``ends``: per pane) need:
        a window's end to fire it, or ``end + lateness`` to drop it once fired (inf: no
        pane)."""
        wm = self.watermark()
        due = np.where(ends > wm, ends, ends + self.lateness)
        times = np.full(n_slots, np.inf)
        np.minimum.at(times, slots, due)
        return times

    # ------------------------------------------------------------------ keys out
    def flush(self) -> None:
        """Write every changed key's panes back to the store (one write)."""
        size = self.index.size
        changed = np.flatnonzero(self.dirty[:size])
        if not len(changed):
            return
        arrays, n = self.panes.arrays, self.panes.size
        pane_slots = arrays["_slot"][:n]
        mine = np.flatnonzero(pane_slots >= 0)
        mine = mine[self.dirty[pane_slots[mine]]]
        mine = mine[np.argsort(pane_slots[mine], kind="stable")]
        owners = pane_slots[mine]
        bounds = np.searchsorted(owners, changed)
        ends_at = np.searchsorted(owners, changed, side="right")
        columns = [arrays["_start"][mine].tolist(), arrays["_end"][mine].tolist()]
        columns += [arrays[name][mine].tolist() for name in self.names]
        rows: list[tuple[Any, ...]] = []
        for lo, hi in zip(bounds.tolist(), ends_at.tolist(), strict=True):
            rows.append(tuple(c[lo:hi] for c in columns) if hi > lo else ())
        keys = self.keys
        self.store.store_rows([keys[s] for s in changed.tolist()],
                              self.index.key_groups[changed], rows)
        self.dirty[:size] = False

    def evict(self) -> None:
        """Write the changed keys back, leave a timer for each key with panes, and empty
        the cache (keys and panes)."""
        self.flush()
        size, n = self.index.size, self.panes.size
        arrays = self.panes.arrays
        slots = arrays["_slot"][:n]
        live = slots >= 0
        times = self._next_times(slots[live], arrays["_end"][:n][live], size)
        waiting = np.flatnonzero(np.isfinite(times))
        self._add_timers([self.keys[s] for s in waiting.tolist()], times[waiting])
        self.panes.compact(np.zeros(n, bool))
        self.index.clear()
        self.keys = []
        self.dirty[:] = False
        self.evictions += 1

    def restore_timers(self) -> None:
        """Timers for every key of the restored store (one scan of this instance's key
        groups): its panes are read back by a batch of its key or by its timer."""
        keys: list[Any] = []
        times: list[float] = []
        wm = self.watermark()
        for key, row in self.store.iter_rows():
            if row:
                ends = np.asarray(row[1], np.float64)
                keys.append(key)
                times.append(float(np.where(ends > wm, ends, ends + self.lateness).min()))
        if keys:
            self._add_timers(keys, np.asarray(times, np.float64))

