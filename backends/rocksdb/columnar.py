"""Columnar keyed state in RocksDB: the :class:`~reactive.columnar.slot_store.SlotStore` of
the columnar operators when the job runs with :class:`~.backend.RocksDBStateBackend`.

A columnar operator's state is one RocksDB state, :data:`COLUMNAR_STATE`, holding per key
the pickled tuple of its state arrays' values, under the usual ``key group | state id |
encoded key`` layout (:mod:`.keys`). Rows are read with one multi-get per batch of keys not
cached, and written through this backend's write-back cache, so they take the same path to
RocksDB and into snapshots as the per-record API's values (generations frozen at the
synchronous part, incremental RocksDB checkpoints, restore at any parallelism by key-group
range). A RocksDB snapshot of columnar state restores only into this backend.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np

from reactive.columnar.slot_store import SlotStore
from reactive.errors import RestoreError
from reactive.state.backend import KeyedStateSnapshot, SnapshotContext

from .backend import RocksDBKeyedStateBackend, RocksDBStateBackend
from .db import BACKEND
from .generations import ABSENT, MISS

__all__ = ["COLUMNAR_STATE", "ColumnarRocksDBKeyedStateBackend"]

_PROTOCOL = pickle.HIGHEST_PROTOCOL

#: the name of the RocksDB state holding a columnar operator's rows
COLUMNAR_STATE = "_columnar"


class ColumnarRocksDBKeyedStateBackend(RocksDBKeyedStateBackend, SlotStore):
    """A :class:`RocksDBKeyedStateBackend` that serves a columnar operator's rows
    (arguments: those of :class:`RocksDBKeyedStateBackend`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._columnar = self._rows_table()
        self._hooks: list[Callable[[], None]] = []
        self._in_snapshot = False

    def before_snapshot(self, hook: Callable[[], None]) -> None:
        self._hooks.append(hook)

    def snapshot(self, ctx: SnapshotContext) -> KeyedStateSnapshot:
        # the operator's cached changes join the generation frozen next, written to
        # RocksDB in the asynchronous part (not here: the synchronous part stays O(changed
        # keys) dict inserts)
        self._in_snapshot = True
        try:
            for hook in self._hooks:
                hook()
        finally:
            self._in_snapshot = False
        return super().snapshot(ctx)

    async def _refill(self, gen: Any) -> None:
        """Nothing to refill: the operator's cache of slots holds the hot keys (copying a
        frozen generation back into this cache would only duplicate them)."""

    def load_rows(self, keys: list[Any], key_groups: np.ndarray) -> list[tuple[Any, ...] | None]:
        table = self._columnar
        out: list[Any] = [None] * len(keys)
        missing: list[int] = []
        loads = pickle.loads
        pending = list(reversed(self._gens.pending))
        cache, staged = table.cache, table.staged
        for i, key in enumerate(keys):
            value = cache.get(key, MISS)
            if value is MISS:
                for gen in pending:
                    value = gen.lookup(table.name, key)
                    if value is not MISS:
                        break
            if value is MISS and staged:
                raw = staged.get(key)
                if raw is not None:
                    value = raw
            if value is MISS:
                missing.append(i)
            elif value is not ABSENT:
                out[i] = loads(value)
        if missing:
            kg = self._kg
            sid = table.sid
            encode = self._encode_key
            kgs = key_groups.tolist()
            raws = self._db[[kg[kgs[i]] + sid + encode(keys[i]) for i in missing]]
            for i, raw in zip(missing, cast(list[Any], raws), strict=True):
                if raw is not None:
                    out[i] = loads(raw)
        return out

    def store_rows(self, keys: list[Any], key_groups: np.ndarray,
                   rows: list[tuple[Any, ...]]) -> None:
        table = self._columnar
        kg = self._kg
        table.cache.update(zip(keys, map(_dumps, rows), strict=True))
        table.dirty.update(zip(keys, [kg[g] for g in key_groups.tolist()], strict=True))
        if self._in_snapshot:
            return
        # the write-back cache's own bounds: write the oldest dirty rows in steps and evict
        # (both wait while a generation is pending, as for the per-record states)
        while len(table.dirty) >= self.write_batch_entries and not self._gens.pending:
            self._write_dirty(table)
        while len(table.cache) > self.cache_entries:
            n = len(table.cache)
            self._evict(table)
            if len(table.cache) >= n:
                break

    def iter_rows(self) -> Iterator[tuple[Any, tuple[Any, ...]]]:
        table = self._columnar
        self._flush_dirty()
        sid, loads = table.sid, pickle.loads
        for g in range(self._start, self._end + 1):
            prefix = self._kg[g] + sid
            n = len(prefix)
            for k, v in self._db.items(from_key=prefix):
                k = cast(bytes, k)
                if k[:n] != prefix:
                    break
                yield self._decode_key(k[n:]), loads(cast(bytes, v))

    def restore(self, handles: list[dict[str, Any]], job_dir: Path) -> None:
        """Restore RocksDB snapshots (of any parallelism) of a columnar operator.

        Raises:
            RestoreError: for a snapshot of another backend (the heap columnar state's
                Arrow files hold other rows than this backend's; restore it with the heap
                backend), and as :meth:`RocksDBKeyedStateBackend.restore`.
        """
        for h in handles:
            if h.get("backend") != BACKEND:
                raise RestoreError(
                    f"operator {self.operator_uid!r}: a {h.get('backend')!r} snapshot of "
                    "columnar state cannot be restored into RocksDB columnar state; restore "
                    "it with the backend that took it")
        super().restore(handles, job_dir)
        self._columnar = self._rows_table()

    def _rows_table(self) -> Any:
        """The table of the rows. Its cached values are the rows' pickles (the bytes
        RocksDB stores, so readers unpickle them as any pickled state): bytes are
        immutable and untracked by the garbage collector, so a frozen generation shares
        them and a cache of many rows adds no collector work."""
        table = self._table(COLUMNAR_STATE, "value")
        table.dumps = table.loads = _identity
        return table


def _identity(value: bytes) -> bytes:
    return value


def _dumps(row: tuple[Any, ...]) -> Any:
    # an empty row (a window operator's key without open panes) is a delete
    return pickle.dumps(row, _PROTOCOL) if row else ABSENT


RocksDBStateBackend.columnar_keyed_backend_class = ColumnarRocksDBKeyedStateBackend
