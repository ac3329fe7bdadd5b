"""The heap backend's full asynchronous snapshots with copy-on-write per key group.

- *synchronous part* (the backend's ``snapshot``): mark every non-empty key group of the
  instance as pending for the snapshot -- O(number of key groups), independent of the state's
  size;
- *asynchronous part* (:meth:`HeapSnapshot.write`): serialize the pending key groups one at a
  time (:func:`serialize_key_group`: pickle, C speed), yielding to the event loop between
  them, and write them to one checksummed ``heap-v1`` file (:mod:`.format`);
- *copy-on-write*: when the task touches a key group that is still pending, the backend
  serializes it first (with :func:`serialize_key_group`) and hands the blob to the snapshot,
  so the snapshot holds exactly the state as of the barrier, even if values are mutated in
  place later.

Each key group is serialized once per snapshot, by whichever side reaches it first: the heap
backend's analogue of Flink's copy-on-write state table (``CopyOnWriteStateTable``, thesis
section 4.5.1).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import pickle
import time
from collections.abc import Callable, Mapping
from typing import Any

from reactive.errors import StateSerializationError
from reactive.state.backend import KeyedStateSnapshot, SnapshotContext

from .format import encode_key_group, heap_handle
from .state import Table, descriptor_serializer

__all__ = ["HeapSnapshot", "serialize_key_group"]

_YIELD_EVERY = 0.002  # seconds of serialization between two yields to the event loop


def serialize_key_group(tables: Mapping[str, Table], idx: int, operator: str) -> bytes | None:
    """Return the snapshot blob of key group index ``idx`` (None when it holds no state).

    Args:
        tables: the backend's states by name.
        idx: the key group's index in the instance's range.
        operator: the operator's uid, named in errors.

    Raises:
        StateSerializationError: if a value (or key) cannot be serialized, naming
            ``operator``, the state and the key.
    """
    try:
        data: dict[str, dict[Any, Any]] = {}
        for name, table in tables.items():
            d = table.maps[idx]
            if not d:
                continue
            ser = None if table.serialized else descriptor_serializer(table.descriptor)
            data[name] = {k: ser.serialize(v) for k, v in d.items()} if ser else d
        if not data:
            return None
        serialized = [name for name, t in tables.items() if name in data and
                      (t.serialized or descriptor_serializer(t.descriptor) is not None)]
        return encode_key_group(serialized, data)
    except Exception as exc:
        # the fast path pickles whole key groups at C speed; only now look entry by entry
        # for the one to name
        error = _unserializable(tables, idx, operator)
        if error is None:  # no entry fails on its own: not a value's fault
            raise
        raise error from exc


def _unserializable(tables: Mapping[str, Table], idx: int,
                    operator: str) -> StateSerializationError | None:
    """Return the error naming the first entry of key group index ``idx`` that cannot be
    serialized (None when every entry can on its own)."""
    for name, table in tables.items():
        ser = None if table.serialized else descriptor_serializer(table.descriptor)
        for k, v in table.maps[idx].items():
            try:
                pickle.dumps((k, ser.serialize(v) if ser else v),
                             protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:
                return StateSerializationError(operator, name, k, exc)
    return None


class HeapSnapshot(KeyedStateSnapshot):
    """One snapshot between its synchronous part and the end of its asynchronous part.

    Args:
        ctx: where to write.
        pending: indexes of the key groups still to serialize (shared with the backend,
            which removes those it captures by copy-on-write).
        tables: the backend's live states by name.
        start: the first key group of the instance's range.
        n: the number of key groups of the range.
        key_encoding: the handle's ``key_encoding``.
        release: called (possibly more than once) when the snapshot no longer needs
            copy-on-write.

    Attributes:
        blobs: key group index -> blob captured by copy-on-write (None: empty).
        failure: set when copy-on-write met a value that cannot be serialized.
    """

    def __init__(self, ctx: SnapshotContext, pending: set[int], *,
                 tables: Mapping[str, Table], start: int, n: int, key_encoding: str,
                 release: Callable[[HeapSnapshot], None]) -> None:
        self.ctx = ctx
        self.pending = pending
        self.tables = tables
        self.start = start
        self.n = n
        self.key_encoding = key_encoding
        self._release = release
        self.blobs: dict[int, bytes | None] = {}
        self.failure: StateSerializationError | None = None

    async def write(self) -> dict[str, Any]:
        """Write the snapshot file and return its handle.

        Raises:
            StateSerializationError: if a value or key cannot be serialized (naming the
                operator, the state and the key).
            OSError: if the file cannot be written.
        """
        ctx = self.ctx
        if self.failure is not None:
            self._release(self)
            raise self.failure
        path = ctx.exclusive_path(".heap")
        tmp = path.with_name("." + path.name + ".tmp")
        index: dict[str, list[int]] = {}
        h = hashlib.sha256()
        offset = 0
        start = self.start
        try:
            with open(tmp, "wb") as f:
                last_yield = time.perf_counter()
                for idx in range(self.n):
                    if idx in self.blobs:
                        blob = self.blobs.pop(idx)
                    elif idx in self.pending:
                        blob = serialize_key_group(self.tables, idx, ctx.operator_uid)
                        self.pending.discard(idx)
                    else:
                        continue
                    if self.failure is not None:
                        raise self.failure
                    if blob:
                        f.write(blob)
                        h.update(blob)
                        index[str(idx + start)] = [offset, len(blob)]
                        offset += len(blob)
                    if time.perf_counter() - last_yield > _YIELD_EVERY:
                        await asyncio.sleep(0)
                        last_yield = time.perf_counter()
                self._release(self)
                if self.failure is not None:
                    raise self.failure
                f.flush()
                # inline: fsync takes < 1 ms here, a worker thread would first wait for the GIL
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        finally:
            self._release(self)
        return heap_handle(ctx.relative(path), offset, h.hexdigest(), index, self.key_encoding)

    def discard(self) -> None:
        self._release(self)
        self.blobs.clear()
