"""Row boundaries of the CSV source: blocks are cut only at row ends (never inside a quoted
field that spans lines), hold rows longer than a block whole, and split into rows with the
byte offsets and line numbers of the file."""

from __future__ import annotations

import io
import random

import pytest

from reactive.connectors.files.csv_rows import RowBlocks, split_rows


def random_csv(seed: int, rows: int = 300) -> tuple[bytes, list[bytes]]:
    """A CSV text (no header) and its rows, with quoted fields holding newlines, doubled
    quotes and delimiters, CRLF and LF endings, empty lines and no final newline."""
    rnd = random.Random(seed)
    out: list[bytes] = []
    for i in range(rows):
        field = rnd.choice([b"x", b'"a\nb"', b'"q""uote"', b'"c,d"', b'"\r\n\n"', b"y" * 300])
        end = rnd.choice([b"\n", b"\r\n"])
        out.append(b"%d," % i + field + end)
    out[-1] = out[-1].rstrip(b"\r\n")
    text = b""
    for row in out:
        text += row + (b"\n" if random.Random(len(text)).random() < 0.1 else b"")
    return text, out


def blocks_of(text: bytes, block_size: int, offset: int = 0, line: int = 1
              ) -> list[tuple[int, int, bytes]]:
    f = io.BytesIO(text)
    f.seek(offset)
    reader = RowBlocks(f, offset, line, block_size, b'"')
    out = []
    while (block := reader.next_block()) is not None:
        out.append(block)
    return out


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("block_size", [1, 7, 64, 1000, 1 << 20])
def test_blocks_cut_at_row_ends_and_split_into_the_rows_of_the_file(seed, block_size):
    text, rows = random_csv(seed)
    blocks = blocks_of(text, block_size)
    assert b"".join(b for _, _, b in blocks) == text
    got = []
    for offset, line, block in blocks:
        assert text[offset:offset + len(block)] == block
        assert line == text[:offset].count(b"\n") + 1
        assert block.count(b'"') % 2 == 0  # never cut inside quotes
        got += split_rows(block, offset, line, b'"')
    assert [r.raw.rstrip(b"\n").rstrip(b"\r") for r in got] == \
        [r.rstrip(b"\n").rstrip(b"\r") for r in rows]
    for row in got:
        assert text[row.offset:row.offset + len(row.raw)] == row.raw
        assert row.line == text[:row.offset].count(b"\n") + 1


def test_a_row_longer_than_a_block_is_read_whole_and_blocks_resume_at_an_offset():
    long_row = b"1," + b"z" * 10_000 + b"\n"
    text = b"0,a\n" + long_row + b"2,b\n"
    # the block that reaches the long row's end holds the whole rows read with it
    assert [b for _, _, b in blocks_of(text, 100)] == [b"0,a\n", long_row + b"2,b\n"]
    # a reader started at a row's offset (a restored position) sees the same rows from there
    assert blocks_of(text, 100, offset=4, line=2) == [(4, 2, long_row + b"2,b\n")]
    assert blocks_of(text, 1 << 20, offset=4 + len(long_row), line=3) == [
        (4 + len(long_row), 3, b"2,b\n")]


def test_without_a_quote_character_every_newline_ends_a_row():
    text = b'1,"a\n2,b"\n'
    assert [r.raw for r in split_rows(text, 0, 1, None)] == [b'1,"a\n', b'2,b"\n']
    assert [r.raw for r in split_rows(text, 0, 1, b'"')] == [text]
