"""The Nexmark queries q0, q1 and q2 in the columnar API: ``pyarrow.compute`` expressions
over the record batches of :class:`~reactive.connectors.nexmark.columnar.NexmarkArrowSource`
(Flink nexmark's table layout), with the semantics and row shapes of the per-record
queries in :mod:`.queries`:

- q0 pass-through: every bid, ``(auction, bidder, price, dateTime, extra)``;
- q1 currency conversion: the same with ``price * 0.908`` (a float64 column);
- q2 selection: ``(auction, price)`` of the bids whose ``auction % 123 == 0``.

``dateTime`` stays an Arrow ``timestamp[ms]`` column (the reference compares its integer
milliseconds). The windowed queries (q5, q7) need columnar event-time windows, which the
columnar API does not have yet; they are not written here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow.compute as pc

from reactive.columnar import ColumnarStream

__all__ = ["COLUMNAR_QUERIES", "bids", "q0", "q1", "q2"]

BID_FIELDS = ("auction", "bidder", "price", "dateTime", "extra")


def _bid(name: str) -> Any:
    return pc.field("bid", name)


def _bids(events: ColumnarStream, name: str, where: Any = None, **columns: Any
          ) -> ColumnarStream:
    """The bids (``event_type == 2``, and ``where`` if given) as the flat ``columns``
    (name -> expression over the event's ``bid`` struct). The projection comes first (it
    takes the struct's child arrays without copying), so the filter copies only the
    columns the query keeps, not the other kinds' structs."""
    keep = pc.field("event_type") == 2
    if where is not None:
        keep = keep & where
    return (events.select(name=f"{name}-project", keep=keep, **columns)
            .filter(pc.field("keep"), name=f"{name}-filter")
            .select(*columns, name=name))


def bids(events: ColumnarStream) -> ColumnarStream:
    """The bids as flat columns ``(auction, bidder, price, dateTime, extra)``: Flink
    nexmark's ``bid`` view."""
    return _bids(events, "bids", **{f: _bid(f) for f in BID_FIELDS})


def q0(events: ColumnarStream) -> ColumnarStream:
    """Pass-through: every bid's columns."""
    return _bids(events, "q0", **{f: _bid(f) for f in BID_FIELDS})


def q1(events: ColumnarStream) -> ColumnarStream:
    """Currency conversion: bids with their price in euros (``0.908 * price``)."""
    return _bids(events, "q1", auction=_bid("auction"), bidder=_bid("bidder"),
                 price=_bid("price").cast("float64") * 0.908, dateTime=_bid("dateTime"),
                 extra=_bid("extra"))


def q2(events: ColumnarStream) -> ColumnarStream:
    """Selection: ``(auction, price)`` of the bids on every 123rd auction (Arrow has no
    modulo kernel: ``a - (a / 123) * 123`` with integer division, auctions being
    positive)."""
    auction = _bid("auction")
    every_123rd = (auction - (auction / 123) * 123) == 0
    return _bids(events, "q2", where=every_123rd, auction=auction, price=_bid("price"))


COLUMNAR_QUERIES: dict[str, Callable[[ColumnarStream], ColumnarStream]] = {
    "q0": q0, "q1": q1, "q2": q2,
}
