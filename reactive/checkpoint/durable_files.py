"""Durable, checksummed files for checkpoints: atomic writes (temp file, fsync, rename),
directory fsync, sha256 verification (paths resolved under their root by :mod:`.paths`)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import CorruptCheckpointError
from .paths import resolve_under

if TYPE_CHECKING:
    from .contract import FileRef

__all__ = ["create_dirs", "fsync_dir", "fsync_tree", "make_dirs", "resolve_under", "sync_created",
           "verify_file", "write_atomic"]

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


def make_dirs(path: Path) -> None:
    """Create ``path`` and its missing parents, each made durable in its parent (an fsync of
    the parent after each ``mkdir``): a directory that a completed checkpoint, a savepoint or
    committed output lives in must not vanish in a power loss."""
    sync_created(create_dirs(path))


def create_dirs(path: Path) -> list[Path]:
    """Create ``path`` and its missing parents without making them durable; return the
    directories this call created, outermost first, for :func:`sync_created` (a caller on
    the event loop's thread creates now and syncs later, in a worker thread)."""
    missing = []
    d = path
    while not d.is_dir():
        missing.append(d)
        if d.parent == d:
            break
        d = d.parent
    created = []
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:
            if not d.is_dir():
                raise
            continue
        created.append(d)
    return created


def sync_created(created: list[Path]) -> None:
    """Make directories :func:`create_dirs` created durable: fsync the parent of each."""
    for d in created:
        fsync_dir(d.parent)


def fsync_tree(root: Path) -> None:
    """fsync every file and directory under ``root`` (and ``root``): what a copy made
    before it is renamed into place or referenced by metadata."""
    for top, _subdirs, files in os.walk(root, followlinks=False):
        for name in files:
            fd = os.open(os.path.join(top, name), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(top))


def write_atomic(path: Path, chunks: Iterable[bytes]) -> tuple[int, str]:
    """Write ``chunks`` to ``path`` atomically (temp file, fsync, rename).

    Returns:
        (size in bytes, sha256 hex digest) of the written file.
    """
    make_dirs(path.parent)
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


def verify_file(job_dir: Path, ref: FileRef) -> None:
    """Check that a referenced file lies under ``job_dir`` and exists with the recorded size
    and sha256.

    Raises:
        CorruptCheckpointError: naming the file and what differs.
    """
    path = resolve_under(job_dir, ref.path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise CorruptCheckpointError(f"checkpoint file {path} is missing") from None
    if size != ref.size:
        raise CorruptCheckpointError(
            f"checkpoint file {path} has {size} bytes, the metadata says {ref.size}"
        )
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    if h.hexdigest() != ref.sha256:
        raise CorruptCheckpointError(f"checkpoint file {path} fails its sha256 checksum")
