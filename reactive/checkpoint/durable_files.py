"""Durable, checksummed files for checkpoints: atomic writes (temp file, fsync, rename),
directory fsync, sha256 verification (paths resolved under their root by :mod:`.paths`)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import CorruptCheckpointError
from .paths import resolve_under

__all__ = ["fsync_dir", "resolve_under", "verify_file", "write_atomic"]

_CHUNK = 1 << 20


def fsync_dir(path: Path) -> None:
    """fsync a directory so a rename in it is durable (no-op where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: Path, chunks: Iterable[bytes]) -> tuple[int, str]:
    """Write ``chunks`` to ``path`` atomically (temp file, fsync, rename).

    Returns:
        (size in bytes, sha256 hex digest) of the written file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name("." + path.name + ".tmp")
    h = hashlib.sha256()
    size = 0
    with open(tmp, "wb") as f:
        for chunk in chunks:
            f.write(chunk)
            h.update(chunk)
            size += len(chunk)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return size, h.hexdigest()


def verify_file(job_dir: Path, ref: dict[str, Any]) -> None:
    """Check that a referenced file lies under ``job_dir`` and exists with the recorded size
    and sha256.

    Raises:
        CorruptCheckpointError: naming the file and what differs.
    """
    path = resolve_under(job_dir, ref.get("path"))
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise CorruptCheckpointError(f"checkpoint file {path} is missing") from None
    if size != ref["size"]:
        raise CorruptCheckpointError(
            f"checkpoint file {path} has {size} bytes, the metadata says {ref['size']}"
        )
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    if h.hexdigest() != ref["sha256"]:
        raise CorruptCheckpointError(f"checkpoint file {path} fails its sha256 checksum")
