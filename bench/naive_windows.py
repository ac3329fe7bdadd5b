"""The baseline of the sharing experiments: one accumulator per open window per query.

Every record is added to each of the r/s windows of every query that contain it (no
sharing), as a per-window aggregator does (the "naive" strategy of Carbone 2018 (PhD thesis),
section 5.7): a baseline for benchmarks and tests, not part of the runtime. Same interface as
:class:`reactive.windowing.cutty.CuttyAggregator`, so tests and ``bench/windows.py`` can
compare results and combine counts on the same input.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from reactive.windowing.assigners import PeriodicWindows
from reactive.windowing.cutty import WindowEmission
from reactive.windowing.flatfat import AggregateStats
from reactive.windowing.functions import AggregateFunction

__all__ = ["NaiveAggregator"]


class NaiveAggregator:
    """Per-window aggregation of periodic windows over in-order positions.

    Args:
        queries: the window definitions.
        agg: the aggregate.
        stats: counters (a new one by default).
    """

    def __init__(self, queries: Sequence[PeriodicWindows], agg: AggregateFunction,
                 stats: AggregateStats | None = None) -> None:
        self.queries = list(queries)
        self.agg = agg
        self.stats = stats if stats is not None else AggregateStats()
        self.position: float = 0
        # per query: open windows as [start, end, accumulator], oldest first
        self.open: list[deque[list[Any]]] = [deque() for _ in queries]
        self.next_begin: list[float] = [q.offset for q in queries]

    def add_all(self, values: Sequence[Any]) -> list[WindowEmission]:
        """Fold ``values`` (the next positions, in order); return the windows they complete."""
        out: list[WindowEmission] = []
        agg = self.agg
        add = agg.add
        stats = self.stats
        queries = self.queries
        next_begin = self.next_begin
        pos = self.position
        for v in values:
            for q, windows in enumerate(self.open):
                if next_begin[q] == pos:
                    spec = queries[q]
                    windows.append([pos, pos + spec.size, agg.create_accumulator()])
                    next_begin[q] = pos + spec.slide
                for w in windows:
                    w[2] = add(v, w[2])
                stats.adds += len(windows)
            pos += 1
            for q, windows in enumerate(self.open):
                while windows and windows[0][1] == pos:
                    start, end, acc = windows.popleft()
                    out.append((q, start, end, acc))
                    stats.windows += 1
        self.position = pos
        return out
