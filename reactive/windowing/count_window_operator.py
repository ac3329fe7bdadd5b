"""The count window operator: ``count_window(size, slide)`` or several count window
definitions sharing partial aggregates through Cutty (Carbone et al., "Cutty: Aggregate
Sharing for User-Defined Windows", CIKM 2016)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..runtime.operators import StreamOperator, checked_outputs
from ..state.api import ValueState
from ..state.descriptors import ValueStateDescriptor
from .assigners import CountWindows, TimeWindow
from .cutty import CuttyAggregator, WindowEmission
from .flatfat import AggregateStats
from .functions import AggregateFunction, ProcessWindowFunction, WindowResult

__all__ = ["CountWindowOperator"]


class CountWindowOperator(StreamOperator):
    """Count windows: ``count_window(size, slide)`` or several count definitions shared.

    With an aggregate, each key has a :class:`CuttyAggregator` (in a value state) fed with
    the key's records in order; with a process window function (one definition) each key
    keeps its last ``size`` records. Only complete windows fire, except for definitions
    with ``partial=True`` (Flink's ``countWindow(size, slide)``), whose partial initial
    windows ``[0, k*slide)`` fire too (running prefix aggregates in a second value state
    until the key has seen ``size`` records).

    Args:
        name, uid: operator identity.
        key_selector: record -> key.
        queries: count window definitions.
        aggregate: the aggregate, or None.
        process: a process window function (one definition), or None.
    """

    keyed = True

    def __init__(self, name: str, uid: str, key_selector: Callable[[Any], Any],
                 queries: list[CountWindows], *, aggregate: AggregateFunction | None,
                 process: ProcessWindowFunction | None) -> None:
        super().__init__(name, uid, key_selector)
        assert (aggregate is None) != (process is None)
        assert process is None or len(queries) == 1
        self.queries = queries
        self.agg = aggregate
        self.fn = process
        self.stats = AggregateStats()
        self.state: ValueState

    def open(self) -> None:
        state = self.ctx.get_state(ValueStateDescriptor("count-windows"))
        assert isinstance(state, ValueState)
        self.state = state
        prefix = self.ctx.get_state(ValueStateDescriptor("count-windows-prefix"))
        assert isinstance(prefix, ValueState)
        self.prefix = prefix
        self.partial = any(q.partial for q in self.queries)

    def process_batch(self, batch: list[Any]) -> list[Any]:
        assert self.keyed_backend is not None and self.key_selector is not None
        key_of = self.key_selector
        groups: dict[Any, list[Any]] = {}
        r = None
        try:
            for r in batch:
                k = key_of(r)
                g = groups.get(k)
                if g is None:
                    groups[k] = [r]
                else:
                    g.append(r)
        except Exception as exc:
            raise self.fail(r, exc) from exc
        set_key = self.keyed_backend.set_current_key
        out: list[Any] = []
        for k, records in groups.items():
            set_key(k)
            try:
                if self.agg is not None:
                    self._aggregate(k, records, out)
                else:
                    self._process(k, records, out)
            except Exception as exc:
                raise self.fail(records[0], exc) from exc
        return out

    def _aggregate(self, key: Any, records: list[Any], out: list[Any]) -> None:
        assert self.agg is not None
        aggr: CuttyAggregator | None = self.state.value()
        if aggr is None:
            aggr = CuttyAggregator(self.queries, self.agg, self.stats)
        elif aggr.agg is None:
            aggr.bind(self.agg, self.stats)
        if self.partial and aggr.position < max(q.size for q in self.queries):
            self._partial_windows(key, int(aggr.position), records, out)
        emitted: list[WindowEmission] = aggr.add_all(records)
        self.state.update(aggr)
        get = self.agg.get_result
        out.extend(WindowResult(key, s, e, get(acc), q) for q, s, e, acc in emitted)

    def _partial_windows(self, key: Any, position: int, records: list[Any],
                         out: list[Any]) -> None:
        """Fold the records of positions < size into each partial definition's prefix
        aggregate; emit ``[0, p)`` at every multiple p of its slide below its size."""
        agg = self.agg
        assert agg is not None
        accs: list[Any] = self.prefix.value() or [None] * len(self.queries)
        for q, spec in enumerate(self.queries):
            size, slide = int(spec.size), int(spec.slide)
            if not spec.partial or position >= size:
                continue
            acc = accs[q] if accs[q] is not None else agg.create_accumulator()
            pos = position
            for r in records[: size - position]:
                acc = agg.add(r, acc)
                pos += 1
                if pos % slide == 0 and pos < size:
                    out.append(WindowResult(key, 0, pos, agg.get_result(acc), q))
            accs[q] = acc if pos < size else None
        if any(a is not None for a in accs):
            self.prefix.update(accs)
        else:
            self.prefix.clear()

    def _process(self, key: Any, records: list[Any], out: list[Any]) -> None:
        assert self.fn is not None
        spec = self.queries[0]
        size, slide = int(spec.size), int(spec.slide)
        cur = self.state.value()
        position, recent = (0, []) if cur is None else cur
        recent = list(recent)
        for r in records:
            recent.append(r)
            position += 1
            if spec.partial and position % slide == 0:
                window = TimeWindow(max(0, position - size), position)
                res = self.fn.process(key, window, recent[-size:])
                if res is not None:
                    out.extend(checked_outputs(res, "process"))
            elif not spec.partial and position >= size and (position - size) % slide == 0:
                window = TimeWindow(position - size, position)
                res = self.fn.process(key, window, recent[-size:])
                if res is not None:
                    out.extend(checked_outputs(res, "process"))
            if len(recent) > size:
                del recent[: len(recent) - size]
        self.state.update((position, recent))
