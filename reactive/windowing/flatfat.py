"""FlatFAT: a flat, array-backed aggregate tree over a sliding sequence of partial
aggregates (Tangwongsan et al., "General Incremental Sliding-Window Aggregation", VLDB
2015; the aggregate store of Cutty, Carbone 2018 (PhD thesis), chapter 5, section 5.5).

Leaves are addressed by an ever-increasing *absolute index*; the tree is a circular buffer
of ``capacity`` leaves (a power of two) with internal node ``n`` holding
``merge(node 2n, node 2n+1)``. Appending or updating a leaf recomputes its path
(``log2(capacity)`` merges); a range query combines O(log capacity) nodes, in order, so
``merge`` need only be associative. Purging is lazy: it moves the front and clears leaves;
an internal node is only read when all its leaves are live, and by then its last leaf was
written after every other leaf of its block, which recomputed it. The store doubles its
capacity when full.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["AggregateStats", "FlatFAT"]


class AggregateStats:
    """Counters of an aggregator, to measure sharing.

    Attributes:
        adds: records folded into an accumulator (``AggregateFunction.add`` calls).
        merges: ``AggregateFunction.merge`` calls (partial + partial).
        slices: partial aggregates written to the aggregate store.
        windows: window results produced.
    """

    __slots__ = ("adds", "merges", "slices", "windows")

    def __init__(self) -> None:
        self.adds = 0
        self.merges = 0
        self.slices = 0
        self.windows = 0

    @property
    def combines(self) -> int:
        """All combine calls: ``adds + merges``."""
        return self.adds + self.merges

    def __repr__(self) -> str:
        return (f"AggregateStats(adds={self.adds}, merges={self.merges}, "
                f"slices={self.slices}, windows={self.windows})")


def _unbound_merge(a: Any, b: Any) -> Any:
    raise RuntimeError("FlatFAT restored from a snapshot is used before bind(): its owner "
                       "must re-attach the aggregate's merge")


class FlatFAT:
    """Aggregate store: append, update, range query and purge of partial aggregates.

    Args:
        merge: the associative combine of two partials (``AggregateFunction.merge``).
        stats: counts merges; ``None`` entries are identities and cost nothing.
        capacity: initial number of leaves (rounded up to a power of two).
    """

    __slots__ = ("cap", "first", "merge", "next", "stats", "tree")

    def __init__(self, merge: Callable[[Any, Any], Any], stats: AggregateStats,
                 capacity: int = 16) -> None:
        cap = 1
        while cap < capacity:
            cap *= 2
        self.cap = cap
        self.tree: list[Any] = [None] * (2 * cap)
        self.merge = merge
        self.stats = stats
        self.first = 0  # absolute index of the oldest live leaf
        self.next = 0  # absolute index of the next appended leaf

    def __len__(self) -> int:
        return self.next - self.first

    def __getstate__(self) -> dict[str, Any]:
        # the merge function is the user's (a lambda in reduce(...)) and the counters are
        # the operator's: neither is state, so neither is pickled; the owner re-binds them
        return {"cap": self.cap, "tree": self.tree, "first": self.first, "next": self.next}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, value)
        self.merge = _unbound_merge
        self.stats = AggregateStats()

    def _combine(self, a: Any, b: Any) -> Any:
        if a is None:
            return b
        if b is None:
            return a
        self.stats.merges += 1
        return self.merge(a, b)

    def _set(self, physical: int, value: Any) -> None:
        tree = self.tree
        n = physical + self.cap
        tree[n] = value
        n >>= 1
        combine = self._combine
        while n:
            tree[n] = combine(tree[2 * n], tree[2 * n + 1])
            n >>= 1

    def append(self, value: Any) -> int:
        """Add a leaf after the last one; return its absolute index."""
        if self.next - self.first == self.cap:
            self._grow()
        idx = self.next
        self.next += 1
        self._set(idx & (self.cap - 1), value)
        return idx

    def update(self, index: int, value: Any) -> None:
        """Replace live leaf ``index`` (absolute).

        Raises:
            IndexError: if ``index`` is not live.
        """
        if not self.first <= index < self.next:
            raise IndexError(f"leaf {index} is not in the store [{self.first}, {self.next})")
        self._set(index & (self.cap - 1), value)

    def get(self, index: int) -> Any:
        """The leaf ``index`` (absolute)."""
        return self.tree[self.cap + (index & (self.cap - 1))]

    def query(self, lo: int, hi: int) -> Any:
        """Combine leaves ``lo .. hi - 1`` (absolute, live) in order; None when empty."""
        lo = max(lo, self.first)
        hi = min(hi, self.next)
        if lo >= hi:
            return None
        mask = self.cap - 1
        plo = lo & mask
        phi = plo + (hi - lo)
        if phi <= self.cap:
            return self._query(plo, phi)
        return self._combine(self._query(plo, self.cap), self._query(0, phi - self.cap))

    def _query(self, lo: int, hi: int) -> Any:
        tree = self.tree
        combine = self._combine
        left: Any = None
        right: Any = None
        lo += self.cap
        hi += self.cap
        while lo < hi:
            if lo & 1:
                left = combine(left, tree[lo])
                lo += 1
            if hi & 1:
                hi -= 1
                right = combine(tree[hi], right)
            lo >>= 1
            hi >>= 1
        return combine(left, right)

    def purge(self, upto: int) -> None:
        """Drop the leaves before absolute index ``upto`` (lazily: no merges)."""
        upto = min(upto, self.next)
        mask, tree, cap = self.cap - 1, self.tree, self.cap
        for i in range(self.first, upto):
            tree[cap + (i & mask)] = None
        self.first = max(self.first, upto)

    def _grow(self) -> None:
        old_cap, old = self.cap, self.tree
        cap = old_cap * 2
        tree: list[Any] = [None] * (2 * cap)
        for i in range(self.first, self.next):
            tree[cap + (i & (cap - 1))] = old[old_cap + (i & (old_cap - 1))]
        self.cap, self.tree = cap, tree
        combine = self._combine
        for n in range(cap - 1, 0, -1):
            tree[n] = combine(tree[2 * n], tree[2 * n + 1])
