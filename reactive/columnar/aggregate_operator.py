"""The keyed columnar aggregation operator: ``key_by(*columns).agg(...)`` over record
batches, with its state in arrays per slot (:mod:`.state`)."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from ..keygroups import KeyGroupRange
from ..runtime.operators import StreamOperator
from ..state.backend import KeyedStateBackend, StateBackend
from .aggregates import Spec, results, update
from .grouping import Grouping
from .key_index import KeyIndex
from .schema import pa, position_of
from .slot_store import SlotCache, SlotStore
from .state import ColumnarKeyedStateBackend, ColumnarStateBackend

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
    """

    keyed = True
    #: slots cached in front of a :class:`SlotStore` (RocksDB) before the cache is
    #: written back and emptied
    cache_slots = 1 << 18

    def __init__(self, name: str, uid: str, key_columns: list[str],
                 specs: list[Spec], emit: Literal["changelog", "final"],
                 schema: Any) -> None:
        super().__init__(name, uid)
        self.key_columns = key_columns
        self.specs = specs
        self.emit = emit
        self.schema = schema
        self.arrays: dict[str, np.ndarray] = {}
        self.index: KeyIndex
        self.cache: SlotCache | None = None

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
            self.cache = SlotCache(keyed_backend, self.key_columns, self.specs,
                                   max_parallelism, self.uid, self.cache_slots)
            self.index, self.arrays = self.cache.index, self.cache.arrays
            return
        assert isinstance(keyed_backend, ColumnarKeyedStateBackend)
        self.backend = keyed_backend
        self.index = KeyIndex(self.key_columns, max_parallelism, self.uid)
        self.key_group_range: KeyGroupRange = keyed_backend.key_group_range
        self.arrays = {f"{s.output}.{part}": np.full(1024, s.initial(part), s.dtype(part))
                       for s in self.specs for part in s.state_columns()}
        keyed_backend.bind(self.index, self.arrays, self.specs)

    def open(self) -> None:
        if self.cache is not None:
            return  # restored state is in the store, read when a batch meets its key
        for keys, table in self.backend.restored:
            table = table.combine_chunks()
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
        else:
            keys = self.index.lookup(b)
            self.backend.thaw()
            self.backend.touch(keys.slots, self.index.size)
            self._grow(self.index.size)
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

    def end_input(self) -> list[Any]:
        if self.emit != "final":
            return []
        if self.cache is not None:
            return self._final_from_store(self.cache)
        if self.index.size == 0:
            return []
        size = self.index.size
        keys = self.index.keys_prefix([len(c) for c in self.index.key_chunks])
        columns = [results(s, {p: self.arrays[f"{s.output}.{p}"] for p in s.state_columns()},
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
