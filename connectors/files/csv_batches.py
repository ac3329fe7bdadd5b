"""Blocks of CSV rows to Arrow record batches (the CSV source's columnar mode): one record
batch per block, of the declared schema, positioned by the block's byte offset; rows that do
not parse or convert go beside it as :class:`~reactive.connectors.files.csv_records.InvalidRow`
dead letters (or fail the job), found as in the per-record mode by bisecting the block.
"""

from __future__ import annotations

from typing import Any

from reactive.errors import ConfigurationError, ReactiveError

from .csv_records import BlockConverter, InvalidRow, _WrongFieldCount
from .csv_rows import split_rows

__all__ = ["ColumnarBlockConverter", "block_batches"]


class ColumnarBlockConverter(BlockConverter):
    """A :class:`BlockConverter` whose records are the block's Arrow tables (or what the
    batch factory makes of them: a table per table): ``convert`` returns tables of good rows
    and an ``InvalidRow`` per bad row (no per-row record)."""

    def __init__(self, pacsv: Any, column_names: Any, **options: Any) -> None:
        super().__init__(pacsv, column_names, **options)
        # a block without the quote character has no quoted newline: pyarrow's parser
        # then finds rows ~1.6x faster with newlines_in_values off, and reads them alike
        self._unquoted_parse_options = pacsv.ParseOptions(
            delimiter=self._parse_options.delimiter, quote_char=self._parse_options.quote_char,
            newlines_in_values=False, invalid_row_handler=self._skip)
        import pyarrow as pa

        self._pa = pa
        self._pool = pa.system_memory_pool()

    def _read(self, data: bytes) -> Any:
        self._invalid.clear()
        quoted = self.quote is not None and self.quote in data
        # the system allocator: pyarrow's default pool (mimalloc) commits fresh pages for
        # each multi-megabyte block of a young process (0.16 vs 0.09 s CPU for the first
        # 8 blocks of 4 MB, measured); the system allocator reuses the freed blocks' memory
        # a BufferReader hands the parser slices of ``data`` (io.BytesIO: copies of it)
        return self._pacsv.read_csv(
            self._pa.BufferReader(data), read_options=self._read_options,
            parse_options=self._parse_options if quoted else self._unquoted_parse_options,
            convert_options=self._convert_options, memory_pool=self._pool)

    def _records(self, table: Any) -> list[Any]:
        if self._batch_factory is None:
            return [table]
        out: Any = self._batch_factory(table)
        if out.num_rows != table.num_rows:
            # not a bad row: offsets could no longer be told, so the job must stop
            raise ConfigurationError(
                f"CSV source: batch_factory returned {out.num_rows} rows for "
                f"{table.num_rows} (it must return one row per row, in order)")
        return [out]

    def convert(self, path: str, offset: int, line: int, block: bytes) -> list[Any]:
        """Tables of the block's good rows, in order, then the dead letters of its bad ones.

        Raises:
            ValueError: at the first bad row without dead letters (naming the file, the
                row's byte offset and line, the raw row and the reason).
        """
        try:
            if not block.isascii():  # ASCII is UTF-8 (5x cheaper to check than decoding)
                block.decode("utf-8")
            table = self._read(block)
            pieces = self._records(table)
        except ReactiveError:
            raise
        except Exception:  # narrowed down row by row
            return self._isolate(path, split_rows(block, offset, line, self.quote))
        if not self._invalid:
            return pieces
        invalid = list(self._invalid)
        rows = split_rows(block, offset, line, self.quote)
        numbers = [r.number for r in invalid]
        if len(rows) != table.num_rows + len(invalid) or None in numbers:
            return self._isolate(path, rows)
        bad = [self._bad_row(path, rows[n - 1], _WrongFieldCount(
            f"expected {r.expected_columns} fields, got {r.actual_columns}"))
            for n, r in zip(numbers, invalid, strict=True)]
        return [*pieces, *bad]


def block_batches(pieces: list[Any], schema: Any, position: str, operator: str) -> list[Any]:
    """One record batch of ``schema`` from the block's tables (carrying ``position``, the
    block's first row), followed by its dead letters.

    Raises:
        SchemaMismatchError: (``reactive.columnar``) when a table does not have ``schema``,
            naming ``operator``, the column and ``position``.
    """
    import pyarrow as pa

    from reactive.columnar.schema import check_batch, with_position

    tables = [p for p in pieces if not isinstance(p, InvalidRow)]
    out: list[Any] = []
    if sum(t.num_rows for t in tables):
        batches = [with_position(b, position) for t in tables for b in t.to_batches()]
        for b in batches:
            check_batch(b, schema, operator)
        batch = batches[0] if len(batches) == 1 else \
            pa.Table.from_batches(batches).combine_chunks().to_batches()[0]
        out.append(with_position(batch, position))
    out.extend(p for p in pieces if isinstance(p, InvalidRow))
    return out
