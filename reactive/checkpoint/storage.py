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
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import CorruptCheckpointError, RestoreError
from .files import fsync_dir, verify_file, write_atomic

__all__ = ["CheckpointStorage", "CompletedCheckpoint", "iter_file_refs", "read_metadata"]

log = logging.getLogger("reactive.checkpoint")

METADATA = "_metadata"
FORMAT_VERSION = 1
_CHK = re.compile(r"^chk-(\d+)$")


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
        """The job directory that handle paths are relative to."""
        return self.path.parent


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


def read_metadata(checkpoint_dir: Path) -> dict[str, Any]:
    """Read and check a checkpoint's ``_metadata``.

    Raises:
        RestoreError: if there is no metadata (an incomplete checkpoint).
        CorruptCheckpointError: if it does not parse or its checksum does not match.
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
    if _checksum(body) != checksum:
        raise CorruptCheckpointError(f"{path} fails its checksum")
    if body.get("format") != FORMAT_VERSION:
        raise RestoreError(f"{path} has format {body.get('format')}, expected {FORMAT_VERSION}")
    return body  # type: ignore[no-any-return]


class CheckpointStorage:
    """The checkpoints of one job under ``<directory>/<job>``.

    Args:
        directory: the storage root (``CheckpointConfig.directory``).
        job_name: the dataflow's name.
    """

    def __init__(self, directory: str | Path, job_name: str) -> None:
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
        body = {"format": FORMAT_VERSION, **body}
        doc = {"body": body, "sha256": _checksum(body)}
        chk = self.checkpoint_dir(checkpoint_id)
        write_atomic(chk / METADATA, [json.dumps(doc, indent=1).encode()])
        fsync_dir(chk)
        return chk

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

    def latest_id(self) -> int:
        """Highest checkpoint id present on disk, completed or not (0 when none)."""
        dirs = self._dirs()
        return dirs[-1][0] if dirs else 0

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
            for ref in iter_file_refs(body):
                verify_file(chk.job_dir, ref)
        return chk

    def latest_restorable(self) -> CompletedCheckpoint | None:
        """The newest completed checkpoint whose files all pass their checksums.

        A corrupted checkpoint is reported (log warning) and the previous one is tried.
        """
        for chk in reversed(self.completed()):
            try:
                for ref in iter_file_refs(chk.metadata):
                    verify_file(chk.job_dir, ref)
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
