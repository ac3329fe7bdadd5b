"""Nexmark events as Arrow record batches (the columnar form), in Flink nexmark's table
layout: ``event_type`` and one struct column per kind (null where the row is of another
kind), as Flink's nexmark DDL declares its ``datagen`` table, plus the row's ``dateTime``;
and :class:`NexmarkArrowSource`, the source of a columnar stream of them.

```python
flow = Dataflow("nexmark")
events = nexmark_columnar(flow, NexmarkArrowSource(NexmarkConfig(num_events=100_000)))
bids = events.filter(pc.field("event_type") == 2)      # a ColumnarStream
```

The batches hold exactly the events of the per-record source for the same event numbers
(both come from :func:`~.generator.generate_columns`). The source's reader is
:class:`~.source.NexmarkReader`'s: the stream is cut into interleaved splits and a split's
position is the number of its next event, so a restore or a rescale resumes every split
exactly where the checkpoint left it. Each read hands out one whole record batch of the
next ``batch_size`` events of the instance's splits (merged in event-number order), so a
checkpoint always falls between two batches. The string columns are built as Arrow arrays
directly (no Python object per value).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from reactive.errors import ConfigurationError
from reactive.extras import require
from reactive.sources import SourceReader

from .config import NexmarkConfig
from .generator import EventColumns, generate_columns
from .model import AUCTION_COLUMNS, BID_COLUMNS, PERSON_COLUMNS, Auction, Bid, Person
from .source import NexmarkReader, NexmarkSource

if TYPE_CHECKING:
    from reactive.columnar import ColumnarStream
    from reactive.dataflow import Dataflow

__all__ = ["NexmarkArrowSource", "event_schema", "nexmark_columnar", "record_batches",
           "to_record_batch"]

_TIME_FIELDS = {"date_time", "expires"}


def _pa() -> Any:
    return require("pyarrow", "parquet", "Nexmark Arrow batches")


_INT_FIELDS = {
    Person: {"id"}, Auction: {"id", "initial_bid", "reserve", "seller", "category"},
    Bid: {"auction", "bidder", "price"},
}


def event_schema() -> Any:
    """The Arrow schema of the batches: ``event_type`` (int8), ``person``, ``auction``,
    ``bid`` (structs with Flink's field names) and ``dateTime`` (timestamp[ms])."""
    pa = _pa()
    structs = []
    for cls, names in ((Person, PERSON_COLUMNS), (Auction, AUCTION_COLUMNS), (Bid, BID_COLUMNS)):
        ints = _INT_FIELDS[cls]
        structs.append(pa.struct([
            pa.field(name, pa.timestamp("ms") if field in _TIME_FIELDS
                     else pa.int64() if field in ints else pa.string())
            for field, name in zip(cls._fields, names, strict=True)]))
    return pa.schema([("event_type", pa.int8()), ("person", structs[0]),
                      ("auction", structs[1]), ("bid", structs[2]),
                      ("dateTime", pa.timestamp("ms"))])


def to_record_batch(columns: EventColumns) -> Any:
    """The events of ``columns`` (generated with or without ``arrow=True``; with it, no
    Python object per value is made) as one ``pyarrow.RecordBatch`` of
    :func:`event_schema`."""
    pa = _pa()
    schema = event_schema()
    n = len(columns)
    arrays = [pa.array(columns.event_type, type=pa.int8())]
    date_time = np.zeros(n, dtype=np.int64)
    for kind, (cls, data) in enumerate(((Person, columns.persons), (Auction, columns.auctions),
                                        (Bid, columns.bids))):
        struct_type = schema.field(kind + 1).type
        where = columns.positions[kind]
        date_time[where] = data["date_time"]
        if len(where) == n:
            children = [_array(pa, data[f], struct_type.field(i).type)
                        for i, f in enumerate(cls._fields)]  # type: ignore[attr-defined]
            arrays.append(pa.StructArray.from_arrays(children, fields=list(struct_type)))
            continue
        # every row has a slot in each struct, null where the row is of another kind: the
        # children are spread to all rows without copying string bytes (a row of another
        # kind gets an empty string, a 0)
        mine = np.zeros(n, dtype=bool)
        mine[where] = True
        before = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(mine, out=before[1:])
        children = [_spread(pa, data[f], struct_type.field(i).type, where, before)
                    for i, f in enumerate(cls._fields)]  # type: ignore[attr-defined]
        arrays.append(pa.StructArray.from_arrays(children, fields=list(struct_type),
                                                 mask=pa.array(~mine)))
    arrays.append(pa.array(date_time, type=pa.timestamp("ms")))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _array(pa: Any, values: Any, type_: Any) -> Any:
    if isinstance(values, pa.Array):
        return values if values.type.equals(type_) else values.cast(type_)
    return pa.array(values, type=type_)


def _spread(pa: Any, values: Any, type_: Any, where: np.ndarray, before: np.ndarray) -> Any:
    """The kind's values (one per row of the kind) at their rows ``where`` among all
    ``len(before) - 1`` rows (``before[i]``: how many rows of the kind precede row i)."""
    n = len(before) - 1
    if pa.types.is_string(type_):
        compact = _array(pa, values, type_)
        offsets = np.frombuffer(compact.buffers()[1], dtype=np.int32,
                                count=len(compact) + 1, offset=4 * compact.offset)
        return pa.StringArray.from_buffers(n, pa.py_buffer(offsets[before]),
                                           compact.buffers()[2])
    full = np.zeros(n, dtype=np.int64)
    full[where] = values
    return pa.array(full, type=type_)


def record_batches(config: NexmarkConfig, batch_size: int = 65_536, start: int = 0,
                   stop: int | None = None) -> Iterator[Any]:
    """The events numbered ``start`` to ``stop`` (default: ``config.num_events``) as record
    batches of ``batch_size`` rows.

    Raises:
        ConfigurationError: when neither ``stop`` nor ``config.num_events`` bounds the stream.
    """
    end = stop if stop is not None else config.num_events
    if end is None:
        raise ConfigurationError("record_batches needs stop= or a bounded NexmarkConfig")
    for first in range(start, end, batch_size):
        numbers = np.arange(first, min(first + batch_size, end), dtype=np.int64)
        yield to_record_batch(generate_columns(config, numbers, arrow=True))


def batch_time(batch: Any) -> float:
    """The event time (seconds) of a record batch's latest event."""
    import pyarrow.compute as pc

    latest = pc.max(batch.column("dateTime")).value
    return float("-inf") if latest is None else latest / 1000.0


class NexmarkArrowSource(NexmarkSource):
    """Generated Nexmark events as ``pyarrow.RecordBatch`` es of
    :func:`~.arrow.event_schema` (``event_type``, the ``person`` / ``auction`` / ``bid``
    structs, ``dateTime``), with watermarks; the same events as :class:`NexmarkSource`'s
    records for the same configuration.

    Args:
        config: the stream's parameters (bounded by ``config.num_events``, or unbounded).
        splits: how many interleaved splits the stream is cut into (the largest useful
            parallelism); fixed for the life of the job's checkpoints.
        watermark_delay: seconds the watermarks are held back behind the generator's.
        batch_size: events per record batch (the last batch of a bounded stream may be
            shorter).

    Attributes:
        schema: the batches' ``pyarrow.Schema``.

    Raises:
        ConfigurationError: for ``splits`` or ``batch_size`` < 1 or a negative delay.
        MissingExtraError: without numpy and pyarrow (``pip install 'reactive[nexmark]'``).
    """

    # set, so that the runtime forwards the readers' watermarks (it does for sources with
    # event time); columnar windows read the dateTime column, and nexmark_columnar keeps
    # this function from per-record operators, to which a batch is not one record
    timestamp_fn = staticmethod(batch_time)  # type: ignore[assignment]

    def __init__(self, config: NexmarkConfig, splits: int = 8, watermark_delay: float = 0.0,
                 batch_size: int = 16_384) -> None:
        if batch_size < 1:
            raise ConfigurationError(f"batch_size must be >= 1, got {batch_size}")
        super().__init__(config, splits, watermark_delay, chunk=batch_size)
        require("pyarrow", "nexmark", "Nexmark record batches")
        self.batch_size = batch_size
        self.schema = event_schema()

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        return NexmarkBatchReader(self, [[k, self.splits, k]
                                         for k in range(subtask, self.splits, parallelism)])


class NexmarkBatchReader(NexmarkReader):
    """One instance's splits of a :class:`NexmarkArrowSource`: one record batch per read.

    Position entries are ``[split, splits, next event number]``, as the per-record
    reader's (the two sources' checkpoints are interchangeable).
    """

    def _materialize(self, numbers: Any) -> list[Any]:
        return [to_record_batch(generate_columns(self.config, numbers, arrow=True))]

    async def read_batch(self, max_records: int) -> list[Any] | None:
        from reactive.columnar.schema import with_position

        if not self._fill(self.source.chunk):
            return None
        numbers, (batch,) = self._numbers, self._records
        # the whole batch is handed out: every split moves past its events in it
        self._advance(len(numbers))
        self._numbers, self._records, self._taken = numbers[:0], [], 0
        self._update_watermark()
        return [with_position(batch, f"event {int(numbers[0])}")]


def nexmark_columnar(flow: Dataflow, source: NexmarkArrowSource, name: str | None = None,
                     uid: str | None = "events") -> ColumnarStream:
    """Add ``source`` to ``flow`` as a columnar stream of record batches.

    Args:
        flow: the dataflow being built.
        source: the Nexmark record-batch source.
        name: the source operator's display name (default ``"nexmark"``).
        uid: its stable id (its positions are snapshotted under it).

    Returns:
        the :class:`~reactive.columnar.ColumnarStream` of the events.
    """
    from reactive.columnar import ColumnarStream
    from reactive.dataflow import Stream

    stream = flow.source(source, name=name or "nexmark", uid=uid)
    stream.transformation.timestamp_fn = None
    return ColumnarStream(flow, stream.transformation, source.schema,
                          lambda t: Stream(flow, t))
