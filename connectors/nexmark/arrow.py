"""Nexmark events as Arrow record batches (the columnar form), in Flink nexmark's table
layout: ``event_type`` and one struct column per kind (null where the row is of another
kind), as Flink's nexmark DDL declares its ``datagen`` table, plus the row's ``dateTime``.

The batches hold exactly the events of the per-record source for the same event numbers
(both come from :func:`~.generator.generate_columns`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from reactive.extras import require

from .config import NexmarkConfig
from .generator import EventColumns, generate_columns
from .model import AUCTION_COLUMNS, BID_COLUMNS, PERSON_COLUMNS, Auction, Bid, Person

__all__ = ["event_schema", "record_batches", "to_record_batch"]

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
    from reactive.errors import ConfigurationError

    end = stop if stop is not None else config.num_events
    if end is None:
        raise ConfigurationError("record_batches needs stop= or a bounded NexmarkConfig")
    for first in range(start, end, batch_size):
        numbers = np.arange(first, min(first + batch_size, end), dtype=np.int64)
        yield to_record_batch(generate_columns(config, numbers, arrow=True))
