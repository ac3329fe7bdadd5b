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

#: the name of the RocksDB state holding a columnar operator's rows
COLUMNAR_STATE = "_columnar"


class ColumnarRocksDBKeyedStateBackend(RocksDBKeyedStateBackend, SlotStore):
    """A :class:`RocksDBKeyedStateBackend` that serves a columnar operator's rows
    (arguments: those of :class:`RocksDBKeyedStateBackend`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._columnar = self._table(COLUMNAR_STATE, "value")
        self._hooks: list[Callable[[], None]] = []

    def before_snapshot(self, hook: Callable[[], None]) -> None:
        self._hooks.append(hook)

    def snapshot(self, ctx: SnapshotContext) -> KeyedStateSnapshot:
        for hook in self._hooks:
            hook()  # the operator's cached changes join the generation frozen next
        return super().snapshot(ctx)

    def load_rows(self, keys: list[Any], key_groups: np.ndarray) -> list[tuple[Any, ...] | None]:
        table = self._columnar
        out: list[Any] = [None] * len(keys)
        missing: list[int] = []
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
                    value = table.loads(raw)
            if value is MISS:
                missing.append(i)
            elif value is not ABSENT:
                out[i] = value
        if missing:
            kg = self._kg
            sid = table.sid
            encode = self._encode_key
            kgs = key_groups.tolist()
            raws = self._db[[kg[kgs[i]] + sid + encode(keys[i]) for i in missing]]
            loads = table.loads
            for i, raw in zip(missing, cast(list[Any], raws), strict=True):
                if raw is not None:
                    out[i] = loads(raw)
        return out

    def store_rows(self, keys: list[Any], key_groups: np.ndarray,
                   rows: list[tuple[Any, ...]]) -> None:
        table = self._columnar
        kg = self._kg
        table.cache.update(zip(keys, rows, strict=True))
        table.dirty.update(zip(keys, [kg[g] for g in key_groups.tolist()], strict=True))
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
        sid, loads = table.sid, table.loads
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
        self._columnar = self._table(COLUMNAR_STATE, "value")


RocksDBStateBackend.columnar_keyed_backend_class = ColumnarRocksDBKeyedStateBackend
