"""Cutty: shared aggregation of several periodic window definitions over one stream
(Carbone et al., "Cutty: Aggregate Sharing for User-Defined Windows", CIKM 2016; Carbone
2018 (PhD thesis), chapter 5: Algorithm 8 and section 5.5).

Slices are cut only where *some* window begins. Every record is folded once into the
current slice's partial aggregate; a finished slice is written to the aggregate store
(:class:`~.flatfat.FlatFAT`). A window that ends *now* is the store's range query over its
slices plus the current slice's running partial, which covers exactly the records from the
last cut up to now -- so windows never need a cut at their end. One periodic query of range
r and slide s thus writes r/s partials per window (Pairs, which cuts at begins and ends,
writes up to 2r/s), and each result costs O(log #slices) merges instead of the r/s adds per
record of a per-window aggregator (:mod:`.naive`).

:class:`CuttyAggregator` works on in-order positions (count windows: a key's n-th record is
position n - 1). :class:`EventTimeCuttyAggregator` serves event-time windows with
out-of-order records: records wait in pending slices until the watermark passes them, then
the sealed slices enter the same store in time order. Because records may arrive out of
order, its slices are also cut where windows end (as general stream slicing does); a
window is emitted when the watermark reaches its end.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

from .assigners import PeriodicWindows
from .flatfat import AggregateStats, FlatFAT
from .functions import AggregateFunction

__all__ = ["CuttyAggregator", "EventTimeCuttyAggregator", "WindowEmission"]

WindowEmission = tuple[int, float, float, Any]
"""``(query index, start, end, accumulator)`` of a finished window."""


class _Store:
    """FlatFAT plus the start position of each of its leaves (for window -> leaf lookups)."""

    __slots__ = ("base", "fat", "starts")

    def __init__(self, agg: AggregateFunction, stats: AggregateStats) -> None:
        self.fat = FlatFAT(agg.merge, stats)
        self.starts: list[float] = []  # starts[i] is leaf base + i
        self.base = 0

    def append(self, start: float, partial: Any) -> None:
        self.fat.append(partial)
        self.fat.stats.slices += 1
        self.starts.append(start)

    def index(self, position: float, lo: int = 0) -> int:
        """Position in ``starts`` of the first slice starting at or after ``position``."""
        return bisect.bisect_left(self.starts, position, lo)

    def query(self, i: int, j: int) -> Any:
        return self.fat.query(self.base + i, self.base + j)

    def purge_before(self, position: float) -> None:
        """Drop the slices starting before ``position`` (no window still needs them)."""
        k = self.index(position)
        if k > 64 or (k and k * 2 > len(self.starts)):
            del self.starts[:k]
            self.base += k
            self.fat.purge(self.base)


class CuttyAggregator:
    """Shared aggregation of periodic windows over in-order positions (count windows).

    Args:
        queries: the window definitions (range ``size``, ``slide``, ``offset``).
        agg: the aggregate (its ``merge`` must be associative).
        stats: counters to share with other aggregators (a new one by default).

    Raises:
        ValueError: without queries.
    """

    def __init__(self, queries: Sequence[PeriodicWindows], agg: AggregateFunction,
                 stats: AggregateStats | None = None) -> None:
        if not queries:
            raise ValueError("CuttyAggregator needs at least one window definition")
        self.sizes = [q.size for q in queries]
        self.slides = [q.slide for q in queries]
        self.agg = agg
        self.stats = stats if stats is not None else AggregateStats()
        self.store = _Store(agg, self.stats)
        self.position: float = 0
        self.partial: Any = None  # running partial of the open slice (None: empty)
        self.slice_start: float = 0
        self.next_begin: list[float] = [q.offset for q in queries]
        self.next_end: list[float] = [q.offset + q.size for q in queries]
        self.boundary = min(min(self.next_begin), min(self.next_end))

    def __getstate__(self) -> dict[str, Any]:
        # the aggregate function and counters are not state: the owner re-binds them
        state = self.__dict__.copy()
        state["agg"] = None
        state["stats"] = None
        return state

    def bind(self, agg: AggregateFunction, stats: AggregateStats) -> None:
        """Re-attach the aggregate function and counters after unpickling."""
        self.agg = agg
        self.stats = stats
        self.store.fat.merge = agg.merge
        self.store.fat.stats = stats

    def add_all(self, values: Sequence[Any]) -> list[WindowEmission]:
        """Fold ``values`` (the next positions, in order); return the windows they complete."""
        out: list[WindowEmission] = []
        add = self.agg.add
        n = len(values)
        i = 0
        while i < n:
            if self.position == self.boundary:
                self._on_boundary(out)
            run = int(min(n - i, self.boundary - self.position))
            acc = self.partial
            if acc is None:
                acc = self.agg.create_accumulator()
            for k in range(i, i + run):
                acc = add(values[k], acc)
            self.partial = acc
            self.stats.adds += run
            self.position += run
            i += run
        if self.position == self.boundary:
            self._on_boundary(out)
        return out

    def _on_boundary(self, out: list[WindowEmission]) -> None:
        pos = self.position
        store = self.store
        next_end, next_begin, sizes, slides = self.next_end, self.next_begin, self.sizes, self.slides
        # windows ending now: stored slices from their begin + the running partial
        for q, end in enumerate(next_end):
            if end == pos:
                start = end - sizes[q]
                if start < self.slice_start:
                    i = store.index(start)
                    j = store.index(self.slice_start, i)
                    acc = store.fat._combine(store.query(i, j), self.partial)
                else:
                    acc = self.partial
                if acc is not None:
                    out.append((q, start, end, acc))
                    self.stats.windows += 1
                next_end[q] = end + slides[q]
        # windows beginning now: cut a slice (once, however many queries begin here)
        cut = False
        for q, begin in enumerate(next_begin):
            if begin == pos:
                cut = True
                next_begin[q] = begin + slides[q]
        if cut:
            if self.partial is not None:
                store.append(self.slice_start, self.partial)
            self.partial = None
            self.slice_start = pos
            oldest = min(e - s for e, s in zip(next_end, sizes, strict=True))
            store.purge_before(oldest)
        self.boundary = min(min(next_begin), min(next_end))


class EventTimeCuttyAggregator:
    """Shared aggregation of periodic event-time windows with out-of-order records.

    Records are added to pending slices (cut at every window begin and end of any query);
    :meth:`advance` seals the slices the watermark passed, in time order, into the store
    and emits every non-empty window that ended, skipping empty stretches of time.

    Args:
        queries: periodic event-time window definitions.
        agg: the aggregate.
        stats: shared counters (a new one by default).
    """

    def __init__(self, queries: Sequence[PeriodicWindows], agg: AggregateFunction,
                 stats: AggregateStats | None = None) -> None:
        self.queries = list(queries)
        self.agg = agg
        self.stats = stats if stats is not None else AggregateStats()
        self.store = _Store(agg, self.stats)
        self.pending: dict[float, Any] = {}
        self.pending_end: dict[float, float] = {}
        self.sealed_until = float("-inf")
        self.next_end: list[float | None] = [None] * len(self.queries)
        self._cache = (0.0, 0.0)  # last slice [start, end) looked up
        # per query: its id (``WindowResult.query``), the start of its first window (-inf:
        # from the beginning) and whether it still emits (see add_query, retire_query)
        self.ids: list[int] = list(range(len(self.queries)))
        self.starts: list[float] = [float("-inf")] * len(self.queries)
        self.active: list[bool] = [True] * len(self.queries)
        self.version = 0  # the owner's version of its query set this aggregator follows

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["agg"] = None
        state["stats"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        # an aggregator pickled before queries could change: every query from the start
        n = len(state["queries"])
        state.setdefault("ids", list(range(n)))
        state.setdefault("starts", [float("-inf")] * n)
        state.setdefault("active", [True] * n)
        state.setdefault("version", 0)
        self.__dict__.update(state)

    def add_query(self, query_id: int, query: PeriodicWindows, start: float) -> None:
        """Add a window definition whose first window begins at ``start`` (one of its
        window begins), sharing the slices from there on (Carbone 2018 (PhD thesis),
        section 5.5: queries added at runtime).

        Invariant: every record folded so far has a timestamp before ``start``, so a pending
        slice reaching past ``start`` ends there instead (it holds nothing of the new
        query's windows) and every later slice is cut at the new query's begins and ends.

        Args:
            query_id: the id its windows carry (``WindowEmission``'s first field).
            query: the periodic definition.
            start: the begin of its first window (event-time seconds).
        """
        for s, e in self.pending_end.items():
            if s < start < e:
                self.pending_end[s] = start
        self.queries.append(query)
        self.ids.append(query_id)
        self.starts.append(start)
        self.active.append(True)
        # from the beginning (-inf: nothing folded yet) the first sealed slice sets it
        self.next_end.append(start + query.size if start > float("-inf") else None)
        self._cache = (0.0, 0.0)

    def retire_query(self, query_id: int) -> None:
        """Stop emitting the windows of query ``query_id``. Its begins and ends still cut
        this aggregator's slices (slices already cut at them may be pending, and the store
        needs slices in time order); an aggregator made after the change slices without it.
        """
        for qi, i in enumerate(self.ids):
            if i == query_id:
                self.active[qi] = False

    def _first_end(self, qi: int, position: float) -> float:
        """The end of query ``qi``'s earliest window that ends after ``position`` and
        begins at or after the query's start."""
        q = self.queries[qi]
        return max(q.first_end_after(position), self.starts[qi] + q.size)

    def bind(self, agg: AggregateFunction, stats: AggregateStats) -> None:
        """Re-attach the aggregate function and counters after unpickling."""
        self.agg = agg
        self.stats = stats
        self.store.fat.merge = agg.merge
        self.store.fat.stats = stats

    def slice_of(self, timestamp: float) -> tuple[float, float]:
        """The slice ``[start, end)`` holding ``timestamp``: between the surrounding window
        begins/ends of all queries."""
        s, e = self._cache
        if s <= timestamp < e:
            return s, e
        lo = float("-inf")
        hi = float("inf")
        for q, begin in zip(self.queries, self.starts, strict=True):
            if begin > timestamp:
                hi = min(hi, begin)  # a query added later cuts at its start only
                continue
            b = timestamp - (timestamp - q.offset) % q.slide  # last begin <= ts
            en = timestamp - (timestamp - q.offset - q.size) % q.slide  # last end <= ts
            lo = max(lo, b, en)
            hi = min(hi, b + q.slide, en + q.slide)
        self._cache = (lo, hi)
        return lo, hi

    def add(self, timestamp: float, value: Any) -> float | None:
        """Fold a record; return its slice's end when the slice is new (to set a timer),
        else None.

        Raises:
            ValueError: if the record's slice was already sealed (a late record).
        """
        start, end = self.slice_of(timestamp)
        if end <= self.sealed_until:
            raise ValueError(f"timestamp {timestamp} is in a sealed slice")
        pending = self.pending
        acc = pending.get(start)
        new = acc is None
        if new:
            acc = self.agg.create_accumulator()
            self.pending_end[start] = end
        pending[start] = self.agg.add(value, acc)
        self.stats.adds += 1
        return end if new else None

    def is_late(self, timestamp: float) -> bool:
        """True when the record's slice was sealed (its windows were emitted)."""
        return self.slice_of(timestamp)[1] <= self.sealed_until

    def advance(self, watermark: float) -> list[WindowEmission]:
        """Seal the slices ending at or before ``watermark`` and emit the windows that ended."""
        store = self.store
        ready = sorted(s for s, e in self.pending_end.items() if e <= watermark)
        for s in ready:
            if any(x is None for x in self.next_end):
                self.next_end = [self._first_end(qi, s) if x is None else x
                                 for qi, x in enumerate(self.next_end)]
            store.append(s, self.pending.pop(s))
            del self.pending_end[s]
        self.sealed_until = max(self.sealed_until, watermark)
        out: list[WindowEmission] = []
        if not store.starts:
            return out
        horizon = min(self.pending) if self.pending else watermark
        for qi, q in enumerate(self.queries):
            if not self.active[qi]:
                continue
            e = self.next_end[qi]
            assert e is not None
            size = q.size
            while e <= watermark:
                s = e - size
                i = store.index(s)
                if i >= len(store.starts):
                    e = self._first_end(qi, min(watermark, horizon))
                    break
                if store.starts[i] >= e:
                    e = self._first_end(qi, store.starts[i])
                    continue
                j = store.index(e, i)
                acc = store.query(i, j)
                out.append((self.ids[qi], s, e, acc))
                self.stats.windows += 1
                e += q.slide
            self.next_end[qi] = e
        oldest = min((x - q.size for x, q, on in zip(self.next_end, self.queries, self.active,
                                                     strict=True)
                      if x is not None and on), default=watermark)
        store.purge_before(oldest)
        out.sort(key=lambda w: (w[2], w[0]))
        return out

    def is_empty(self) -> bool:
        """True when nothing is pending and no stored slice can join a future window."""
        return not self.pending and not self.store.starts
