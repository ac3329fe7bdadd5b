"""Checkpoint storage on the local filesystem (DESIGN.md, "Checkpoint storage layout").

```
<dir>/<job>/chk-<n>/_metadata   the completed checkpoint's manifest (JSON, checksummed)
<dir>/<job>/chk-<n>/...         files only checkpoint n uses
<dir>/<job>/shared/...          files incremental checkpoints share
```

A checkpoint is *completed* exactly when its ``_metadata`` exists: it is written last,
atomically (temp file, fsync, rename, fsync of the directory). Directories without it are
incomplete and are ignored and removed. Shared files are reference counted from the
metadata of the retained checkpoints, so the count survives restarts.

Every checkpoint names the *run* that wrote it (``run_id``: one per ``Dataflow.start``, as
Flink gives each submission a job id), so a run's failover restores only its own lineage.
Each run also records where it started, before it takes any checkpoint:

```
<dir>/<job>/_runs/<run_id>.json  {"run_id", "first_checkpoint_id", "restored_from"}
```

so that resuming continues the most recent run even when it was killed before its first
checkpoint (it started from a savepoint elsewhere, or from the beginning of the input).

Trust: checkpoint files hold pickled values, so restoring runs whatever a crafted file says.
When the environment variable ``REACTIVE_CHECKPOINT_KEY`` is set, every ``_metadata`` is
signed with HMAC-SHA256 under that key, and a restore checks the signature before it reads
any other file; the metadata holds the sha256 of every file, so no unsigned byte is ever
unpickled. Every path read from metadata must stay under its checkpoint's root.

Savepoints (Flink's savepoints; thesis 4.2 for rescaling them) are *self-contained*: their
metadata says ``"self_contained": true``, they reference no shared file, and their handle
paths are relative to the savepoint directory itself (``uid-0.heap``, not
``chk-7/uid-0.heap``), so the directory can be moved or copied anywhere and still be passed
to ``restore_from``. Retention never deletes a checkpoint of kind ``savepoint``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, ConfigurationError, CorruptCheckpointError, RestoreError
from .files import fsync_dir, resolve_under, verify_file, write_atomic

__all__ = [
    "CheckpointStorage",
    "CompletedCheckpoint",
    "export_savepoint",
    "iter_file_refs",
    "move_savepoint",
    "read_metadata",
    "rebase_savepoint_paths",
    "validate_job_name",
]

log = logging.getLogger("reactive.checkpoint")

METADATA = "_metadata"
# 2: canonical key encoding (key groups and RocksDB keys of format 1 differ), run ids
FORMAT_VERSION = 2
_CHK = re.compile(r"^chk-(\d+)$")
KEY_ENV = "REACTIVE_CHECKPOINT_KEY"
"""Environment variable holding the key that signs and checks checkpoint metadata."""


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


def _signing_key() -> bytes | None:
    value = os.environ.get(KEY_ENV)
    return value.encode() if value else None


@dataclass(frozen=True)
class CompletedCheckpoint:
    """A completed checkpoint on disk.

    Attributes:
        checkpoint_id: its id.
        path: its directory (``.../chk-<n>``).
        metadata: the parsed ``_metadata``.
    """

    checkpoint_id: int
    path: Path
    metadata: dict[str, Any]

    @property
    def job_dir(self) -> Path:
        """The directory that handle paths are relative to: the job directory (the parent of
        ``chk-<n>``) for a checkpoint, the directory itself for a self-contained savepoint."""
        return self.path if self.metadata.get("self_contained") else self.path.parent

    @property
    def is_savepoint(self) -> bool:
        """True for a savepoint (kind ``savepoint``)."""
        return self.metadata.get("kind") == "savepoint"


def _checksum(body: dict[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(canonical).hexdigest()


def iter_file_refs(metadata: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Yield every ``{"path", "size", "sha256"}`` a checkpoint's metadata references."""
    for op in metadata.get("operators", {}).values():
        for sub in op.get("subtasks", {}).values():
            for key in ("keyed_state", "operator_state"):
                handle = sub.get(key)
                if handle:
                    yield from handle.get("files", [])


def _shared_paths(metadata: dict[str, Any]) -> set[str]:
    out: set[str] = set()
    for op in metadata.get("operators", {}).values():
        for sub in op.get("subtasks", {}).values():
            handle = sub.get("keyed_state")
            if handle:
                out.update(ref["path"] for ref in handle.get("shared", []))
    return out


def _rebase(value: Any, mapping: dict[str, str]) -> Any:
    if isinstance(value, str):
        return mapping.get(value, value)
    if isinstance(value, list):
        return [_rebase(v, mapping) for v in value]
    if isinstance(value, dict):
        return {k: _rebase(v, mapping) for k, v in value.items()}
    return value


def rebase_savepoint_paths(operators: dict[str, Any], checkpoint_dir_name: str
                           ) -> dict[str, Any]:
    """Make the handles of a savepoint relative to the savepoint directory.

    Tasks write every snapshot file under ``<job_dir>/chk-<n>/`` and record paths relative to
    the job directory; a savepoint must not depend on where it lives, so each path
    ``chk-<n>/x`` becomes ``x``. Every path a handle holds is listed in its ``files`` (the
    backend protocol, ``reactive.state.backend``); any other string equal to such a path
    (e.g. RocksDB's ``db_files``) is rewritten the same way.

    Args:
        operators: the ``operators`` section of the metadata (not modified).
        checkpoint_dir_name: ``chk-<n>``.

    Returns:
        a rewritten copy of ``operators``.

    Raises:
        CheckpointError: if a handle references a file outside ``chk-<n>`` (a shared file
            of an incremental snapshot: the backend ignored ``SnapshotContext.savepoint``).
    """
    prefix = checkpoint_dir_name + "/"
    mapping: dict[str, str] = {}
    for uid, op in operators.items():
        for sub in op.get("subtasks", {}).values():
            for key in ("keyed_state", "operator_state"):
                handle = sub.get(key) or {}
                refs = [*handle.get("files", []), *handle.get("shared", []),
                        *handle.get("shared_reused", [])]
                for ref in refs:
                    path = ref["path"]
                    if not path.startswith(prefix):
                        raise CheckpointError(
                            f"savepoint state of operator {uid!r} ({handle.get('backend', key)})"
                            f" references {path}, outside {checkpoint_dir_name}: a savepoint "
                            "must be self-contained (does the backend honour "
                            "SnapshotContext.savepoint?)"
                        )
                    mapping[path] = path[len(prefix):]
    return _rebase(operators, mapping)  # type: ignore[no-any-return]


def _signature(key: bytes, body: dict[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key, canonical, hashlib.sha256).hexdigest()


def read_metadata(checkpoint_dir: Path) -> dict[str, Any]:
    """Read and check a checkpoint's ``_metadata``.

    With ``REACTIVE_CHECKPOINT_KEY`` set, the metadata must carry a valid HMAC-SHA256
    signature under that key (checked here, before any state file is read).

    Raises:
        RestoreError: if there is no metadata (an incomplete checkpoint), or it was written
            by another format version.
        CorruptCheckpointError: if it does not parse, its checksum does not match, or (with
            a key set) it is unsigned or its signature does not match.
    """
    path = checkpoint_dir / METADATA
    if not path.exists():
        raise RestoreError(
            f"{checkpoint_dir} has no {METADATA}: it is not a completed checkpoint"
        )
    try:
        doc = json.loads(path.read_text())
        body, checksum = doc["body"], doc["sha256"]
    except (ValueError, KeyError) as exc:
        raise CorruptCheckpointError(f"{path} is not valid checkpoint metadata: {exc}") from exc
    if not isinstance(body, dict) or _checksum(body) != checksum:
        raise CorruptCheckpointError(f"{path} fails its checksum")
    key = _signing_key()
    if key is not None:
        signature = doc.get("hmac-sha256")
        if not isinstance(signature, str):
            raise CorruptCheckpointError(
                f"{path} is not signed, but {KEY_ENV} is set: only signed checkpoints are "
                f"restored (unset {KEY_ENV} to trust unsigned ones)")
        if not hmac.compare_digest(signature, _signature(key, body)):
            raise CorruptCheckpointError(f"{path} fails its signature check under the key in "
                                         f"{KEY_ENV}: it was altered or signed with another key")
    if body.get("format") != FORMAT_VERSION:
        raise RestoreError(f"{path} has format {body.get('format')}, expected {FORMAT_VERSION} "
                           "(written by another version of reactive)")
    root = checkpoint_dir if body.get("self_contained") else checkpoint_dir.parent
    for ref in iter_file_refs(body):
        # fail on a path that leaves the checkpoint before anyone joins it to a directory
        resolve_under(root, ref.get("path"))
    return body


def move_savepoint(savepoint: CompletedCheckpoint, dest: str | Path) -> CompletedCheckpoint:
    """Move a completed self-contained savepoint to ``dest`` (the new savepoint directory).

    A rename when ``dest`` is on the same filesystem (atomic); else a copy, verified against
    the metadata's checksums, then the removal of the original. Nothing inside the directory
    changes: its paths are relative to itself.

    Args:
        savepoint: a savepoint whose metadata has ``self_contained``.
        dest: a directory that does not exist, or an empty one.

    Returns:
        the savepoint at its new place.

    Raises:
        CheckpointError: if it is not self-contained or ``dest`` is not empty.
        OSError: if moving fails (the original stays).
    """
    if not savepoint.metadata.get("self_contained"):
        raise CheckpointError(f"{savepoint.path} is not a self-contained savepoint")
    target = Path(dest)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise CheckpointError(f"savepoint target {target} exists and is not an empty directory")
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(savepoint.path, target)
    except OSError:  # another filesystem (EXDEV) or an existing empty dir on some systems
        if target.exists():
            target.rmdir()
        tmp = target.with_name(f".{target.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(savepoint.path, tmp)
        for ref in iter_file_refs(savepoint.metadata):
            verify_file(tmp, ref)
        os.replace(tmp, target)
        shutil.rmtree(savepoint.path, ignore_errors=True)
    fsync_dir(target.parent)
    return CompletedCheckpoint(savepoint.checkpoint_id, target, savepoint.metadata)


def export_savepoint(checkpoint: CompletedCheckpoint, dest: str | Path) -> CompletedCheckpoint:
    """Copy a completed checkpoint (incremental or not) into a self-contained savepoint.

    Every referenced file, shared ones included, is copied under ``dest`` (``chk-<n>/x``
    becomes ``x``, ``shared/...`` stays ``shared/...``) and verified; the handles then list
    no shared file, and the metadata gets kind ``savepoint`` and ``self_contained``. Used by
    ``reactive savepoint`` to turn the latest checkpoint of a stopped job into a savepoint.

    Args:
        checkpoint: the completed checkpoint or savepoint to copy.
        dest: a directory that does not exist, or an empty one.

    Returns:
        the savepoint.

    Raises:
        CheckpointError: if ``dest`` is not empty.
        CorruptCheckpointError: if a file is missing or fails its checksum.
    """
    target = Path(dest)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise CheckpointError(f"savepoint target {target} exists and is not an empty directory")
    prefix = checkpoint.path.relative_to(checkpoint.job_dir).as_posix() + "/" \
        if not checkpoint.metadata.get("self_contained") else ""
    mapping: dict[str, str] = {}
    for ref in iter_file_refs(checkpoint.metadata):
        verify_file(checkpoint.job_dir, ref)
        old = ref["path"]
        new = old[len(prefix):] if prefix and old.startswith(prefix) else old
        mapping[old] = new
        dest_file = resolve_under(target, new)
        dest_file.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(resolve_under(checkpoint.job_dir, old), dest_file)
    body = dict(_rebase(checkpoint.metadata, mapping))
    for op in body.get("operators", {}).values():
        for sub in op.get("subtasks", {}).values():
            handle = sub.get("keyed_state")
            if handle:
                # copies now, owned by the savepoint alone
                handle["shared"] = []
                handle["shared_reused"] = []
    body["kind"] = "savepoint"
    body["self_contained"] = True
    body.pop("format", None)
    _write_metadata(target, body)
    return CheckpointStorage.load(target)


def _write_metadata(directory: Path, body: dict[str, Any]) -> None:
    body = {"format": FORMAT_VERSION, **body}
    doc = {"body": body, "sha256": _checksum(body)}
    key = _signing_key()
    if key is not None:
        doc["hmac-sha256"] = _signature(key, body)
    write_atomic(directory / METADATA, [json.dumps(doc, indent=1).encode()])
    fsync_dir(directory)


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

    def write_metadata(self, checkpoint_id: int, body: dict[str, Any]) -> Path:
        """Complete checkpoint ``checkpoint_id`` by writing its metadata atomically.

        Returns:
            the checkpoint directory.
        """
        chk = self.checkpoint_dir(checkpoint_id)
        _write_metadata(chk, body)
        return chk

    def checkpoint_dirs(self) -> list[tuple[int, Path]]:
        """Every ``chk-<n>`` directory, completed or not, as ``(n, path)``, oldest first."""
        return self._dirs()

    def _dirs(self) -> list[tuple[int, Path]]:
        if not self.job_dir.is_dir():
            return []
        out = []
        for p in self.job_dir.iterdir():
            m = _CHK.match(p.name)
            if m and p.is_dir():
                out.append((int(m.group(1)), p))
        return sorted(out)

    def completed(self) -> list[CompletedCheckpoint]:
        """Completed checkpoints, oldest first (unreadable metadata is skipped, with a log)."""
        out = []
        for n, p in self._dirs():
            if not (p / METADATA).exists():
                continue
            try:
                out.append(CompletedCheckpoint(n, p, read_metadata(p)))
            except RestoreError as exc:
                log.warning("ignoring checkpoint %s: %s", p, exc)
        return out

    def latest_id(self, include_runs: bool = True) -> int:
        """Highest checkpoint id used in the directory (0 when none): of every ``chk-<n>``,
        completed or not, and (``include_runs``) of the first ids runs reserved when they
        started."""
        dirs = self._dirs()
        used = dirs[-1][0] if dirs else 0
        if not include_runs:
            return used
        return max([used, *(int(r["first_checkpoint_id"]) for r in self.runs())])

    # ------------------------------------------------------------------ runs
    @property
    def runs_dir(self) -> Path:
        """``<job_dir>/_runs``: one record per run (see the module docstring)."""
        return self.job_dir / "_runs"

    def record_run(self, run_id: str, first_checkpoint_id: int,
                   restored_from: CompletedCheckpoint | None, keep: int = 20) -> None:
        """Record, durably, that run ``run_id`` starts here (before its first checkpoint).

        Args:
            run_id: the run's id.
            first_checkpoint_id: the first id the run may use (reserved: later runs start
                above it even if this one never completes a checkpoint).
            restored_from: what the run restored, None for a start from the beginning.
            keep: how many run records to keep (the oldest are removed).
        """
        body = {
            "run_id": run_id,
            "first_checkpoint_id": first_checkpoint_id,
            "restored_from": None if restored_from is None else {
                "path": str(restored_from.path.resolve()),
                "checkpoint_id": restored_from.checkpoint_id,
            },
        }
        write_atomic(self.runs_dir / f"{run_id}.json", [json.dumps(body).encode()])
        fsync_dir(self.runs_dir)
        for old in self.runs()[:-keep]:
            (self.runs_dir / f"{old['run_id']}.json").unlink(missing_ok=True)

    def runs(self) -> list[dict[str, Any]]:
        """The run records, oldest first (by their first checkpoint id); unreadable ones are
        skipped."""
        if not self.runs_dir.is_dir():
            return []
        out = []
        for f in self.runs_dir.glob("*.json"):
            try:
                rec = json.loads(f.read_text())
                int(rec["first_checkpoint_id"])
            except (OSError, ValueError, KeyError, TypeError):
                log.warning("ignoring unreadable run record %s", f)
                continue
            out.append(rec)
        return sorted(out, key=lambda r: int(r["first_checkpoint_id"]))

    @staticmethod
    def load(path: str | Path, verify: bool = True) -> CompletedCheckpoint:
        """Load the completed checkpoint (or savepoint) at ``path``.

        Raises:
            RestoreError: if it is incomplete or not a checkpoint directory.
            CorruptCheckpointError: if ``verify`` and a file fails its checksum.
        """
        p = Path(path)
        body = read_metadata(p)
        chk = CompletedCheckpoint(int(body["checkpoint_id"]), p, body)
        if verify:
            CheckpointStorage.verify(chk)
        return chk

    @staticmethod
    def verify(chk: CompletedCheckpoint) -> None:
        """Check every file ``chk`` references (under its root, size, sha256).

        Raises:
            CorruptCheckpointError: naming the first file that fails.
        """
        for ref in iter_file_refs(chk.metadata):
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

    def apply_retention(self, retained: int, keep: set[int] | None = None) -> list[int]:
        """Keep the ``retained`` newest completed checkpoints (plus ``keep``, and savepoints);
        delete older ones, incomplete directories older than the newest completed one, and
        shared files no retained checkpoint references.

        Returns:
            ids of the removed checkpoints.
        """
        keep = keep or set()
        completed = self.completed()
        if not completed:
            return []
        kept_ids = {c.checkpoint_id for c in completed[-retained:]} | keep
        kept_ids |= {c.checkpoint_id for c in completed if c.metadata.get("kind") == "savepoint"}
        newest = completed[-1].checkpoint_id
        removed = []
        for n, p in self._dirs():
            # never touch a checkpoint newer than what this pass saw completed
            if n in kept_ids or n > newest:
                continue
            if (p / METADATA).exists() or n < newest:
                shutil.rmtree(p, ignore_errors=True)
                removed.append(n)
        self._collect_shared(kept_ids)
        return removed

    def _collect_shared(self, kept_ids: set[int]) -> None:
        """Delete shared files that no kept checkpoint references.

        Safe for checkpoints in flight when a backend (as ``backends.rocksdb`` does) creates
        its ``chk-<n>`` directory in the synchronous part, before writing under ``shared/``,
        and re-uses only shared files of completed checkpoints: while any ``chk-<n>`` lacks
        metadata nothing is collected, and retention runs on the event loop, between the
        synchronous parts.
        """
        if not self.shared_dir.is_dir():
            return
        referenced: set[str] = set()
        for chk in self.completed():
            if chk.checkpoint_id in kept_ids:
                referenced |= _shared_paths(chk.metadata)
        in_flight = {n for n, p in self._dirs() if not (p / METADATA).exists()}
        if in_flight:
            # A pending checkpoint may be about to reference files it did not upload itself;
            # only files older than every retained reference could be collected safely, so
            # wait for the next retention pass.
            return
        for f in self.shared_dir.rglob("*"):
            if f.is_file() and f.relative_to(self.job_dir).as_posix() not in referenced:
                f.unlink(missing_ok=True)
