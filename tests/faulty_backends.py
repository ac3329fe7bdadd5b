"""State backends with one deliberate fault each, built on the heap backend, for checking that
the backend contract suite and the runtime catch what a third-party backend gets wrong.

- :class:`ThreadBoundStateBackend`: each keyed backend holds a ``sqlite3`` connection made on
  the thread that created it (sqlite3's default ``check_same_thread=True``) and touches it in
  every hook, as a backend storing its state in SQLite does. It works as long as every hook
  runs on the creating thread (the event loop's), and fails in ``restore``, which the runtime
  runs in a worker thread.
- :class:`TamperedHandleStateBackend`: a snapshot handle that lies about its files (a wrong
  sha256 or size, an absolute path, a path with ``..``) while its own restore reads the
  files it wrote, so the state still restores in a test that reads it back directly.
"""

from __future__ import annotations

import copy
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from reactive.backends.heap import HeapStateBackend
from reactive.spi import (
    KeyedStateBackend,
    KeyedStateSnapshot,
    KeyGroupRange,
    SnapshotContext,
    State,
    StateBackend,
    StateDescriptor,
)


class _Delegating(KeyedStateBackend):
    """A keyed backend that forwards every hook to a heap keyed backend."""

    def __init__(self, inner: KeyedStateBackend) -> None:
        self.inner = inner
        self.key_group_range = inner.key_group_range
        self.max_parallelism = inner.max_parallelism

    @property  # type: ignore[override]
    def current_key(self) -> Any:
        return self.inner.current_key

    def touch(self) -> None:
        """Called at the start of every hook."""

    def set_current_key(self, key: Any) -> None:
        self.touch()
        self.inner.set_current_key(key)

    def get_state(self, descriptor: StateDescriptor) -> State:
        self.touch()
        return self.inner.get_state(descriptor)

    def keys(self, state_name: str) -> Iterator[Any]:
        self.touch()
        return self.inner.keys(state_name)

    def snapshot(self, ctx: SnapshotContext) -> KeyedStateSnapshot:
        self.touch()
        return self.inner.snapshot(ctx)

    def restore(self, handles: list[dict[str, Any]], job_dir: Path) -> None:
        self.touch()
        self.inner.restore(handles, job_dir)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.touch()
        self.inner.notify_checkpoint_complete(checkpoint_id)

    def dispose(self) -> None:
        self.inner.dispose()


class _ThreadBound(_Delegating):
    def __init__(self, inner: KeyedStateBackend) -> None:
        super().__init__(inner)
        self.db = sqlite3.connect(":memory:")  # usable on this thread only

    def touch(self) -> None:
        # raises sqlite3.ProgrammingError on any other thread
        self.db.execute("SELECT 1")

    def dispose(self) -> None:
        super().dispose()
        self.db.close()


class ThreadBoundStateBackend(StateBackend):
    """Heap state behind a per-instance ``sqlite3`` connection bound to its creating thread."""

    name = "heap"

    def __init__(self) -> None:
        self.heap = HeapStateBackend()

    def create_keyed_backend(self, *, job_name: str, operator_uid: str, subtask: int,
                             key_group_range: KeyGroupRange,
                             max_parallelism: int) -> KeyedStateBackend:
        return _ThreadBound(self.heap.create_keyed_backend(
            job_name=job_name, operator_uid=operator_uid, subtask=subtask,
            key_group_range=key_group_range, max_parallelism=max_parallelism))


class _TamperedSnapshot(KeyedStateSnapshot):
    def __init__(self, inner: KeyedStateSnapshot, fault: str, job_dir: Path) -> None:
        self.inner, self.fault, self.job_dir = inner, fault, job_dir

    async def write(self) -> dict[str, Any]:
        handle = copy.deepcopy(await self.inner.write())
        # the backend's own restore finds its files whatever the handle says (as one that
        # opens job_dir / path does with an absolute path, and none verifies a checksum)
        handle["true_files"] = copy.deepcopy(handle["files"])
        for ref in handle["files"]:
            if self.fault == "wrong_sha256":
                ref["sha256"] = "0" * 64
            elif self.fault == "absolute_path":
                ref["path"] = str((self.job_dir / ref["path"]).resolve())
            elif self.fault == "dotdot_path":
                first, _, rest = ref["path"].partition("/")
                ref["path"] = f"{first}/../{first}/{rest}"
            elif self.fault == "wrong_size":
                ref["size"] += 1
        return handle

    def discard(self) -> None:
        self.inner.discard()


class _Tampered(_Delegating):
    def __init__(self, inner: KeyedStateBackend, fault: str) -> None:
        super().__init__(inner)
        self.fault = fault

    def snapshot(self, ctx: SnapshotContext) -> KeyedStateSnapshot:
        return _TamperedSnapshot(self.inner.snapshot(ctx), self.fault, ctx.job_dir)

    def restore(self, handles: list[dict[str, Any]], job_dir: Path) -> None:
        self.inner.restore([{**h, "files": h.get("true_files", h["files"])} for h in handles],
                           job_dir)


class TamperedHandleStateBackend(StateBackend):
    """Heap state whose snapshot handles misstate their files.

    Args:
        fault: ``"wrong_sha256"``, ``"wrong_size"``, ``"absolute_path"`` or
            ``"dotdot_path"``.
    """

    name = "heap"

    def __init__(self, fault: str) -> None:
        self.fault = fault
        self.heap = HeapStateBackend()

    def create_keyed_backend(self, *, job_name: str, operator_uid: str, subtask: int,
                             key_group_range: KeyGroupRange,
                             max_parallelism: int) -> KeyedStateBackend:
        return _Tampered(self.heap.create_keyed_backend(
            job_name=job_name, operator_uid=operator_uid, subtask=subtask,
            key_group_range=key_group_range, max_parallelism=max_parallelism), self.fault)


class _FlakyRestore(_Delegating):
    def __init__(self, inner: KeyedStateBackend, owner: FlakyRestoreStateBackend) -> None:
        super().__init__(inner)
        self.owner = owner

    def restore(self, handles: list[dict[str, Any]], job_dir: Path) -> None:
        if self.owner.failures_left > 0:
            self.owner.failures_left -= 1
            raise OSError(5, "Input/output error (injected)")
        self.inner.restore(handles, job_dir)

    def dispose(self) -> None:
        self.owner.disposed += 1
        super().dispose()


class FlakyRestoreStateBackend(StateBackend):
    """Heap state whose first ``failures`` restores (over all instances) raise an ``OSError``,
    as a flaky disk or network mount would; counts the keyed backends it created and how
    many were disposed.

    Args:
        failures: how many restores fail.
    """

    name = "heap"

    def __init__(self, failures: int) -> None:
        self.failures_left = failures
        self.created = self.disposed = 0
        self.heap = HeapStateBackend()

    def create_keyed_backend(self, *, job_name: str, operator_uid: str, subtask: int,
                             key_group_range: KeyGroupRange,
                             max_parallelism: int) -> KeyedStateBackend:
        self.created += 1
        return _FlakyRestore(self.heap.create_keyed_backend(
            job_name=job_name, operator_uid=operator_uid, subtask=subtask,
            key_group_range=key_group_range, max_parallelism=max_parallelism), self)
