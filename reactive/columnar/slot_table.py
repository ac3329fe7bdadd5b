"""An open-addressing hash table in numpy arrays: 64-bit key hashes -> slots, probed for a
whole batch of keys at once (linear probing, vectorized: each round gathers every pending
key's bucket, and only keys that met another key's hash probe on).

It spares :class:`~reactive.columnar.key_index.KeyIndex` a Python ``dict`` lookup per
distinct key of a batch: the hashes of a string array's values come from its bytes in a
few numpy passes (:func:`string_hashes`), and the table answers for all of them together.
A hash only proposes a slot: the index compares the keys themselves (``pyarrow.compute.equal``)
before using it, so a collision of two keys' hashes never merges their state.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .schema import pa

__all__ = ["SlotTable", "identity_hashes"]

_P = np.uint64(0x100000001B3)  # the FNV-1 64-bit prime: odd, so powers never vanish
_M1 = np.uint64(0xFF51AFD7ED558CCD)
_M2 = np.uint64(0xC4CEB9FE1A85EC53)
_powers = np.ones(1, np.uint64)


def _fmix64(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finalizer (every input bit affects every output bit)."""
    with np.errstate(over="ignore"):
        h = h ^ (h >> np.uint64(33))
        h = h * _M1
        h = h ^ (h >> np.uint64(33))
        h = h * _M2
        out: np.ndarray = h ^ (h >> np.uint64(33))
        return out


def _power_table(n: int) -> np.ndarray:
    global _powers
    if len(_powers) < n:
        size = max(n, 2 * len(_powers))
        with np.errstate(over="ignore"):
            p = np.full(size, _P, np.uint64)
            p[0] = 1
            _powers = np.cumprod(p, dtype=np.uint64)
    return _powers


def identity_hashes(array: Any) -> np.ndarray | None:
    """A 64-bit hash per value of a string, binary or integer array without nulls (a
    polynomial over a string's bytes, then a finalizer), or None for other arrays.

    Equal values hash equal; it is not the key-group hash (that one is
    :func:`~reactive.columnar.canonical_hash.key_groups_of`), and distinct values may
    collide.
    """
    if array.null_count:
        return None
    t = array.type
    if pa.types.is_integer(t):
        return _fmix64(array.to_numpy(zero_copy_only=False).astype(np.int64)
                       .view(np.uint64))
    large = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
    if not (large or pa.types.is_string(t) or pa.types.is_binary(t)):
        return None
    n = len(array)
    buffers = array.buffers()
    offset_type = np.dtype(np.int64 if large else np.int32)
    offsets = np.frombuffer(buffers[1], offset_type, n + 1,
                            array.offset * offset_type.itemsize).astype(np.int64)
    lengths = np.diff(offsets)
    nbytes = int(offsets[-1] - offsets[0]) if n else 0
    h = lengths.astype(np.uint64)
    if nbytes:
        data = np.frombuffer(buffers[2], np.uint8, nbytes, int(offsets[0])).astype(np.uint64)
        starts = offsets[:-1] - offsets[0]
        within = np.arange(nbytes, dtype=np.int64) - np.repeat(starts, lengths)
        with np.errstate(over="ignore"):
            terms = (data + np.uint64(1)) * _power_table(int(lengths.max()))[within]
        nonempty = lengths > 0
        sums = np.zeros(n, np.uint64)
        with np.errstate(over="ignore"):
            sums[nonempty] = np.add.reduceat(terms, starts[nonempty])
            h = h * _M2 + sums
    return _fmix64(h)


class SlotTable:
    """64-bit hashes -> slots, with linear probing; at most half full.

    Attributes:
        size: the number of entries.
    """

    def __init__(self, capacity: int = 1 << 12) -> None:
        self._hashes = np.zeros(capacity, np.uint64)
        self._slots = np.full(capacity, -1, np.int64)
        self._mask = np.uint64(capacity - 1)
        self.size = 0

    def lookup(self, hashes: np.ndarray) -> np.ndarray:
        """The slot of each hash's first entry, or -1 where there is none."""
        out = np.full(len(hashes), -1, np.int64)
        bucket = (hashes & self._mask).astype(np.int64)
        pending = np.arange(len(hashes))
        table_h, table_s, mask = self._hashes, self._slots, int(self._mask)
        while len(pending):
            b = bucket[pending]
            s = table_s[b]
            hit = (s >= 0) & (table_h[b] == hashes[pending])
            out[pending[hit]] = s[hit]
            go_on = (s >= 0) & ~hit
            pending = pending[go_on]
            bucket[pending] = (bucket[pending] + 1) & mask
        return out

    def insert(self, hashes: np.ndarray, slots: np.ndarray) -> None:
        """Add entries (a hash already present gets a second entry, found after the
        first)."""
        if 2 * (self.size + len(hashes)) > len(self._slots):
            self._grow(self.size + len(hashes))
        table_h, table_s, mask = self._hashes, self._slots, int(self._mask)
        bucket = (hashes & self._mask).astype(np.int64)
        pending = np.arange(len(hashes))
        while len(pending):
            b = bucket[pending]
            free = table_s[b] < 0
            # of several pending entries aiming at one free bucket, the first takes it
            cand = pending[free]
            _, first = np.unique(bucket[cand], return_index=True)
            placed = cand[first]
            table_h[bucket[placed]] = hashes[placed]
            table_s[bucket[placed]] = slots[placed]
            done = np.zeros(len(hashes), bool)
            done[placed] = True
            pending = pending[~done[pending]]
            moved = pending[table_s[bucket[pending]] >= 0]
            bucket[moved] = (bucket[moved] + 1) & mask
        self.size += len(hashes)

    def _grow(self, entries: int) -> None:
        capacity = len(self._slots)
        while 2 * entries > capacity:
            capacity *= 2
        used = self._slots >= 0
        hashes, slots = self._hashes[used], self._slots[used]
        self._hashes = np.zeros(capacity, np.uint64)
        self._slots = np.full(capacity, -1, np.int64)
        self._mask = np.uint64(capacity - 1)
        self.size = 0
        # re-inserted in slot order, so the first entry of a repeated hash stays first
        order = np.argsort(slots, kind="stable")
        self.insert(hashes[order], slots[order])

    def clear(self) -> None:
        """Remove every entry."""
        self._slots[:] = -1
        self.size = 0
