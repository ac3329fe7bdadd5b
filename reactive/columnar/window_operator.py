"""The columnar window operator: ``key_by(*columns).window(assigner, timestamp=column)
.agg(...)`` over record batches, with its windows and aggregates in arrays per *pane* (one
key's one window, :mod:`.panes`).

Semantics are those of the per-record :class:`~reactive.windowing.window_operator.WindowOperator`
with an aggregate and the default event-time trigger (Flink's ``WindowOperator`` with
``EventTimeTrigger``), computed per batch instead of per record:

* A row's windows come from the assigner; a window whose ``end + allowed_lateness <=
  watermark`` is gone; a row none of whose windows is still there and with ``timestamp +
  allowed_lateness < watermark`` is *late*: it goes to the late output (``late_data()``) or
  is counted in ``late_records``, never dropped without a trace.
* A window fires when the watermark reaches its end, emitting one row: the key, the
  window's bounds and the final aggregates. A row for a window that has fired but is within
  the allowed lateness updates it and fires it again at once (a late firing): one output
  row per such input row, with the window's values including it (accumulating mode).
* A window's state is dropped when the watermark reaches ``end + allowed_lateness``.
* Sessions (``EventTimeSessionWindows.with_gap``): a row opens ``[ts, ts + gap)``; windows
  of a key that overlap or touch merge, their aggregates merged.

The watermark does not move within a batch (the columnar watermark generator cuts batches
where it moves, :mod:`.watermarks`), so each step is an array operation over the batch:
the pairs (row, window) are mapped to panes at once, grouped, and every aggregate is updated
from the whole batch (:func:`.aggregates.update`). For sessions, the rows whose session may
fire or be gone at once (``ts + gap <= watermark``, behind the watermark by a gap or more)
are taken one at a time in input order, since whether such a row is late depends on the
windows the rows before it opened; the others, whose merges do not depend on their order,
are merged together (sorted by key and start, a new session where a start passes the
running maximum end).

With the RocksDB state backend the panes live in RocksDB, one row of panes per key, behind a
bounded cache of keys with heap timers for the evicted ones (:mod:`.pane_store`); with any
other backend they live in memory and are snapshotted in full (:mod:`.state`).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ..runtime.operators import StreamOperator
from ..runtime.operators.process import restore_watermark, snapshot_watermark
from ..state.backend import KeyedStateBackend, StateBackend
from ..windowing.assigners import EventTimeSessionWindows, PeriodicWindows, WindowAssigner
from .aggregates import Spec, merge_states, results, update
from .grouping import Grouping, combine_codes
from .key_index import KeyIndex
from .pane_store import PaneCache
from .panes import META, PaneTable
from .schema import pa, position_of
from .slot_store import SlotStore
from .state import ColumnarKeyedStateBackend, ColumnarStateBackend
from .watermarks import event_times
from .windows import LATE_KEY, assign_periodic, window_values

__all__ = ["ColumnarWindowOperator"]

log = logging.getLogger(__name__)

_NEG_INF = float("-inf")


class ColumnarWindowOperator(StreamOperator):
    """Event-time windows aggregated over record batches.

    Args:
        name, uid: operator identity.
        key_columns: the key columns.
        timestamp: the timestamp column (seconds, or an Arrow timestamp).
        assigner: tumbling, sliding or session (fixed gap) event-time windows.
        specs: the aggregates.
        allowed_lateness: seconds after a window's end during which late rows update it.
        schema: the output schema (:func:`.windows.window_schema`).
        late_output: returns True when late rows go to the late output (asked at open).
    """

    keyed = True
    #: keys cached in front of a :class:`SlotStore` (RocksDB) before the changed ones are
    #: written back and the cache emptied
    cache_keys = 1 << 16

    def __init__(self, name: str, uid: str, key_columns: list[str], timestamp: str,
                 assigner: WindowAssigner, specs: list[Spec],
                 allowed_lateness: float, schema: Any, late_output: Any) -> None:
        super().__init__(name, uid)
        self.key_columns = key_columns
        self.timestamp = timestamp
        self.assigner = assigner
        self.sessions = isinstance(assigner, EventTimeSessionWindows)
        self.specs = specs
        self.lateness = float(allowed_lateness)
        self.schema = schema
        self.late_output = late_output
        self.emit_late = False
        self.late_records = 0
        self.watermark = _NEG_INF
        self.arrays: dict[str, np.ndarray] = {}
        self.panes: PaneTable
        self.index: KeyIndex
        self.cache: PaneCache | None = None

    def keyed_state_backend(self, job_backend: StateBackend) -> StateBackend:
        """The job backend's columnar backend when it has one (RocksDB: a row of panes per
        key, :mod:`.pane_store`), else columnar arrays in memory with full snapshots (the
        state is the open windows only: what was cleaned up is gone, nothing to chain)."""
        columnar = job_backend.columnar_state_backend()
        if columnar is not None:
            return columnar
        return ColumnarStateBackend(incremental=False)

    def setup(self, subtask: int, parallelism: int, max_parallelism: int,
              keyed_backend: KeyedStateBackend | None) -> None:
        super().setup(subtask, parallelism, max_parallelism, keyed_backend)
        self.index = KeyIndex(self.key_columns, max_parallelism, self.uid)
        initial: dict[str, Any] = {}
        arrays: dict[str, np.ndarray] = {"_slot": np.zeros(1024, np.int64),
                                         "_start": np.zeros(1024, np.float64),
                                         "_end": np.zeros(1024, np.float64)}
        for s in self.specs:
            for part in s.state_columns():
                name = f"{s.output}.{part}"
                initial[name] = s.initial(part)
                arrays[name] = np.full(1024, s.initial(part), s.dtype(part))
        self.arrays = arrays
        self.panes = PaneTable(arrays, initial)
        if isinstance(keyed_backend, SlotStore):
            self.cache = PaneCache(
                keyed_backend, self.index, self.panes,
                [self.schema.field(c).type for c in self.key_columns], self.lateness,
                lambda: self.watermark, self.cache_keys, self.sessions)
            return
        assert isinstance(keyed_backend, ColumnarKeyedStateBackend)
        self.backend = keyed_backend
        keyed_backend.bind(self.index, arrays, self.specs, rows=self.panes)

    def open(self) -> None:
        self.emit_late = bool(self.late_output())
        self.watermark = restore_watermark(self)
        if self.cache is not None:
            self.cache.restore_timers()  # the panes stay in the store until needed
            return
        for _keys, table in self.backend.restored:
            for b in table.combine_chunks().to_batches():
                keys = self.index.lookup(b)
                slots = keys.slots[keys.codes]
                starts = b.column("_start").to_numpy(zero_copy_only=False)
                ends = b.column("_end").to_numpy(zero_copy_only=False)
                if self.sessions:
                    panes = self.panes._append(slots, starts, ends)
                else:
                    panes = self.panes.add_restored(slots, starts, ends)
                for name in self.arrays:
                    if name not in META:
                        self.arrays[name][panes] = b.column(name).to_numpy(
                            zero_copy_only=False)
        self.backend.restored = []

    # ------------------------------------------------------------------ batches
    def process_batch(self, batch: list[Any]) -> list[Any]:
        out: list[Any] = []
        for b in batch:
            if not b.num_rows:
                continue
            try:
                if self.cache is None:
                    self.backend.thaw()
                if self.sessions:
                    self._sessions(b, out)
                else:
                    self._periodic(b, out)
            except Exception as exc:
                raise self.fail(f"<record batch of {b.num_rows} rows>", exc,
                                position_of(b)) from exc
        return out

    def _periodic(self, b: Any, out: list[Any]) -> None:
        assigner = self.assigner
        assert isinstance(assigner, PeriodicWindows)
        wm, lateness = self.watermark, self.lateness
        ts = event_times(b, self.timestamp)
        keys = self._lookup(b)
        rows, starts = assign_periodic(assigner, ts)
        ends = starts + assigner.size
        alive = ends + lateness > wm
        if not alive.all():
            placed = np.zeros(len(ts), bool)
            placed[rows[alive]] = True
            self._late(b, np.flatnonzero(~placed & (ts + lateness < wm)), out)
            rows, starts, ends = rows[alive], starts[alive], ends[alive]
        elif len(rows) < len(ts):  # sliding windows with gaps: a row may have none
            placed = np.zeros(len(ts), bool)
            placed[rows] = True
            self._late(b, np.flatnonzero(~placed & (ts + lateness < wm)), out)
        if not len(rows):
            return
        identity = len(rows) == len(ts)  # one window per row, in row order
        pb = b if identity else b.take(pa.array(rows))
        # the batch's (key, window) pairs: the key's batch code and the start's code in the
        # batch's distinct starts (Arrow's hash kernel), combined into dense group codes
        distinct = pa.array(starts + 0.0).dictionary_encode()  # -0.0 is 0.0
        n_starts = len(distinct.dictionary)
        codes, pairs = combine_codes(
            keys.codes if identity else keys.codes[rows], keys.num_groups,
            distinct.indices.to_numpy(zero_copy_only=False).astype(np.int64, copy=False),
            n_starts)
        group_starts = distinct.dictionary.to_numpy(zero_copy_only=False)[pairs % n_starts]
        panes = self.panes.lookup(keys.slots[pairs // n_starts], group_starts,
                                  group_starts + assigner.size)
        firing = ends <= wm  # windows that fired already: each row fires them again
        changelog = bool(firing.any())
        grouping = Grouping(codes, len(pairs))
        row_panes = panes[codes] if changelog else None
        columns = [update(s, self._state(s), pb, grouping, panes, row_panes)
                   for s in self.specs]
        if changelog:
            at = np.flatnonzero(firing)
            taken = pa.array(at)
            out.append(pa.RecordBatch.from_arrays(
                [pb.column(c).take(taken) for c in self.key_columns]
                + self._bounds(starts[at], ends[at])
                + [c.take(taken) for c in columns], schema=self.schema))

    def _lookup(self, b: Any) -> Any:
        """The batch's keys, read from the store first when they are not cached."""
        return self.index.lookup(b) if self.cache is None else self.cache.lookup(b)

    def _state(self, s: Spec) -> dict[str, np.ndarray]:
        return {part: self.arrays[f"{s.output}.{part}"] for part in s.state_columns()}

    def _bounds(self, starts: np.ndarray, ends: np.ndarray) -> list[Any]:
        t = self.schema.field("window_start").type
        return [window_values(starts, t), window_values(ends, t)]

    def _late(self, b: Any, rows: np.ndarray, out: list[Any]) -> None:
        if not len(rows):
            return
        if self.emit_late:
            late = b.take(pa.array(rows))
            meta = dict(late.schema.metadata or {})
            meta[LATE_KEY] = b"1"
            out.append(late.replace_schema_metadata(meta))
            return
        if not self.late_records:
            log.warning(
                "operator %r got late rows (beyond the allowed lateness) and has no late "
                "output: use late_data() to receive them; counting them in late_records",
                self.name)
        self.late_records += len(rows)

    # ------------------------------------------------------------------ sessions
    def _sessions(self, b: Any, out: list[Any]) -> None:
        assert isinstance(self.assigner, EventTimeSessionWindows)
        gap, wm = self.assigner.gap, self.watermark
        ts = event_times(b, self.timestamp)
        keys = self._lookup(b)
        row_slot = keys.slots[keys.codes]
        behind = np.flatnonzero(ts + gap <= wm)
        bounds = [0, *behind.tolist(), len(ts)]
        # runs of rows whose merges do not depend on their order, between rows behind
        for i in range(len(bounds) - 1):
            lo = bounds[i] if i == 0 else bounds[i] + 1
            hi = bounds[i + 1]
            if hi > lo:
                self._merge_rows(b.slice(lo, hi - lo), row_slot[lo:hi], ts[lo:hi], None)
            if i + 1 < len(bounds) - 1:
                r = bounds[i + 1]
                self._behind_row(b.slice(r, 1), int(row_slot[r]), float(ts[r]), out)

    def _behind_row(self, row: Any, slot: int, ts: float, out: list[Any]) -> None:
        """A row whose session ends at or before the watermark: late when it merges with
        none of its key's windows and ``ts + gap + lateness <= watermark``; else merged and
        fired at once (its session has ended)."""
        assert isinstance(self.assigner, EventTimeSessionWindows)
        gap, wm = self.assigner.gap, self.watermark
        arrays, size = self.arrays, self.panes.size
        touching = (arrays["_slot"][:size] == slot) & (arrays["_start"][:size] <= ts + gap) \
            & (arrays["_end"][:size] >= ts)
        if not touching.any() and ts + gap + self.lateness <= wm:
            if ts + self.lateness < wm:
                self._late(row, np.array([0]), out)
            return
        pane = self._merge_rows(row, np.array([slot]), np.array([ts]), touching)
        end = float(arrays["_end"][pane])
        if end <= wm:
            out.append(self._results(np.array([pane])))

    def _merge_rows(self, rows: Any, slots: np.ndarray, ts: np.ndarray,
                    touching: np.ndarray | None) -> int:
        """Merge the rows' windows ``[ts, ts + gap)`` with each other and with their keys'
        sessions; returns the pane of the last row's session."""
        assert isinstance(self.assigner, EventTimeSessionWindows)
        gap = self.assigner.gap
        arrays, size = self.arrays, self.panes.size
        pane_slot = arrays["_slot"][:size]
        old = np.flatnonzero(touching if touching is not None else np.isin(pane_slot, slots))
        n_old = len(old)
        slot = np.concatenate([pane_slot[old], slots])
        start = np.concatenate([arrays["_start"][old], ts])
        end = np.concatenate([arrays["_end"][old], ts + gap])
        order = np.lexsort((start, slot))
        s_slot, s_start, s_end = slot[order], start[order], end[order]
        m = len(order)
        segment = np.concatenate([[0], np.cumsum(s_slot[1:] != s_slot[:-1])])
        # the running maximum end within each key, by the offset trick: a value's rank plus
        # segment * m never falls below an earlier segment's
        by_end = np.argsort(s_end, kind="stable")
        rank = np.empty(m, np.int64)
        rank[by_end] = np.arange(m)
        running = np.maximum.accumulate(rank + segment * m) - segment * m
        reach = s_end[by_end[running]]
        opens = np.ones(m, bool)
        opens[1:] = (segment[1:] != segment[:-1]) | (s_start[1:] > reach[:-1])
        group_sorted = np.cumsum(opens) - 1
        group = np.empty(m, np.int64)
        group[order] = group_sorted
        # only the sessions a row joins change: number them, leave the other panes be
        touched = np.zeros(int(group_sorted[-1]) + 1, bool)
        touched[group[n_old:]] = True
        renumber = np.cumsum(touched) - 1
        keep = touched[group]
        old = old[keep[:n_old]]
        n_old = len(old)
        group = renumber[group[keep]]
        start, end, slot = start[keep], end[keep], slot[keep]
        n_groups = int(touched.sum())
        g_start = np.full(n_groups, np.inf)
        np.minimum.at(g_start, group, start)
        g_end = np.full(n_groups, -np.inf)
        np.maximum.at(g_end, group, end)
        g_slot = np.empty(n_groups, np.int64)
        g_slot[group] = slot
        # each changed session gets a new pane with the merged aggregates of its old panes
        new = self.panes._append(g_slot, g_start, g_end)
        old_group = group[:n_old]
        for s in self.specs:
            merge_states(s, self._state(s), new[old_group], old)
        arrays["_slot"][old] = -1  # merged away: dropped at the next compaction
        arrays["_end"][old] = _NEG_INF
        row_group = group[n_old:]
        grouping = Grouping(row_group, n_groups)
        for s in self.specs:
            update(s, self._state(s), rows, grouping, new, None)
        return int(new[row_group[-1]])

    # ------------------------------------------------------------------ watermarks
    def process_watermark(self, timestamp: float) -> list[Any]:
        if timestamp <= self.watermark:
            return []
        try:
            return self._advance(timestamp)
        except Exception as exc:
            raise self.fail(f"watermark {timestamp}", exc) from exc

    def _advance(self, watermark: float) -> list[Any]:
        """Fire the windows whose end the watermark reached; drop those past their allowed
        lateness."""
        before, self.watermark = self.watermark, watermark
        cache = self.cache
        if cache is not None:
            cache.fire_timers(watermark)  # evicted keys with windows due: read back first
        size = self.panes.size
        if not size:
            return []
        if cache is None:
            self.backend.thaw()
        arrays = self.arrays
        slot, end = arrays["_slot"][:size], arrays["_end"][:size]
        due = np.flatnonzero((end > before) & (end <= watermark) & (slot >= 0))
        out = []
        if len(due):
            # in the order of the timers (by end), then of the windows' creation
            due = due[np.argsort(end[due], kind="stable")]
            out.append(self._results(due))
        gone = (end + self.lateness <= watermark) | (slot < 0)
        if cache is not None:
            cache.mark(slot[due])
            cache.mark(slot[gone & (slot >= 0)])
        if gone.any():
            self.panes.compact(~gone)
        return out

    def _results(self, panes: np.ndarray) -> Any:
        """One output row per pane: its key, its window, its aggregates' values."""
        arrays = self.arrays
        slots = pa.array(arrays["_slot"][panes])
        keys = [_all(chunks).take(slots) for chunks in self.index.key_chunks]
        columns = [results(s, {p: a[panes] for p, a in self._state(s).items()}, len(panes))
                   for s in self.specs]
        return pa.RecordBatch.from_arrays(
            keys + self._bounds(arrays["_start"][panes], arrays["_end"][panes]) + columns,
            schema=self.schema)

    def snapshot_state(self, checkpoint_id: int) -> None:
        snapshot_watermark(self, self.watermark)


def _all(chunks: list[Any]) -> Any:
    """The keys of every slot of one key column, as one array (chunks merged in place)."""
    if len(chunks) > 1:
        chunks[:] = [pa.concat_arrays(chunks)]
    return chunks[0]
