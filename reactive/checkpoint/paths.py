"""Resolving names read from checkpoint storage under their root, and deleting without
following symbolic links.

Everything the runtime reads from a checkpoint directory is input: ``_metadata`` handles,
run records, the entries of ``shared/``. Anyone who can write into the directory (a bucket
mounted on several hosts, a shared volume) could plant a name like ``../../x``, an absolute
path, or a symbolic link, and a deletion, read or write that joined it blindly would then
act outside the directory. This module is the one place that turns such a name into a path:
it refuses any name that leaves its root, and deletes only through real directories (a
symbolic link is removed itself, its target never touched), with ``O_NOFOLLOW`` directory
descriptors so a link swapped in meanwhile is not followed either.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from ..errors import CorruptCheckpointError

__all__ = ["UnsafePathError", "check_id", "check_name", "check_real_dir", "resolve_under",
           "unlink_under"]

_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class UnsafePathError(CorruptCheckpointError):
    """A name read from checkpoint storage (metadata, a run record, a snapshot handle) or a
    directory of it would make the runtime act outside its root: a ``..`` or absolute path,
    a separator in a single name, or a symbolic link where a directory belongs. The runtime
    refuses it, touching nothing; the message names the name, where it was read, and the
    root."""


def check_name(name: Any, what: str, pattern: re.Pattern[str] | None = None) -> str:
    """Check that ``name`` is a single path component (a file name, a run id).

    Args:
        name: the name as read.
        what: where it was read, for the message ("run record r1.json", ...).
        pattern: a stricter format the name must match (default: any single component).

    Returns:
        ``name``.

    Raises:
        UnsafePathError: for a non-string, empty, ``.``/``..`` name, one with a separator or
            NUL, or one that does not match ``pattern``.
    """
    if not isinstance(name, str) or not name or name in (".", "..") \
            or any(c in name for c in "/\\\0") \
            or (pattern is not None and not pattern.match(name)):
        raise UnsafePathError(f"{what} names {name!r}, which is not a plain file name (no "
                              "separators, not '.' or '..'): refusing to use it")
    return name


def check_id(value: Any, what: str) -> str:
    """Check a run id read from storage: 1 to 64 letters, digits, '_' or '-'.

    Raises:
        UnsafePathError: naming ``what`` and the value.
    """
    return check_name(value, what, _ID)


def resolve_under(root: Path, relative: Any, what: str = "checkpoint metadata") -> Path:
    """Join a relative path read from storage to its root, refusing any escape.

    Every path a handle holds is relative to its root (the job directory, or a
    self-contained savepoint's own directory) and must stay under it.

    Args:
        root: the directory the path is relative to.
        relative: the path as stored (a POSIX-style relative ``str``).
        what: where it was read, for the message.

    Returns:
        ``root / relative``.

    Raises:
        UnsafePathError: when ``relative`` is not a relative path string, or resolves
            (following ``..`` and symbolic links) outside ``root``.
    """
    if not isinstance(relative, str) or not relative or relative.startswith(("/", "\\")) \
            or "\0" in relative or ".." in relative.replace("\\", "/").split("/"):
        raise UnsafePathError(f"{what} names the path {relative!r}, which may lead outside "
                              f"{root}: only relative paths without '..' are allowed")
    path = root / relative
    if not path.resolve().is_relative_to(root.resolve()):
        raise UnsafePathError(f"{what} names the path {relative!r}, which leads outside "
                              f"{root} (through a symbolic link): refusing to use it")
    return path


def check_real_dir(root: Path, relative: str) -> Path:
    """Check that ``root/relative`` is not a symbolic link (nor under one): a directory the
    runtime lists, writes into or deletes from must be the directory itself.

    Returns:
        ``root / relative`` (which may not exist).

    Raises:
        UnsafePathError: naming the link and where it points.
    """
    path = root
    for part in Path(relative).parts:
        path = path / part
        if path.is_symlink():
            raise UnsafePathError(
                f"{path} is a symbolic link (to {os.readlink(path)}): the runtime never "
                f"writes or deletes through a link under {root}; replace it with a directory")
    return path


def unlink_under(root: Path, relative: str, what: str = "checkpoint storage") -> bool:
    """Delete the file ``root/relative`` without following any symbolic link under ``root``.

    Each directory between ``root`` and the file is opened with ``O_NOFOLLOW``: a link
    among them is refused; a link as the last component is removed itself.

    Args:
        root: the directory ``relative`` is relative to (opened as given).
        relative: a relative path without ``..`` (as :func:`resolve_under` checks).
        what: where the name was read, for the message.

    Returns:
        True if the file was deleted, False if it did not exist.

    Raises:
        UnsafePathError: for a path that leaves ``root`` lexically, or goes through a
            symbolic link.
        OSError: when the deletion itself fails.
    """
    if not isinstance(relative, str) or not relative or relative.startswith(("/", "\\")) \
            or "\0" in relative:
        raise UnsafePathError(f"{what} names the path {relative!r} for deletion: only "
                              f"relative paths under {root} are deleted")
    parts = relative.replace("\\", "/").split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise UnsafePathError(f"{what} names the path {relative!r} for deletion: only "
                              f"plain relative paths under {root} are deleted")
    flags = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(root, flags)
    except FileNotFoundError:
        return False
    try:
        for i, part in enumerate(parts[:-1]):
            try:
                nxt = os.open(part, flags | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                return False
            except OSError as exc:
                if os.path.islink(root.joinpath(*parts[:i + 1])):
                    raise UnsafePathError(
                        f"{what}: refusing to delete {relative!r}: "
                        f"{root.joinpath(*parts[:i + 1])} is a symbolic link, and the runtime "
                        f"never deletes through a link under {root}") from exc
                raise
            os.close(fd)
            fd = nxt
        try:
            os.unlink(parts[-1], dir_fd=fd)
        except FileNotFoundError:
            return False
        return True
    finally:
        os.close(fd)
