"""The retained completed checkpoints of a job (Flink's ``CompletedCheckpointStore``).

When a checkpoint completes it is added here: its shared files are registered in the
:class:`~.shared_state_registry.SharedStateRegistry`, and older checkpoints beyond the
``retained`` newest are *subsumed*: their directories are removed and their shared files
unregistered; files no checkpoint references any more are deleted. Savepoints kept in
checkpoint storage are never subsumed. Incomplete directories older than the newest completed
checkpoint (aborted, or left by a crashed process) are removed too.

Deleting a shared file waits while a checkpoint is in flight: its task may already have
decided to reference a file that the checkpoint being subsumed was the last to hold (the
backend re-uses the files of the last checkpoint it was told completed). Such files are
deleted by the first pass with nothing in flight. Files under ``shared/`` that no retained
checkpoint references when the store is opened (uploads of checkpoints that never completed)
are removed then, once, before the attempt's first checkpoint.

The bookkeeping (registering, choosing what to subsume) runs on the event loop, at once; the
file work (listing, deleting) runs in worker threads (:mod:`.off_loop`), one directory or one
chunk of files per step, one pass at a time. A subsumed checkpoint loses its ``_metadata``
first, so a crash in the middle of deleting it leaves an incomplete directory (removed by a
later pass), never a "completed" checkpoint with files missing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from .metadata import METADATA, CompletedCheckpoint
from .off_loop import chunks, in_thread
from .paths import UnsafePathError, check_real_dir, unlink_under
from .shared_state_registry import SharedStateRegistry
from .storage import CheckpointStorage

__all__ = ["CompletedCheckpointStore"]

log = logging.getLogger(__name__)

# shared files deleted per worker-thread step: small enough that a checkpoint triggered
# meanwhile is noticed before the next step (see _delete_unreferenced)
_FILES_PER_STEP = 64


def _never() -> bool:
    return False


def remove_checkpoint_dir(path: Path) -> None:
    """Delete a checkpoint directory, its ``_metadata`` first (blocking: call in a thread).

    Without the manifest the directory is an incomplete checkpoint: a crash before the rest
    is gone leaves nothing that looks restorable but lacks files.
    """
    # through the job directory without following links; rmtree never follows them either
    unlink_under(path.parent, f"{path.name}/{METADATA}", "retention")
    shutil.rmtree(path, ignore_errors=True)


class CompletedCheckpointStore:
    """Retention and shared-file reference counting for the checkpoints of one job.

    Args:
        storage: the job's checkpoint storage.
        retained: how many completed checkpoints to keep (>= 1); savepoints do not count.
        checkpoints: the completed checkpoints already on disk, oldest first; None reads
            them now, on the calling thread (:meth:`open` reads them in a worker thread).
        in_flight: whether a checkpoint is pending in memory (the coordinator's view; the
            directories on disk are checked too): shared files are not deleted meanwhile.
    """

    def __init__(self, storage: CheckpointStorage, retained: int,
                 checkpoints: Sequence[CompletedCheckpoint] | None = None,
                 in_flight: Callable[[], bool] = _never) -> None:
        self.storage = storage
        self.retained = retained
        self.registry = SharedStateRegistry()
        self._checkpoints: list[CompletedCheckpoint] = sorted(
            storage.completed() if checkpoints is None else checkpoints,
            key=lambda c: c.checkpoint_id)
        for chk in self._checkpoints:
            self.registry.register(chk.checkpoint_id, chk.metadata.shared_paths())
        self._unreferenced: set[str] = set()
        self.in_flight = in_flight
        # one pass of file work at a time: two passes would list and delete the same
        # directories and could each see the other's half-deleted checkpoint as in flight
        self._pass = asyncio.Lock()

    @classmethod
    async def open(cls, storage: CheckpointStorage, retained: int,
                   in_flight: Callable[[], bool] = _never) -> CompletedCheckpointStore:
        """Create the store, reading the retained checkpoints' metadata in a worker thread.

        Raises:
            OSError: if the job directory cannot be listed.
        """
        checkpoints = await in_thread(storage.completed)
        return cls(storage, retained, checkpoints, in_flight)

    @property
    def checkpoints(self) -> list[CompletedCheckpoint]:
        """The retained completed checkpoints, oldest first."""
        return list(self._checkpoints)

    async def remove_orphans(self) -> int:
        """Delete shared files that no retained checkpoint references (uploads of checkpoints
        that never completed); call it before the attempt's first checkpoint.

        Returns:
            how many files were deleted.

        Raises:
            OSError: if ``shared/`` cannot be walked.
            UnsafePathError: if ``shared/`` is a symbolic link (nothing is deleted).
        """
        async with self._pass:
            if self.in_flight():
                return 0
            found = await in_thread(self._list_shared)
            if found is None:
                return 0
            deleted, _ = await self._unlink_unreferenced(sorted(found))
            return deleted

    def _list_shared(self) -> list[str] | None:
        """Blocking: every file under ``shared/`` (relative to the job directory), or None
        when ``shared/`` is missing or a checkpoint is in flight on disk."""
        job_dir = self.storage.job_dir
        # a linked shared/ would make its target's files look like orphans
        shared = check_real_dir(job_dir, "shared")
        if not shared.is_dir() or self._in_flight_on_disk():
            return None
        out: list[str] = []
        for top, _subdirs, files in os.walk(shared, followlinks=False):
            rel = Path(top).relative_to(job_dir).as_posix()
            out.extend(f"{rel}/{name}" for name in files)
        return out

    async def add(self, checkpoint: CompletedCheckpoint) -> list[int]:
        """Register a checkpoint that just completed and subsume what retention drops.

        Everything before the first ``await`` runs at the call: the new checkpoint's files
        are registered, and the subsumed ones unregistered, before any other task runs (so no
        concurrent pass can see the new checkpoint's files as unreferenced). The directories
        and files are then deleted in worker threads.

        Returns:
            ids of the checkpoints removed.
        """
        self.registry.register(checkpoint.checkpoint_id, checkpoint.metadata.shared_paths())
        self._checkpoints.append(checkpoint)
        self._checkpoints.sort(key=lambda c: c.checkpoint_id)
        regular = [c for c in self._checkpoints if not c.is_savepoint]
        subsumed = regular[:-self.retained] if len(regular) > self.retained else []
        for chk in subsumed:
            self._unreferenced.update(self.registry.unregister(chk.checkpoint_id))
            self._checkpoints.remove(chk)
        newest = self._checkpoints[-1].checkpoint_id
        async with self._pass:
            for chk in subsumed:
                # no retained checkpoint lists it any more: nobody reads it (a restore reads
                # a retained one, a query the newest)
                await in_thread(remove_checkpoint_dir, chk.path)
            for path in await in_thread(self._incomplete_before, newest):
                # ids only grow, so every checkpoint still being taken is newer than
                # `newest`; one older than it was aborted when a newer one completed
                await in_thread(remove_checkpoint_dir, path)
            await self._delete_unreferenced()
        return [chk.checkpoint_id for chk in subsumed]

    def _incomplete_before(self, newest: int) -> list[Path]:
        """Blocking: the directories of checkpoints older than ``newest`` without
        ``_metadata`` (aborted, or left by a crashed process)."""
        return [path for n, path in self.storage.checkpoint_dirs()
                if n < newest and not (path / METADATA).exists()]

    def _in_flight_on_disk(self) -> bool:
        """Blocking: a ``chk-<n>`` directory without ``_metadata`` exists (a snapshot's
        synchronous part creates it: see ``SnapshotContext``)."""
        return any(not (p / METADATA).exists() for _, p in self.storage.checkpoint_dirs())

    async def _delete_unreferenced(self) -> None:
        if not self._unreferenced or self.in_flight():
            return  # a pending checkpoint may still reference one of them; next pass
        batch = sorted(self._unreferenced)
        _, finished = await self._unlink_unreferenced(batch)
        if finished:
            # only this batch: add() may have queued more while the steps ran (it updates
            # the set before it waits for this pass to end)
            self._unreferenced.difference_update(batch)

    async def _unlink_unreferenced(self, paths: Sequence[str]) -> tuple[int, bool]:
        """Delete the files of ``paths`` no registered checkpoint references, a chunk per
        worker-thread step; stop as soon as a checkpoint is in flight.

        Returns:
            (how many files were deleted, whether every chunk was handled).
        """
        deleted = 0
        for chunk in chunks(paths, _FILES_PER_STEP):
            # decided on the loop right before the step: a checkpoint that completes during
            # the step was in flight now (so we stop), and one triggered during it reuses
            # only files of the last completed checkpoint, which is retained and registered
            if self.in_flight():
                return deleted, False
            doomed = [rel for rel in chunk if not self.registry.is_referenced(rel)]
            n = await in_thread(self._unlink_if_idle, doomed)
            if n < 0:
                return deleted, False
            deleted += n
        return deleted, True

    def _unlink_if_idle(self, paths: list[str]) -> int:
        """Blocking: unlink ``paths`` (relative to the job directory) unless a checkpoint is
        in flight on disk; return how many, or -1 when one is."""
        if self._in_flight_on_disk():
            return -1
        for rel in paths:
            try:
                unlink_under(self.storage.job_dir, rel, "retention")
            except UnsafePathError as exc:
                log.warning("not deleting shared file %r: %s", rel, exc)
        return len(paths)
