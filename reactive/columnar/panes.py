"""The windows of a columnar window operator: (key slot, window start) pairs mapped to dense
*pane* ids, looked up for a whole batch at once.

A pane is one key's one window. Its metadata lives in arrays indexed by pane id beside the
aggregates' arrays (one dict, so snapshots capture and copy-on-write them together):
``_slot`` (the key's slot in the :class:`~reactive.columnar.key_index.KeyIndex`), ``_start``
and ``_end`` (the window, seconds). The lookup hashes each pair to 64 bits and finds the
hash among the panes' hashes; a hash only proposes a pane, confirmed by comparing slot and
start, so two pairs whose hashes collide never share a pane (a pair whose hash proposes
another pair's pane is found by a scan of the pane arrays, then kept in a small dict).

The panes' hashes are kept in three places: a :class:`~reactive.columnar.slot_table.SlotTable`,
a sorted array (binary search, ``numpy.searchsorted``) and the hashes of the panes added
since the last lookup, unsorted. A batch's new panes are only appended to the last; the
next lookup sorts them into the sorted array (one merge), which moves into the table when
it outgrows :data:`SORTED_MAX`. A compaction starts over from the kept panes, so a job
whose windows are cleaned up between batches (event time that moves forward: most panes
live for a batch or two) never sorts or inserts the hashes of the panes it drops.

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
        # hashes not in the table, ascending, and their panes
        self._sorted = np.zeros(0, np.uint64)
        self._sorted_panes = np.zeros(0, np.int64)
        # hashes in neither, unsorted (the panes added since the last lookup), and panes
        self._recent: list[tuple[np.ndarray, np.ndarray]] = []
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
            # two new pairs with one hash get a pane each; a later lookup finds one of them
            # by the hash and the other by the scan of _slow
            ids = self._append(slots[new], starts[new], ends[new])
            self._recent.append((hashes[new], ids))
            panes[new] = ids
        for i in np.flatnonzero(panes == -2).tolist():
            panes[i] = self._slow(int(slots[i]), float(starts[i]), float(ends[i]))
        return panes

    def _find(self, hashes: np.ndarray) -> np.ndarray:
        """The pane proposed for each hash (-1: none), from the table and the sorted
        array (the recent panes sorted into it first)."""
        if self._recent:
            self._sort_recent()
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

    def _sort_recent(self) -> None:
        """Merge the recent panes' hashes into the sorted array; move it into the table
        once it outgrows :data:`SORTED_MAX`."""
        recent, self._recent = self._recent, []
        hashes = np.concatenate([h for h, _ in recent])
        panes = np.concatenate([p for _, p in recent])
        # stable: of panes with one hash, the older one is proposed first
        order = np.argsort(hashes, kind="stable")
        hashes, panes = hashes[order], panes[order]
        if len(self._sorted):
            at = np.searchsorted(self._sorted, hashes, side="right")
            hashes = np.insert(self._sorted, at, hashes)
            panes = np.insert(self._sorted_panes, at, panes)
        if len(hashes) > SORTED_MAX:
            self._table.insert(hashes, panes)
            hashes, panes = np.zeros(0, np.uint64), np.zeros(0, np.int64)
        self._sorted, self._sorted_panes = hashes, panes

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
        self._recent = []
        self._overflow.clear()  # its pairs are found by the scan again, then kept
        if len(kept):
            slots, starts = arrays["_slot"][:self.size], arrays["_start"][:self.size]
            self._recent.append((pair_hashes(slots, starts),
                                 np.arange(self.size, dtype=np.int64)))
