"""The size and SHA-256 of part files: counted and hashed as they are written, or read back
from disk."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


class _HashingFile:
    """A binary file opened for writing that counts and hashes (SHA-256) what goes through
    it, so pre-commit knows the part file's size and digest without reading it back.

    Handed to pyarrow's ``ParquetWriter`` as a Python file object (it calls ``write``,
    ``tell``, ``flush`` and ``closed``); the jsonl path writes through it directly.

    Args:
        path: the file to create (truncated if it exists).
    """

    def __init__(self, path: Path) -> None:
        self.raw = open(path, "wb")  # noqa: SIM115 - closed by close()
        self.sha256 = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Write ``data`` (bytes-like); return the number of bytes written."""
        self.sha256.update(data)
        n = self.raw.write(data)
        self.size += n
        return n

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self.raw.flush()

    def fileno(self) -> int:
        return self.raw.fileno()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readable(self) -> bool:
        return False

    @property
    def closed(self) -> bool:
        return bool(self.raw.closed)

    def close(self) -> None:
        self.raw.close()


def _file_digest(path: Path) -> tuple[int, str]:
    """The size (bytes) and SHA-256 (hex) of the file ``path``.

    Raises:
        OSError: if it cannot be read (FileNotFoundError when it does not exist).
    """
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        return size, hashlib.file_digest(f, "sha256").hexdigest()
