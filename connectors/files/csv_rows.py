"""Row boundaries of CSV bytes: a file read in blocks cut at row ends, and a block split into
its rows with their byte offsets and line numbers.

A row ends at a newline (``\\n``; ``\\r\\n`` too) outside quotes. Quotes are tracked by
parity, as RFC 4180 writes them (a field holding the quote character or a newline is quoted,
its quotes doubled), so a quoted field may span lines. A quote character inside an unquoted
field (not RFC 4180) makes the parity wrong: the rows up to the next such quote are then
kept together in one block (never cut apart; a parser that reads them still sees them as
separate rows), so nothing is lost but a bad row's dead letter may hold several rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO

__all__ = ["Row", "RowBlocks", "split_rows"]

_NL = b"\n"


@dataclass(frozen=True)
class Row:
    """One row of a block.

    Attributes:
        offset: byte offset of the row's first byte in the file.
        line: 1-based line number of the row's first line in the file.
        raw: the row's bytes, line ending included.
    """

    offset: int
    line: int
    raw: bytes


def _count_newlines(block: bytes, scratch: bytearray | None = None) -> int:
    """How many ``\\n`` bytes ``block`` holds: compared as a numpy byte array when numpy is
    installed (about 6x faster than ``bytes.count`` on multi-megabyte blocks, where the
    count is a visible share of reading a block), into ``scratch`` when it is given and
    long enough (a reused buffer: no fresh pages for the comparison's result)."""
    if len(block) < 1 << 16:
        return block.count(_NL)
    try:
        import numpy as np  # imported by pyarrow already; the per-record source needs none
    except ImportError:
        return block.count(_NL)
    data = np.frombuffer(block, np.uint8)
    if scratch is None or len(scratch) < len(block):
        return int(np.count_nonzero(data == _NL[0]))
    out = np.frombuffer(scratch, np.bool_, len(block))
    return int(np.count_nonzero(np.equal(data, _NL[0], out=out)))


def _last_row_end(chunk: bytes | bytearray, quote: bytes | None, size: int | None = None
                  ) -> int:
    """The index just past the last newline of ``chunk[:size]`` that is outside quotes
    (``chunk`` starts at a row boundary), or 0 when it holds no complete row."""
    size = len(chunk) if size is None else size
    end = chunk.rfind(_NL, 0, size)
    if end < 0:
        return 0
    if quote is None or chunk.find(quote, 0, size) < 0:
        return end + 1
    # parity of the quotes before each candidate newline, moving back one newline at a time
    # so the counting stays linear in the chunk
    odd = chunk.count(quote, 0, end) % 2
    while odd:
        prev = chunk.rfind(_NL, 0, end)
        if prev < 0:
            return 0
        odd ^= chunk.count(quote, prev, end) % 2
        end = prev
    return end + 1


class RowBlocks:
    """Blocks of whole rows of a file from a byte offset, each about ``block_size`` bytes
    (more when one row is longer).

    Args:
        file: the file, opened in binary mode and positioned at ``offset`` (a row start).
        offset: the file position, bytes.
        line: the 1-based line number at ``offset``.
        block_size: bytes read at a time.
        quote: the quote character (bytes), or None when fields are never quoted.
    """

    def __init__(self, file: BinaryIO, offset: int, line: int, block_size: int,
                 quote: bytes | None) -> None:
        self.file = file
        self.offset = offset
        self.line = line
        self.block_size = block_size
        self.quote = quote
        # the bytes read past the last block are buffer[:filled]; the buffer is reused for
        # every read (a fresh multi-megabyte object per read costs the kernel's page faults
        # on it, several times the copy), and each block is copied out of it once
        self._buffer = bytearray()
        self._filled = 0
        self._scratch = bytearray()

    def next_block(self) -> tuple[int, int, bytes] | None:
        """The next block as ``(offset, line, bytes)``, or None at the end of the file.

        The last block of a file that does not end with a newline holds the last row
        without one.
        """
        buffer, filled, size = self._buffer, self._filled, self.block_size
        while True:
            if len(buffer) < filled + size:  # with room for the next reads' tails
                buffer.extend(bytes(filled + size + size // 8 - len(buffer)))
            with memoryview(buffer) as view:
                n = _read_into(self.file, view[filled:filled + size])
            if not n:
                if not filled:
                    return None
                cut = filled  # the last row, without a newline
                break
            searched, filled = filled, filled + n
            if buffer.find(_NL, searched, filled) < 0:
                continue  # a row longer than what was read so far
            cut = _last_row_end(buffer, self.quote, filled)
            if cut:
                break
        with memoryview(buffer) as view:
            block = bytes(view[:cut])
        buffer[:filled - cut] = buffer[cut:filled]
        self._filled = filled - cut
        start, line = self.offset, self.line
        self.offset += len(block)
        if len(self._scratch) < len(block):
            self._scratch = bytearray(max(len(block), size) * 9 // 8)
        self.line += _count_newlines(block, self._scratch)
        return start, line, block


def _read_into(file: BinaryIO, view: memoryview) -> int:
    """Read up to ``len(view)`` bytes of ``file`` into ``view`` (fewer only at its end);
    returns how many."""
    readinto = getattr(file, "readinto", None)
    if readinto is not None:
        return int(readinto(view) or 0)
    data = file.read(len(view))
    view[:len(data)] = data
    return len(data)


def split_rows(block: bytes, offset: int, line: int, quote: bytes | None) -> list[Row]:
    """The non-empty rows of ``block`` (which starts at a row boundary at byte ``offset`` and
    line ``line`` of its file), in order; lines that are empty (or only ``\\r``) are no rows,
    as for pyarrow's CSV reader.

    Returns:
        the rows; their bytes together with the empty lines are ``block``.
    """
    rows: list[Row] = []
    track = quote is not None and quote in block
    pos, n = 0, len(block)
    while pos < n:
        end = block.find(_NL, pos)
        end = n if end < 0 else end + 1
        if track:
            assert quote is not None
            while block.count(quote, pos, end) % 2 and end < n:
                nxt = block.find(_NL, end)
                end = n if nxt < 0 else nxt + 1
        raw = block[pos:end]
        if raw.strip(b"\r\n"):
            rows.append(Row(offset + pos, line, raw))
        line += raw.count(_NL)
        pos = end
    return rows
