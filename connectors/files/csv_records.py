"""Blocks of CSV rows to records with pyarrow's CSV reader, vectorized; a block that does not
convert falls back to bisecting its rows, so each bad row becomes one :class:`InvalidRow`
dead letter (or fails the job) and the other rows of its block are kept.

A block is parsed by ``pyarrow.csv.read_csv`` into an Arrow table (column conversion in C),
and the table becomes records in bulk: the columns as Python lists zipped into tuples or
into a row factory, or a batch factory given the table itself. Rows with the wrong number
of fields are skipped by pyarrow's ``invalid_row_handler`` and reported with the row number,
which maps them back to their byte offsets. Any other failure (a value that does not convert,
a row factory that raises, bytes that are not UTF-8) is isolated by parsing halves of the
block again until the failing rows stand alone: log2(rows) parses per bad row, and nothing
extra for a clean block.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reactive.errors import ConfigurationError, ReactiveError

from .csv_rows import Row, split_rows
from .line_source import InvalidLine

__all__ = ["BlockConverter", "InvalidRow"]


@dataclass(frozen=True)
class InvalidRow(InvalidLine):
    """A CSV row that cannot be read, emitted in place of its record by a
    :class:`~reactive.connectors.files.CsvFileSource` with ``errors="dead_letter"``; an
    :class:`InvalidLine`, so one ``isinstance(record, InvalidLine)`` routes both sources'
    bad input to a dead-letter output.

    Attributes:
        path: the file the row is in.
        offset: byte offset of the row's first byte in the file.
        raw: the row's bytes, without the line ending.
        reason: why it cannot be read (the wrong number of fields, the value that does not
            convert, the row factory's exception, or the first byte that is not UTF-8).
        line: the 1-based line number of the row's first line in the file.
    """

    line: int = 0


InvalidRow.__module__ = "reactive.connectors.files"  # its public name, as for InvalidLine

_ROW_NUMBER = re.compile(r"Row #\d+: ")  # pyarrow's row number counts from the parsed piece


class _WrongFieldCount(ValueError):
    """pyarrow's invalid-row handler saw a row with the wrong number of fields."""


def _build_tuples(columns: list[list[Any]]) -> list[Any]:
    return list(zip(*columns, strict=True))


class BlockConverter:
    """Converts blocks of whole CSV rows to records.

    Args:
        pacsv: the ``pyarrow.csv`` module (imported by the caller, lazily).
        column_names: the names of the file's columns, in file order.
        columns: the columns to read, in the order records get them (None: all).
        column_types: pyarrow types of some columns (others are inferred per block, so
            give the type of every column whose values might look numeric in one block and
            not in another).
        null_values: the strings that are null (None: pyarrow's defaults).
        delimiter: the field delimiter.
        quote: the quote character, or None when fields are never quoted.
        row_factory: called once per row with the row's values, in ``columns`` order, to
            make its record (e.g. a ``NamedTuple`` class); None makes tuples.
        batch_factory: called once per block with its ``pyarrow.Table`` (the ``columns``),
            returns one record per row, in order; vectorized conversion (pyarrow.compute)
            belongs here. Exclusive with ``row_factory``.
        dead_letters: bad rows become :class:`InvalidRow` records (True) or raise (False).

    Raises:
        ConfigurationError: if both factories are given.
    """

    def __init__(self, pacsv: Any, column_names: Sequence[str], *,
                 columns: Sequence[str] | None = None,
                 column_types: Mapping[str, Any] | None = None,
                 null_values: Sequence[str] | None = None, delimiter: str = ",",
                 quote: str | None = '"', row_factory: Callable[..., Any] | None = None,
                 batch_factory: Callable[[Any], Sequence[Any]] | None = None,
                 dead_letters: bool = False, block_size: int = 1 << 20) -> None:
        if row_factory is not None and batch_factory is not None:
            raise ConfigurationError("CSV source: give row_factory or batch_factory, not both")
        self._pacsv = pacsv
        self.quote = quote.encode() if quote else None
        self.dead_letters = dead_letters
        self._row_factory = row_factory
        self._batch_factory = batch_factory
        self._invalid: list[Any] = []
        self._read_options = pacsv.ReadOptions(
            column_names=list(column_names), use_threads=False,
            block_size=max(block_size, 1 << 20))
        self._parse_options = pacsv.ParseOptions(
            delimiter=delimiter, quote_char=quote or False,
            newlines_in_values=quote is not None, invalid_row_handler=self._skip)
        convert: dict[str, Any] = {"include_columns": list(columns or [])}
        if column_types:
            convert["column_types"] = dict(column_types)
        if null_values is not None:
            convert["null_values"] = list(null_values)
        self._convert_options = pacsv.ConvertOptions(**convert)

    def _skip(self, row: Any) -> str:
        self._invalid.append(row)
        return "skip"

    def _read(self, data: bytes) -> Any:
        """``data`` as an Arrow table; rows with the wrong field count land in
        ``self._invalid`` (cleared first)."""
        self._invalid.clear()
        return self._pacsv.read_csv(io.BytesIO(data), read_options=self._read_options,
                                    parse_options=self._parse_options,
                                    convert_options=self._convert_options)

    def _records(self, table: Any) -> list[Any]:
        if self._batch_factory is not None:
            records = list(self._batch_factory(table))
            if len(records) != table.num_rows:
                # not a bad row: offsets could no longer be told, so the job must stop
                raise ConfigurationError(
                    f"CSV source: batch_factory returned {len(records)} records for "
                    f"{table.num_rows} rows (it must return one record per row, in order)")
            return records
        columns = [c.to_pylist() for c in table.columns]
        if self._row_factory is None:
            return _build_tuples(columns) if columns else [()] * table.num_rows
        return list(map(self._row_factory, *columns)) if columns else \
            [self._row_factory() for _ in range(table.num_rows)]

    def convert(self, path: str, offset: int, line: int, block: bytes) -> list[Any]:
        """The records of ``block`` (whole rows of ``path`` from byte ``offset``, line
        ``line``), in row order, an :class:`InvalidRow` in place of each bad row.

        Raises:
            ValueError: at the first bad row without ``dead_letters`` (naming the file, the
                row's byte offset and line, the raw row and the reason).
            ConfigurationError: if a batch factory returns a wrong number of records.
        """
        try:
            # strict UTF-8 for every byte, read columns or not (pyarrow checks only the
            # string columns it reads), as the line-file source: never a replacement char
            block.decode("utf-8")
            records = self._records(self._read(block))
        except ReactiveError:
            raise
        except Exception:  # any failure is narrowed down row by row
            return self._isolate(path, split_rows(block, offset, line, self.quote))
        if not self._invalid:
            return records
        invalid = list(self._invalid)
        rows = split_rows(block, offset, line, self.quote)
        numbers = [r.number for r in invalid]
        if len(rows) != len(records) + len(invalid) or None in numbers:
            # pyarrow and the row splitter disagree on the rows (a stray quote): isolate
            return self._isolate(path, rows)
        for number, bad in zip(numbers, invalid, strict=True):
            row = rows[number - 1]
            error = _WrongFieldCount(f"expected {bad.expected_columns} fields, got "
                                     f"{bad.actual_columns}")
            records.insert(number - 1, self._bad_row(path, row, error))
        return records

    def _isolate(self, path: str, rows: list[Row]) -> list[Any]:
        """The records of ``rows``: each failing row alone (found by bisection) becomes a
        dead letter (or raises)."""
        if not rows:
            return []
        data = b"".join(r.raw for r in rows)
        try:
            data.decode("utf-8")
            table = self._read(data)
            if self._invalid:
                bad = self._invalid[0]
                raise _WrongFieldCount(f"expected {bad.expected_columns} fields, got "
                                       f"{bad.actual_columns}")
            return self._records(table)
        except ReactiveError:
            raise
        except Exception as exc:  # narrowed down below
            if len(rows) == 1:
                return [self._bad_row(path, rows[0], exc)]
        half = len(rows) // 2
        return self._isolate(path, rows[:half]) + self._isolate(path, rows[half:])

    def _bad_row(self, path: str, row: Row, exc: Exception) -> InvalidRow:
        raw = row.raw.rstrip(b"\r\n")
        if isinstance(exc, UnicodeDecodeError):
            reason = (f"invalid UTF-8 at byte offset {row.offset + exc.start} ({exc.reason}: "
                      f"{row.raw[exc.start:exc.end]!r})")
        elif isinstance(exc, _WrongFieldCount):
            reason = str(exc)
        else:
            reason = f"{type(exc).__name__}: {_ROW_NUMBER.sub('', str(exc))}"
        if not self.dead_letters:
            raise ValueError(
                f"{path}: the row at byte offset {row.offset} (line {row.line}) cannot be "
                f"read: {reason}; row: {raw[:200]!r}; fix the file, or read it with "
                "errors='dead_letter' to route such rows to a dead-letter output"
            ) from exc
        return InvalidRow(path, row.offset, raw, reason, row.line)
