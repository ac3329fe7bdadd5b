"""The Nexmark queries q0, q1 and q2 in the columnar API: ``pyarrow.compute`` expressions
over the record batches of :class:`~reactive.connectors.nexmark.columnar.NexmarkArrowSource`
(Flink nexmark's table layout), with the semantics and row shapes of the per-record
queries in :mod:`.queries`:

- q0 pass-through: every bid, ``(auction, bidder, price, dateTime, extra)``;
- q1 currency conversion: the same with ``price * 0.908`` (a float64 column);
- q2 selection: ``(auction, price)`` of the bids whose ``auction % 123 == 0``;
- q5 hot items: ``(auction, num, window start, window end)`` of the most-bid auctions of
  each sliding window (10 s every 2 s), ties included;
- q7 highest bid: ``(auction, bidder, price, dateTime, extra)`` of the bids with the
  highest price of each tumbling 10 s window, ties included.

``dateTime`` stays an Arrow ``timestamp[ms]`` column (the reference compares its integer
milliseconds).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reactive import SlidingEventTimeWindows, TumblingEventTimeWindows
from reactive.columnar import ColumnarStream, MaxRows, VectorizedAggregateFunction

from .queries import HOP_MS, WINDOW_MS

__all__ = ["COLUMNAR_QUERIES", "COLUMNAR_STATEFUL", "HotAuctions", "bids", "q0", "q1", "q2", "q5", "q7"]

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


# q5's (count, auction) pairs packed in one int64: count in the high bits, so the pairs
# order by count; auction ids stay below 2**40 (a trillion auctions) and counts below 2**23
_AUCTION_BITS = 40
_AUCTION_MASK = (1 << _AUCTION_BITS) - 1


class HotAuctions(VectorizedAggregateFunction):
    """The packed ``(count, auction)`` pairs with the highest count of each window, ties
    included (SQL's ``RANK() = 1``), as a ``list<int64>`` of packed pairs.

    The accumulators are the highest count, how many pairs have it, and ``capacity``
    arrays holding those pairs; a window with more ties than ``capacity`` fails the job
    (:class:`ValueError`) rather than drop one.

    Args:
        capacity: the most tied auctions a window may have.
    """

    result_type = pa.list_(pa.int64())

    def __init__(self, capacity: int = 16) -> None:
        self.capacity = capacity
        self.accumulators = {"max": (np.int64, -1), "n": (np.int64, 0),
                             **{f"a{k}": (np.int64, 0) for k in range(capacity)}}

    def update(self, acc: dict[str, np.ndarray], slots: np.ndarray, groups: np.ndarray,
               values: Any) -> None:
        packed = values.to_numpy(zero_copy_only=False).astype(np.int64)
        count = packed >> _AUCTION_BITS
        top = np.full(len(slots), -1, np.int64)
        np.maximum.at(top, groups, count)
        before = acc["max"][slots]
        acc["n"][slots[top > before]] = 0
        acc["max"][slots] = np.maximum(before, top)
        at_top = np.flatnonzero(count == acc["max"][slots][groups])
        self._append(acc, slots[groups[at_top]], packed[at_top])

    def _append(self, acc: dict[str, np.ndarray], slots: np.ndarray, packed: np.ndarray
                ) -> None:
        """Append pairs (at their slot's highest count) to their slots' lists."""
        if not len(slots):
            return
        order = np.argsort(slots, kind="stable")
        slots, packed = slots[order], packed[order]
        rank = np.arange(len(slots)) - np.searchsorted(slots, slots, side="left")
        position = acc["n"][slots] + rank
        if int(position.max()) >= self.capacity:
            raise ValueError(f"more than {self.capacity} auctions tie for a window's highest "
                             f"bid count ({int(acc['max'][slots[0]])}): raise HotAuctions' "
                             "capacity")
        for k in range(int(position.max()) + 1):
            at = position == k
            acc[f"a{k}"][slots[at]] = packed[at]
        np.add.at(acc["n"], slots, 1)

    def merge(self, acc: dict[str, np.ndarray], into: np.ndarray,
              other: dict[str, np.ndarray]) -> None:
        for i, slot in enumerate(into.tolist()):
            n, top = int(other["n"][i]), int(other["max"][i])
            if top > acc["max"][slot]:
                acc["max"][slot], acc["n"][slot] = top, 0
            if top == acc["max"][slot] and n:
                pairs = np.array([other[f"a{k}"][i] for k in range(n)], np.int64)
                self._append(acc, np.full(n, slot, np.int64), pairs)

    def result(self, acc: dict[str, np.ndarray]) -> Any:
        n = acc["n"]
        pairs = np.stack([acc[f"a{k}"] for k in range(self.capacity)], axis=1)
        values = pairs[np.arange(self.capacity) < n[:, None]]
        offsets = np.zeros(len(n) + 1, np.int32)
        np.cumsum(n, out=offsets[1:])
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.int64()))


_Q5_SCHEMA = pa.schema([("auction", pa.int64()), ("num", pa.int64()),
                        ("starttime", pa.timestamp("ms")), ("endtime", pa.timestamp("ms"))])


def _hot_rows(batch: Any) -> Any:
    """One row per hot auction of each window: the lists of packed pairs flattened."""
    hot = batch.column("hot")
    packed = pc.list_flatten(hot).to_numpy(zero_copy_only=False)
    parents = pc.list_parent_indices(hot)
    return pa.RecordBatch.from_arrays(
        [pa.array(packed & _AUCTION_MASK), pa.array(packed >> _AUCTION_BITS),
         batch.column("start").take(parents).cast(pa.timestamp("ms")),
         batch.column("end").take(parents).cast(pa.timestamp("ms"))],
        schema=_Q5_SCHEMA)


def q5(events: ColumnarStream) -> ColumnarStream:
    """Hot items: the auctions with the most bids of each sliding window of 10 s every 2 s
    (ties included), as ``(auction, num, starttime, endtime)``.

    Two window aggregations, as Flink nexmark's q5 (a count per auction and window, then
    the maximum per window): the counts per ``(auction, window)``, then, keyed by the
    window's start, the counts of each window gathered by :class:`HotAuctions` into its
    highest ones. The second step reads each count at ``window end - 1 ms`` (Flink's
    ``window.maxTimestamp()``) into a tumbling 2 s window that closes at the same end: the
    counts of a window are emitted before the watermark that closes it, so none is late.
    """
    bid_times = _bids(events, "q5-bids", auction=_bid("auction"), dateTime=_bid("dateTime"))
    counts = (bid_times.key_by("auction")
              .window(SlidingEventTimeWindows.of(WINDOW_MS / 1000, HOP_MS / 1000),
                      timestamp="dateTime")
              .agg(name="q5-counts", num=("dateTime", "count")))
    one_ms = pa.scalar(dt.timedelta(milliseconds=1), pa.duration("ms"))
    pairs = counts.select(
        name="q5-pairs", start=pc.field("window_start").cast("int64"),
        end=pc.field("window_end").cast("int64"),
        last=pc.field("window_end") - one_ms,
        pair=pc.field("num") * (1 << _AUCTION_BITS) + pc.field("auction"))
    hot = (pairs.key_by("start", "end")
           .window(TumblingEventTimeWindows.of(HOP_MS / 1000), timestamp="last")
           .agg(name="q5-hot", hot=("pair", HotAuctions())))
    return hot.map_batches(_hot_rows, _Q5_SCHEMA, name="q5")


Q7_ROW = pa.struct([("auction", pa.int64()), ("bidder", pa.int64()), ("price", pa.int64()),
                    ("dateTime", pa.timestamp("ms")), ("extra", pa.string())])
"""q7's output row."""


def _max_bid_rows(batch: Any) -> Any:
    """The windows' lists of highest bids, one row per bid."""
    return pa.RecordBatch.from_struct_array(pc.list_flatten(batch.column("top")))


def q7(events: ColumnarStream) -> ColumnarStream:
    """Highest bid: the bids with the highest price of each tumbling 10 s window, ties
    included, as ``(auction, bidder, price, dateTime, extra)``.

    Flink nexmark's q7 joins the bids with each window's maximum price; here one window
    aggregate keeps the rows at the maximum as it goes (:class:`MaxRows`, SQL's ``RANK() =
    1``), keyed by the window's start so that the windows spread over the instances. A bid
    belongs to ``[start, end)`` (as the per-record q7 and Beam's Query7).
    """
    when = _bid("dateTime")
    ms = when.cast("int64")
    window_ms = pa.scalar(WINDOW_MS, pa.int64())
    rows = _bids(events, "q7-bids", window=(ms / window_ms) * window_ms, dateTime=when,
                 row=pc.make_struct(*(_bid(f) for f in Q7_ROW.names),
                                    field_names=Q7_ROW.names))
    top = (rows.key_by("window")
           .window(TumblingEventTimeWindows.of(WINDOW_MS / 1000), timestamp="dateTime")
           .agg(name="q7-max", top=("row", MaxRows(Q7_ROW, by="price"))))
    return top.map_batches(_max_bid_rows, pa.schema(list(Q7_ROW)), name="q7")


COLUMNAR_QUERIES: dict[str, Callable[[ColumnarStream], ColumnarStream]] = {
    "q0": q0, "q1": q1, "q2": q2, "q5": q5, "q7": q7,
}

COLUMNAR_STATEFUL = ("q5", "q7")
"""The columnar queries that keep state (windows)."""
