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
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from .metadata import METADATA, CompletedCheckpoint, shared_paths
from .shared_state_registry import SharedStateRegistry
from .storage import CheckpointStorage

__all__ = ["CompletedCheckpointStore"]

log = logging.getLogger(__name__)


class CompletedCheckpointStore:
    """Retention and shared-file reference counting for the checkpoints of one job.

    Args:
        storage: the job's checkpoint storage.
        retained: how many completed checkpoints to keep (>= 1); savepoints do not count.
    """

    def __init__(self, storage: CheckpointStorage, retained: int) -> None:
        self.storage = storage
        self.retained = retained
        self.registry = SharedStateRegistry()
        self._checkpoints: list[CompletedCheckpoint] = storage.completed()
        for chk in self._checkpoints:
            self.registry.register(chk.checkpoint_id, shared_paths(chk.metadata))
        self._unreferenced: set[str] = set()

    @property
    def checkpoints(self) -> list[CompletedCheckpoint]:
        """The retained completed checkpoints, oldest first."""
        return list(self._checkpoints)

    def remove_orphans(self) -> int:
        """Delete shared files that no retained checkpoint references (uploads of checkpoints
        that never completed); call it before the attempt's first checkpoint.

        Returns:
            how many files were deleted.
        """
        shared = self.storage.shared_dir
        if not shared.is_dir() or self._in_flight():
            return 0
        removed = 0
        for f in shared.rglob("*"):
            rel = f.relative_to(self.storage.job_dir).as_posix()
            if f.is_file() and not self.registry.is_referenced(rel):
                f.unlink(missing_ok=True)
                removed += 1
        return removed

    def add(self, checkpoint: CompletedCheckpoint) -> list[int]:
        """Register a checkpoint that just completed and subsume what retention drops.

        Returns:
            ids of the checkpoints removed.
        """
        self.registry.register(checkpoint.checkpoint_id, shared_paths(checkpoint.metadata))
        self._checkpoints.append(checkpoint)
        self._checkpoints.sort(key=lambda c: c.checkpoint_id)
        regular = [c for c in self._checkpoints if not c.is_savepoint]
        subsumed = regular[:-self.retained] if len(regular) > self.retained else []
        removed = []
        for chk in subsumed:
            shutil.rmtree(chk.path, ignore_errors=True)
            self._unreferenced.update(self.registry.unregister(chk.checkpoint_id))
            self._checkpoints.remove(chk)
            removed.append(chk.checkpoint_id)
        newest = checkpoint.checkpoint_id
        for n, path in self.storage.checkpoint_dirs():
            if n < newest and not (path / METADATA).exists():
                shutil.rmtree(path, ignore_errors=True)  # aborted, or a crashed process's
        self._delete_unreferenced()
        return removed

    def _in_flight(self) -> bool:
        return any(not (p / METADATA).exists() for _, p in self.storage.checkpoint_dirs())

    def _delete_unreferenced(self) -> None:
        if not self._unreferenced or self._in_flight():
            return  # a pending checkpoint may still reference one of them; next pass
        for rel in sorted(self._unreferenced):
            if not self.registry.is_referenced(rel):
                Path(self.storage.job_dir / rel).unlink(missing_ok=True)
        self._unreferenced.clear()
