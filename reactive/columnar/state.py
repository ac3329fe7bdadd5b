"""Columnar keyed state: per-slot numpy arrays beside a :class:`KeyIndex`, snapshotted per
key group into Arrow IPC files, in full or incrementally (the slots changed since the last
completed checkpoint).

The state of one operator instance is a set of named arrays indexed by slot (the dense
index :class:`~reactive.columnar.key_index.KeyIndex` gives each distinct key). A snapshot's
synchronous part captures references: the arrays (marked frozen; the operator copies an
array before its next write to it, copy-on-write per array), the key index's chunk lists
(append-only, so a prefix is stable) and the mask of slots changed since the previous
snapshot (swapped for a fresh one). That is O(number of arrays + key chunks), independent of
the number of keys. The asynchronous part, in a worker thread (pyarrow and numpy release
the GIL for their bulk work), writes the slots in slot order as one record batch (key
columns, ``_key_group``, the state arrays) into an Arrow IPC file: a full snapshot hands
the frozen arrays to the IPC writer as they are, an incremental one gathers its changed
slots in ascending order. The grouping by key group (an O(n) sort and gathers in random
order, Flink's ``KeyGroupPartitioner`` at snapshot time) is left to the restore and the
readers, which take place far less often than checkpoints. A window operator's panes are
written one record batch per key group.

- Full snapshots (``arrow-ipc-v1``): one file in the checkpoint's directory; the handle maps
  each key group to its batch.
- Incremental snapshots (``arrow-ipc-chain-v1``, when the job's state backend is
  incremental, e.g. ``HeapStateBackend(incremental=True)``): a file under ``shared/`` with
  the slots changed since the last *completed* checkpoint (the masks of every snapshot
  taken since, so an aborted checkpoint's changes go into the next one), appended to that
  checkpoint's chain of files; a chain of :data:`MAX_CHAIN` files is replaced by a full
  file. A restore reads a key group's batches along the chain, the later row of a key
  winning (Flink's changelog / incremental heap snapshots; SDG paper section 5's dirty
  state). Savepoints are always full and self-contained.

A restore at any parallelism reads only the key groups of its range (rescaling: Carbone
2018 (PhD thesis), section 4.2); its first checkpoint afterwards is full.
"""

from __future__ import annotations

import itertools
import uuid
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..checkpoint.durable_files import write_atomic
from ..checkpoint.off_loop import in_thread
from ..errors import RestoreError, StateAccessError
from ..key_encoding import KEY_ENCODING
from ..keygroups import KeyGroupRange
from ..state.api import State
from ..state.backend import (
    KeyedStateBackend,
    KeyedStateSnapshot,
    SnapshotContext,
    StateBackend,
    file_name_component,
)
from ..state.descriptors import StateDescriptor
from ..state.key_group_stream import (
    KeyDecoder,
    KeyGroupState,
    KeyGroupStream,
    register_key_group_reader,
)
from .aggregates import AggregateSpec, Spec, results
from .key_index import KeyIndex
from .schema import pa, pc

__all__ = ["BACKEND_NAME", "MAX_CHAIN", "ColumnarKeyedStateBackend", "ColumnarStateBackend",
           "iter_columnar_key_groups"]

BACKEND_NAME = "columnar-heap"
FORMAT = "arrow-ipc-v1"
CHAIN_FORMAT = "arrow-ipc-chain-v1"
KEY_GROUP_COLUMN = "_key_group"
ROW_COLUMN = "_row"
MAX_CHAIN = 8
"""Files an incremental snapshot's chain may reach before a full file replaces it."""
TTL_TIMESTAMP = "_ttl_timestamp"
"""The state array of a slot's last write time (seconds; float64) under a time-to-live:
written into snapshots beside the values, so a restore keeps each key's expiry."""

_LAYOUT = b"reactive.layout"
_BY_SLOT = b"slots"
"""A file's schema metadata ``{_LAYOUT: _BY_SLOT}``: its rows are in slot order, not one
record batch per key group (readers group them, :func:`_split_by_key_group`)."""

_IPC_SLACK = 1 << 16
"""Bytes an IPC file may take beyond its record batch and twice its schema (its magic
numbers and footer: 634 bytes for a file of one batch here)."""

Chain = list[tuple[dict[str, Any], dict[str, int]]]
"""An incremental snapshot's files, oldest first: (file reference, key group -> batch)."""


class ColumnarKeyedStateBackend(KeyedStateBackend):
    """The columnar keyed state of one operator instance.

    The operator binds its :class:`KeyIndex` and its arrays (:meth:`bind`), calls
    :meth:`thaw` before changing its arrays in place and :meth:`touch` with the slots a
    batch changed.

    Args:
        key_group_range: the key groups this instance owns.
        max_parallelism: the number of key groups.
        incremental: write the changed slots only (see the module docstring).
    """

    def __init__(self, key_group_range: KeyGroupRange, max_parallelism: int,
                 incremental: bool = False) -> None:
        self.key_group_range = key_group_range
        self.max_parallelism = max_parallelism
        self.incremental = incremental
        self.current_key = None
        self.index: KeyIndex | None = None
        self.arrays: dict[str, np.ndarray] = {}
        self.aggregates: list[Spec] = []
        self.rows: Any = None
        self.ttl: tuple[float, Callable[[], float]] | None = None
        self._frozen: set[str] = set()
        # arrays no snapshot reads any more, by name: the next copy-on-write copies into
        # one (no fresh pages to fault in); and the snapshots still to write
        self._spare: dict[str, np.ndarray] = {}
        self._writing: weakref.WeakSet[_ColumnarSnapshot] = weakref.WeakSet()
        self.restored: list[tuple[list[Any], Any]] = []
        # slots changed since the last snapshot, and the masks of the snapshots taken
        # since the last completed checkpoint (checkpoint id, mask)
        self.dirty = np.zeros(1024, bool)
        self._pending: list[tuple[int, np.ndarray]] = []
        self._base: Chain = []  # the chain of the last completed checkpoint
        self._written: dict[int, Chain] = {}

    def bind(self, index: KeyIndex, arrays: dict[str, np.ndarray],
             aggregates: list[Spec], rows: Any = None,
             ttl: tuple[float, Callable[[], float]] | None = None) -> None:
        """Attach the operator's key index, arrays (by name; the dict is shared) and the
        aggregates they hold (recorded in handles, for readers of the snapshots).

        Args:
            index: the key index.
            arrays: the state arrays by name.
            aggregates: the aggregates the arrays hold.
            rows: None when the arrays are indexed by key slot; else the windows' panes
                (an object whose ``size`` counts the rows), the arrays indexed by pane with
                each pane's slot in ``_slot`` (a negative slot: a pane merged away) and its
                window in ``_start`` and ``_end``; a key then has one row per window.
            ttl: ``(seconds, clock)`` when the slots expire: ``arrays`` then holds
                :data:`TTL_TIMESTAMP`, and a snapshot leaves out the slots whose last write
                is ``seconds`` or more before the clock's time at the barrier.
        """
        self.index = index
        self.arrays = arrays
        self.aggregates = aggregates
        self.rows = rows
        self.ttl = ttl

    def thaw(self) -> None:
        """Copy the arrays a snapshot still reads (copy-on-write), before the operator
        changes them in place; free when no snapshot was taken since the last call."""
        if self._frozen:
            for name in self._frozen:
                if name in self.arrays:
                    old = self.arrays[name]
                    spare = self._spare.pop(name, None)
                    if spare is not None and spare.shape == old.shape \
                            and spare.dtype == old.dtype:
                        np.copyto(spare, old)
                        self.arrays[name] = spare
                    else:
                        self.arrays[name] = old.copy()
            self._frozen = set()

    def _release(self, snapshot: _ColumnarSnapshot) -> None:
        """``snapshot`` was written: its arrays that neither the operator nor another
        snapshot still uses become spares for the next copy-on-write."""
        self._writing.discard(snapshot)
        live = {id(a) for a in self.arrays.values()}
        for other in self._writing:
            live.update(id(a) for a in other.arrays.values())
        for name, array in snapshot.arrays.items():
            if id(array) not in live:
                self._spare[name] = array

    def compacted(self, index: KeyIndex) -> None:
        """The operator rebuilt its key index and arrays with the live slots only (new slot
        numbers; the arrays replaced in the bound dict): a snapshot in flight keeps the old
        ones, and the next incremental snapshot writes every live slot (the masks of the
        old numbering are dropped; an older file's rows of a dropped key are expired)."""
        self.index = index
        self._frozen = set()
        self._pending = []
        self.dirty = np.ones(max(index.size, 1024), bool)

    def touch(self, slots: np.ndarray, size: int) -> None:
        """Mark ``slots`` changed (``size``: the slots in use)."""
        if not self.incremental:
            return
        if size > len(self.dirty):
            grown = np.zeros(max(size, 2 * len(self.dirty)), bool)
            grown[:len(self.dirty)] = self.dirty
            self.dirty = grown
        self.dirty[slots] = True

    # the per-record state API does not address columnar state
    def set_current_key(self, key: Any) -> None:
        raise StateAccessError("columnar keyed state is addressed by record batch, not by a "
                               "current key")

    def get_state(self, descriptor: StateDescriptor) -> State:
        raise StateAccessError(f"state {descriptor.name!r}: a columnar operator keeps its "
                               "state in arrays, not in per-key state objects")

    def keys(self, state_name: str) -> Iterator[Any]:
        index = self.index
        if index is None or index.size == 0:
            return iter(())
        columns = index.keys_prefix([len(c) for c in index.key_chunks])
        if len(columns) == 1:
            return iter(columns[0].to_pylist())
        return iter(zip(*(c.to_pylist() for c in columns), strict=True))

    def snapshot(self, ctx: SnapshotContext) -> KeyedStateSnapshot:
        index = self.index
        assert index is not None, "snapshot before the operator bound its state"
        self._frozen = set(self.arrays)
        mask, self.dirty = self.dirty, np.zeros(len(self.dirty), bool)
        masks = [m for _, m in self._pending] + [mask]
        self._pending.append((ctx.checkpoint_id, mask))
        incremental = self.incremental and not ctx.savepoint
        base = list(self._base) if incremental and 0 < len(self._base) < MAX_CHAIN else []
        rows = self.rows
        # the time at the barrier: a slot expired then is not written (never resurrected)
        expired_before = None if self.ttl is None else self.ttl[1]() - self.ttl[0]
        snap = _ColumnarSnapshot(
            self, ctx, index.size if rows is None else rows.size, list(index.key_columns),
            list(self.aggregates), [list(chunks) for chunks in index.key_chunks],
            index.key_groups, dict(self.arrays), incremental, base, masks if base else None,
            windowed=rows is not None, expired_before=expired_before)
        self._writing.add(snap)
        return snap

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        chain = self._written.pop(checkpoint_id, None)
        if chain is not None:
            self._base = chain
            self._pending = [(c, m) for c, m in self._pending if c > checkpoint_id]
        for c in [c for c in self._written if c < checkpoint_id]:
            del self._written[c]

    def restore(self, handles: list[dict[str, Any]], job_dir: Path) -> None:
        """Read the key groups of this instance's range; the operator installs them
        (:attr:`restored`: ``(key columns, state table)`` per handle) when it opens."""
        for handle in handles:
            batches = [b for _, bs in _key_group_batches(handle, job_dir, self.key_group_range)
                       for b in bs]
            if batches:
                table = _latest_per_key(pa.Table.from_batches(batches),
                                        handle["key_columns"] + handle.get("row_columns", []))
                self.restored.append(([table.column(c).combine_chunks()
                                       for c in handle["key_columns"]], table))
        self._base, self._pending = [], []  # the next checkpoint is full

    def dispose(self) -> None:
        self.arrays = {}
        self._spare = {}
        self.index = None


def _key_group_batches(handle: dict[str, Any], job_dir: Path,
                       key_group_range: KeyGroupRange | None) -> list[tuple[int, list[Any]]]:
    """Per key group of ``key_group_range`` (None: all) that the handle holds, ascending,
    its record batches along the handle's chain (oldest first).

    Raises:
        RestoreError: for a handle of another format, or a file that cannot be read.
    """
    fmt = handle.get("format")
    if handle.get("backend") != BACKEND_NAME or fmt not in (FORMAT, CHAIN_FORMAT):
        raise RestoreError(
            f"a columnar aggregate cannot restore a {handle.get('backend')!r} snapshot "
            f"({fmt!r}): restore it with the state backend that took it (the columnar "
            "heap and RocksDB states have different formats), unless the operator's uid "
            "was given to another operator")
    chain = [(handle["files"][0], handle["key_groups"])] if fmt == FORMAT else \
        [(handle["files"][int(e["file"])], e["key_groups"]) for e in handle["chain"]]
    out: dict[int, list[Any]] = {}
    for ref, key_groups in chain:
        path = job_dir / ref["path"]
        try:
            reader = pa.ipc.open_file(pa.memory_map(str(path)))
            if (reader.schema.metadata or {}).get(_LAYOUT) == _BY_SLOT:
                for kg, rows in _split_by_key_group(reader, key_group_range):
                    out.setdefault(kg, []).append(rows)
                continue
            for kg, i in key_groups.items():
                if key_group_range is None or int(kg) in key_group_range:
                    out.setdefault(int(kg), []).append(reader.get_batch(int(i)))
        except (OSError, pa.ArrowInvalid) as exc:
            raise RestoreError(f"cannot read columnar snapshot {path}: {exc}") from exc
    return sorted(out.items())


def _split_by_key_group(reader: Any, key_group_range: KeyGroupRange | None
                        ) -> Iterator[tuple[int, Any]]:
    """The rows of a file in slot order (:data:`_BY_SLOT`), per key group of
    ``key_group_range`` (None: all), ascending: the grouping the snapshot left out is done
    here, when a restore or a reader needs it."""
    for i in range(reader.num_record_batches):
        batch = reader.get_batch(i)
        kgs = batch.column(KEY_GROUP_COLUMN).to_numpy()
        rows = np.arange(len(kgs))
        if key_group_range is not None:
            rows = rows[(kgs >= key_group_range.start) & (kgs <= key_group_range.end)]
        by_group = rows[np.argsort(kgs[rows].astype(np.uint16), kind="stable")]
        sorted_kgs = kgs[by_group]
        bounds = [0, *(np.flatnonzero(np.diff(sorted_kgs)) + 1).tolist(), len(by_group)]
        taken = batch.take(pa.array(by_group))
        for lo, hi in itertools.pairwise(bounds):
            if hi > lo:
                yield int(sorted_kgs[lo]), taken.slice(lo, hi - lo)


def iter_columnar_key_groups(handle: dict[str, Any], job_dir: Path, *,
                             key_group_range: KeyGroupRange | None = None,
                             key_decoder: KeyDecoder | None = None) -> KeyGroupStream:
    """A columnar snapshot as a key-group stream (:mod:`reactive.state.key_group_stream`):
    per key group, ``{aggregate output: {key: value}}``, the key as the per-record API sees
    it (the column's value, or the tuple of the key columns' values), the value as the
    aggregate's result (a mean, not its sum and count); for a window operator's state, one
    entry per open window, keyed by ``(key, window start, window end)``; under a time to
    live, the keys live at the snapshot's barrier only. For the embedding's state queries
    and the PySpark bridge's checkpoint reader.

    Args:
        handle: a ``"columnar-heap"`` handle.
        job_dir: the job directory its paths are relative to.
        key_group_range: only these key groups; None: all.
        key_decoder: unused (the keys are stored as Arrow values, not bytes).

    Raises:
        RestoreError: for a handle of another format or a file that cannot be read.
    """
    specs = [AggregateSpec(*a[:4]) for a in handle.get("aggregates", [])]
    # a user aggregate's function is not in the snapshot: its accumulators are read as
    # they are, {array name: value}
    user = {a[0]: a[4] for a in handle.get("aggregates", []) if len(a) > 4}
    key_columns = handle["key_columns"]
    row_columns = handle.get("row_columns", [])
    groups = _key_group_batches(handle, job_dir, key_group_range)
    expired_before = handle.get("ttl_expired_before")

    def key_groups() -> Iterator[KeyGroupState]:
        for kg, batches in groups:
            table = _latest_per_key(pa.Table.from_batches(batches),
                                    key_columns + row_columns).combine_chunks()
            if expired_before is not None:  # an older file of a chain may hold expired keys
                table = table.filter(pa.array(
                    table.column(TTL_TIMESTAMP).to_numpy() > expired_before))
            columns = [table.column(c).to_pylist() for c in key_columns]
            keys: list[Any] = columns[0] if len(columns) == 1 \
                else list(zip(*columns, strict=True))
            if row_columns:  # a window's state: the key is (key, window start, window end)
                keys = list(zip(keys, table.column("_start").to_pylist(),
                                table.column("_end").to_pylist(), strict=True))
            states = {}
            for spec in specs:
                if spec.output in user:
                    parts = {p: table.column(f"{spec.output}.{p}").to_pylist()
                             for p in user[spec.output]}
                    values = [dict(zip(parts, v, strict=True))
                              for v in zip(*parts.values(), strict=True)]
                    states[spec.output] = dict(zip(keys, values, strict=True))
                    continue
                arrays = {part: table.column(f"{spec.output}.{part}").to_numpy()
                          for part in spec.state_columns()}
                values = results(spec, arrays, table.num_rows).to_pylist()
                states[spec.output] = dict(zip(keys, values, strict=True))
            yield KeyGroupState(kg, frozenset(), states)

    return KeyGroupStream(key_groups(), backend=BACKEND_NAME,
                          key_encoding=handle.get("key_encoding", KEY_ENCODING))


def _take_from_chunks(chunks: list[Any], at: np.ndarray) -> Any:
    """The values at positions ``at`` (any order) of the array the ``chunks`` make,
    taken from each chunk without concatenating them all (an incremental snapshot's few
    changed keys out of many)."""
    if len(chunks) == 1:
        return chunks[0].take(pa.array(at))
    starts = np.cumsum([0, *(len(c) for c in chunks)])
    order = np.argsort(at, kind="stable")
    ascending = at[order]
    bounds = np.searchsorted(ascending, starts)
    parts = [chunks[c].take(pa.array(ascending[bounds[c]:bounds[c + 1]] - starts[c]))
             for c in range(len(chunks)) if bounds[c + 1] > bounds[c]]
    if not parts:
        return pa.array([], chunks[0].type)
    taken = pa.concat_arrays(parts)
    back = np.empty_like(order)
    back[order] = np.arange(len(order))
    return taken.take(pa.array(back))


def _latest_per_key(table: Any, key_columns: list[str]) -> Any:
    """The last row of each key (rows in chain order: a later file's row is newer)."""
    rows = table.append_column(ROW_COLUMN, pa.array(np.arange(table.num_rows)))
    latest = rows.group_by(key_columns, use_threads=False).aggregate([(ROW_COLUMN, "max")])
    if latest.num_rows == table.num_rows:
        return table
    return table.take(latest.column(f"{ROW_COLUMN}_max")).combine_chunks()


class _ColumnarSnapshot(KeyedStateSnapshot):
    def __init__(self, backend: ColumnarKeyedStateBackend, ctx: SnapshotContext, size: int,
                 key_columns: list[str], aggregates: list[Spec],
                 key_chunks: list[list[Any]], key_groups: np.ndarray,
                 arrays: dict[str, np.ndarray], incremental: bool, base: Chain,
                 masks: list[np.ndarray] | None, windowed: bool = False,
                 expired_before: float | None = None) -> None:
        self.backend = backend
        self.ctx = ctx
        self.size = size
        self.key_columns = key_columns
        self.aggregates = aggregates
        self.key_chunks = key_chunks
        self.key_groups = key_groups
        self.arrays = arrays
        self.incremental = incremental
        self.base = base
        self.masks = masks  # None: write every slot
        self.windowed = windowed  # rows are windows' panes (see bind)
        # slots last written at or before this time are expired (None: no ttl)
        self.expired_before = expired_before

    async def write(self) -> dict[str, Any]:
        try:
            handle, chain = await in_thread(self._write)
        finally:
            self.backend._release(self)
        if chain is not None:
            self.backend._written[self.ctx.checkpoint_id] = chain
        return handle

    def _slots(self) -> np.ndarray | None:
        """The slots (or windows' panes) to write, ascending; None: every slot (a full
        snapshot without a ttl, written without building an index of millions of slots
        while holding the GIL)."""
        size = self.size
        if self.windowed:
            return np.flatnonzero(self.arrays["_slot"][:size] >= 0)
        if self.masks is None:
            if self.expired_before is None and size:
                return None
            slots = np.arange(size)
        else:
            changed = np.zeros(size, bool)
            for m in self.masks:
                n = min(len(m), size)
                changed[:n] |= m[:n]
            slots = np.flatnonzero(changed)
        if self.expired_before is not None:
            # an expired slot left out of an incremental file: an older file's row of its
            # key has an older timestamp, so a restore finds it expired too
            slots = slots[self.arrays[TTL_TIMESTAMP][slots] > self.expired_before]
        return slots

    def _slot_file(self, slots: np.ndarray | None) -> tuple[Any, dict[str, int]]:
        """The IPC file of ``slots`` (ascending; None: every slot) in slot order, one
        record batch, marked :data:`_BY_SLOT`; its index maps every key group present to
        that batch. Every slot (a full snapshot) is written from the arrays as they are
        (no gather); a subset is gathered in ascending order.

        The file is built in an Arrow buffer (``pyarrow.FixedSizeBufferWriter``): Arrow's
        writer fills it without the GIL, where a Python file object (``io.BytesIO``) would
        take the GIL to copy each of the batch's buffers (hundreds of MB for a full
        snapshot of millions of keys), stalling the pipeline's event loop meanwhile; the key
        groups present are found by Arrow's hash kernel for the same reason."""
        every = slots is None or len(slots) == self.size
        kgs = self.key_groups[:self.size] if every else self.key_groups[slots]
        columns = []
        for chunks in self.key_chunks:
            if not chunks:
                columns.append(pa.array([], pa.null()))
            elif every:
                columns.append(pa.concat_arrays(chunks).slice(0, self.size))
            else:
                assert slots is not None
                columns.append(_take_from_chunks(chunks, slots))
        names = sorted(self.arrays)
        values = [self.arrays[n][:self.size] if every else self.arrays[n][slots]
                  for n in names]
        key_groups = pa.array(kgs)
        batch = pa.RecordBatch.from_arrays(
            [*columns, key_groups, *(pa.array(v) for v in values)],
            names=[*self.key_columns, KEY_GROUP_COLUMN, *names])
        schema = batch.schema.with_metadata({_LAYOUT: _BY_SLOT})
        batch = batch.replace_schema_metadata(schema.metadata)
        # one buffer of the file's size (a growing one would be copied as it doubles);
        # the file's own bytes are returned (no copy of a file as large as the state)
        buffer = pa.allocate_buffer(pa.ipc.get_record_batch_size(batch)
                                    + 2 * schema.serialize().size + _IPC_SLACK)
        sink = pa.FixedSizeBufferWriter(buffer)
        with pa.ipc.new_file(sink, schema) as writer:
            writer.write_batch(batch)
        present = np.sort(pc.unique(key_groups).to_numpy())
        return buffer.slice(0, sink.tell()), {str(int(kg)): 0 for kg in present}

    def _file(self, slots: np.ndarray) -> tuple[Any, dict[str, int]]:
        """The IPC file of ``slots`` (rows: panes for windows), one record batch per key
        group, and its index."""
        key_slots = self.arrays["_slot"][slots] if self.windowed else slots
        kgs = self.key_groups[key_slots]
        # key groups < 2**15: numpy's radix sort
        by_group = np.argsort(kgs.astype(np.uint16), kind="stable")
        order = by_group if len(slots) == self.size and not self.windowed \
            else slots[by_group]  # every slot: slots is arange(size)
        sorted_kgs = kgs[by_group]
        taken = key_slots[by_group]
        columns = [_take_from_chunks(c, taken) if c else pa.array([], pa.null())
                   for c in self.key_chunks]
        names = sorted(n for n in self.arrays if n != "_slot" or not self.windowed)
        table = pa.RecordBatch.from_arrays(
            [*columns, pa.array(sorted_kgs), *(pa.array(self.arrays[n][order]) for n in names)],
            names=[*self.key_columns, KEY_GROUP_COLUMN, *names])
        sink = pa.BufferOutputStream()  # filled without the GIL (see _slot_file)
        index: dict[str, int] = {}
        n = len(order)
        with pa.ipc.new_file(sink, table.schema) as writer:
            bounds = (np.flatnonzero(np.diff(sorted_kgs)) + 1).tolist()
            starts, ends = [0, *bounds], [*bounds, n]
            for i, (lo, hi) in enumerate(zip(starts, ends, strict=True)):
                if hi > lo:
                    writer.write_batch(table.slice(lo, hi - lo))
                    index[str(int(sorted_kgs[lo]))] = i
        return sink.getvalue(), index

    def _write(self) -> tuple[dict[str, Any], Chain | None]:
        slots = self._slots()
        # panes (windows) are written by key group; a key's slots in slot order (the
        # grouping by key group costs a sort and gathers in random order per snapshot,
        # paid instead by a restore or a reader, which happen far less often)
        data, index = self._file(slots) if slots is not None and \
            (self.windowed or not len(slots)) else self._slot_file(slots)
        ctx = self.ctx
        handle: dict[str, Any] = {
            "backend": BACKEND_NAME, "key_encoding": KEY_ENCODING,
            "key_columns": self.key_columns,
            "aggregates": [[a.output, a.column, a.function, a.floating]
                           + ([a.state_columns()] if a.function == "user" else [])
                           for a in self.aggregates]}
        if self.windowed:
            handle["row_columns"] = ["_start"]
        if self.expired_before is not None:
            # the keys last written at or before this time were expired at the barrier
            handle["ttl_expired_before"] = self.expired_before
        if not self.incremental:
            path = ctx.exclusive_path(".arrow")
            n, sha = write_atomic(path, [data])
            ref = {"path": ctx.relative(path), "size": n, "sha256": sha}
            handle.update(format=FORMAT, key_groups=index, files=[ref])
            return handle, None
        ctx.shared_dir.mkdir(parents=True, exist_ok=True)
        uid = file_name_component(ctx.operator_uid)
        path = ctx.shared_dir / (f"{uid}-{ctx.subtask}-{ctx.checkpoint_id}-"
                                 f"{uuid.uuid4().hex[:8]}.arrow")
        n, sha = write_atomic(path, [data])
        ref = {"path": ctx.relative(path), "size": n, "sha256": sha}
        chain: Chain = [*self.base, (ref, index)]
        files = [r for r, _ in chain]
        handle.update(format=CHAIN_FORMAT, files=files, shared=files,
                      shared_reused=[r for r, _ in self.base],
                      chain=[{"file": i, "key_groups": kgs} for i, (_, kgs) in enumerate(chain)])
        return handle, chain


class ColumnarStateBackend(StateBackend):
    """Creates :class:`ColumnarKeyedStateBackend` s (in memory; the columnar operators use
    it whatever backend the job runs with, incremental when that one is).

    Args:
        incremental: write the slots changed since the last completed checkpoint only.
    """

    name = BACKEND_NAME

    def __init__(self, incremental: bool = False) -> None:
        self.incremental = incremental

    def create_keyed_backend(self, *, job_name: str, operator_uid: str, subtask: int,
                             key_group_range: KeyGroupRange, max_parallelism: int
                             ) -> KeyedStateBackend:
        return ColumnarKeyedStateBackend(key_group_range, max_parallelism, self.incremental)


register_key_group_reader(BACKEND_NAME, iter_columnar_key_groups)
