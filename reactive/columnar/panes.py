"""The windows of a columnar window operator: (key slot, window start) pairs mapped to dense
*pane* ids, looked up for a whole batch at once.

A pane is one key's one window. Its metadata lives in arrays indexed by pane id beside the
aggregates' arrays (one dict, so snapshots capture and copy-on-write them together):
``_slot`` (the key's slot in the :class:`~reactive.columnar.key_index.KeyIndex`), ``_start``
and ``_end`` (the window, seconds). The lookup hashes each pair to 64 bits and finds the
hash among the panes' hashes; a hash only proposes a pane, confirmed by comparing slot and
start, so two pairs whose hashes collide never share a pane (the rare colliding pair lives
in a small dict).

The panes' hashes are kept in two places: a :class:`~reactive.columnar.slot_table.SlotTable`
and a sorted array of the hashes added since (binary search, ``numpy.searchsorted``). A
batch's new panes join the sorted array (one merge, O(panes there)); it moves into the
table only when it outgrows :data:`SORTED_MAX`. A compaction rebuilds the sorted array
from the kept panes, so a job whose windows are cleaned up between batches (event time
that moves forward: most panes live for a batch or two) never pays the table's
insertions, each a few vectorized probing rounds.

Panes are never reused in place: :meth:`PaneTable.compact` drops the windows that were
cleaned up by building new arrays (the ones a snapshot still reads stay intact).
"""

from __future__ import annotations

import numpy as np

from .slot_table import SlotTable, _fmix64

__all__ = ["META", "SORTED_MAX", "PaneTable", "pair_hashes"]

META = ("_slot", "_start", "_end")
"""The pane metadata arrays' names."""

_MIX = np.uint64(0x9E3779B97F4A7C15)

SORTED_MAX = 1 << 16
"""Hashes in the sorted array beyond which they move into the hash table (a merge copies
the array: at this size about 1 MB per batch)."""


def pair_hashes(slots: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each (slot, start) pair (equal pairs hash equal; -0.0 is 0.0)."""
    bits = (starts + 0.0).view(np.uint64)
    with np.errstate(over="ignore"):
        return _fmix64(slots.astype(np.uint64) * _MIX ^ bits)


class PaneTable:
    """(slot, start) -> pane id over the operator's arrays.

    Args:
        arrays: the operator's arrays by name (shared; :data:`META` among them).
        initial: the value of a new pane in each array other than :data:`META` (an
            aggregate's neutral value).

    Attributes:
        size: the panes in use (ids ``[0, size)``).
    """

    def __init__(self, arrays: dict[str, np.ndarray], initial: dict[str, object]) -> None:
        self.arrays = arrays
        self.initial = initial
        self.size = 0
        self._table = SlotTable()
        # hashes not in the table, ascending and distinct, and their panes
        self._sorted = np.zeros(0, np.uint64)
        self._sorted_panes = np.zeros(0, np.int64)
        self._overflow: dict[tuple[int, float], int] = {}

    def lookup(self, slots: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """The pane of each distinct (slot, start) pair, adding the new ones.

        Args:
            slots, starts, ends: per pair (distinct pairs), its key slot and window.

        Returns:
            Per pair, its pane id (``int64``).
        """
        hashes = pair_hashes(slots, starts)
        panes = self._find(hashes)
        found = np.flatnonzero(panes >= 0)
        if len(found):
            p = panes[found]
            same = (self.arrays["_slot"][p] == slots[found]) \
                & (self.arrays["_start"][p] == starts[found])
            panes[found[~same]] = -2  # another pair's hash
        new = np.flatnonzero(panes == -1)
        if len(new):
            # a hash twice among the new pairs: the first occurrence gets it, the others
            # are resolved one by one below
            distinct, first = np.unique(hashes[new], return_index=True)
            if len(first) < len(new):
                later = np.ones(len(new), bool)
                later[first] = False
                panes[new[later]] = -2
            # panes numbered in the pairs' order (a firing lists windows of one end in
            # pane order); the sorted array takes them in hash order
            order = np.argsort(first, kind="stable")
            new = new[first[order]]
            ids = self._append(slots[new], starts[new], ends[new])
            by_hash = np.empty_like(ids)
            by_hash[order] = ids
            self._add_sorted(distinct, by_hash)
            panes[new] = ids
        for i in np.flatnonzero(panes == -2).tolist():
            panes[i] = self._slow(int(slots[i]), float(starts[i]), float(ends[i]))
        return panes

    def _find(self, hashes: np.ndarray) -> np.ndarray:
        """The pane proposed for each hash (-1: none), from the table and the sorted
        array (whose hashes the table does not hold)."""
        in_table = bool(self._table.size)
        panes = self._table.lookup(hashes) if in_table else np.full(len(hashes), -1, np.int64)
        known = self._sorted
        if len(known):
            missing = np.flatnonzero(panes < 0) if in_table else np.arange(len(hashes))
            wanted = hashes[missing]
            at = np.minimum(np.searchsorted(known, wanted), len(known) - 1)
            hit = known[at] == wanted
            panes[missing[hit]] = self._sorted_panes[at[hit]]
        return panes

    def _add_sorted(self, hashes: np.ndarray, panes: np.ndarray) -> None:
        """Add hashes (ascending, distinct, none known) and their panes to the sorted
        array; move it into the table once it outgrows :data:`SORTED_MAX`."""
        if len(self._sorted):
            at = np.searchsorted(self._sorted, hashes)
            self._sorted = np.insert(self._sorted, at, hashes)
            self._sorted_panes = np.insert(self._sorted_panes, at, panes)
        else:
            self._sorted, self._sorted_panes = hashes, panes
        if len(self._sorted) > SORTED_MAX:
            self._table.insert(self._sorted, self._sorted_panes)
            self._sorted = np.zeros(0, np.uint64)
            self._sorted_panes = np.zeros(0, np.int64)

    def _slow(self, slot: int, start: float, end: float) -> int:
        """The pane of a pair whose hash another pair has."""
        key = (slot, start)
        pane = self._overflow.get(key)
        if pane is None:
            matches = np.flatnonzero((self.arrays["_slot"][:self.size] == slot)
                                     & (self.arrays["_start"][:self.size] == start))
            if len(matches):
                pane = int(matches[0])
            else:
                pane = int(self._append(np.array([slot]), np.array([start]),
                                        np.array([end]))[0])
            self._overflow[key] = pane
        return pane

    def _append(self, slots: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        begin, end = self.size, self.size + len(slots)
        arrays = self.arrays
        for name, old in list(arrays.items()):
            if len(old) < end:
                grown = np.empty(max(end, 2 * len(old)), old.dtype)
                grown[:begin] = old[:begin]
                arrays[name] = grown
        for name, value in self.initial.items():
            arrays[name][begin:end] = value
        arrays["_slot"][begin:end] = slots
        arrays["_start"][begin:end] = starts
        arrays["_end"][begin:end] = ends
        self.size = end
        return np.arange(begin, end, dtype=np.int64)

    def add_restored(self, slots: np.ndarray, starts: np.ndarray, ends: np.ndarray
                     ) -> np.ndarray:
        """Add restored panes (distinct pairs); returns their ids."""
        return self.lookup(slots, starts, ends)

    def compact(self, keep: np.ndarray) -> None:
        """Keep only the panes where ``keep`` (a mask over ``[0, size)``) is true, renumbered
        in order; every array is replaced by a new one."""
        kept = np.flatnonzero(keep)
        arrays = self.arrays
        for name in list(arrays):
            old = arrays[name]
            fresh = np.empty(max(len(kept), 1024), old.dtype)
            fresh[:len(kept)] = old[kept]
            arrays[name] = fresh
        self.size = len(kept)
        if self._table.size:
            self._table.clear()
        self._sorted = np.zeros(0, np.uint64)
        self._sorted_panes = np.zeros(0, np.int64)
        self._overflow.clear()
        if not len(kept):
            return
        slots, starts = arrays["_slot"][:self.size], arrays["_start"][:self.size]
        hashes = pair_hashes(slots, starts)
        distinct, first = np.unique(hashes, return_index=True)
        if len(first) < self.size:
            # a hash's first pane holds it; the later ones go to the overflow dict
            for i in np.setdiff1d(np.arange(self.size), first).tolist():
                self._overflow[(int(slots[i]), float(starts[i]))] = i
        self._add_sorted(distinct, first.astype(np.int64, copy=False))
