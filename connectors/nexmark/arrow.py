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
    """The events of ``columns`` as one ``pyarrow.RecordBatch`` of :func:`event_schema`."""
    pa = _pa()
    schema = event_schema()
    n = len(columns)
    arrays = [pa.array(columns.event_type, type=pa.int8())]
    date_time = np.zeros(n, dtype=np.int64)
    for kind, (cls, data) in enumerate(((Person, columns.persons), (Auction, columns.auctions),
                                        (Bid, columns.bids))):
        struct_type = schema.field(kind + 1).type
        where = columns.positions[kind]
        children = [pa.array(data[f], type=struct_type.field(i).type)
                    for i, f in enumerate(cls._fields)]  # type: ignore[attr-defined]
        compact = pa.StructArray.from_arrays(children, fields=list(struct_type))
        date_time[where] = data["date_time"]
        if len(where) == n:
            arrays.append(compact)
            continue
        # row i takes the struct of its rank among the rows of this kind, or null
        rank = np.full(n, -1, dtype=np.int64)
        rank[where] = np.arange(len(where))
        arrays.append(compact.take(pa.array(rank, mask=rank < 0)))
    arrays.append(pa.array(date_time, type=pa.timestamp("ms")))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


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
        yield to_record_batch(generate_columns(config, numbers))
