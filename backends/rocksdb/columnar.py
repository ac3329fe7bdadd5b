"""Columnar keyed state in RocksDB: the :class:`~reactive.columnar.slot_store.SlotStore` of
the columnar operators when the job runs with :class:`~.backend.RocksDBStateBackend`.

A columnar operator's state is one RocksDB state, :data:`COLUMNAR_STATE`, holding per key
the pickled tuple of its state arrays' values, under the usual ``key group | state id |
encoded key`` layout (:mod:`.keys`). Rows are read with one multi-get per batch of keys not
cached, and written through this backend's write-back cache, so they take the same path to
RocksDB and into snapshots as the per-record API's values (generations frozen at the
synchronous part, incremental RocksDB checkpoints, restore at any parallelism by key-group
range). A RocksDB snapshot of columnar state restores only into this backend.

At a barrier the operator's cache hands over its changed slots as copied arrays
(:class:`~reactive.columnar.slot_store.BarrierRows`): the synchronous part only attaches
them to the generation it freezes, and the asynchronous part pickles them into that
generation in steps of :data:`.generations.STEP_SECONDS` on the loop before the generation
is written to RocksDB. Anything that reads or writes the generation before that (a lookup
after the cache was emptied, a blocking drain) builds the rest first, so the generation
always holds exactly the state at its barrier.
"""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
from rocksdict import WriteBatch

from reactive.columnar.slot_store import BarrierRows, SlotStore
from reactive.errors import RestoreError
from reactive.state.backend import KeyedStateSnapshot, SnapshotContext

from .backend import RocksDBKeyedStateBackend, RocksDBStateBackend
from .db import BACKEND
from .generations import ABSENT, MISS, FrozenTable, Generation, raw_bytes, step_budget
from .keys import KEY_GROUP_BYTES, PREFIX_BYTES, key_group_bounds
from .ttl_sweep import successor

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
        # barrier rows handed over in the synchronous part under way, for its generation
        self._barrier_rows: list[BarrierRows] = []
        self._encode_key = _memoized(self._encode_key, self.cache_entries)
        # where the next sweep of expired rows starts (None: the range's start)
        self._sweep_cursor: bytes | None = None
        # the key group the cursor is in, and its last row when the sweep entered it
        self._sweep_group: bytes | None = None
        self._sweep_group_end = b""

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

    def store_barrier_rows(self, rows: BarrierRows) -> None:
        """Keep ``rows`` for the generation the synchronous part under way freezes (built
        in its asynchronous part, :class:`_BarrierBuild`); outside a snapshot, store them
        at once."""
        if not self._in_snapshot:
            super().store_barrier_rows(rows)
            return
        self._barrier_rows.append(rows)

    def _freeze(self, checkpoint_id: int, local: Path | None) -> Generation:
        rows, self._barrier_rows = self._barrier_rows, []
        gen = super()._freeze(checkpoint_id, local)
        if rows:
            ft = gen.tables.get(COLUMNAR_STATE)
            if ft is None:  # the live cache was empty: a frozen table of the rows alone
                t = self._columnar
                ft = FrozenTable(cast(Any, SimpleNamespace(
                    name=t.name, sid=t.sid, dumps=t.dumps, cache={}, dirty={},
                    staged=t.staged)), self.operator_uid)
                gen.tables[COLUMNAR_STATE] = ft
            gen.persisted = False
            gen.complete = _BarrierBuild(gen, ft, rows, self._kg)
        return gen

    async def _refill(self, gen: Any) -> None:
        """No refill (the operator's cache of slots holds the hot keys: copying a frozen
        generation back into this cache would only duplicate them); instead, build the
        barrier rows of every pending generation up to ``gen``, oldest first, in steps of
        :data:`.generations.STEP_SECONDS` with the loop's other work between them."""
        for g in list(self._gens.pending):
            build = g.complete
            while isinstance(build, _BarrierBuild) and g.complete is build:
                if self._gens.closed:
                    return
                if not build.step(step_budget()[1]):
                    await asyncio.sleep(0)
            if g is gen:
                return

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

    def sweep_rows(self, budget: int, column: int,
                   expired_before: float) -> tuple[int, int]:
        """Delete expired rows from RocksDB (Flink's incremental cleanup over the store, as
        :class:`.ttl_sweep.RocksDBTtlSweep` for the per-record states): at most ``budget``
        rows checked from the cursor of the last call (wrapping around the instance's key
        range; a key group's rows only up to its last row when the sweep entered it, so
        keys named in increasing order, all inserted past the cursor, are left to the next
        pass instead of keeping it in the live tail), for at most
        :data:`.generations.STEP_SECONDS`. A row whose key this
        backend's write-back cache holds is skipped (the cache holds its newest value),
        and nothing is deleted while a frozen generation is pending (it would leak into an
        older checkpoint)."""
        if budget <= 0 or self._gens.pending:
            return 0, 0
        table = self._columnar
        sid, cache, staged = table.sid, table.cache, table.staged
        lower, upper = key_group_bounds(self._start, self._end)
        clock, step, every = step_budget()
        deadline = clock() + step
        it = self._db.iter()
        it.seek(self._sweep_cursor if self._sweep_cursor is not None else lower)
        gone: list[bytes] = []
        n = checked = 0
        wrapped = False
        while n < budget:
            k = cast(bytes, it.key()) if it.valid() else None
            if k is None or (upper is not None and k >= upper):
                if wrapped:
                    break
                wrapped = True
                self._sweep_group = None  # a new pass: each key group's end is read again
                it.seek(lower)
                continue
            n += 1
            if k[KEY_GROUP_BYTES:PREFIX_BYTES] == sid:
                group = k[:PREFIX_BYTES]
                if group != self._sweep_group:
                    self._sweep_group = group
                    last = self._db.iter()
                    last.seek_for_prev(successor(group))
                    self._sweep_group_end = cast(bytes, last.key())
                elif k > self._sweep_group_end:  # inserted after the sweep entered it
                    self._sweep_group = None
                    it.seek(successor(group))
                    continue
            else:  # not a row: the next key group's
                kg = k[:KEY_GROUP_BYTES]
                if k[KEY_GROUP_BYTES:PREFIX_BYTES] < sid:
                    it.seek(kg + sid)
                elif kg == b"\xff" * KEY_GROUP_BYTES:  # the last key group: past its end
                    it.seek_to_last()
                    it.next()
                else:
                    it.seek(successor(kg) + sid)
                continue
            checked += 1
            row = pickle.loads(cast(bytes, it.value()))
            if len(row) > column and row[column] <= expired_before:
                key = self._decode_key(k[PREFIX_BYTES:])
                if key not in cache:
                    gone.append(k)
                    if staged:
                        staged.pop(key, None)
            it.next()
            if not n % every and clock() >= deadline:
                break
        self._sweep_cursor = cast(bytes, it.key()) if it.valid() else None
        del it
        if gone:
            wb = WriteBatch(raw_mode=True)
            for k in gone:
                wb.delete(k)
            self._db.write(wb)
        return checked, len(gone)

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
        table.dumps = table.loads = raw_bytes
        return table


def _memoized(encode: Callable[[Any], bytes], limit: int) -> Callable[[Any], bytes]:
    """``encode`` remembering the encodings of up to ``limit`` string keys: a columnar
    operator's keys are encoded when first read and again at every snapshot that writes
    them (other types pass through: ``1 == True`` as dict keys, not as encodings)."""
    memo: dict[str, bytes] = {}

    def memo_encode(key: Any) -> bytes:
        if type(key) is not str:
            return encode(key)
        data = memo.get(key)
        if data is None:
            if len(memo) >= limit:
                memo.clear()
            data = memo[key] = encode(key)
        return data
    return memo_encode


class _BarrierBuild:
    """The barrier rows of a generation, pickled into its frozen table of rows (values and
    dirty key-group prefixes) in steps; calling it builds all that is left. Once built, it
    detaches itself from the generation (``gen.complete = None``).

    Args:
        gen: the generation frozen at the barrier.
        ft: its frozen table of :data:`COLUMNAR_STATE`.
        rows: the operator caches' changed slots at the barrier.
        kg: key group -> its 2-byte prefix.
    """

    #: rows built between two looks at the clock (~1-2 us each: pickle and two inserts)
    CHUNK = 512

    def __init__(self, gen: Generation, ft: FrozenTable, rows: list[BarrierRows],
                 kg: list[bytes]) -> None:
        self.gen = gen
        self.ft = ft
        self.rows = rows
        self.kg = kg

    def __call__(self) -> None:
        self.step(float("inf"))

    def step(self, budget: float) -> bool:
        """Build rows for about ``budget`` seconds (at least one chunk); return whether all
        are built."""
        now = step_budget()[0]
        deadline = now() + budget
        values, dirty, kg = self.ft.values, self.ft.dirty, self.kg
        while self.rows:
            part = self.rows[0]
            while part.done < len(part):
                keys, key_groups, rows = part.take(self.CHUNK)
                values.update(zip(keys, map(_dumps, rows), strict=True))
                dirty.update(zip(keys, [kg[g] for g in key_groups.tolist()], strict=True))
                if now() >= deadline:
                    if part.done >= len(part):
                        self.rows.pop(0)
                    return False
            self.rows.pop(0)
        if self.gen.complete is self:
            self.gen.complete = None
        return True


def _dumps(row: tuple[Any, ...]) -> Any:
    # an empty row (a window operator's key without open panes) is a delete
    return pickle.dumps(row, _PROTOCOL) if row else ABSENT


RocksDBStateBackend.columnar_keyed_backend_class = ColumnarRocksDBKeyedStateBackend
