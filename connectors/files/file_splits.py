"""Files as the splits of a file source: the files a path names, and the reader state both
file sources keep (per split ``[path, byte offset, ...]``, offset -1 once the file is done).

Shared by the line-file source and the CSV source: the split list *is* the checkpointed
position, so a restore (at any parallelism: every reader's list is operator state) resumes
each file at its byte offset.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reactive.sources import SourceReader

__all__ = ["FileSplitsReader", "files_of"]


def files_of(path: Path) -> list[str]:
    """The files ``path`` names, sorted: itself, or a directory's files (hidden files,
    those whose name starts with ``.``, are not read)."""
    if path.is_dir():
        return sorted(str(p) for p in path.iterdir() if p.is_file()
                      and not p.name.startswith("."))
    return [str(path)]


class FileSplitsReader(SourceReader):
    """A reader over a list of file splits; subclasses read the open file.

    Args:
        splits: ``[path, byte offset, ...]`` per file (extra fields are the subclass's, e.g.
            a line number); offset -1 marks a finished file.

    Attributes:
        splits: the split list, snapshotted as the reader's state.
    """

    def __init__(self, splits: list[list[Any]]) -> None:
        self.splits = splits
        self._current = 0  # index of the split being read
        self._file: Any = None

    def _next_split(self) -> list[Any] | None:
        """The split being read, skipping finished ones; None once every file is read."""
        while self._current < len(self.splits):
            split = self.splits[self._current]
            if split[1] >= 0:
                return split
            self._current += 1
        return None

    def _finish_split(self, split: list[Any]) -> None:
        """``split``'s file is read to its end: close it and mark the split finished."""
        self.close()
        split[1] = -1
        self._current += 1

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        return [list(s) for s in self.splits]

    def restore_state(self, entries: list[Any]) -> None:
        self.close()
        self.splits = [list(e) for e in entries]
        self._current = 0

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
