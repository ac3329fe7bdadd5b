"""Checkpoint storage on the local filesystem: where the checkpoints of a job live.

```
<dir>/<job>/chk-<n>/_metadata    the completed checkpoint's manifest (``metadata``)
<dir>/<job>/chk-<n>/...          files only checkpoint n uses
<dir>/<job>/shared/...           files incremental checkpoints share
<dir>/<job>/_runs/<run_id>.json  where each run started
```

Directories without ``_metadata`` are incomplete checkpoints: ignored, and removed by the
completed-checkpoint store. Every checkpoint names the *run* that wrote it (``run_id``: one
per ``Dataflow.start``, as Flink gives each submission a job id), so a run's failover
restores only its own lineage. Each run also records where it started, before it takes any
checkpoint (``{"run_id", "first_checkpoint_id", "restored_from"}``), so that resuming
continues the most recent run even when it was killed before its first checkpoint (it
started from a savepoint elsewhere, or from the beginning of the input).
"""

from __future__ import annotations

import hmac
import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, ConfigurationError, CorruptCheckpointError, RestoreError
from .contract import CheckpointMetadata
from .durable_files import fsync_dir, verify_file, write_atomic
from .metadata import (
    KEY_ENV,
    METADATA,
    CompletedCheckpoint,
    read_metadata,
    signature,
    signing_key,
    write_metadata,
)
from .paths import UnsafePathError, check_id, check_real_dir, unlink_under

__all__ = ["CheckpointStorage", "validate_job_name"]

log = logging.getLogger(__name__)

_CHK = re.compile(r"^chk-(\d+)$")


def validate_job_name(name: str) -> str:
    """Check that a job name is one path component (it names ``<directory>/<job>``).

    Raises:
        ConfigurationError: for an empty name, ``.``/``..``, or a name with a separator.
    """
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name \
            or "\\" in name or "\0" in name:
        raise ConfigurationError(
            f"job name {name!r} must be a single path component (no '/', not '.' or '..'): "
            "it names the job's checkpoint directory")
    return name


class CheckpointStorage:
    """The checkpoints of one job under ``<directory>/<job>``.

    Args:
        directory: the storage root (``CheckpointConfig.directory``).
        job_name: the dataflow's name.
    """

    def __init__(self, directory: str | Path, job_name: str) -> None:
        validate_job_name(job_name)
        self.root = Path(directory)
        self.job_dir = self.root / job_name
        self.shared_dir = self.job_dir / "shared"

    def checkpoint_dir(self, checkpoint_id: int) -> Path:
        """Return ``<job_dir>/chk-<n>``."""
        return self.job_dir / f"chk-{checkpoint_id}"

    def write_metadata(self, checkpoint_id: int, metadata: CheckpointMetadata) -> Path:
        """Complete checkpoint ``checkpoint_id`` by writing its metadata atomically.

        Returns:
            the checkpoint directory.
        """
        chk = self.checkpoint_dir(checkpoint_id)
        self._sync_dirs(chk, metadata)
        write_metadata(chk, metadata)
        return chk

    def _sync_dirs(self, chk: Path, metadata: CheckpointMetadata) -> None:
        """fsync every directory whose entries the checkpoint depends on, before its
        metadata: each referenced file's directory and its parents up to the job directory,
        the job directory (its entries ``chk-<n>``, ``shared/``) and the storage root (its
        entry for the job directory).
        A file's own fsync does not make its name durable; without these a power loss can
        take a completed checkpoint's files (or ``chk-<n>`` itself) away."""
        dirs = {self.root, self.job_dir, chk}
        for ref in metadata.file_refs():
            d = (self.job_dir / ref.path).parent
            while d != self.job_dir and d.is_relative_to(self.job_dir):
                dirs.add(d)
                d = d.parent
        for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):  # deepest first
            fsync_dir(d)

    def checkpoint_dirs(self) -> list[tuple[int, Path]]:
        """Every ``chk-<n>`` directory, completed or not, as ``(n, path)``, oldest first."""
        return self._dirs()

    def _dirs(self) -> list[tuple[int, Path]]:
        if not self.job_dir.is_dir():
            return []
        out = []
        for p in self.job_dir.iterdir():
            m = _CHK.match(p.name)
            # a link named chk-<n> is no checkpoint of this directory: never followed
            if m and p.is_dir() and not p.is_symlink():
                out.append((int(m.group(1)), p))
        return sorted(out)

    def completed(self) -> list[CompletedCheckpoint]:
        """Completed checkpoints, oldest first (unreadable metadata is skipped, with a log).

        Safe while the job runs: a checkpoint that retention removes between the listing
        and the reading of its metadata is left out, as it would be a moment later.
        """
        out = []
        for n, p in self._dirs():
            if not (p / METADATA).exists():
                continue
            try:
                out.append(CompletedCheckpoint(n, p, read_metadata(p)))
            except RestoreError as exc:
                if (p / METADATA).exists():  # else removed meanwhile: subsumed, not damaged
                    log.warning("ignoring checkpoint %s: %s", p, exc)
        return out

    def latest_id(self, include_runs: bool = True) -> int:
        """Highest checkpoint id used in the directory (0 when none): of every ``chk-<n>``,
        completed or not, and (``include_runs``) of the first ids runs reserved when they
        started and of the savepoints they moved out of the directory."""
        dirs = self._dirs()
        used = dirs[-1][0] if dirs else 0
        if not include_runs:
            return used
        runs = self.runs()
        return max([used, *(int(r["first_checkpoint_id"]) for r in runs),
                    *(int(n) for r in runs for n in r.get("savepoints", []))])

    def highest_completed_id(self) -> int:
        """Highest id of a checkpoint or savepoint that completed in this directory (0 when
        none): of every ``chk-<n>`` with ``_metadata`` (any run, savepoints kept here
        included) and of the savepoints runs moved out of it.

        A two-phase-commit transaction pre-committed for an id up to it may still be listed
        by a retained checkpoint or a savepoint; one above it never completed anywhere.
        """
        done = [n for n, p in self._dirs() if (p / METADATA).exists()]
        return max([0, *done,
                    *(int(n) for r in self.runs() for n in r.get("savepoints", []))])

    # ------------------------------------------------------------------ runs
    @property
    def runs_dir(self) -> Path:
        """``<job_dir>/_runs``: one record per run (see the module docstring)."""
        return self.job_dir / "_runs"

    def record_run(self, run_id: str, first_checkpoint_id: int,
                   restored_from: CompletedCheckpoint | None, keep: int = 20) -> None:
        """Record, durably, that run ``run_id`` starts here (before its first checkpoint).

        The record is signed like checkpoint metadata when ``REACTIVE_CHECKPOINT_KEY`` is
        set.

        Args:
            run_id: the run's id (letters, digits, '_' and '-').
            first_checkpoint_id: the first id the run may use (reserved: later runs start
                above it even if this one never completes a checkpoint).
            restored_from: what the run restored, None for a start from the beginning.
            keep: how many run records to keep (the oldest are removed).

        Raises:
            UnsafePathError: if ``_runs`` is a symbolic link.
        """
        check_id(run_id, "run id")
        body = {
            "run_id": run_id,
            "first_checkpoint_id": first_checkpoint_id,
            "restored_from": None if restored_from is None else {
                "path": str(restored_from.path.resolve()),
                "checkpoint_id": restored_from.checkpoint_id,
            },
        }
        self._write_run(body)
        for f, _ in self._run_files()[:-keep]:
            # the file listed, not a name from its content: a record is input
            unlink_under(self.runs_dir, f.name, "run records")

    def reserve_savepoint(self, run_id: str, checkpoint_id: int) -> None:
        """Record in run ``run_id``'s record that savepoint ``checkpoint_id`` leaves the
        directory (it is moved elsewhere): its id stays used, so no later run repeats it,
        and the pending transactions it lists stay (see :meth:`highest_completed_id`).

        Raises:
            CheckpointError: if the run has no record.
            UnsafePathError: if ``_runs`` is a symbolic link.
            OSError: if the record cannot be written.
        """
        check_id(run_id, "run id")
        for _, rec in self._run_files():
            if rec["run_id"] == run_id:
                body = {k: v for k, v in rec.items() if k != "hmac-sha256"}
                body["savepoints"] = sorted({*body.get("savepoints", []), checkpoint_id})
                self._write_run(body)
                return
        raise CheckpointError(f"run {run_id} has no record in {self.runs_dir}: cannot reserve "
                              f"the id of savepoint {checkpoint_id} before it leaves the "
                              "directory")

    def _write_run(self, body: dict[str, Any]) -> None:
        check_real_dir(self.job_dir, "_runs")
        doc = dict(body)
        key = signing_key()
        if key is not None:
            doc["hmac-sha256"] = signature(key, body)
        write_atomic(self.runs_dir / f"{body['run_id']}.json", [json.dumps(doc).encode()])
        fsync_dir(self.runs_dir)

    def forget_run(self, run_id: str) -> None:
        """Remove a run's record (it failed before completing any checkpoint, so it
        committed nothing and a resume should continue the run before it)."""
        unlink_under(self.runs_dir, check_id(run_id, "run id") + ".json", "run records")

    def runs(self) -> list[dict[str, Any]]:
        """The run records, oldest first (by their first checkpoint id); unreadable ones, and
        with ``REACTIVE_CHECKPOINT_KEY`` set unsigned or forged ones, are skipped (with a
        warning)."""
        return [rec for _, rec in self._run_files()]

    def _run_files(self) -> list[tuple[Path, dict[str, Any]]]:
        runs_dir = self.runs_dir
        if not runs_dir.is_dir() or runs_dir.is_symlink():
            return []
        key = signing_key()
        out = []
        for f in runs_dir.glob("*.json"):
            try:
                rec = json.loads(f.read_text())
                int(rec["first_checkpoint_id"])
                for n in rec.get("savepoints", []):  # ids of savepoints moved out
                    int(n)
                if check_id(rec["run_id"], f"run record {f}") != f.stem:
                    raise UnsafePathError(f"run record {f} names run {rec['run_id']!r}, not "
                                          f"{f.stem!r}")
                if key is not None:
                    signed = rec.get("hmac-sha256")
                    body = {k: v for k, v in rec.items() if k != "hmac-sha256"}
                    if not isinstance(signed, str) or \
                            not hmac.compare_digest(signed, signature(key, body)):
                        raise UnsafePathError(
                            f"run record {f} is unsigned or fails its signature check under "
                            f"the key in {KEY_ENV}")
            except (OSError, ValueError, KeyError, TypeError, UnsafePathError) as exc:
                log.warning("ignoring run record %s: %s", f, exc)
                continue
            out.append((f, rec))
        return sorted(out, key=lambda p: int(p[1]["first_checkpoint_id"]))

    @staticmethod
    def load(path: str | Path, verify: bool = True) -> CompletedCheckpoint:
        """Load the completed checkpoint (or savepoint) at ``path``.

        Raises:
            RestoreError: if it is incomplete or not a checkpoint directory.
            CorruptCheckpointError: if ``verify`` and a file fails its checksum.
        """
        p = Path(path)
        metadata = read_metadata(p)
        chk = CompletedCheckpoint(metadata.checkpoint_id, p, metadata)
        if verify:
            CheckpointStorage.verify(chk)
        return chk

    @staticmethod
    def verify(chk: CompletedCheckpoint) -> None:
        """Check every file ``chk`` references (under its root, size, sha256).

        Raises:
            CorruptCheckpointError: naming the first file that fails.
        """
        for ref in chk.metadata.file_refs():
            verify_file(chk.job_dir, ref)

    def latest_restorable(self) -> CompletedCheckpoint | None:
        """The newest completed checkpoint whose files all pass their checksums.

        A corrupted checkpoint is reported (log warning) and the previous one is tried.
        """
        for chk in reversed(self.completed()):
            try:
                self.verify(chk)
            except CorruptCheckpointError as exc:
                log.warning("checkpoint %d is corrupted, trying the previous one: %s",
                            chk.checkpoint_id, exc)
                continue
            return chk
        return None

    def discard(self, checkpoint_id: int) -> None:
        """Remove the directory of an aborted (incomplete) checkpoint."""
        shutil.rmtree(self.checkpoint_dir(checkpoint_id), ignore_errors=True)
