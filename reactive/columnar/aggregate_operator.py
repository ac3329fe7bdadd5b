"""The keyed columnar aggregation operator: ``key_by(*columns).agg(...)`` over record
batches, with its state in arrays per slot (:mod:`.state`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from ..keygroups import KeyGroupRange
from ..runtime.operators import StreamOperator
from ..state.backend import KeyedStateBackend, StateBackend
from ..state.ttl_clock import TtlClock
from ..state.ttl_config import StateTtlConfig
from .aggregates import Spec, results, update
from .grouping import Grouping
from .key_index import KeyIndex
from .schema import pa, position_of
from .slot_store import SlotCache, SlotStore
from .state import TTL_TIMESTAMP, ColumnarKeyedStateBackend, ColumnarStateBackend

__all__ = ["ColumnarAggregateOperator"]


class ColumnarAggregateOperator(StreamOperator):
    """Folds each record batch into per-key aggregates: the batch's distinct keys are
    mapped to slots once (:class:`KeyIndex`), rows grouped by a radix sort of their codes
    (:class:`Grouping`), and every aggregate updated with array operations.

    Args:
        name: display name.
        uid: stable id (its snapshots are keyed by it).
        key_columns: the key columns.
        specs: the aggregates.
        emit: ``"changelog"`` (a row per input row, with the running values) or
            ``"final"`` (a row per key at the end of input).
        schema: the output schema (key columns, then one column per aggregate).
        ttl: the keys' time to live (processing time, on create and write, never returning
            an expired value; see :meth:`KeyedColumnarStream.agg
            <reactive.columnar.stream.KeyedColumnarStream.agg>`), or None.
    """

    keyed = True
    #: slots cached in front of a :class:`SlotStore` (RocksDB) before the cache is
    #: written back and emptied
    cache_slots = 1 << 18
    #: under a ttl, the key index's size below which expired slots are never dropped from
    #: memory (the check runs each time the index grew to four times its last live size)
    compact_min_slots = 1 << 12

    def __init__(self, name: str, uid: str, key_columns: list[str],
                 specs: list[Spec], emit: Literal["changelog", "final"],
                 schema: Any, ttl: StateTtlConfig | None = None) -> None:
        super().__init__(name, uid)
        self.ttl = ttl
        #: read once per record batch: every row of a batch is written at the batch's time
        self.ttl_clock = None if ttl is None else \
            TtlClock(time.time if ttl.clock is None else ttl.clock.now)
        self.key_columns = key_columns
        self.specs = specs
        self.emit = emit
        self.schema = schema
        self.arrays: dict[str, np.ndarray] = {}
        self.index: KeyIndex
        self.cache: SlotCache | None = None
        #: the key index's size at which the next check for expired slots to drop runs
        self._compact_at = self.compact_min_slots

    def keyed_state_backend(self, job_backend: StateBackend) -> StateBackend:
        """The backend of this operator's keyed state: the job backend's columnar one
        (RocksDB: rows per key behind a cache of slots, :mod:`.slot_store`), else columnar
        arrays in memory, with incremental snapshots when the job's backend is
        incremental."""
        columnar = job_backend.columnar_state_backend()
        if columnar is not None:
            return columnar
        return ColumnarStateBackend(incremental=bool(getattr(job_backend, "incremental",
                                                             False)))

    def setup(self, subtask: int, parallelism: int, max_parallelism: int,
              keyed_backend: KeyedStateBackend | None) -> None:
        super().setup(subtask, parallelism, max_parallelism, keyed_backend)
        if isinstance(keyed_backend, SlotStore):
            # with a ttl, each stored row ends with its key's last-write time
            self.cache = SlotCache(keyed_backend, self.key_columns, self.specs,
                                   max_parallelism, self.uid, self.cache_slots,
                                   ttl=self._ttl_spec())
            self.index, self.arrays = self.cache.index, self.cache.arrays
            return
        assert isinstance(keyed_backend, ColumnarKeyedStateBackend)
        self.backend = keyed_backend
        self.index = KeyIndex(self.key_columns, max_parallelism, self.uid)
        self.key_group_range: KeyGroupRange = keyed_backend.key_group_range
        self.arrays = {f"{s.output}.{part}": np.full(1024, s.initial(part), s.dtype(part))
                       for s in self.specs for part in s.state_columns()}
        ttl = self._ttl_spec()
        if ttl is not None:
            # +inf: a slot not yet written is not expired (its values are the initial ones)
            self.arrays[TTL_TIMESTAMP] = np.full(1024, np.inf)
        keyed_backend.bind(self.index, self.arrays, self.specs, ttl=ttl)

    def _ttl_spec(self) -> tuple[float, Callable[[], float]] | None:
        """``(seconds, clock)`` of the keys' time to live (None: no ttl)."""
        if self.ttl is None or self.ttl_clock is None:
            return None
        return (float(self.ttl.ttl), self.ttl_clock.now)

    def open(self) -> None:
        if self.cache is not None:
            return  # restored state is in the store, read when a batch meets its key
        now = None if self.ttl_clock is None else self.ttl_clock.now()
        for keys, table in self.backend.restored:
            table = table.combine_chunks()
            if now is not None and self.ttl is not None:
                if TTL_TIMESTAMP not in table.column_names:
                    # state taken without a ttl: its keys count as written at the restore
                    table = table.append_column(TTL_TIMESTAMP,
                                                pa.array(np.full(table.num_rows, now)))
                # an expired key is not installed: it never gets a slot again
                live = table.column(TTL_TIMESTAMP).to_numpy() > now - self.ttl.ttl
                if not live.all():
                    table = table.filter(pa.array(live))
                    keys = [table.column(c).combine_chunks() for c in self.key_columns]
                if not table.num_rows:
                    continue
            slots = self.index.install(keys)
            self._grow(self.index.size)
            for name, array in self.arrays.items():
                array[slots] = table.column(name).to_numpy(zero_copy_only=False)
        self.backend.restored = []

    def _grow(self, size: int) -> None:
        arrays = self.arrays
        first = next(iter(arrays.values()))
        if size <= len(first):
            return
        capacity = max(size, 2 * len(first))
        for s in self.specs:
            for part in s.state_columns():
                name = f"{s.output}.{part}"
                old = arrays[name]
                grown = np.full(capacity, s.initial(part), old.dtype)
                grown[:len(old)] = old
                arrays[name] = grown
        if TTL_TIMESTAMP in arrays:
            old = arrays[TTL_TIMESTAMP]
            grown = np.full(capacity, np.inf)
            grown[:len(old)] = old
            arrays[TTL_TIMESTAMP] = grown

    def process_batch(self, batch: list[Any]) -> list[Any]:
        out = []
        changelog = self.emit == "changelog"
        for b in batch:
            if not b.num_rows:
                continue
            try:
                result = self._fold(b, changelog)
            except Exception as exc:
                raise self.fail(f"<record batch of {b.num_rows} rows>", exc,
                                position_of(b)) from exc
            if result is not None:
                out.append(result)
        return out

    def _fold(self, b: Any, changelog: bool) -> Any:
        if self.cache is not None:
            keys = self.cache.lookup(b)
            if self.ttl_clock is not None:
                self._expire(keys.slots, keys.codes, keys.num_groups, b.num_rows)
                self.cache.sweep(b.num_rows)  # the store's share of the cleanup
        else:
            if self.ttl is not None and self.index.size >= self._compact_at:
                self._compact()
            keys = self.index.lookup(b)
            self.backend.thaw()
            self.backend.touch(keys.slots, self.index.size)
            self._grow(self.index.size)
            if self.ttl_clock is not None:
                self._expire(keys.slots, keys.codes, keys.num_groups, b.num_rows)
        grouping = Grouping(keys.codes, keys.num_groups)
        row_slots = keys.slots[keys.codes] if changelog else None
        arrays = self.arrays
        columns = []
        for s in self.specs:
            state = {part: arrays[f"{s.output}.{part}"] for part in s.state_columns()}
            columns.append(update(s, state, b, grouping, keys.slots, row_slots))
        if not changelog:
            return None
        keys_out = [b.column(c) for c in self.key_columns]
        return pa.RecordBatch.from_arrays(keys_out + columns, schema=self.schema)

    def _expire(self, slots: np.ndarray, codes: np.ndarray, num_groups: int,
                num_rows: int) -> None:
        """Reset the batch's slots whose time to live ran out to fresh accumulators, and
        stamp every slot the batch writes with the batch's time (Flink's
        ``OnCreateAndWrite``): a gather, a compare and a scatter per batch, none per row."""
        assert self.ttl is not None and self.ttl_clock is not None
        if num_groups > num_rows // 4:
            # a batch's groups may be a whole dictionary: only the slots its rows use are
            # written (the others keep their time)
            slots = slots[np.bincount(codes, minlength=num_groups) > 0]
        now = self.ttl_clock.now()
        stamps = self.arrays[TTL_TIMESTAMP]
        expired = slots[stamps[slots] <= now - self.ttl.ttl]
        if len(expired):
            for s in self.specs:
                for part in s.state_columns():
                    self.arrays[f"{s.output}.{part}"][expired] = s.initial(part)
        stamps[slots] = now

    def _compact(self) -> None:
        """Drop the expired slots from memory when they are at least half of the index:
        rebuild the key index with the live keys (new slots, in the old order) and the
        arrays with their rows. O(slots), run when the index grew to four times the live
        slots of the last check, so O(1) amortized per key (the slots stay within four times
        the live keys of the last check, plus a batch's new keys)."""
        size = self.index.size
        live = self._live(size)
        assert live is not None
        if 2 * len(live) <= size:
            index = KeyIndex(self.key_columns, self.index.max_parallelism, self.uid)
            taken = pa.array(live)
            columns = self.index.keys_prefix([len(c) for c in self.index.key_chunks])
            if len(live):
                index.install([c.take(taken) for c in columns])
            capacity = max(1024, 2 * len(live))
            for s in self.specs:
                for part in s.state_columns():
                    name = f"{s.output}.{part}"
                    self.arrays[name] = _compacted(self.arrays[name], live, capacity,
                                                   s.initial(part))
            self.arrays[TTL_TIMESTAMP] = _compacted(self.arrays[TTL_TIMESTAMP], live,
                                                    capacity, np.inf)
            self.index = index
            self.backend.compacted(index)
        self._compact_at = max(self.compact_min_slots, 4 * len(live))

    def _live(self, size: int) -> np.ndarray | None:
        """The slots below ``size`` not expired now (None: every slot, no ttl)."""
        if self.ttl is None or self.ttl_clock is None:
            return None
        now = self.ttl_clock.now()
        return np.flatnonzero(self.arrays[TTL_TIMESTAMP][:size] > now - self.ttl.ttl)

    def end_input(self) -> list[Any]:
        if self.emit != "final":
            return []
        if self.cache is not None:
            return self._final_from_store(self.cache)
        if self.index.size == 0:
            return []
        size = self.index.size
        keys = self.index.keys_prefix([len(c) for c in self.index.key_chunks])
        live = self._live(size)
        arrays = self.arrays
        if live is not None:  # an expired key's value is never returned
            keys = [k.take(pa.array(live)) for k in keys]
            arrays = {n: a[live] for n, a in arrays.items()}
            size = len(live)
            if not size:
                return []
        columns = [results(s, {p: arrays[f"{s.output}.{p}"] for p in s.state_columns()},
                           size) for s in self.specs]
        return [pa.RecordBatch.from_arrays(keys + columns, schema=self.schema)]

    def _final_from_store(self, cache: SlotCache) -> list[Any]:
        keys, arrays = cache.all_rows()
        if not keys:
            return []
        if len(self.key_columns) == 1:
            key_columns = [pa.array(keys, self.schema.field(self.key_columns[0]).type)]
        else:
            key_columns = [pa.array(list(c), self.schema.field(n).type)
                           for n, c in zip(self.key_columns, zip(*keys, strict=True),
                                           strict=True)]
        columns = [results(s, {p: arrays[f"{s.output}.{p}"] for p in s.state_columns()},
                           len(keys)) for s in self.specs]
        return [pa.RecordBatch.from_arrays(key_columns + columns, schema=self.schema)]


def _compacted(array: np.ndarray, live: np.ndarray, capacity: int, initial: Any) -> np.ndarray:
    """A new array of ``capacity`` elements: ``array[live]``, then ``initial``."""
    out = np.full(capacity, initial, array.dtype)
    out[:len(live)] = array[live]
    return out
