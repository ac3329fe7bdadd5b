"""Which checkpoint a run restores: resume, restore, failover, and falling back past damage.

Every ``Dataflow.start`` is a *run* with its own id (Flink gives each submission a job id);
the checkpoints a run completes carry that ``run_id`` in their metadata, and checkpoint ids
grow across runs within a checkpoint directory. What a run restores:

- ``restore_from=PATH``: exactly that checkpoint or savepoint. If it cannot be honoured
  (missing, damaged, another max parallelism) the run fails with the reason; it never
  falls back to another checkpoint or to a fresh start.
- ``resume=True``: continue the most recent run of ``<directory>/<job>`` (runs record where
  they started in ``_runs/``): its newest completed checkpoint, else the checkpoint or
  savepoint it started from, else the beginning of the input (it had started fresh and was
  stopped before its first checkpoint). Without run records (a directory of an older
  version), the newest completed checkpoint of any run.
- neither: a fresh start (a new lineage; ids continue after those on disk).
- failover (a task failed, the restart strategy restarts the run): the newest checkpoint
  *this run* completed, else the checkpoint it started from, else a fresh start. Never a
  checkpoint of another run that happens to share the directory.

A checkpoint whose files fail their checks is skipped for an older one only when that is
still exactly-once: if a skipped checkpoint had already committed output (two-phase-commit
sinks commit when a checkpoint completes), restoring an older one publishes that output a
second time. Then the selection fails and names the option that accepts the replay, unless
every exactly-once sink of the job deduplicates by checkpoint id. When no candidate can be
restored at all, the selection fails and lists each checkpoint with the reason it was
rejected; starting from scratch is left to the user (a fresh run).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import CorruptCheckpointError, RestoreError
from .contract import CheckpointMetadata
from .metadata import METADATA, CompletedCheckpoint, read_metadata
from .storage import CheckpointStorage

__all__ = ["RejectedCheckpoint", "ReplayPolicy", "candidates_in", "committed_output",
           "lineage_candidates", "resume_candidates", "select_restore"]

log = logging.getLogger(__name__)

REPLAY_OPTION = "allow_replayed_output=True (reactive run --allow-replayed-output)"


@dataclass(frozen=True)
class RejectedCheckpoint:
    """A completed checkpoint that cannot be restored, and why."""

    checkpoint_id: int
    path: Path
    reason: str
    committed_output: bool

    def __str__(self) -> str:
        return f"checkpoint {self.checkpoint_id} ({self.path}): {self.reason}"


@dataclass(frozen=True)
class ReplayPolicy:
    """What the job's sinks allow when a restore falls back past a checkpoint that committed.

    Attributes:
        allow_replayed_output: the user accepts that output committed after the restored
            checkpoint is published again.
        exactly_once_sinks: names of the job's exactly-once sinks that cannot deduplicate
            (their output would be duplicated by a replay).
        deduplicating_sinks: names of the exactly-once sinks that drop a checkpoint
            interval they already committed (so a replay is harmless for them).
    """

    allow_replayed_output: bool = False
    exactly_once_sinks: Sequence[str] = field(default_factory=tuple)
    deduplicating_sinks: Sequence[str] = field(default_factory=tuple)


def committed_output(metadata: CheckpointMetadata | None) -> bool:
    """Whether completing this checkpoint committed side effects (unknown: assume it did).

    An intermediate savepoint commits nothing (``commits`` false); every other completed
    checkpoint notified its tasks, which committed their pending transactions.
    """
    if metadata is None:
        return True
    if metadata.commits is None:
        return not metadata.is_savepoint
    return metadata.commits


def candidates_in(storage: CheckpointStorage, min_id: int = 0, run_id: str | None = None
                  ) -> list[CompletedCheckpoint | RejectedCheckpoint]:
    """The completed checkpoints of ``storage`` with an id >= ``min_id``, newest first.

    A directory whose ``_metadata`` exists but cannot be read is a rejected candidate (it
    completed, so it may have committed output). With ``run_id``, checkpoints whose metadata
    names another run are left out, and so are intermediate savepoints (as in Flink, failover
    never restores one: its side effects were not committed). A stop-with-savepoint committed
    them (``commits`` true): it is where the run stopped, and where it resumes.
    """
    out: list[CompletedCheckpoint | RejectedCheckpoint] = []
    for n, path in reversed(storage.checkpoint_dirs()):
        if n < min_id or not (path / METADATA).exists():
            continue
        try:
            chk = CompletedCheckpoint(n, path, read_metadata(path))
        except RestoreError as exc:
            if (path / METADATA).exists():  # else removed meanwhile by retention: subsumed
                out.append(RejectedCheckpoint(n, path, str(exc), committed_output(None)))
            continue
        if run_id is not None and (chk.metadata.run_id != run_id or (
                chk.is_savepoint and not committed_output(chk.metadata))):
            continue
        out.append(chk)
    return out


def lineage_candidates(storage: CheckpointStorage, run_id: str, first_id: int,
                       start: CompletedCheckpoint | Path | None
                       ) -> list[CompletedCheckpoint | RejectedCheckpoint]:
    """The checkpoints a run's lineage may restore, newest first: the run's own completed
    checkpoints, then the checkpoint or savepoint it started from (read again from disk).

    Args:
        storage: the run's checkpoint storage.
        run_id: the run.
        first_id: the first checkpoint id the run used.
        start: what the run restored when it started (a checkpoint, or its directory), or
            None when it started from the beginning of the input.
    """
    out = candidates_in(storage, first_id, run_id)
    if start is not None:
        path = start.path if isinstance(start, CompletedCheckpoint) else Path(start)
        try:
            out.append(CheckpointStorage.load(path, verify=False))
        except RestoreError as exc:
            n = start.checkpoint_id if isinstance(start, CompletedCheckpoint) else -1
            out.append(RejectedCheckpoint(n, path, f"the run started from it, but: {exc}",
                                          committed_output(None)))
    return out


def resume_candidates(storage: CheckpointStorage
                      ) -> list[CompletedCheckpoint | RejectedCheckpoint]:
    """What ``resume=True`` may restore, newest first (see the module docstring)."""
    runs = storage.runs()
    if not runs:
        return candidates_in(storage)
    last = runs[-1]
    restored = last.get("restored_from")
    return lineage_candidates(storage, str(last["run_id"]), int(last["first_checkpoint_id"]),
                              Path(restored["path"]) if restored else None)


def select_restore(
    candidates: Sequence[CompletedCheckpoint | RejectedCheckpoint],
    policy: ReplayPolicy,
    what: str,
) -> CompletedCheckpoint | None:
    """Pick the newest candidate that passes its checks, if falling back to it is safe.

    Args:
        candidates: completed checkpoints newest first; entries already known to be
            unreadable (e.g. damaged metadata) come as :class:`RejectedCheckpoint`.
        policy: what the job's sinks allow (see :class:`ReplayPolicy`).
        what: how the caller names this restore in errors ("resume", "failover").

    Returns:
        the checkpoint to restore, or None when there are no candidates (fresh start).

    Raises:
        RestoreError: when no candidate passes its checks (listing each and why), or when
            the first one that does is older than a rejected checkpoint that committed
            output and the sinks cannot absorb the replay.
    """
    rejected: list[RejectedCheckpoint] = []
    for candidate in candidates:
        if isinstance(candidate, RejectedCheckpoint):
            rejected.append(candidate)
            continue
        try:
            CheckpointStorage.verify(candidate)
        except (CorruptCheckpointError, OSError) as exc:
            log.warning("checkpoint %d is corrupted, trying the previous one: %s",
                        candidate.checkpoint_id, exc)
            rejected.append(RejectedCheckpoint(candidate.checkpoint_id, candidate.path,
                                               str(exc), committed_output(candidate.metadata)))
            continue
        _check_replay(candidate, rejected, policy)
        return candidate
    if rejected:
        listing = "\n".join(f"  - {r}" for r in rejected)
        raise RestoreError(
            f"{what}: found {len(rejected)} completed checkpoint(s) but can restore none:\n"
            f"{listing}\nRepair or remove them, restore a savepoint with restore_from=..., "
            "or start a fresh run (resume=False; reactive run --fresh) if replaying the "
            "input from its start is what you want"
        )
    return None


def _check_replay(chosen: CompletedCheckpoint, rejected: list[RejectedCheckpoint],
                  policy: ReplayPolicy) -> None:
    newer_committed = [r for r in rejected if r.committed_output]
    if not newer_committed:
        return
    ids = ", ".join(str(r.checkpoint_id) for r in newer_committed)
    if not policy.exactly_once_sinks:
        if policy.deduplicating_sinks:
            log.warning("restoring checkpoint %d past damaged checkpoint(s) %s that committed "
                        "output: sinks %s deduplicate by checkpoint id, so the replay is not "
                        "published twice", chosen.checkpoint_id, ids,
                        ", ".join(policy.deduplicating_sinks))
        return
    if policy.allow_replayed_output:
        log.warning("restoring checkpoint %d past damaged checkpoint(s) %s that committed "
                    "output: sinks %s will publish the replayed records again "
                    "(allow_replayed_output)", chosen.checkpoint_id, ids,
                    ", ".join(policy.exactly_once_sinks))
        return
    reasons = "\n".join(f"  - {r}" for r in newer_committed)
    raise RestoreError(
        f"the newest restorable checkpoint is {chosen.checkpoint_id}, but the newer "
        f"checkpoint(s) {ids} cannot be restored and had already committed output:\n"
        f"{reasons}\nRestoring checkpoint {chosen.checkpoint_id} would publish that output a "
        f"second time through the sinks {', '.join(policy.exactly_once_sinks)} (not "
        f"exactly-once). Repair the damaged checkpoint, or pass {REPLAY_OPTION} to accept "
        "the duplicates"
    )
