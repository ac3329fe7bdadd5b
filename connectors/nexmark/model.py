"""The three Nexmark event kinds as records (Flink nexmark's ``Person``, ``Auction`` and
``Bid``), and their event time.

Records are named tuples: cheap to build, to pickle into state and to compare. Times are
integers in milliseconds since the epoch (Flink's ``TIMESTAMP(3)``); :func:`event_time`
gives the runtime's event time in seconds. The file and Arrow forms use Flink's column names
(``emailAddress``, ``dateTime`` ...), listed in :data:`PERSON_COLUMNS` and its siblings.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["AUCTION_COLUMNS", "BID_COLUMNS", "PERSON_COLUMNS", "Auction", "Bid", "Event",
           "EventType", "Person", "event_time"]


class Person(NamedTuple):
    """A new user of the auction site (event type 0)."""

    id: int
    name: str
    email_address: str
    credit_card: str
    city: str
    state: str
    date_time: int
    extra: str


class Auction(NamedTuple):
    """A new auction (event type 1): open from ``date_time`` to ``expires`` (ms)."""

    id: int
    item_name: str
    description: str
    initial_bid: int
    reserve: int
    date_time: int
    expires: int
    seller: int
    category: int
    extra: str


class Bid(NamedTuple):
    """A bid on an auction (event type 2); ``price`` in cents."""

    auction: int
    bidder: int
    price: int
    channel: str
    url: str
    date_time: int
    extra: str


Event = Person | Auction | Bid


class EventType:
    """The ``event_type`` column of the file and Arrow forms."""

    PERSON = 0
    AUCTION = 1
    BID = 2


PERSON_COLUMNS = ("id", "name", "emailAddress", "creditCard", "city", "state", "dateTime",
                  "extra")
AUCTION_COLUMNS = ("id", "itemName", "description", "initialBid", "reserve", "dateTime",
                   "expires", "seller", "category", "extra")
BID_COLUMNS = ("auction", "bidder", "price", "channel", "url", "dateTime", "extra")


def event_time(event: Event) -> float:
    """The event time of a record, in seconds (``date_time / 1000``)."""
    return event.date_time / 1000.0
