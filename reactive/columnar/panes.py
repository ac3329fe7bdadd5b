"""The windows of a columnar window operator: (key slot, window start) pairs mapped to dense
*pane* ids, looked up for a whole batch at once.

A pane is one key's one window. Its metadata lives in arrays indexed by pane id beside the
aggregates' arrays (one dict, so snapshots capture and copy-on-write them together):
``_slot`` (the key's slot in the :class:`~reactive.columnar.key_index.KeyIndex`), ``_start``
and ``_end`` (the window, seconds). The lookup hashes each pair to 64 bits and probes a
:class:`~reactive.columnar.slot_table.SlotTable`; a hash only proposes a pane, confirmed by
comparing slot and start, so two pairs whose hashes collide never share a pane (the rare
colliding pair lives in a small dict).

Panes are never reused in place: :meth:`PaneTable.compact` drops the windows that were
cleaned up by building new arrays (the ones a snapshot still reads stay intact).
"""

from __future__ import annotations

import numpy as np

from .slot_table import SlotTable, _fmix64

__all__ = ["META", "PaneTable", "pair_hashes"]

META = ("_slot", "_start", "_end")
"""The pane metadata arrays' names."""

_MIX = np.uint64(0x9E3779B97F4A7C15)


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
        self._overflow: dict[tuple[int, float], int] = {}

    def lookup(self, slots: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """The pane of each distinct (slot, start) pair, adding the new ones.

        Args:
            slots, starts, ends: per pair (distinct pairs), its key slot and window.

        Returns:
            Per pair, its pane id (``int64``).
        """
        hashes = pair_hashes(slots, starts)
        panes = self._table.lookup(hashes)
        found = np.flatnonzero(panes >= 0)
        if len(found):
            p = panes[found]
            same = (self.arrays["_slot"][p] == slots[found]) \
                & (self.arrays["_start"][p] == starts[found])
            panes[found[~same]] = -2  # another pair's hash
        new = np.flatnonzero(panes == -1)
        if len(new):
            _, first = np.unique(hashes[new], return_index=True)
            if len(first) < len(new):
                later = np.ones(len(new), bool)
                later[first] = False
                panes[new[later]] = -2
                new = new[~later]
            ids = self._append(slots[new], starts[new], ends[new])
            self._table.insert(hashes[new], ids)
            panes[new] = ids
        for i in np.flatnonzero(panes == -2).tolist():
            panes[i] = self._slow(int(slots[i]), float(starts[i]), float(ends[i]))
        return panes

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
        self._table.clear()
        self._overflow.clear()
        if not len(kept):
            return
        slots, starts = arrays["_slot"][:self.size], arrays["_start"][:self.size]
        hashes = pair_hashes(slots, starts)
        _, first = np.unique(hashes, return_index=True)
        ids = np.arange(self.size, dtype=np.int64)
        if len(first) < self.size:
            for i in np.setdiff1d(ids, first).tolist():
                self._overflow[(int(slots[i]), float(starts[i]))] = i
            ids = np.sort(first)
        self._table.insert(hashes[ids], ids)
