"""Window-sharing strategies of the Cutty evaluation (Carbone 2018 (PhD thesis), section 5.7,
table 5.1), for benchmarks.

Every strategy folds an in-order stream of ``(timestamp, value)`` records into the periodic
windows ``[k * slide, k * slide + size)`` of several queries and emits each window that has
records when the stream passes its end (count windows are the case ``timestamp =
position``). They differ in where they cut the stream into slices (partial aggregates) and
in how a window's result is assembled from the slices (the aggregate store):

- ``naive``: no sharing: one accumulator per open window per query, every record added to
  each of them (the "per-window aggregator" baseline).
- ``panes`` (Li et al., "No pane, no gain", 2005): slices of a fixed width, the gcd of all
  ranges and slides.
- ``pairs`` (Krishnamurthy et al., "On-the-fly sharing for streamed aggregation", 2006):
  cuts where any window begins or ends.
- ``cutty`` (Carbone et al., CIKM 2016; Carbone 2018 (PhD thesis), Algorithm 8): cuts only
  where a window begins; a window that ends inside the open slice takes the slice's running partial.

Stores: ``lazy`` keeps the slices in a list and folds a window's slices when it ends
(``j - i - 1`` merges); ``eager`` keeps them in a FlatFAT (the runtime's
:class:`reactive.windowing.flatfat.FlatFAT`), which pre-aggregates on append and answers a
window with O(log n) merges. The runtime's own Cutty (``reactive.windowing.CuttyAggregator``,
count windows) is Cutty with the eager store; the benchmark runs it next to these.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Sequence
from functools import reduce
from typing import Any, Literal

from reactive.windowing.flatfat import AggregateStats, FlatFAT
from reactive.windowing.functions import AggregateFunction

__all__ = ["NaiveWindows", "SlicingWindows", "Strategy", "WindowResult"]

WindowResult = tuple[int, float, float, Any]
"""``(query index, start, end, result accumulator)``."""

Strategy = Literal["panes", "pairs", "cutty"]


class NaiveWindows:
    """One accumulator per open window per query (no sharing).

    Args:
        queries: ``(size, slide)`` per query (same unit as the timestamps).
        agg: the aggregate.
    """

    def __init__(self, queries: Sequence[tuple[float, float]], agg: AggregateFunction) -> None:
        self.queries = list(queries)
        self.agg = agg
        self.stats = AggregateStats()
        self.open: list[deque[list[Any]]] = [deque() for _ in self.queries]
        self.next_begin = [0.0 for _ in self.queries]

    def add_all(self, records: Sequence[tuple[float, Any]]) -> list[WindowResult]:
        """Fold ``records`` (in timestamp order); return the windows they complete."""
        out: list[WindowResult] = []
        agg, stats, queries, next_begin = self.agg, self.stats, self.queries, self.next_begin
        add = agg.add
        for t, v in records:
            for q, windows in enumerate(self.open):
                while windows and windows[0][1] <= t:
                    start, end, acc, n = windows.popleft()
                    if n:
                        out.append((q, start, end, acc))
                        stats.windows += 1
                size, slide = queries[q]
                while next_begin[q] <= t:
                    b = next_begin[q]
                    if b + size > t:  # windows that ended before t never saw a record
                        windows.append([b, b + size, agg.create_accumulator(), 0])
                    next_begin[q] = b + slide
                for w in windows:
                    w[2] = add(v, w[2])
                    w[3] += 1
                stats.adds += len(windows)
        return out


class SlicingWindows:
    """Shared aggregation by slicing (``panes``, ``pairs`` or ``cutty``) with a ``lazy``
    or ``eager`` aggregate store.

    Args:
        queries: ``(size, slide)`` per query; for ``panes`` integers (their gcd is the
            pane width).
        agg: the aggregate (``merge`` associative).
        strategy: where to cut slices.
        store: ``"lazy"`` (list, fold per window) or ``"eager"`` (FlatFAT).
    """

    def __init__(self, queries: Sequence[tuple[float, float]], agg: AggregateFunction,
                 strategy: Strategy, store: Literal["lazy", "eager"]) -> None:
        self.queries = list(queries)
        self.agg = agg
        self.strategy = strategy
        self.eager = store == "eager"
        self.stats = AggregateStats()
        self.fat = FlatFAT(agg.merge, self.stats)
        self.partials: list[Any] = []  # lazy store
        self.starts: list[float] = []  # start of each stored slice, oldest first
        self.base = 0  # index of starts[0] in the store
        self.partial: Any = None
        self.slice_start = 0.0
        self.next_begin = [0.0 for _ in self.queries]
        self.next_end = [float(size) for size, _ in self.queries]
        self.pane = float(reduce(math.gcd, [int(x) for q in self.queries for x in q])) \
            if strategy == "panes" else math.inf
        self.next_pane = self.pane

    def _boundary(self) -> float:
        return min(min(self.next_begin), min(self.next_end), self.next_pane)

    def _merge(self, a: Any, b: Any) -> Any:
        if a is None:
            return b
        if b is None:
            return a
        self.stats.merges += 1
        return self.agg.merge(a, b)

    def _query(self, start: float) -> Any:
        """The stored slices from ``start`` on, folded."""
        i = bisect.bisect_left(self.starts, start)
        if i >= len(self.starts):
            return None
        if self.eager:
            return self.fat.query(self.base + i, self.base + len(self.starts))
        acc = None
        for p in self.partials[i:]:
            acc = self._merge(acc, p)
        return acc

    def _on_boundary(self, b: float, out: list[WindowResult]) -> None:
        queries, next_end, next_begin = self.queries, self.next_end, self.next_begin
        for q, end in enumerate(next_end):
            if end == b:
                start = end - queries[q][0]
                acc = self._merge(self._query(start), self.partial) \
                    if start < self.slice_start else self.partial
                if acc is not None:
                    out.append((q, start, end, acc))
                    self.stats.windows += 1
                next_end[q] = end + queries[q][1]
        if b == self.next_pane:
            self.next_pane += self.pane
        # panes and pairs cut at every boundary (for panes every begin and end is a pane
        # boundary); Cutty only where a window begins
        cut = self.strategy != "cutty"
        for q, begin in enumerate(next_begin):
            if begin == b:
                next_begin[q] = begin + queries[q][1]
                cut = True
        if cut:
            if self.partial is not None:
                self.starts.append(self.slice_start)
                if self.eager:
                    self.fat.append(self.partial)
                else:
                    self.partials.append(self.partial)
                self.stats.slices += 1
            self.partial = None
            self.slice_start = b
            oldest = min(e - size for e, (size, _) in zip(next_end, queries, strict=True))
            k = bisect.bisect_left(self.starts, oldest)
            if k > 64 or (k and k * 2 > len(self.starts)):
                del self.starts[:k]
                self.base += k
                if self.eager:
                    self.fat.purge(self.base)
                else:
                    del self.partials[:k]

    def add_all(self, records: Sequence[tuple[float, Any]]) -> list[WindowResult]:
        """Fold ``records`` (in timestamp order); return the windows they complete."""
        out: list[WindowResult] = []
        add = self.agg.add
        stats = self.stats
        boundary = self._boundary()
        for t, v in records:
            while boundary <= t:
                self._on_boundary(boundary, out)
                boundary = self._boundary()
            acc = self.partial
            self.partial = add(v, self.agg.create_accumulator() if acc is None else acc)
            stats.adds += 1
        return out
