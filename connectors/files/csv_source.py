"""The CSV file source: the rows of a CSV file, or of every file of a directory, parsed in
vectorized blocks by pyarrow (the ``parquet`` extra) and positioned by byte offset; bad rows
fail the job or become :class:`~reactive.connectors.files.csv_records.InvalidRow` dead
letters.

Each file is a split, as for the line-file source (:mod:`.line_source`). A reader reads its
file in blocks of whole rows (:mod:`.csv_rows`), converts each block with pyarrow
(:mod:`.csv_records`) and returns the block's records as one batch. Barriers fall between
batches, so the position a checkpoint stores, ``[path, byte offset, line]`` per split, is
always the start of the next unread row, and a restore resumes exactly there (Flink's file
source keeps the same kind of per-split offset).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from reactive.errors import ConfigurationError
from reactive.extras import require
from reactive.sources import Source, SourceReader

from .csv_batches import ColumnarBlockConverter, block_batches
from .csv_records import BlockConverter
from .csv_rows import RowBlocks, split_rows
from .file_splits import FileSplitsReader, files_of

__all__ = ["CsvFileSource"]

_ERRORS = ("fail", "dead_letter")


def _pyarrow_csv() -> Any:
    return require("pyarrow.csv", "parquet", "the CSV file source")


class CsvFileSource(Source):
    """Rows of a CSV file, or of every file of a directory (sorted by name), as records.

    Each file is a split; instance ``i`` of ``p`` reads files ``i, i+p, ...``. The position
    is ``[path, byte offset, line]`` per split (offset -1 once read to its end). Each batch
    is one block of about ``block_size`` bytes of whole rows (``max_records`` does not cut
    it), so a checkpoint never falls inside a block and a restore re-reads no row.

    Records are tuples of the ``columns`` (in that order), or what ``row_factory`` makes of
    each row's values, or what ``batch_factory`` makes of each block's Arrow table. Rows may
    end with ``\\n`` or ``\\r\\n`` (not a lone ``\\r``); empty lines are skipped. Quoted
    fields may hold the delimiter, doubled quotes and newlines (RFC 4180); a quote inside an
    unquoted field keeps the rows up to the next such quote in one block.

    A bad row - the wrong number of fields, a value that does not convert to its column's
    type, bytes that are not UTF-8 (in any column, read or not), a factory that raises on it
    - fails the job (``errors="fail"``, naming the file, the row's byte offset and line, and
    the reason) or is emitted in place of its record as an ``InvalidRow(path, offset, raw,
    reason, line)`` (``errors="dead_letter"``); the other rows of its block are kept.

    Args:
        path: a file or a directory.
        columns: the columns to read (None: all), in the order records get them.
        column_types: pyarrow types (or type names pyarrow knows, ``"int64"``) of columns;
            the others are inferred per block.
        row_factory: called with each row's values to make its record (e.g. a
            ``NamedTuple`` class).
        batch_factory: called with each block's ``pyarrow.Table`` (the ``columns``); returns
            one record per row, in order. Exclusive with ``row_factory``. When it raises,
            the rows are retried in halves to find the bad ones, so it must raise only for
            rows that are bad.
        header: the first row of each file names the columns (and is no record).
        column_names: the file's column names, in file order (required without ``header``;
            with it they replace the header's names).
        delimiter: the field delimiter (one character).
        quote: the quote character, or None when fields are never quoted.
        null_values: the strings that are null (None: pyarrow's defaults, e.g. ``""``,
            ``"NA"``, ``"null"``; string columns are never null unless pyarrow is told).
        block_size: bytes per block and batch (more when a row is longer).
        errors: ``"fail"`` (the default) or ``"dead_letter"``.
        columnar: emit one ``pyarrow.RecordBatch`` of :attr:`schema` per block instead of
            records (read it with ``Dataflow.columnar_source``; dead letters, when
            ``errors="dead_letter"``, come beside the batches as ``InvalidRow`` s). Needs
            the type of every column read, in ``column_types``. A ``batch_factory`` then
            maps each block's table to a table of ``schema`` (vectorized parsing and
            validation: a block it raises for is bisected, so its bad rows become dead
            letters with their offsets); no ``row_factory``.
        schema: with ``columnar`` and a ``batch_factory``, the ``pyarrow.Schema`` of its
            tables.

    Attributes:
        schema: with ``columnar``, the ``pyarrow.Schema`` of the batches (the ``columns``
            with their ``column_types``); else None.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        ConfigurationError: for an unknown ``errors``, both factories, a block size < 1, no
            column names, or ``columnar`` without ``columns`` and all their types, or with a
            factory.
        MissingExtraError: if pyarrow is not installed (``pip install 'reactive[parquet]'``).
    """

    def __init__(self, path: str | Path, *, columns: Sequence[str] | None = None,
                 column_types: Mapping[str, Any] | None = None,
                 row_factory: Callable[..., Any] | None = None,
                 batch_factory: Callable[[Any], Sequence[Any]] | None = None,
                 header: bool = True, column_names: Sequence[str] | None = None,
                 delimiter: str = ",", quote: str | None = '"',
                 null_values: Sequence[str] | None = None, block_size: int = 1 << 18,
                 errors: Literal["fail", "dead_letter"] = "fail", columnar: bool = False,
                 schema: Any = None) -> None:
        if errors not in _ERRORS:
            raise ConfigurationError(f"CSV source: errors must be 'fail' or 'dead_letter', "
                                     f"got {errors!r}")
        if row_factory is not None and batch_factory is not None:
            raise ConfigurationError("CSV source: give row_factory or batch_factory, not both")
        if block_size < 1:
            raise ConfigurationError(f"CSV source: block_size must be >= 1, got {block_size}")
        if not header and not column_names:
            raise ConfigurationError("CSV source: without a header, column_names are needed")
        _pyarrow_csv()  # fail when the program is built, not when it first reads
        self.path = Path(path)
        if not self.path.exists():
            raise FileNotFoundError(f"CSV source: {self.path} does not exist")
        self.columns = list(columns) if columns is not None else None
        self.column_types = dict(column_types or {})
        self.row_factory = row_factory
        self.batch_factory = batch_factory
        self.header = header
        self.column_names = list(column_names) if column_names else None
        self.delimiter = delimiter
        self.quote = quote
        self.null_values = list(null_values) if null_values is not None else None
        self.block_size = block_size
        self.errors = errors
        self.columnar = columnar
        self.schema: Any = None
        if columnar:
            self.schema = self._columnar_schema(schema)
        elif schema is not None:
            raise ConfigurationError("CSV source: a schema applies to columnar=True only")

    def _columnar_schema(self, schema: Any) -> Any:
        """The schema of the batches in columnar mode: the batch factory's, or every column
        read with its type."""
        import pyarrow as pa

        if self.row_factory is not None:
            raise ConfigurationError("CSV source: columnar=True emits record batches, not "
                                     "row_factory records (use a batch_factory of tables)")
        if (self.batch_factory is None) != (schema is None):
            raise ConfigurationError("CSV source: with columnar=True, a batch_factory needs "
                                     "the schema of its tables, and a schema a batch_factory")
        if schema is not None and not isinstance(schema, pa.Schema):
            raise ConfigurationError(f"CSV source: schema must be a pyarrow.Schema, got "
                                     f"{type(schema).__name__}")
        missing = [c for c in self.columns or [] if c not in self.column_types]
        if not self.columns or missing:
            raise ConfigurationError(
                "CSV source: columnar=True needs the columns to read and the type of each "
                f"in column_types (missing: {missing or 'columns'}), so that every batch "
                "has one schema")
        if schema is not None:
            return schema
        try:
            return pa.schema([(c, self.column_types[c]) for c in self.columns])
        except (TypeError, ValueError, pa.ArrowInvalid) as exc:
            raise ConfigurationError(f"CSV source: column_types: {exc}") from exc

    def splits(self) -> list[str]:
        """The files to read, sorted (a directory's hidden files are not read)."""
        return files_of(self.path)

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        mine = [[f, 0, 1] for f in self.splits()[subtask::parallelism]]
        return _CsvReader(self, mine)

    def read_header(self, path: str) -> tuple[list[str], int, int]:
        """The column names of ``path``, the byte offset and the line number where its
        data rows start (``0, 1`` without ``header``).

        Raises:
            ValueError: if the file is empty or its header row is not UTF-8.
        """
        if not self.header:
            assert self.column_names is not None
            return list(self.column_names), 0, 1
        quote = self.quote.encode() if self.quote else None
        with open(path, "rb") as f:
            first = RowBlocks(f, 0, 1, 1 << 16, quote).next_block()
        rows = split_rows(first[2], 0, 1, quote) if first is not None else []
        if not rows:
            raise ValueError(f"{path}: empty CSV file, expected a header row")
        row = rows[0]
        try:
            text = row.raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path}: the header row is not valid UTF-8: {exc}") from None
        names = next(csv.reader(io.StringIO(text, newline=""), delimiter=self.delimiter,
                                quotechar=self.quote or '"',
                                quoting=csv.QUOTE_MINIMAL if self.quote else csv.QUOTE_NONE))
        return (list(self.column_names) if self.column_names else names,
                row.offset + len(row.raw), row.line + row.raw.count(b"\n"))


class _CsvReader(FileSplitsReader):
    def __init__(self, source: CsvFileSource, splits: list[list[Any]]) -> None:
        super().__init__(splits)  # [path, offset, line]
        self.source = source
        self._blocks: RowBlocks | None = None
        self._converter: BlockConverter | None = None

    def _open_split(self, split: list[Any]) -> None:
        src = self.source
        names, data_offset, data_line = src.read_header(split[0])
        if split[1] < data_offset:  # a fresh split: the header row is no record
            split[1], split[2] = data_offset, data_line
        self._converter = (ColumnarBlockConverter if src.columnar else BlockConverter)(
            _pyarrow_csv(), names, columns=src.columns, column_types=src.column_types,
            null_values=src.null_values, delimiter=src.delimiter, quote=src.quote,
            row_factory=src.row_factory, batch_factory=src.batch_factory,
            dead_letters=src.errors == "dead_letter", block_size=src.block_size)
        self._file = open(split[0], "rb")  # noqa: SIM115 - closed at end or close()
        self._file.seek(split[1])
        self._blocks = RowBlocks(self._file, split[1], split[2], src.block_size,
                                 src.quote.encode() if src.quote else None)

    async def read_batch(self, max_records: int) -> list[Any] | None:
        while (split := self._next_split()) is not None:
            if self._file is None:
                self._open_split(split)
            assert self._blocks is not None and self._converter is not None
            block = self._blocks.next_block()
            if block is None:
                self._finish_split(split)
                continue
            offset, line, data = block
            records = self._converter.convert(split[0], offset, line, data)
            if self.source.schema is not None:
                records = block_batches(records, self.source.schema,
                                        f"{split[0]} byte {offset} (line {line})",
                                        f"CsvFileSource({self.source.path})")
            # advanced only now: a row that fails the job is met again after a restore
            split[1], split[2] = self._blocks.offset, self._blocks.line
            if records:
                return records
        return None

    def describe_position(self) -> Any:
        if self._current < len(self.splits):
            path, offset, line = self.splits[self._current]
            return f"{path} byte {offset} (line {line})"
        return None

    def close(self) -> None:
        super().close()
        self._blocks = None
