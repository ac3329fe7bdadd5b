"""Columnar keyed state: per-slot numpy arrays beside a :class:`KeyIndex`, snapshotted per
key group into an Arrow IPC file.

The state of one operator instance is a set of named arrays indexed by slot (the dense
index :class:`~reactive.columnar.key_index.KeyIndex` gives each distinct key). A snapshot's
synchronous part captures references: the arrays (marked frozen; the operator copies an
array before its next write to it, copy-on-write per array) and the key index's chunk lists
(append-only, so a prefix is stable). That is O(number of arrays + key chunks), independent
of the number of keys. The asynchronous part, in a worker thread (pyarrow and numpy release
the GIL for their bulk work), sorts the slots by key group and writes one record batch per
key group (key columns, then the state arrays) into an Arrow IPC file; the handle maps each
key group to its batch, so a restore at any parallelism reads only the key groups of its
range (rescaling: thesis section 4.2).
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..checkpoint.durable_files import write_atomic
from ..checkpoint.off_loop import in_thread
from ..errors import RestoreError, StateAccessError
from ..key_encoding import KEY_ENCODING
from ..keygroups import KeyGroupRange
from ..state.api import State
from ..state.backend import KeyedStateBackend, KeyedStateSnapshot, SnapshotContext, StateBackend
from ..state.descriptors import StateDescriptor
from .key_index import KeyIndex
from .schema import pa

__all__ = ["BACKEND_NAME", "ColumnarKeyedStateBackend", "ColumnarStateBackend"]

BACKEND_NAME = "columnar-heap"
FORMAT = "arrow-ipc-v1"
KEY_GROUP_COLUMN = "_key_group"


class ColumnarKeyedStateBackend(KeyedStateBackend):
    """The columnar keyed state of one operator instance.

    The operator binds its :class:`KeyIndex` and its arrays (:meth:`bind`), and asks
    :meth:`thaw` before changing its arrays in place.

    Args:
        key_group_range: the key groups this instance owns.
        max_parallelism: the number of key groups.
    """

    def __init__(self, key_group_range: KeyGroupRange, max_parallelism: int) -> None:
        self.key_group_range = key_group_range
        self.max_parallelism = max_parallelism
        self.current_key = None
        self.index: KeyIndex | None = None
        self.arrays: dict[str, np.ndarray] = {}
        self._frozen: set[str] = set()
        self.restored: list[tuple[list[Any], Any]] = []

    def bind(self, index: KeyIndex, arrays: dict[str, np.ndarray]) -> None:
        """Attach the operator's key index and arrays (by name; the dict is shared)."""
        self.index = index
        self.arrays = arrays

    def thaw(self) -> None:
        """Copy the arrays a snapshot still reads (copy-on-write), before the operator
        changes them in place; free when no snapshot was taken since the last call."""
        if self._frozen:
            for name in self._frozen:
                if name in self.arrays:
                    self.arrays[name] = self.arrays[name].copy()
            self._frozen = set()

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
        return _ColumnarSnapshot(
            ctx, self.key_group_range, index.size, list(index.key_columns),
            [list(chunks) for chunks in index.key_chunks],
            index.key_groups, dict(self.arrays))

    def restore(self, handles: list[dict[str, Any]], job_dir: Path) -> None:
        """Read the key groups of this instance's range; the operator installs them
        (:attr:`restored`: ``(key columns, state table)`` per key group) when it opens."""
        for handle in handles:
            if handle.get("backend") != BACKEND_NAME or handle.get("format") != FORMAT:
                raise RestoreError(
                    f"a columnar aggregate cannot restore a {handle.get('backend')!r} "
                    f"snapshot ({handle.get('format')!r}): was the operator's uid given to "
                    "another operator?")
            path = job_dir / handle["files"][0]["path"]
            try:
                reader = pa.ipc.open_file(pa.memory_map(str(path)))
                for kg, i in handle["key_groups"].items():
                    if int(kg) in self.key_group_range:
                        batch = reader.get_batch(int(i))
                        keys = [batch.column(c) for c in handle["key_columns"]]
                        self.restored.append((keys, batch))
            except (OSError, pa.ArrowInvalid) as exc:
                raise RestoreError(f"cannot read columnar snapshot {path}: {exc}") from exc

    def dispose(self) -> None:
        self.arrays = {}
        self.index = None


class _ColumnarSnapshot(KeyedStateSnapshot):
    def __init__(self, ctx: SnapshotContext, key_group_range: KeyGroupRange, size: int,
                 key_columns: list[str], key_chunks: list[list[Any]], key_groups: np.ndarray,
                 arrays: dict[str, np.ndarray]) -> None:
        self.ctx = ctx
        self.key_group_range = key_group_range
        self.size = size
        self.key_columns = key_columns
        self.key_chunks = key_chunks
        self.key_groups = key_groups
        self.arrays = arrays

    async def write(self) -> dict[str, Any]:
        return await in_thread(self._write)

    def _write(self) -> dict[str, Any]:
        size = self.size
        kgs = self.key_groups[:size]
        # slots sorted by key group (< 2**15: numpy's radix sort)
        order = np.argsort(kgs.astype(np.uint16), kind="stable")
        sorted_kgs = kgs[order]
        columns = [pa.concat_arrays(c).take(pa.array(order)) if c else pa.array([])
                   for c in self.key_chunks]
        names = [*self.key_columns, KEY_GROUP_COLUMN, *sorted(self.arrays)]
        data = columns + [pa.array(sorted_kgs)] + \
            [pa.array(self.arrays[n][:size][order]) for n in sorted(self.arrays)]
        table = pa.RecordBatch.from_arrays(data, names=names)
        sink = io.BytesIO()
        index: dict[str, int] = {}
        with pa.ipc.new_file(sink, table.schema) as writer:
            bounds = np.flatnonzero(np.diff(sorted_kgs)) + 1
            starts = np.concatenate([[0], bounds]) if size else np.array([], np.int64)
            ends = np.concatenate([bounds, [size]]) if size else np.array([], np.int64)
            for i, (lo, hi) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
                writer.write_batch(table.slice(lo, hi - lo))
                index[str(int(sorted_kgs[lo]))] = i
        path = self.ctx.exclusive_path(".arrow")
        n, sha = write_atomic(path, [sink.getvalue()])
        return {
            "backend": BACKEND_NAME,
            "format": FORMAT,
            "key_encoding": KEY_ENCODING,
            "key_columns": self.key_columns,
            "key_groups": index,
            "files": [{"path": self.ctx.relative(path), "size": n, "sha256": sha}],
        }


class ColumnarStateBackend(StateBackend):
    """Creates :class:`ColumnarKeyedStateBackend` s (in memory; the columnar operators use
    it whatever backend the job runs with)."""

    name = BACKEND_NAME

    def create_keyed_backend(self, *, job_name: str, operator_uid: str, subtask: int,
                             key_group_range: KeyGroupRange, max_parallelism: int
                             ) -> KeyedStateBackend:
        return ColumnarKeyedStateBackend(key_group_range, max_parallelism)
