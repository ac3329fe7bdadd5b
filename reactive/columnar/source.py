"""The Arrow source: a table (or record batches) as a columnar stream; the position is the
row index of the next row, so a restore resumes exactly there."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..errors import ConfigurationError
from ..runtime.operators import StreamOperator
from ..sources import Source, SourceReader
from .schema import check_batch, pa, with_position

__all__ = ["ArrowSource", "SourceOutput"]


class ArrowSource(Source):
    """A non-parallel source over an in-memory Arrow table, emitting record batches of
    ``batch_size`` rows (zero-copy slices of the table).

    Args:
        data: a ``pyarrow.Table``, a ``pyarrow.RecordBatch`` or an iterable of record
            batches (materialized once into a table).
        batch_size: rows per emitted record batch (>= 1).
        name: the operator name used in schema errors.

    Attributes:
        schema: the table's schema, which the stream declares.

    Raises:
        ConfigurationError: on a batch size < 1, or batches of different schemas (naming
            the first column that differs and the batch's first row).
    """

    max_source_parallelism = 1

    def __init__(self, data: Any, batch_size: int = 65536, name: str = "arrow") -> None:
        if batch_size < 1:
            raise ConfigurationError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self.table = _as_table(data, name)
        self.schema = self.table.schema

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        return _ArrowReader(self.table, self.batch_size)


def _as_table(data: Any, name: str) -> Any:
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if not isinstance(data, Iterable):
        raise ConfigurationError(f"from_arrow takes a pyarrow Table, RecordBatch or an "
                                 f"iterable of RecordBatches, got {type(data).__name__}")
    batches = list(data)
    if not batches:
        raise ConfigurationError("from_arrow: no record batches (an empty source needs a "
                                 "Table with a schema)")
    row = 0
    for b in batches:
        try:
            check_batch(with_position(b, f"row {row}"), batches[0].schema, name)
        except Exception as exc:
            raise ConfigurationError(str(exc)) from exc
        row += b.num_rows
    return pa.Table.from_batches(batches)


class _ArrowReader(SourceReader):
    def __init__(self, table: Any, batch_size: int) -> None:
        self.table = table
        self.batch_size = batch_size
        self.position = 0

    async def read_batch(self, max_records: int) -> list[Any] | None:
        start = self.position
        n = self.table.num_rows
        if start >= n:
            return None
        end = min(start + self.batch_size, n)
        self.position = end
        # a table slice may span chunks: combine_chunks makes it one batch (zero-copy when
        # the slice lies in one chunk)
        part = self.table.slice(start, end - start)
        batches = part.to_batches()
        batch = batches[0] if len(batches) == 1 else part.combine_chunks().to_batches()[0]
        return [with_position(batch, f"row {start}")]

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        return [self.position]

    def restore_state(self, entries: list[Any]) -> None:
        self.position = int(entries[0])

    def describe_position(self) -> Any:
        return f"row {self.position}"


class SourceOutput(StreamOperator):
    """One of the two outputs of a columnar source that emits record batches and, beside
    them, other records (dead letters): ``batches=True`` keeps the record batches,
    ``batches=False`` the others."""

    def __init__(self, name: str, uid: str, batches: bool) -> None:
        super().__init__(name, uid)
        self.batches = batches

    def process_batch(self, batch: list[Any]) -> list[Any]:
        keep = self.batches
        return [b for b in batch if isinstance(b, pa.RecordBatch) is keep]
