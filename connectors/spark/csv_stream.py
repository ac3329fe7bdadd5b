"""The CSV file source (``CsvFileSource`` in per-record mode) as a Spark streaming reader:
each Spark task parses whole blocks of rows with pyarrow (the embedded source's own
:class:`~reactive.connectors.files.csv_records.BlockConverter`), so the records and the
``InvalidRow`` dead letters (with their byte offsets and lines) are the embedded run's.

Offsets are ``{"file": i, "pos": byte, "line": n, "seq": s, "done": bool}``: the file
(sorted by name, as the embedded source reads them), the byte offset and line number of the
next unread row (always a row boundary, as the embedded checkpoint position), ``seq`` a
running count of the lines before it. A micro-batch is whole blocks of rows; its records
get ``seq`` = the seq of their block's first line + their index in the block (a row holds at
least one line, so these rise through the input and never collide). A query restarted on
its checkpoint location resumes at the byte offset of its last committed micro-batch.
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from .record_chain import _CHUNK_ROWS, END_OF_INPUT, END_OF_INPUT_TIME, Chunk, ChunkedRead

__all__ = ["CsvStreamReader"]


def _blocks(source: Any, path: str, pos: int, line: int, stop: int | None
            ) -> Iterator[tuple[int, int, bytes]]:
    """The blocks of whole rows of ``path`` from byte ``pos`` (line ``line``) to byte
    ``stop`` (a row boundary; None: the end of the file), as ``(offset, line, bytes)``."""
    from reactive.connectors.files.csv_rows import RowBlocks

    quote = source.quote.encode() if source.quote else None
    with open(path, "rb") as fh:
        fh.seek(pos)
        file: Any = fh if stop is None else io.BytesIO(fh.read(stop - pos))
        blocks = RowBlocks(file, pos, line, source.block_size, quote)
        while (block := blocks.next_block()) is not None:
            yield block


def _lines(data: bytes) -> int:
    """The lines of a block, a last one without its newline included (additive: a block
    split at row ends has as many lines as its parts together)."""
    return data.count(b"\n") + (not data.endswith(b"\n"))


def _chunk(records: list[Any], seqs: list[int]) -> Chunk:
    """Records and their positions as a chunk: no event times, but the end-of-input
    marker's (the last record, when there)."""
    tss: list[Any] = [None] * len(records)
    if records[-1] is END_OF_INPUT:
        tss[-1] = END_OF_INPUT_TIME
    return records, tss, seqs


class _Span(InputPartition):
    """The rows of one Spark task: from offset ``start`` to ``end``."""

    def __init__(self, start: dict[str, Any], end: dict[str, Any]) -> None:
        super().__init__((start, end))
        self.start = start
        self.end = end


class CsvStreamReader(ChunkedRead, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A ``CsvFileSource`` read by Spark (built by :class:`.stream_source.ReactiveSource`).

    Args:
        source: the dataflow's ``CsvFileSource`` (per-record mode).
        limit: records per micro-batch at most, counted as lines and rounded up to a block
            (a checkpoint never falls inside a block).
        parts: Spark tasks per micro-batch (consecutive ranges of blocks).
        emit: turns ``(record, ts, seq)`` rows (the end-of-input marker's record is
            :data:`~.record_chain.END_OF_INPUT`) into the Arrow record batches of the
            source's schema (the reactive data source's own, shared by its readers).
        then: the first chain of steps, given the records as
            :data:`~.record_chain.Chunk` s of whole blocks (no tuple per record), instead
            of ``emit`` (:class:`~.record_chain.ChunkedRead`).
    """

    def __init__(self, source: Any, limit: int, parts: int,
                 emit: Callable[[Iterator[tuple[Any, ...]]], Iterator[Any]],
                 then: Callable[[Iterator[Chunk]], Iterator[Any]] | None = None) -> None:
        self.source = source
        self.emit = emit
        self.then = then
        self.files: list[str] = source.splits()
        self.limit = limit
        self.parts = parts

    def initialOffset(self) -> dict[str, Any]:
        return {"file": 0, "pos": 0, "line": 1, "seq": 0, "done": False}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.limit)

    def prepareForTriggerAvailableNow(self) -> None:
        """The files do not grow: their ends are the target."""

    def _fresh(self, f: int, pos: int, line: int) -> tuple[int, int]:
        """A file's first data row when ``pos`` is its start (the header row is no
        record), else ``(pos, line)``."""
        if pos == 0:
            _, data_offset, data_line = self.source.read_header(self.files[f])
            return data_offset, data_line
        return pos, line

    def _walk(self, start: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """The offsets after each block from ``start`` on, through every file."""
        f, pos, line, seq = start["file"], start["pos"], start["line"], start["seq"]
        while f < len(self.files):
            pos, line = self._fresh(f, pos, line)
            for _, _, data in _blocks(self.source, self.files[f], pos, line, None):
                pos, line, seq = pos + len(data), line + data.count(b"\n"), seq + _lines(data)
                yield {"file": f, "pos": pos, "line": line, "seq": seq, "done": False}
            f, pos, line = f + 1, 0, 1
            yield {"file": f, "pos": 0, "line": 1, "seq": seq, "done": False}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        if start["done"]:
            return start
        rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = start
        walk = self._walk(start)
        for after in walk:
            if rows is not None and end["seq"] - start["seq"] >= rows \
                    and after["seq"] > end["seq"]:
                break  # the limit is reached; only offsets without records (a file's
                # end, empty files) are taken past it, so the input's end is seen here
            end = after
        # at the end of the last file, the marker rides with the micro-batch's last rows
        return {**end, "done": end["file"] >= len(self.files)}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """The micro-batch's blocks in ``parts`` consecutive ranges of about equal lines,
        cut at block ends found by reading the files again from ``start`` (the cuts follow
        from the offsets alone, so a micro-batch replayed from the offset log is cut the
        same way)."""
        total = end["seq"] - start["seq"]
        if self.parts == 1 or total < 2:
            return [_Span(start, end)]
        per = -(-total // self.parts)
        cuts: list[dict[str, Any]] = []
        target = start["seq"] + per
        for after in self._walk(start):
            if after["seq"] >= end["seq"] or len(cuts) == self.parts - 1:
                break
            if after["seq"] >= target:
                cuts.append(after)
                target = after["seq"] + per
        bounds = [start, *cuts, end]
        return [_Span(a, b) for a, b in itertools.pairwise(bounds)]

    def _chunks(self, partition: InputPartition, size: int = _CHUNK_ROWS) -> Iterator[Chunk]:
        """The partition's records as :data:`~.record_chain.Chunk` s of whole blocks, at
        least ``size`` records each but the last (the end-of-input marker last of all)."""
        records: list[Any] = []
        seqs: list[int] = []
        for block, first in self._blocks(partition):
            records += block
            seqs += range(first, first + len(block))
            if len(records) >= size:
                yield _chunk(records, seqs)
                records, seqs = [], []
        if records:
            yield _chunk(records, seqs)

    def _blocks(self, partition: InputPartition) -> Iterator[tuple[list[Any], int]]:
        """The partition's blocks as ``(records, seq of the first)``; the end-of-input
        marker comes as a block of its own."""
        from reactive.connectors.files.csv_records import BlockConverter
        from reactive.connectors.files.csv_source import _pyarrow_csv

        assert isinstance(partition, _Span)
        src = self.source
        start, end = partition.start, partition.end
        f, pos, line, seq = start["file"], start["pos"], start["line"], start["seq"]
        while f < len(self.files) and (f, pos) < (end["file"], end["pos"]):
            path = self.files[f]
            names, data_offset, data_line = src.read_header(path)
            if pos == 0:
                pos, line = data_offset, data_line
            converter = BlockConverter(
                _pyarrow_csv(), names, columns=src.columns, column_types=src.column_types,
                null_values=src.null_values, delimiter=src.delimiter, quote=src.quote,
                row_factory=src.row_factory, batch_factory=src.batch_factory,
                dead_letters=src.errors == "dead_letter", block_size=src.block_size)
            stop = end["pos"] if f == end["file"] else None
            for offset, first, data in _blocks(src, path, pos, line, stop):
                yield converter.convert(path, offset, first, data), seq
                seq += _lines(data)
            f, pos, line = f + 1, 0, 1
        if end["done"] and not start["done"]:
            yield [END_OF_INPUT], end["seq"]

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release."""
