"""The checkpoint metadata format: the ``_metadata`` manifest of a completed checkpoint.

A checkpoint is *completed* exactly when its ``_metadata`` exists: it is written last,
atomically (temp file, fsync, rename, fsync of the directory). The manifest is JSON,
``{"body": {...}, "sha256": ..., "hmac-sha256": ...}``; the body names the job, the run
(``run_id``), the checkpoint id and kind, the max parallelism, whether completing it
committed side effects (``commits``), and per operator and subtask the state handles: every
file with its path (relative to the checkpoint's root), size and sha256.

Trust: checkpoint files hold pickled values, so restoring runs whatever a crafted file says.
When the environment variable ``REACTIVE_CHECKPOINT_KEY`` is set, every ``_metadata`` is
signed with HMAC-SHA256 under that key, and reading it checks the signature before any other
file is read; the body holds the sha256 of every file, so no unsigned byte is ever
unpickled. Every path read from metadata must stay under its checkpoint's root. The body
is read into, and written from, the types of :mod:`.contract`.
(Flink: ``Checkpoints.storeCheckpointMetadata`` / ``CompletedCheckpoint``.)
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import CorruptCheckpointError, RestoreError
from .contract import FORMAT_VERSION, CheckpointMetadata
from .durable_files import fsync_dir, write_atomic
from .paths import UnsafePathError, resolve_under

__all__ = [
    "FORMAT_VERSION",
    "KEY_ENV",
    "METADATA",
    "CompletedCheckpoint",
    "read_metadata",
    "signature",
    "signing_key",
    "write_metadata",
]

METADATA = "_metadata"
KEY_ENV = "REACTIVE_CHECKPOINT_KEY"
"""Environment variable holding the key that signs and checks checkpoint metadata."""


def signing_key() -> bytes | None:
    """The key in ``REACTIVE_CHECKPOINT_KEY`` (None when unset): what signs and checks the
    metadata and the run records of checkpoint storage."""
    value = os.environ.get(KEY_ENV)
    return value.encode() if value else None


@dataclass(frozen=True)
class CompletedCheckpoint:
    """A completed checkpoint on disk.

    Attributes:
        checkpoint_id: its id.
        path: its directory (``.../chk-<n>``).
        metadata: its ``_metadata``.
    """

    checkpoint_id: int
    path: Path
    metadata: CheckpointMetadata

    @property
    def job_dir(self) -> Path:
        """The directory that handle paths are relative to: the job directory (the parent of
        ``chk-<n>``) for a checkpoint, the directory itself for a self-contained savepoint."""
        return self.path if self.metadata.self_contained else self.path.parent

    @property
    def is_savepoint(self) -> bool:
        """True for a savepoint (kind ``savepoint``)."""
        return self.metadata.is_savepoint


def _checksum(body: dict[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(canonical).hexdigest()


def signature(key: bytes, body: dict[str, Any]) -> str:
    """HMAC-SHA256 (hex) of ``body`` in canonical JSON under ``key``."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key, canonical, hashlib.sha256).hexdigest()


def read_metadata(checkpoint_dir: Path) -> CheckpointMetadata:
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
    try:
        # opened without an exists() check first: retention may remove a subsumed
        # checkpoint between the two calls, and the open is the one answer that counts
        text = path.read_text()
    except FileNotFoundError:
        raise RestoreError(
            f"{checkpoint_dir} has no {METADATA}: it is not a completed checkpoint"
        ) from None
    try:
        doc = json.loads(text)
        body, checksum = doc["body"], doc["sha256"]
    except (ValueError, KeyError) as exc:
        raise CorruptCheckpointError(f"{path} is not valid checkpoint metadata: {exc}") from exc
    if not isinstance(body, dict) or _checksum(body) != checksum:
        raise CorruptCheckpointError(f"{path} fails its checksum")
    key = signing_key()
    if key is not None:
        signed = doc.get("hmac-sha256")
        if not isinstance(signed, str):
            raise CorruptCheckpointError(
                f"{path} is not signed, but {KEY_ENV} is set: only signed checkpoints are "
                f"restored (unset {KEY_ENV} to trust unsigned ones)")
        if not hmac.compare_digest(signed, signature(key, body)):
            raise CorruptCheckpointError(f"{path} fails its signature check under the key in "
                                         f"{KEY_ENV}: it was altered or signed with another key")
    if body.get("format") != FORMAT_VERSION:
        raise RestoreError(f"{path} has format {body.get('format')}, expected {FORMAT_VERSION} "
                           "(written by another version of reactive)")
    try:
        metadata = CheckpointMetadata.from_json(body)
    except CorruptCheckpointError as exc:
        raise CorruptCheckpointError(f"{path}: {exc}") from exc
    root = checkpoint_dir if metadata.self_contained else checkpoint_dir.parent
    for ref in metadata.file_refs():
        # fail on a path that leaves the checkpoint before anyone joins it to a directory
        resolve_under(root, ref.path, f"{path}")
    for ref in metadata.shared_refs():
        # retention deletes these when no retained checkpoint lists them any more: each
        # must name a file under shared/ of this job directory, and nothing else
        if not ref.path.startswith("shared/"):
            raise UnsafePathError(f"{path} lists the shared file {ref.path!r}, which is not "
                                  "under shared/ of its job directory: refusing to use it")
        resolve_under(root, ref.path, f"{path}")
    return metadata


def write_metadata(directory: Path, metadata: CheckpointMetadata) -> None:
    """Write ``metadata`` as ``directory/_metadata`` atomically (checksummed, signed when a
    key is set): the step that completes a checkpoint."""
    body = metadata.to_json()
    doc: dict[str, Any] = {"body": body, "sha256": _checksum(body)}
    key = signing_key()
    if key is not None:
        doc["hmac-sha256"] = signature(key, body)
    write_atomic(directory / METADATA, [json.dumps(doc, indent=1).encode()])
    fsync_dir(directory)
