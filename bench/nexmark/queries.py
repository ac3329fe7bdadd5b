"""The Nexmark queries q0-q8 in the per-record API.

Each query is a function ``query(events) -> Stream`` from the stream of generated events (a
:class:`~reactive.connectors.nexmark.NexmarkSource`) to its results, built from the runtime's
operators: filters and maps, event-time windows, keyed (co-)process functions with timers.
Results are plain tuples (JSON-able, so a committing file sink writes them). The semantics
are those of Flink nexmark's SQL texts (``nexmark/nexmark``, ``queries/q*.sql``) unless said:

- q0 pass-through: every bid, ``(auction, bidder, price, dateTime, extra)``.
- q1 currency conversion: the same with ``price * 0.908`` (dollars to euros).
- q2 selection: ``(auction, price)`` of the bids whose ``auction % 123 == 0``.
- q3 local item suggestion: ``(name, city, state, auction id)`` for each auction of category
  10 by a seller from OR, ID or CA: an incremental inner join of persons and auctions by
  seller (each side kept in keyed state until the other comes; persons are unique by id).
- q4 average closing price per category: an auction closes when the watermark passes its
  ``expires``; its final price is the highest bid with ``dateTime`` in ``[dateTime,
  expires]`` (none: it is left out, as the SQL's inner join); per category the running
  average of final prices, emitted at each closing as ``(category, average, count)``.
- q5 hot items: per sliding window (10 s, every 2 s) the auctions with the most bids,
  ``(auction, num, window start ms, window end ms)``; bids are counted per 2 s pane and
  auction, each pane's counts go to its five windows, summed per window.
- q6 average selling price by seller: per seller, the average final price (q4's) of its
  last 10 closed auctions in closing order ``(expires, auction)``, ``(seller, average)``
  at each closing.
- q7 highest bid: per tumbling window of 10 s the bids with the window's highest price,
  ``(auction, bidder, price, dateTime, extra)``. A bid belongs to the window ``[start,
  end)`` (the SQL text's ``BETWEEN`` also matches a bid at exactly ``end`` with the previous
  window's price: Beam's Query7 and this one do not).
- q8 new users: the people who created an auction within the tumbling 10 s window in which
  they registered, ``(id, name, window start ms)``, emitted when the window ends (the
  SQL's window join of distinct persons and distinct sellers).

Times in results are integer milliseconds, as in the events.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from reactive import (
    AggregateFunction,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    Stream,
    TumblingEventTimeWindows,
    ValueStateDescriptor,
    WindowResult,
)
from reactive.connectors.nexmark import Auction, Bid, Person
from reactive.two_input_functions import KeyedCoProcessFunction

__all__ = ["QUERIES", "STATEFUL", "q0", "q1", "q2", "q3", "q4", "q4_closed_auctions", "q5",
           "q6", "q7", "q8"]

WINDOW_MS = 10_000
HOP_MS = 2_000
Q6_LAST = 10
Q3_STATES = frozenset({"OR", "ID", "CA"})


def is_bid(e: Any) -> bool:
    return type(e) is Bid


def is_auction(e: Any) -> bool:
    return type(e) is Auction


def is_person(e: Any) -> bool:
    return type(e) is Person


def is_not_bid(e: Any) -> bool:
    return type(e) is not Bid


def _persons_and_auctions(events: Stream, query: str) -> Stream:
    """The persons and auctions (8% of the events): the queries that join them test each
    event's kind once here, and their two branches test only these."""
    return events.filter(is_not_bid, name=f"{query}-persons-auctions")


def _bid_row(b: Bid) -> tuple[Any, ...]:
    return (b.auction, b.bidder, b.price, b.date_time, b.extra)


# ---------------------------------------------------------------------- stateless
def q0(events: Stream) -> Stream:
    """Pass-through: every bid's columns."""
    return events.filter(is_bid, name="bids").map(_bid_row, name="q0")


def _to_euros(b: Bid) -> tuple[Any, ...]:
    return (b.auction, b.bidder, 0.908 * b.price, b.date_time, b.extra)


def q1(events: Stream) -> Stream:
    """Currency conversion: bids with their price in euros."""
    return events.filter(is_bid, name="bids").map(_to_euros, name="q1")


def _q2(e: Any) -> bool:
    return type(e) is Bid and e.auction % 123 == 0


def q2(events: Stream) -> Stream:
    """Selection: ``(auction, price)`` of the bids on every 123rd auction."""
    return events.filter(_q2, name="q2-filter").map(lambda b: (b.auction, b.price), name="q2")


# ---------------------------------------------------------------------- q3
def _q3_person(e: Any) -> bool:
    return type(e) is Person and e.state in Q3_STATES


def _q3_auction(e: Any) -> bool:
    return type(e) is Auction and e.category == 10


class LocalItemSuggestion(KeyedCoProcessFunction):
    """q3's join, keyed by person id = seller: the person (name, city, state) once it came,
    the ids of the seller's auctions that came before it."""

    def open(self, ctx: Any) -> None:
        self.person = ctx.get_state(ValueStateDescriptor("person"))
        self.pending = ctx.get_state(ListStateDescriptor("pending-auctions"))

    def process_element1(self, p: Person, ctx: Any) -> list[Any] | None:
        row = (p.name, p.city, p.state)
        self.person.update(row)
        waiting = list(self.pending.get())
        if waiting:
            self.pending.clear()
        return [(*row, auction) for auction in waiting]

    def process_element2(self, a: Auction, ctx: Any) -> list[Any] | None:
        row = self.person.value()
        if row is None:
            self.pending.add(a.id)
            return None
        return [(*row, a.id)]


def q3(events: Stream) -> Stream:
    """Local item suggestion: auctions of category 10 by sellers from OR, ID or CA."""
    events = _persons_and_auctions(events, "q3")
    persons = events.filter(_q3_person, name="q3-persons").key_by(lambda p: p.id)
    auctions = events.filter(_q3_auction, name="q3-auctions").key_by(lambda a: a.seller)
    return persons.connect(auctions).process(LocalItemSuggestion(), name="q3").uid("q3")


# ---------------------------------------------------------------------- q4
class WinningBids(KeyedCoProcessFunction):
    """q4's (and q6's) first step, keyed by auction id: the highest bid within the auction's
    lifetime, emitted as ``(auction, category, final price)`` when the watermark passes
    ``expires`` (q6: ``(auction, seller, final price, expires)``, with ``group="seller"``).

    Bids that come before their auction wait in state until it comes, at most until the
    watermark passes them (an auction that has not come by then started after them, so
    they do not count for it).

    Args:
        group: the auction field emitted second (``"category"`` or ``"seller"``).
        with_expires: also emit the auction's ``expires`` (ms).
    """

    def __init__(self, group: str = "category", with_expires: bool = False) -> None:
        self.group = group
        self.with_expires = with_expires

    def open(self, ctx: Any) -> None:
        # (start, expires, group value)
        self.auction = ctx.get_state(ValueStateDescriptor("auction"))
        self.best = ctx.get_state(ValueStateDescriptor("best-price"))
        self.early = ctx.get_state(ListStateDescriptor("early-bids"))  # (dateTime, price)

    def process_element1(self, a: Auction, ctx: Any) -> None:
        best = None
        for t, price in self.early.get():
            if a.date_time <= t <= a.expires and (best is None or price > best):
                best = price
        self.early.clear()
        self.auction.update((a.date_time, a.expires, getattr(a, self.group)))
        if best is not None:
            self.best.update(best)
        # bids at exactly expires still count: close once the watermark is past it
        ctx.timer_service.register_event_time_timer((a.expires + 1) / 1000.0)

    def process_element2(self, b: Bid, ctx: Any) -> None:
        auction = self.auction.value()
        if auction is None:
            # one cleanup timer per key at a time: many bids reach a closed hot auction
            # between two watermarks, and a timer each would rescan the list each time
            if not self.early.get():
                ctx.timer_service.register_event_time_timer((b.date_time + 1) / 1000.0)
            self.early.add((b.date_time, b.price))
            return
        if auction[0] <= b.date_time <= auction[1]:
            best = self.best.value()
            if best is None or b.price > best:
                self.best.update(b.price)

    def on_timer(self, timestamp: float, ctx: Any) -> list[Any] | None:
        auction = self.auction.value()
        if auction is None:
            # drop the bids the watermark passed (an auction that has not come by then
            # started after them), then wait for the oldest of the others
            watermark = ctx.timer_service.current_watermark()
            keep = [(t, p) for t, p in self.early.get() if (t + 1) / 1000.0 > watermark]
            if keep:
                self.early.update(keep)
                oldest = min(t for t, _ in keep)
                ctx.timer_service.register_event_time_timer((oldest + 1) / 1000.0)
            else:
                self.early.clear()
            return None
        if timestamp < (auction[1] + 1) / 1000.0:
            return None  # an early bid's timer, before the auction closes
        best = self.best.value()
        self.auction.clear()
        self.best.clear()
        if best is None:
            return None
        if self.with_expires:
            return [(ctx.current_key, auction[2], best, auction[1])]
        return [(ctx.current_key, auction[2], best)]


class CategoryAverage(KeyedProcessFunction):
    """q4's second step, keyed by category: the running average of the final prices,
    ``(category, average, count)`` after each closed auction."""

    def open(self, ctx: Any) -> None:
        self.total = ctx.get_state(ValueStateDescriptor("sum-count", default=(0, 0)))

    def process_element(self, closed: tuple[int, int, int], ctx: Any) -> list[Any] | None:
        total, count = self.total.value()
        total, count = total + closed[2], count + 1
        self.total.update((total, count))
        return [(closed[1], total / count, count)]


def q4_closed_auctions(events: Stream) -> Stream:
    """q4's first step: ``(auction, category, final price)`` per closed auction."""
    auctions = events.filter(is_auction, name="q4-auctions").key_by(lambda a: a.id)
    bids = events.filter(is_bid, name="q4-bids").key_by(lambda b: b.auction)
    return auctions.connect(bids).process(WinningBids(), name="q4-winning-bids").uid("q4-winning")


def q4(events: Stream, closed: Callable[[Stream], None] | None = None) -> Stream:
    """Average closing price per category (``closed`` also receives the first step's
    stream, for a test to check it)."""
    winning = q4_closed_auctions(events)
    if closed is not None:
        closed(winning)
    return (winning.key_by(lambda c: c[1]).process(CategoryAverage(), name="q4")
            .uid("q4-average"))


# ---------------------------------------------------------------------- q6
class SellerAverage(KeyedProcessFunction):
    """q6's second step, keyed by seller: the average final price of the seller's last 10
    closed auctions, ``(seller, average)`` at each closing.

    Closings are taken in event-time order, ``(expires, auction)``, whatever order they
    arrive in from the upstream instances: each waits in state until the watermark passes
    its ``expires`` (by then every closing before it has arrived), as Flink orders an OVER
    window by its time attribute.
    """

    def open(self, ctx: Any) -> None:
        self.waiting = ctx.get_state(ListStateDescriptor("closings"))  # (expires, id, price)
        self.last = ctx.get_state(ValueStateDescriptor("last-prices", default=()))

    def process_element(self, closed: tuple[int, int, int, int], ctx: Any) -> None:
        auction, _, price, expires = closed
        self.waiting.add((expires, auction, price))
        ctx.timer_service.register_event_time_timer((expires + 1) / 1000.0)

    def on_timer(self, timestamp: float, ctx: Any) -> list[Any] | None:
        watermark = ctx.timer_service.current_watermark()
        ready, later = [], []
        for c in self.waiting.get():
            (ready if (c[0] + 1) / 1000.0 <= watermark else later).append(c)
        if later:
            self.waiting.update(later)
        else:
            self.waiting.clear()
        if not ready:
            return None
        last: tuple[int, ...] = self.last.value()
        out = []
        for _, _, price in sorted(ready):
            last = (*last[-(Q6_LAST - 1):], price)
            out.append((ctx.current_key, sum(last) / len(last)))
        self.last.update(last)
        return out


def q6(events: Stream) -> Stream:
    """Average selling price by seller: per seller, the average final price of its last 10
    closed auctions, after each closing (Beam's Query6; Flink's SQL form, an OVER window
    on an updating input, is not supported by Flink)."""
    auctions = events.filter(is_auction, name="q6-auctions").key_by(lambda a: a.id)
    bids = events.filter(is_bid, name="q6-bids").key_by(lambda b: b.auction)
    closed = (auctions.connect(bids)
              .process(WinningBids("seller", with_expires=True), name="q6-winning-bids")
              .uid("q6-winning"))
    return closed.key_by(lambda c: c[1]).process(SellerAverage(), name="q6").uid("q6-average")


# ---------------------------------------------------------------------- q5
class CountBids(AggregateFunction):
    """``count(*)``."""

    def create_accumulator(self) -> int:
        return 0

    def add(self, value: Any, accumulator: int) -> int:
        return accumulator + 1

    def get_result(self, accumulator: int) -> int:
        return accumulator

    def merge(self, a: int, b: int) -> int:
        return a + b


def _pane_to_windows(r: WindowResult) -> list[tuple[int, int, int]]:
    """A 2 s pane's count, once for each of the five sliding windows that contain the pane:
    ``(window end ms, auction, count)``."""
    start = round(r.start * 1000)
    return [(start + HOP_MS * (k + 1), r.key, r.value) for k in range(WINDOW_MS // HOP_MS)]


class HotItems(KeyedProcessFunction):
    """q5's second step, keyed by window end: sums each auction's pane counts of the window
    (a map state, auction -> count) and emits the auctions with the most bids when the
    watermark passes the window's end (every pane of the window has been counted by then:
    the pane window emits its counts before forwarding that watermark)."""

    def open(self, ctx: Any) -> None:
        self.counts = ctx.get_state(MapStateDescriptor("counts"))

    def process_element(self, r: tuple[int, int, int], ctx: Any) -> None:
        end, auction, n = r
        counts = self.counts
        before = counts.get(auction)
        if before is None:
            # the window's timer, registered again for each new auction (the timer service
            # keeps one per key and time)
            counts.put(auction, n)
            ctx.timer_service.register_event_time_timer(end / 1000.0)
        else:
            counts.put(auction, before + n)

    def on_timer(self, timestamp: float, ctx: Any) -> list[Any] | None:
        counts = dict(self.counts.items())
        self.counts.clear()
        if not counts:
            return None
        top = max(counts.values())
        end = round(timestamp * 1000)
        return [(auction, num, end - WINDOW_MS, end) for auction, num in counts.items()
                if num == top]


def q5(events: Stream) -> Stream:
    """Hot items: the most-bid auctions per sliding window of 10 s every 2 s (counted per
    tumbling 2 s pane keyed by auction, each pane's count sent to its five windows, summed
    per window keyed by window end: the slices shared by the overlapping windows, as
    Flink's hopping window aggregation, without a timer per auction and window)."""
    panes = (events.filter(is_bid, name="q5-bids").key_by(lambda b: b.auction)
             .window(TumblingEventTimeWindows.of(HOP_MS / 1000))
             .aggregate(CountBids(), name="q5-panes").uid("q5-panes"))
    windows = panes.flat_map(_pane_to_windows, name="q5-pane-to-windows")
    return windows.key_by(lambda w: w[0]).process(HotItems(), name="q5").uid("q5-hot")


# ---------------------------------------------------------------------- q7
class MaxBids(AggregateFunction):
    """The highest price and the bids that have it: ``(price, (bid, ...))``."""

    def create_accumulator(self) -> tuple[int, tuple[Any, ...]]:
        return (-1, ())

    def add(self, b: Bid, acc: tuple[int, tuple[Any, ...]]) -> tuple[int, tuple[Any, ...]]:
        if b.price > acc[0]:
            return (b.price, (_bid_row(b),))
        if b.price == acc[0]:
            return (acc[0], (*acc[1], _bid_row(b)))
        return acc

    def get_result(self, acc: tuple[int, tuple[Any, ...]]) -> tuple[int, tuple[Any, ...]]:
        return acc

    def merge(self, a: tuple[int, tuple[Any, ...]], b: tuple[int, tuple[Any, ...]]
              ) -> tuple[int, tuple[Any, ...]]:
        if a[0] != b[0]:
            return a if a[0] > b[0] else b
        return (a[0], a[1] + b[1])


class HighestBids(KeyedProcessFunction):
    """q7's second step, keyed by window end: merges the per-auction maxima of the window
    and emits the bids with the highest price when the watermark passes its end."""

    def open(self, ctx: Any) -> None:
        self.best = ctx.get_state(ValueStateDescriptor("best"))
        self.merge = MaxBids().merge

    def process_element(self, r: WindowResult, ctx: Any) -> None:
        best = self.best.value()
        if best is None:
            ctx.timer_service.register_event_time_timer(r.end)
            self.best.update(r.value)
        else:
            self.best.update(self.merge(best, r.value))

    def on_timer(self, timestamp: float, ctx: Any) -> list[Any] | None:
        best = self.best.value()
        self.best.clear()
        return list(best[1])


def q7(events: Stream) -> Stream:
    """Highest bid: the bids with the highest price of each tumbling 10 s window (the
    maximum taken per auction first, then per window)."""
    maxima = (events.filter(is_bid, name="q7-bids").key_by(lambda b: b.auction)
              .window(TumblingEventTimeWindows.of(WINDOW_MS / 1000))
              .aggregate(MaxBids(), name="q7-max").uid("q7-max"))
    return maxima.key_by(lambda r: r.end).process(HighestBids(), name="q7").uid("q7-highest")


# ---------------------------------------------------------------------- q8
class NewUsers(KeyedCoProcessFunction):
    """q8's window join, keyed by person id = seller: the person's name and window, the
    windows in which the seller created auctions; at each window's end, the person if
    both are there."""

    def open(self, ctx: Any) -> None:
        self.person = ctx.get_state(ValueStateDescriptor("person"))  # (name, window start ms)
        self.sold = ctx.get_state(MapStateDescriptor("auction-windows"))

    def process_element1(self, p: Person, ctx: Any) -> None:
        start = p.date_time - p.date_time % WINDOW_MS
        self.person.update((p.name, start))
        ctx.timer_service.register_event_time_timer((start + WINDOW_MS) / 1000.0)

    def process_element2(self, a: Auction, ctx: Any) -> None:
        start = a.date_time - a.date_time % WINDOW_MS
        if not self.sold.contains(start):
            self.sold.put(start, True)
            ctx.timer_service.register_event_time_timer((start + WINDOW_MS) / 1000.0)

    def on_timer(self, timestamp: float, ctx: Any) -> list[Any] | None:
        start = round(timestamp * 1000) - WINDOW_MS
        sold = self.sold.contains(start)
        if sold:
            self.sold.remove(start)
        person = self.person.value()
        if person is None or person[1] != start:
            return None
        self.person.clear()
        return [(ctx.current_key, person[0], start)] if sold else None


def q8(events: Stream) -> Stream:
    """New users: people who created an auction in the 10 s window they registered in."""
    events = _persons_and_auctions(events, "q8")
    persons = events.filter(is_person, name="q8-persons").key_by(lambda p: p.id)
    auctions = events.filter(is_auction, name="q8-auctions").key_by(lambda a: a.seller)
    return persons.connect(auctions).process(NewUsers(), name="q8").uid("q8")


QUERIES: dict[str, Callable[[Stream], Stream]] = {
    "q0": q0, "q1": q1, "q2": q2, "q3": q3, "q4": q4, "q5": q5, "q6": q6, "q7": q7, "q8": q8,
}
STATEFUL = ("q3", "q4", "q5", "q6", "q7", "q8")
