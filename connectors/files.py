"""File sources: lines of text files, with the byte offset as the position."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reactive.sources import Source, SourceReader

__all__ = ["LineFileSource"]


class LineFileSource(Source):
    """Lines of a file, or of every file of a directory (sorted by name), as ``str``
    without the line ending (UTF-8).

    Each file is a split; instance ``i`` of ``p`` reads files ``i, i+p, ...``. The position
    is ``[path, byte offset]`` per split, so a restore resumes at the next unread line.

    Args:
        path: a file or a directory.
        with_offsets: emit ``(byte_offset, line)`` instead of ``line`` (for error reports
            and dead-letter outputs that must name where a record came from).
        read_size: bytes read per batch at most (a hint: whole lines are read).

    Raises:
        FileNotFoundError: if ``path`` does not exist.
    """

    def __init__(self, path: str | Path, with_offsets: bool = False,
                 read_size: int = 1 << 16) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise FileNotFoundError(f"line-file source: {self.path} does not exist")
        self.with_offsets = with_offsets
        self.read_size = read_size

    def splits(self) -> list[str]:
        """The files to read, sorted."""
        if self.path.is_dir():
            return sorted(str(p) for p in self.path.iterdir() if p.is_file()
                          and not p.name.startswith("."))
        return [str(self.path)]

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        mine = [[f, 0] for f in self.splits()[subtask::parallelism]]
        return _LineReader(mine, self.with_offsets, self.read_size)


class _LineReader(SourceReader):
    def __init__(self, splits: list[list[Any]], with_offsets: bool, read_size: int) -> None:
        self.splits = splits  # [path, offset]; offset -1 = finished
        self.with_offsets = with_offsets
        self.read_size = read_size
        self._current = 0
        self._file: Any = None

    async def read_batch(self, max_records: int) -> list[Any] | None:
        while self._current < len(self.splits):
            split = self.splits[self._current]
            if split[1] < 0:
                self._current += 1
                continue
            if self._file is None:
                self._file = open(split[0], "rb")  # noqa: SIM115 - closed at end or close()
                self._file.seek(split[1])
            lines = self._file.readlines(self.read_size)
            if not lines:
                self._file.close()
                self._file = None
                split[1] = -1
                self._current += 1
                continue
            offset = split[1]
            out: list[Any] = []
            if self.with_offsets:
                for raw in lines:
                    out.append((offset, raw.rstrip(b"\r\n").decode("utf-8", "replace")))
                    offset += len(raw)
            else:
                out = [raw.rstrip(b"\r\n").decode("utf-8", "replace") for raw in lines]
                offset += sum(map(len, lines))
            split[1] = offset
            return out
        return None

    def snapshot_state(self) -> list[Any]:
        return [list(s) for s in self.splits]

    def restore_state(self, entries: list[Any]) -> None:
        self.close()
        self.splits = [list(e) for e in entries]
        self._current = 0

    def describe_position(self) -> Any:
        if self._current < len(self.splits):
            path, offset = self.splits[self._current]
            return f"{path} byte {offset}"
        return None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
