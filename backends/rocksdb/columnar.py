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
them to the generation it freezes (:class:`_BarrierWriter`), and its local phase writes
them straight into RocksDB after the generation's frozen entries, in steps of
:data:`.generations.STEP_SECONDS` on the loop, by key group and sorted by stored key (the
keys encoded and sorted in a worker thread, with kernels that release the GIL). A
lookup of a key while the generation is pending finds its barrier row there, so reads
always see exactly the state at the barrier. A cache that holds every key the instance
has seen since it started without a restore reads nothing from RocksDB
(:meth:`ColumnarRocksDBKeyedStateBackend.may_hold_rows`): a new key starts from the
initial values.
"""

from __future__ import annotations

import functools
import pickle
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rocksdict import WriteBatch

from reactive.columnar.slot_store import BarrierRows, SlotStore
from reactive.errors import RestoreError
from reactive.key_encoding import encode_key
from reactive.state.backend import KeyedStateSnapshot, SnapshotContext

from .backend import RocksDBKeyedStateBackend, RocksDBStateBackend
from .db import BACKEND
from .generations import ABSENT, MISS, Generation, raw_bytes, run_in_worker, step_budget
from .keys import KEY_GROUP_BYTES, PREFIX_BYTES, key_group_bounds
from .ttl_sweep import successor

__all__ = ["COLUMNAR_STATE", "ColumnarRocksDBKeyedStateBackend", "pickled_rows",
           "stored_keys"]

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
        self._restored = False

    def may_hold_rows(self) -> bool:
        return self._restored

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
        """Keep ``rows`` for the generation the synchronous part under way freezes
        (written in its asynchronous part, :class:`_BarrierWriter`); outside a snapshot,
        store them at once."""
        if not self._in_snapshot:
            super().store_barrier_rows(rows)
            return
        self._barrier_rows.append(rows)

    def _freeze(self, checkpoint_id: int, local: Path | None) -> Generation:
        rows, self._barrier_rows = self._barrier_rows, []
        gen = super()._freeze(checkpoint_id, local)
        if rows:
            t = self._columnar
            gen.rows = _BarrierWriter(t.name, t.sid, rows, self._kg, t.staged,
                                      canonical=self._key_serializer is None)
            gen.persisted = False
        return gen

    async def _refill(self, gen: Any) -> None:
        """No refill: the operator's cache of slots holds the hot keys (copying a frozen
        generation back into this cache would only duplicate them)."""

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
        self._restored = self._restored or bool(handles)
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


class _BarrierWriter:
    """The barrier rows of a generation (:class:`~.generations.FrozenRows`), written
    straight from their arrays into RocksDB in steps, each row pickled once.

    Rows are written by key group, and in stored-key order within a run of rows: the
    memtable's skip list then inserts neighbours, about ten times cheaper per entry than
    keys in hash order (measured with rocksdict on 82,000 rows). A part whose keys this
    store encodes with Arrow kernels (canonical encoding, one key column) is *planned* in
    a worker thread, :data:`PIECE` rows at a time (:func:`_plan`: stored keys built with
    ``pyarrow.compute`` and sorted with numpy, both releasing the GIL), the next piece
    while the loop writes the current one; the loop's steps then only slice the sorted
    keys, pickle the rows (:func:`pickled_rows`) and put them. Other parts are encoded and
    sorted :data:`CHUNK` rows at a time on the loop. A lookup (a key read while the
    generation is pending) indexes the rows by key on first use.

    Args:
        name: the rows' state name.
        sid: its state id.
        rows: the operator caches' changed slots at the barrier (a later part's row of a
            key is newer).
        kg: key group -> its 2-byte prefix.
        staged: the state's restored-but-unread entries (a key written leaves it).
    """

    #: rows pickled and put between two looks at the clock
    CHUNK = 1024
    #: rows a worker thread plans at a time
    PIECE = 32768

    def __init__(self, name: str, sid: bytes, rows: list[BarrierRows], kg: list[bytes],
                 staged: dict[Any, bytes], canonical: bool = True) -> None:
        self.name = name
        # key group -> the stored keys' prefix, for stored_keys (None: keys encoded one
        # by one, as a key serializer of the job encodes them)
        self._prefixes = pa.array([p + sid for p in kg], pa.binary()) if canonical else None
        self.sid = sid
        self.parts = rows
        self.kg = kg
        self.staged = staged
        self._index: dict[Any, tuple[int, int]] | None = None
        self._part = 0  # the part being written
        self._at = 0  # rows of it written, in the order of _order
        self._order: np.ndarray | None = None  # the part's rows by key group
        self._column: Any = None  # the part's key column (concatenated key chunks)
        self._planned = False  # the part is written by planned pieces
        # the piece being written (from row _piece_lo of _order): its rows in stored-key
        # order and their stored keys; and the worker planning the next piece
        self._piece: np.ndarray | None = None
        self._sorted: Any = None
        self._piece_lo = 0
        self._planning: Future[Any] | None = None

    def waiting(self) -> Future[Any] | None:
        """The worker's plan of the piece the next step writes, while it runs (None: the
        next step writes rows)."""
        if self._piece is None and self._planning is not None and \
                not self._planning.done():
            return self._planning
        return None

    def persist(self, db: Any, encode: Callable[[Any], bytes], budget: float) -> bool:
        now = step_budget()[0]
        # the write costs about as much as building the batch: half the budget for each
        deadline = now() + budget / 2
        wb = WriteBatch(raw_mode=True)
        n = 0
        while self._part < len(self.parts):
            part = self.parts[self._part]
            if self._order is None:
                # key groups < 2**15: numpy's radix sort
                self._order = np.argsort(part.key_groups.astype(np.uint16), kind="stable")
                self._planned = self._prefixes is not None and bool(part.key_chunks)
            if self._planned and self._piece is None:
                if self._planning is None:
                    self._planning = self._plan(part, self._at)
                if not self._planning.done() and budget != float("inf"):
                    break  # the caller awaits waiting(); drain() blocks below
                plan = self._planning.result()  # waits without the GIL if drained
                self._planning = None
                if plan is None:  # stored_keys declined the keys
                    self._planned = False
                else:
                    self._piece, self._sorted = plan
                    self._piece_lo = self._at
                    end = self._at + len(self._piece)
                    if end < len(part):
                        self._planning = self._plan(part, end)  # while this one is written
            if self._piece is not None:
                lo = self._at - self._piece_lo
                hi = min(lo + self.CHUNK, len(self._piece))
                self._write_planned(wb, part, self._piece[lo:hi],
                                    self._sorted.slice(lo, hi - lo))
                if hi >= len(self._piece):
                    self._piece = self._sorted = None
            else:
                lo, hi = self._at, min(self._at + self.CHUNK, len(part))
                self._write_chunk(wb, part, lo, hi, encode)
            n += hi - lo
            self._at += hi - lo
            if self._at >= len(part):
                self._part += 1
                self._at, self._order, self._column = 0, None, None
            if now() >= deadline:
                break
        if n:
            db.write(wb)
        return self._part >= len(self.parts)

    def _key_column(self, part: BarrierRows) -> Any:
        """The part's key of every slot (one Arrow array)."""
        if self._column is None:
            assert part.key_chunks
            self._column = pa.concat_arrays(part.key_chunks) if len(part.key_chunks) > 1 \
                else part.key_chunks[0]
        return self._column

    def _plan(self, part: BarrierRows, lo: int) -> Future[Any]:
        """Plan the piece of ``part`` from row ``lo`` of its key-group order in a worker."""
        assert self._order is not None and self._prefixes is not None
        at = self._order[lo:lo + self.PIECE]
        return run_in_worker(_plan, self._prefixes.take(pa.array(part.key_groups[at])),
                             self._key_column(part).take(pa.array(part.slots[at])), at)

    def _write_planned(self, wb: Any, part: BarrierRows, at: np.ndarray, keys: Any) -> None:
        """Put the rows ``at`` of ``part`` under their stored ``keys`` (an Arrow array)."""
        if self.staged:
            known = part.keys
            for s in part.slots[at].tolist():
                self.staged.pop(known[s], None)  # RocksDB gets a newer value
        stored = keys.to_pylist()
        values: Any = pickled_rows([c[at] for c in part.columns])
        if values is not None:  # no deletes among them: put them without a Python loop
            deque(map(wb.put, stored, values), maxlen=0)
            return
        values = map(_dumps, zip(*[c[at].tolist() for c in part.columns], strict=True))
        for k, v in zip(stored, values, strict=True):
            if v is ABSENT:
                wb.delete(k)
            else:
                wb.put(k, v)

    def _write_chunk(self, wb: Any, part: BarrierRows, lo: int, hi: int,
                     encode: Callable[[Any], bytes]) -> None:
        """Put the rows ``lo:hi`` of ``part`` in key-group order, encoded and sorted here."""
        assert self._order is not None
        kg, sid, staged = self.kg, self.sid, self.staged
        at = self._order[lo:hi]
        keys = part.keys
        groups = part.key_groups[at]
        chunk: Any = None  # the Python keys, built only where needed
        encoded = None
        if self._prefixes is not None:
            prefixes = self._prefixes.take(pa.array(groups))
            if part.key_chunks:
                if self._column is None:
                    self._column = pa.concat_arrays(part.key_chunks)
                encoded = stored_keys(prefixes, self._column.take(pa.array(part.slots[at])))
            if encoded is None:
                chunk = [keys[s] for s in part.slots[at].tolist()]
                encoded = stored_keys(prefixes, chunk)
        if staged or encoded is None:
            chunk = chunk or [keys[s] for s in part.slots[at].tolist()]
        if staged:
            for k in chunk:
                staged.pop(k, None)  # RocksDB gets a newer value
        if encoded is not None:  # sorted by Arrow's kernel
            by_key = pc.sort_indices(encoded).to_numpy()
            at = at[by_key]
            values: Any = pickled_rows([c[at] for c in part.columns])
            if values is None:
                values = map(_dumps, zip(*[c[at].tolist() for c in part.columns],
                                         strict=True))
            pairs: Any = zip(encoded.take(pa.array(by_key)).to_pylist(), values,
                             strict=True)
        else:
            stored = [kg[g] + sid + encode(k)
                      for g, k in zip(groups.tolist(), chunk, strict=True)]
            values = pickled_rows([c[at] for c in part.columns]) or \
                map(_dumps, zip(*[c[at].tolist() for c in part.columns], strict=True))
            pairs = sorted(zip(stored, values, strict=True), key=_first)
        for k, v in pairs:
            if v is ABSENT:
                wb.delete(k)
            else:
                wb.put(k, v)

    def lookup(self, key: Any) -> Any:
        if self._index is None:
            self._index = {}
            for p, part in enumerate(self.parts):
                keys = part.keys
                self._index.update((keys[s], (p, i)) for i, s in enumerate(part.slots.tolist()))
        hit = self._index.get(key)
        if hit is None:
            return MISS
        part = self.parts[hit[0]]
        return _dumps(tuple(c[hit[1]].item() for c in part.columns))


def _plan(prefixes: Any, keys: Any, at: np.ndarray) -> tuple[np.ndarray, Any] | None:
    """Blocking (worker thread; Arrow's and numpy's kernels release the GIL): the rows
    ``at`` (positions in their part) in stored-key order, and their stored keys in that
    order (:func:`stored_keys` of ``prefixes`` and ``keys``, Arrow arrays in the order of
    ``at``); None when :func:`stored_keys` declines the keys."""
    encoded = stored_keys(prefixes, keys)
    if encoded is None:
        return None
    by_key = _key_order(encoded)
    return at[by_key], encoded.take(pa.array(by_key))


# the bytes of a stored key that _key_order compares: its key group, and the canonical
# key's first six bytes after its type tag (the state id and the tag are the same for
# every row of a part)
_LEADING = [*range(KEY_GROUP_BYTES), *range(PREFIX_BYTES + 1, PREFIX_BYTES + 7)]


def _key_order(encoded: Any) -> np.ndarray:
    """The order of ``encoded`` (stored keys of one part: a ``pyarrow`` binary array),
    sorted by their :data:`_LEADING` bytes packed into one integer (a numpy sort, several
    times faster than ``pyarrow.compute.sort_indices`` on the bytes); keys equal there
    stay together in any order, which costs the memtable little. When they are more than
    an eighth of the keys (long common prefixes, small integers), the keys are sorted
    whole."""
    n = len(encoded)
    buffers = encoded.buffers()
    offsets = np.frombuffer(buffers[1], np.int32, n + 1, encoded.offset * 4)
    data = np.frombuffer(buffers[2], np.uint8)
    starts, lengths = offsets[:-1], np.diff(offsets)
    packed = np.zeros(n, np.uint64)
    last = len(data) - 1
    for k, j in enumerate(_LEADING):
        byte = data[np.minimum(starts + j, last)].astype(np.uint64)
        byte[lengths <= j] = 0
        packed |= byte << np.uint64(8 * (7 - k))
    order = np.argsort(packed, kind="stable")
    ordered = packed[order]
    if 8 * np.count_nonzero(ordered[1:] == ordered[:-1]) > n:
        return cast(np.ndarray, pc.sort_indices(encoded).to_numpy())
    return order


def _canonical_parts() -> tuple[list[bytes], bytes] | None:
    """The canonical key encoding's head of a string of each length below 256 and its
    tag of an int64, read back from :func:`~reactive.key_encoding.encode_key` (None when
    that encoding is not head + UTF-8 bytes, resp. tag + 8 big-endian bytes)."""
    heads = []
    for n in range(256):
        data = encode_key("a" * n)
        if not data.endswith(b"a" * n):
            return None
        heads.append(data[:len(data) - n])
    tag = encode_key(0)[:1]
    for n in (0, 1, -1, 1 << 40, -(1 << 62)):
        if encode_key(n) != tag + n.to_bytes(8, "big", signed=True):
            return None
    return heads, tag


_CANONICAL = _canonical_parts()
_INT_RECORD = np.dtype([("tag", "u1"), ("value", ">i8")])


@functools.cache
def _str_heads() -> Any:
    """:data:`_CANONICAL`'s string heads as a ``pyarrow`` binary array; made at first use,
    not on import: ``pa.array`` of a list imports pandas (~0.3 CPU s), which a job with the
    RocksDB backend and no columnar operator never needs."""
    return pa.array(cast(tuple[list[bytes], bytes], _CANONICAL)[0], pa.binary())


def stored_keys(prefixes: Any, keys: Any) -> Any:
    """``prefixes[i]`` followed by the canonical encoding of ``keys[i]``
    (:func:`~reactive.key_encoding.encode_key`), built with Arrow and numpy kernels
    instead of a call per key, when every key is a str shorter than 256 UTF-8 bytes or
    every key an int in int64's range.

    Args:
        prefixes: a ``pyarrow`` binary array, one prefix per key.
        keys: the keys, as the per-record API sees them (a list), or a ``pyarrow``
            array of them (a string or integer column; other types are declined).

    Returns:
        The stored keys (a ``pyarrow`` binary array), or None for keys of other types
        (mixed, None, bool, long, tuples): the caller encodes them one by one.
    """
    if _CANONICAL is None or not len(keys):
        return None
    if isinstance(keys, list):
        first = type(keys[0])
        if first is not str and first is not int:
            return None
        try:
            array = pa.array(keys)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            return None
    else:
        array = keys
        if pa.types.is_integer(array.type) and array.type != pa.uint64():
            array = array.cast(pa.int64())
    if array.null_count:
        return None
    if pa.types.is_string(array.type):
        lengths = pc.binary_length(array).to_numpy()
        if int(lengths.max()) >= len(_CANONICAL[0]):
            return None
        heads = _str_heads().take(pa.array(lengths))
        return pc.binary_join_element_wise(prefixes, heads, array.cast(pa.binary()), b"")
    if pa.types.is_int64(array.type):
        record = np.empty(len(array), _INT_RECORD)
        record["tag"] = _CANONICAL[1][0]
        record["value"] = array.to_numpy()
        encoded = pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(9), len(array), [None, pa.py_buffer(record.tobytes())])
        return pc.binary_join_element_wise(prefixes, encoded.cast(pa.binary()), b"")
    return None


_TUPLE_OF = {1: b"\x85", 2: b"\x86", 3: b"\x87"}  # pickle's TUPLE1, TUPLE2, TUPLE3


def pickled_rows(columns: list[np.ndarray]) -> list[bytes] | None:
    """Per row, the pickle of the tuple of ``columns``' values (``pickle.loads`` gives the
    row ``pickle.dumps`` would have pickled: Python ints and floats), built as one byte
    matrix with numpy instead of a ``pickle.dumps`` per row: pickle protocol 2's
    ``PROTO``, per value ``LONG1`` with 8 bytes (int64) or ``BINFLOAT`` (float64), then
    ``TUPLE1-3`` (or ``MARK`` ... ``TUPLE``) and ``STOP``.

    Args:
        columns: equal-length int64 or float64 arrays.

    Returns:
        The pickles, or None when a column has another dtype (the caller pickles rows).
    """
    if not columns or any(c.dtype not in (np.int64, np.float64) for c in columns):
        return None
    n, k = len(columns[0]), len(columns)
    mark = k not in _TUPLE_OF
    width = 2 + mark + sum(10 if c.dtype == np.int64 else 9 for c in columns) + 2
    out = np.empty((n, width), np.uint8)
    out[:, 0], out[:, 1] = 0x80, 2  # PROTO 2
    at = 2
    if mark:
        out[:, at] = ord("(")
        at += 1
    for c in columns:
        if c.dtype == np.int64:
            out[:, at], out[:, at + 1] = 0x8A, 8  # LONG1, 8 bytes little-endian
            out[:, at + 2:at + 10] = c.astype("<i8").view(np.uint8).reshape(n, 8)
            at += 10
        else:
            out[:, at] = ord("G")  # BINFLOAT, big-endian
            out[:, at + 1:at + 9] = c.astype(">f8").view(np.uint8).reshape(n, 8)
            at += 9
    out[:, at] = ord("t") if mark else _TUPLE_OF[k][0]
    out[:, at + 1] = ord(".")
    # a pickle ends with STOP ("."), never with NUL, which numpy's bytes strip
    rows: list[bytes] = out.view(f"S{width}").ravel().tolist()
    return rows


def _first(pair: tuple[bytes, Any]) -> bytes:
    return pair[0]


def _dumps(row: tuple[Any, ...]) -> Any:
    # an empty row (a window operator's key without open panes) is a delete
    return pickle.dumps(row, _PROTOCOL) if row else ABSENT


RocksDBStateBackend.columnar_keyed_backend_class = ColumnarRocksDBKeyedStateBackend
