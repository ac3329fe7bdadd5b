"""The line-file source: the lines of a text file, or of every file of a directory, as
records, positioned by byte offset; lines that are not valid UTF-8 fail the job or become
:class:`InvalidLine` dead letters."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from reactive.errors import ConfigurationError
from reactive.sources import Source, SourceReader

from .file_splits import FileSplitsReader, files_of

__all__ = ["InvalidLine", "LineFileSource"]


@dataclass(frozen=True)
class InvalidLine:
    """A line that is not valid UTF-8, emitted in place of its record by a
    :class:`LineFileSource` with ``errors="dead_letter"`` (with or without ``with_offsets``:
    it carries its offset itself), so the pipeline can route it to its dead-letter output
    (``isinstance(record, InvalidLine)``) like any other bad input.

    Attributes:
        path: the file the line is in.
        offset: byte offset of the line's first byte in the file.
        raw: the line's bytes, without the line ending.
        reason: why it cannot be decoded (names the first bad byte's offset in the file).
    """

    path: str
    offset: int
    raw: bytes
    reason: str


# records of the pipeline (state, buffers) may hold it, so it is pickled under its public
# name, as before reactive.connectors.files became a package
InvalidLine.__module__ = "reactive.connectors.files"


_LINE_ERRORS = ("fail", "dead_letter")


def decode_block(path: str, offset: int, lines: list[bytes], errors: str,
                 with_offsets: bool) -> tuple[list[Any], int]:
    """:func:`decode_lines` for a block of lines, at C speed when every line is UTF-8: one
    strict decode per line in a comprehension; only a block that holds an invalid line is
    decoded line by line (:func:`decode_lines`). Same arguments, result and errors."""
    try:
        if with_offsets:
            out: list[Any] = []
            end = offset
            for raw in lines:
                out.append((end, raw.rstrip(b"\r\n").decode("utf-8")))
                end += len(raw)
            return out, end
        return ([raw.rstrip(b"\r\n").decode("utf-8") for raw in lines],
                offset + sum(map(len, lines)))
    except UnicodeDecodeError:
        return decode_lines(path, offset, lines, errors, with_offsets)


def decode_lines(path: str, offset: int, lines: list[bytes], errors: str,
                 with_offsets: bool) -> tuple[list[Any], int]:
    """Decode ``lines`` (as read by ``readlines``, with their line breaks) read from ``path``
    at byte ``offset``, one by one: what the line source emits for them, wherever it runs
    (embedded, or in a Spark read task).

    Args:
        path: the file (named in errors and dead letters).
        offset: the byte offset of the first line in the file.
        lines: the raw lines.
        errors: ``"fail"`` or ``"dead_letter"`` (:class:`LineFileSource`'s ``errors``).
        with_offsets: emit ``(byte offset, line)`` instead of the line.

    Returns:
        the records (an :class:`InvalidLine` for each invalid line under
        ``"dead_letter"``) and the offset after the last line.

    Raises:
        ValueError: naming the file and the line's byte offset, at the first line that is
            not UTF-8 under ``errors="fail"``.
    """
    out: list[Any] = []
    for raw in lines:
        line = raw.rstrip(b"\r\n")
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            reason = (f"invalid UTF-8 at byte offset {offset + exc.start} ({exc.reason}: "
                      f"{line[exc.start:exc.end]!r})")
            if errors == "fail":
                raise ValueError(
                    f"{path}: the line at byte offset {offset} is not valid UTF-8: "
                    f"{reason}; fix the file, or read it with errors='dead_letter' to "
                    "route such lines to a dead-letter output"
                ) from None
            out.append(InvalidLine(path, offset, line, reason))
        else:
            out.append((offset, text) if with_offsets else text)
        offset += len(raw)
    return out, offset


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
        errors: what a line that is not valid UTF-8 does: ``"fail"`` (the default) fails
            the job with an error naming the file and the line's byte offset;
            ``"dead_letter"`` emits an :class:`InvalidLine` in place of the line's record.
            No line is ever decoded with replacement characters.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        ConfigurationError: if ``errors`` is not ``"fail"`` or ``"dead_letter"``.
    """

    def __init__(self, path: str | Path, with_offsets: bool = False,
                 read_size: int = 1 << 16, errors: Literal["fail", "dead_letter"] = "fail") -> None:
        if errors not in _LINE_ERRORS:
            raise ConfigurationError(f"line-file source: errors must be 'fail' or "
                                     f"'dead_letter', got {errors!r}")
        self.path = Path(path)
        if not self.path.exists():
            raise FileNotFoundError(f"line-file source: {self.path} does not exist")
        self.with_offsets = with_offsets
        self.read_size = read_size
        self.errors = errors

    def splits(self) -> list[str]:
        """The files to read, sorted (a directory's hidden files are not read)."""
        return files_of(self.path)

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        mine = [[f, 0] for f in self.splits()[subtask::parallelism]]
        return _LineReader(mine, self.with_offsets, self.read_size, self.errors)


class _LineReader(FileSplitsReader):
    def __init__(self, splits: list[list[Any]], with_offsets: bool, read_size: int,
                 errors: Literal["fail", "dead_letter"] = "fail") -> None:
        super().__init__(splits)  # [path, offset]
        self.with_offsets = with_offsets
        self.read_size = read_size
        self.errors = errors

    async def read_batch(self, max_records: int) -> list[Any] | None:
        while (split := self._next_split()) is not None:
            if self._file is None:
                self._file = open(split[0], "rb")  # noqa: SIM115 - closed at end or close()
                self._file.seek(split[1])
            lines = self._file.readlines(self.read_size)
            if not lines:
                self._finish_split(split)
                continue
            # an invalid line under errors="fail" raises before the position advances, so a
            # restore meets the line again
            out, split[1] = decode_block(split[0], split[1], lines, self.errors,
                                         self.with_offsets)
            return out
        return None

    def describe_position(self) -> Any:
        if self._current < len(self.splits):
            path, offset = self.splits[self._current]
            return f"{path} byte {offset}"
        return None
