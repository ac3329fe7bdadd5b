"""A snapshot of operator instances taken by the test harness
(:class:`~reactive.testing.operator_harness.OperatorTestHarness`), restorable at another
parallelism, and the scratch directory that holds its files while anything refers to it."""

from __future__ import annotations

import shutil
import tempfile
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..checkpoint.contract import CheckpointMetadata, OperatorState, OperatorSubtaskState
from ..checkpoint.metadata import CompletedCheckpoint

__all__ = ["OperatorSnapshot", "ScratchDirectory"]


class ScratchDirectory:
    """A temporary directory removed when no harness or snapshot refers to it any more."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="reactive-harness-"))
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.path, ignore_errors=True)


@dataclass(frozen=True)
class OperatorSnapshot:
    """The state of one or more instances of an operator, taken by
    :meth:`OperatorTestHarness.snapshot` (Flink's ``OperatorSubtaskState``).

    Restore it with ``OperatorTestHarness(...).open(restore_from=snapshot)``, at the same or
    another parallelism: each new instance gets the keyed state of its key groups and its
    share of the operator state, as a job restore hands them out. Merge the snapshots of
    several instances with :meth:`combine` first.

    Attributes:
        checkpoint_id (int): the checkpoint id it was taken for.
        max_parallelism (int): the number of key groups of the state.
        parallelism (int): the parallelism of the instances it was taken from.
        job_dir (Path): the directory its handles' paths are relative to.
        subtasks (Mapping[int, OperatorSubtaskState]): per instance index, what a
            checkpoint's metadata holds of it: ``keyed_state`` (the backend's handle),
            ``operator_state`` (the handle of the pickled operator state) and, for keyed
            operators, ``key_group_range``.
    """

    checkpoint_id: int
    max_parallelism: int
    parallelism: int
    job_dir: Path
    subtasks: Mapping[int, OperatorSubtaskState]
    _keep_alive: tuple[ScratchDirectory, ...] = field(default=(), repr=False, compare=False)

    @staticmethod
    def combine(snapshots: Iterable[OperatorSnapshot]) -> OperatorSnapshot:
        """Merge the snapshots of different instances of one operator (Flink's
        ``AbstractStreamOperatorTestHarness.repackageState``).

        Snapshots written to different directories are copied into a new one, so the result
        is one restorable snapshot.

        Args:
            snapshots (Iterable[OperatorSnapshot]): snapshots of distinct instances, all
                taken at the same parallelism and max parallelism.

        Returns:
            OperatorSnapshot: one snapshot holding every instance's state (its checkpoint
            id is the largest of theirs).

        Raises:
            ValueError: for no snapshots, different (max) parallelisms, an instance twice,
                or two different files at one path.
        """
        snaps = list(snapshots)
        if not snaps:
            raise ValueError("combine() needs at least one snapshot")
        first = snaps[0]
        subtasks: dict[int, OperatorSubtaskState] = {}
        for snap in snaps:
            if (snap.max_parallelism, snap.parallelism) != (first.max_parallelism,
                                                           first.parallelism):
                raise ValueError(
                    "cannot combine snapshots of different parallelism or max_parallelism: "
                    f"{first.parallelism}/{first.max_parallelism} and "
                    f"{snap.parallelism}/{snap.max_parallelism}")
            for index, entry in snap.subtasks.items():
                if index in subtasks:
                    raise ValueError(f"instance {index} is in more than one snapshot")
                subtasks[index] = entry
        checkpoint_id = max(s.checkpoint_id for s in snaps)
        keep = tuple(d for s in snaps for d in s._keep_alive)
        if len({s.job_dir for s in snaps}) == 1:
            return OperatorSnapshot(checkpoint_id, first.max_parallelism, first.parallelism,
                                    first.job_dir, subtasks, keep)
        scratch = ScratchDirectory()
        job_dir = scratch.path / "combined"
        for snap in snaps:
            for entry in snap.subtasks.values():
                for ref in (r for handle in entry.handles() for r in handle.files):
                    src, dest = snap.job_dir / ref.path, job_dir / ref.path
                    if dest.exists():
                        if dest.read_bytes() != src.read_bytes():
                            raise ValueError(f"two snapshots hold different files at {ref.path}")
                        continue
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(src, dest)
        return OperatorSnapshot(checkpoint_id, first.max_parallelism, first.parallelism,
                                job_dir, subtasks, (scratch,))

    def as_completed_checkpoint(self, uid: str) -> CompletedCheckpoint:
        """The snapshot as a completed checkpoint holding the state of operator ``uid``
        (instances it has no state of are empty), for the runtime's state assignment.

        Args:
            uid (str): the operator uid to file the state under.

        Returns:
            CompletedCheckpoint: a checkpoint (not written to disk) whose job directory is
            :attr:`job_dir`.
        """
        subtasks = {i: self.subtasks.get(i, OperatorSubtaskState())
                    for i in range(self.parallelism)}
        metadata = CheckpointMetadata(
            job="harness", checkpoint_id=self.checkpoint_id, kind="checkpoint",
            max_parallelism=self.max_parallelism, operators={uid: OperatorState(
                uid, self.parallelism, any(s.keyed_state for s in subtasks.values()),
                subtasks)})
        return CompletedCheckpoint(self.checkpoint_id,
                                   self.job_dir / f"chk-{self.checkpoint_id}", metadata)
