"""The Nexmark generator, vectorized: the events of any set of event numbers as columns
(numpy), then as records or as an Arrow record batch.

The rules are those of the Nexmark specification as Flink nexmark's and Beam's
``NexmarkGenerator`` implement them (Tucker et al., "NEXMark - A Benchmark for Queries over
Data Streams", 2008; ``GeneratorConfig``, ``PersonGenerator``, ``AuctionGenerator``,
``BidGenerator``):

- event number ``n`` becomes event id ``(n // g) * g + (n * 953) % g`` (``g`` the
  out-of-order group size), which decides its kind (``id % 50``: 1 person, then 3
  auctions, then 46 bids), its ids and its timestamp ``base + id * 1e6 / rate`` us;
- a person or an auction takes the next id of its kind; a bid goes to the current hot
  auction (the first of each hundred) or to a random one of the last 100 in flight
  (plus 10 ids ahead), by the hot bidder or a random one of the 1,000 active people;
- an auction lasts on average as long as it takes to generate 100 more auctions.

Random draws come from a counter-based generator (splitmix64 of seed, event id and draw
index) instead of one seeded ``java.util.Random`` per event, so a whole batch of events is
drawn with a few numpy operations, and an event does not depend on any other. Strings are
slices of one pseudo-random text drawn from the seed, made either as Python lists (for
records) or directly as Arrow string arrays from gathered bytes (for record batches, with
no Python object per value); both forms hold the same strings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np

from .config import FIRST_AUCTION_ID, FIRST_CATEGORY_ID, FIRST_PERSON_ID, NexmarkConfig
from .model import Auction, Bid, Event, EventType, Person

__all__ = ["EventColumns", "generate_columns", "to_records"]

NUM_CATEGORIES = 5
PERSON_ID_LEAD = 10
AUCTION_ID_LEAD = 10
HOT_SELLER_RATIO = 100
HOT_AUCTION_RATIO = 100
HOT_BIDDER_RATIO = 100
HOT_CHANNELS_RATIO = 2
CHANNELS_NUMBER = 10_000
US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend",
             "Redmond", "Seattle", "Kent", "Cheyenne")
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah",
               "Deiter", "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones",
              "Noris")
HOT_CHANNELS = ("Google", "Facebook", "Baidu", "Apple")
HOT_URLS = tuple(f"https://www.nexmark.com/{c.lower()}/item.htm?query=1" for c in HOT_CHANNELS)

_POOL_SIZE = 1 << 16
_MAX_SLICE = 512
_U = np.uint64
_GOLDEN = _U(0x9E3779B97F4A7C15)
_MIX1 = _U(0xBF58476D1CE4E5B9)
_MIX2 = _U(0x94D049BB133111EB)


@dataclass
class EventColumns:
    """The events of a run of event numbers, as columns.

    Attributes:
        event_type: per event, in event-number order: 0 person, 1 auction, 2 bid (int8).
        persons, auctions, bids: the columns of the events of each kind, in event-number
            order, keyed by the record's field names: numpy int64 arrays, and lists of str
            (``pyarrow.StringArray`` s when generated with ``arrow=True``).
        positions: per kind, the indices of its events among all (int64 arrays).
    """

    event_type: np.ndarray
    persons: dict[str, Any]
    auctions: dict[str, Any]
    bids: dict[str, Any]
    positions: tuple[np.ndarray, np.ndarray, np.ndarray]

    def __len__(self) -> int:
        return len(self.event_type)


class _Pool:
    """The text strings are cut from, and the channel cache, per seed."""

    _cache: dict[int, _Pool] = {}

    def __init__(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz ", dtype=np.uint8)
        codes = letters[rng.integers(0, 27, _POOL_SIZE + _MAX_SLICE)]
        self.text = codes.tobytes().decode("ascii")
        self.channels = [f"channel-{n}" for n in range(CHANNELS_NUMBER)]
        self.urls = [f"https://www.nexmark.com/item.htm?query=1&channel_id={n}"
                     for n in range(CHANNELS_NUMBER)]
        # a channel index below len(HOT_CHANNELS) is a hot channel, above a numbered one
        self.channel_table = [*HOT_CHANNELS, *self.channels]
        self.url_table = [*HOT_URLS, *self.urls]

    @classmethod
    def of(cls, seed: int) -> _Pool:
        pool = cls._cache.get(seed)
        if pool is None:
            pool = cls._cache[seed] = _Pool(seed)
        return pool

    def strings(self, offsets: np.ndarray, lengths: np.ndarray) -> list[str]:
        text = self.text
        return [text[o:o + n] for o, n in zip(offsets.tolist(), lengths.tolist(), strict=True)]


class _ListText:
    """String columns as Python lists (the records' form). The loops run in C (``map``
    over bound methods), not in Python bytecode."""

    _names = [f"{a} {b}" for a in FIRST_NAMES for b in LAST_NAMES]

    def __init__(self, pool: _Pool) -> None:
        self.pool = pool

    def slices(self, offsets: np.ndarray, lengths: np.ndarray) -> Any:
        return list(map(self.pool.text.__getitem__,
                        map(slice, offsets.tolist(), (offsets + lengths).tolist())))

    def pick(self, table: Sequence[str], index: np.ndarray) -> Any:
        return list(map(table.__getitem__, index.tolist()))

    def names(self, first: np.ndarray, last: np.ndarray) -> Any:
        return self.pick(self._names, first * len(LAST_NAMES) + last)

    def emails(self, users: Any, hosts: Any) -> Any:
        return [f"{u}@{h}.com" for u, h in zip(users, hosts, strict=True)]

    def cards(self, digits: list[np.ndarray]) -> Any:
        return [f"{a:04d} {b:04d} {c:04d} {e:04d}"
                for a, b, c, e in zip(*(d.tolist() for d in digits), strict=True)]

    def channels(self, hot: np.ndarray, hot_i: np.ndarray, other_i: np.ndarray
                 ) -> tuple[Any, Any]:
        index = np.where(hot, hot_i, len(HOT_CHANNELS) + other_i)
        return (self.pick(self.pool.channel_table, index),
                self.pick(self.pool.url_table, index))


class _ArrowText:
    """String columns as ``pyarrow.StringArray`` s, built from gathered bytes and table
    lookups (``take``) without a Python object per value; the same strings as
    :class:`_ListText`."""

    _cache: dict[int, _ArrowText] = {}

    def __init__(self, pool: _Pool) -> None:
        import pyarrow as pa

        self.pa = pa
        self.text = np.frombuffer(pool.text.encode("ascii"), dtype=np.uint8)
        self.name_table = pa.array([f"{a} {b}" for a in FIRST_NAMES for b in LAST_NAMES])
        self.digits = pa.array([f"{n:04d}" for n in range(10_000)])
        self.channel_table = pa.array(pool.channel_table)
        self.url_table = pa.array(pool.url_table)

    @classmethod
    def of(cls, pool: _Pool) -> _ArrowText:
        # pools live as long as the process (cached per seed), so their ids are unique
        text = cls._cache.get(id(pool))
        if text is None:
            text = cls._cache[id(pool)] = _ArrowText(pool)
        return text

    def slices(self, offsets: np.ndarray, lengths: np.ndarray) -> Any:
        n = len(lengths)
        width = int(lengths.max()) if n else 0
        # value i is text[offsets[i]:offsets[i] + lengths[i]]: the rows of a strided
        # (n, width) view of the text cut to their lengths, in one copy of the bytes
        windows = np.lib.stride_tricks.as_strided(
            self.text, shape=(len(self.text) - width + 1, width), strides=(1, 1), writeable=False)
        data = windows[offsets][np.arange(width) < lengths[:, None]]
        value_offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(lengths, out=value_offsets[1:])
        return self.pa.StringArray.from_buffers(n, self.pa.py_buffer(value_offsets),
                                                self.pa.py_buffer(data))

    def pick(self, table: Sequence[str], index: np.ndarray) -> Any:
        return self.pa.array(table).take(index)

    def names(self, first: np.ndarray, last: np.ndarray) -> Any:
        return self.name_table.take(first * len(LAST_NAMES) + last)

    def emails(self, users: Any, hosts: Any) -> Any:
        import pyarrow.compute as pc

        return pc.binary_join_element_wise(users, pc.binary_join_element_wise(hosts, "com", "."),
                                           "@")

    def cards(self, digits: list[np.ndarray]) -> Any:
        import pyarrow.compute as pc

        return pc.binary_join_element_wise(*(self.digits.take(d) for d in digits), " ")

    def channels(self, hot: np.ndarray, hot_i: np.ndarray, other_i: np.ndarray
                 ) -> tuple[Any, Any]:
        index = np.where(hot, hot_i, len(HOT_CHANNELS) + other_i)
        return self.channel_table.take(index), self.url_table.take(index)


class _Draws:
    """Counter-based random draws for a set of event ids: draw ``k`` of event ``id`` is
    splitmix64(seed, id, k), so it depends on nothing else."""

    def __init__(self, seed: int, ids: np.ndarray) -> None:
        seed_mix = _mix(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))[0]
        self.base = ids.astype(np.uint64) * _GOLDEN + seed_mix
        self.k = 0

    def bits(self) -> np.ndarray:
        self.k += 1
        return _mix(self.base + _U((self.k * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF))

    def below(self, bound: np.ndarray | int) -> np.ndarray:
        """Uniform integers in ``[0, bound)`` (int64)."""
        return (self.bits() % np.asarray(bound, dtype=np.uint64)).astype(np.int64)

    def unit(self) -> np.ndarray:
        """Uniform floats in ``[0, 1)``."""
        return (self.bits() >> _U(11)).astype(np.float64) * (1.0 / (1 << 53))


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer (Steele, Lea and Flood, OOPSLA 2014), on uint64 arrays."""
    x = x ^ (x >> _U(30))
    x = x * _MIX1
    x = x ^ (x >> _U(27))
    x = x * _MIX2
    return np.asarray(x ^ (x >> _U(31)))


def _timestamps(config: NexmarkConfig, ids: np.ndarray) -> np.ndarray:
    # Java's (long)(n * delayUs) / 1000: truncate, then integer division
    us = (ids.astype(np.float64) * config.inter_event_delay_us).astype(np.int64)
    return config.base_time_ms + us // 1000


def _last_person(config: NexmarkConfig, ids: np.ndarray) -> np.ndarray:
    """The last person id (base 0) generated at or before each event id."""
    t, p = config.total_proportion, config.person_proportion
    offset = ids % t
    return np.asarray((ids // t) * p + np.minimum(offset, p - 1))


def _last_auction(config: NexmarkConfig, ids: np.ndarray) -> np.ndarray:
    """The last auction id (base 0) generated at or before each event id."""
    t, p, a = config.total_proportion, config.person_proportion, config.auction_proportion
    epoch, offset = ids // t, ids % t
    before = offset < p
    epoch = epoch - before
    offset = np.where(before | (offset >= p + a), a - 1, offset - p)
    return np.asarray(epoch * a + offset)


def _random_person(config: NexmarkConfig, ids: np.ndarray, draws: _Draws) -> np.ndarray:
    """A random one of the active people, or a few ids ahead (base 0)."""
    people = _last_person(config, ids) + 1
    active = np.minimum(people, config.num_active_people)
    return np.asarray(people - active + draws.below(active + PERSON_ID_LEAD))


def _prices(draws: _Draws) -> np.ndarray:
    """Prices spread over six decades (cents): round(10 ** (6u) * 100)."""
    return np.floor(10.0 ** (draws.unit() * 6.0) * 100.0 + 0.5).astype(np.int64)


def _lengths(draws: _Draws, max_length: int) -> np.ndarray:
    return 3 + draws.below(max_length - 3)


def _extra_lengths(draws: _Draws, current: np.ndarray | int, average: int, n: int
                   ) -> np.ndarray:
    """Lengths of the ``extra`` padding: about ``average - current``, +-20%."""
    desired = np.maximum(average - np.broadcast_to(np.asarray(current, dtype=np.int64), (n,)), 0)
    delta = np.floor(desired * 0.2 + 0.5).astype(np.int64)
    spread = draws.below(np.maximum(2 * delta, 1))
    return np.where(delta > 0, desired - delta + spread, desired).clip(0, _MAX_SLICE)


Text = _ListText | _ArrowText


def _strings(text: Text, draws: _Draws, lengths: np.ndarray) -> Any:
    return text.slices(draws.below(_POOL_SIZE), lengths)


def _persons(config: NexmarkConfig, text: Text, ids: np.ndarray, ts: np.ndarray
             ) -> dict[str, Any]:
    n = len(ids)
    d = _Draws(config.seed, ids)
    first, last = d.below(len(FIRST_NAMES)), d.below(len(LAST_NAMES))
    names = text.names(first, last)
    user_len, host_len = _lengths(d, 7), _lengths(d, 5)
    users, hosts = _strings(text, d, user_len), _strings(text, d, host_len)
    emails = text.emails(users, hosts)
    cards = text.cards([d.below(10_000) for _ in range(4)])
    city_i, state_i = d.below(len(US_CITIES)), d.below(len(US_STATES))
    city_len = np.array([len(c) for c in US_CITIES])[city_i]
    name_len = (np.array([len(x) for x in FIRST_NAMES])[first]
                + np.array([len(x) for x in LAST_NAMES])[last] + 1)
    current = 8 + name_len + user_len + host_len + 5 + 19 + city_len + 2
    extra = _strings(text, d, _extra_lengths(d, current, config.avg_person_byte_size, n))
    return {
        "id": _last_person(config, ids) + FIRST_PERSON_ID,
        "name": names,
        "email_address": emails,
        "credit_card": cards,
        "city": text.pick(US_CITIES, city_i),
        "state": text.pick(US_STATES, state_i),
        "date_time": ts,
        "extra": extra,
    }


def _auctions(config: NexmarkConfig, text: Text, ids: np.ndarray, ts: np.ndarray
              ) -> dict[str, Any]:
    n = len(ids)
    d = _Draws(config.seed, ids)
    hot = d.below(config.hot_sellers_ratio) > 0
    hot_seller = (_last_person(config, ids) // HOT_SELLER_RATIO) * HOT_SELLER_RATIO
    seller = np.where(hot, hot_seller, _random_person(config, ids, d)) + FIRST_PERSON_ID
    category = FIRST_CATEGORY_ID + d.below(NUM_CATEGORIES)
    initial = _prices(d)
    # an auction lasts, on average, until num_in_flight_auctions more auctions were made
    ahead = (config.num_in_flight_auctions * config.total_proportion) // config.auction_proportion
    horizon = _timestamps(config, ids + ahead) - ts
    expires = ts + 1 + d.below(np.maximum(horizon * 2, 1))
    name_len, desc_len = _lengths(d, 20), _lengths(d, 100)
    item_names, descriptions = _strings(text, d, name_len), _strings(text, d, desc_len)
    reserve = initial + _prices(d)
    current = 8 + name_len + desc_len + 40
    extra = _strings(text, d, _extra_lengths(d, current, config.avg_auction_byte_size, n))
    return {
        "id": _last_auction(config, ids) + FIRST_AUCTION_ID,
        "item_name": item_names,
        "description": descriptions,
        "initial_bid": initial,
        "reserve": reserve,
        "date_time": ts,
        "expires": expires,
        "seller": seller,
        "category": category,
        "extra": extra,
    }


def _bids(config: NexmarkConfig, text: Text, ids: np.ndarray, ts: np.ndarray
          ) -> dict[str, Any]:
    n = len(ids)
    d = _Draws(config.seed, ids)
    last_auction = _last_auction(config, ids)
    hot = d.below(config.hot_auction_ratio) > 0
    low = np.maximum(last_auction - config.num_in_flight_auctions, 0)
    in_flight = low + d.below(last_auction - low + 1 + AUCTION_ID_LEAD)
    auction = np.where(hot, (last_auction // HOT_AUCTION_RATIO) * HOT_AUCTION_RATIO, in_flight)
    hot = d.below(config.hot_bidders_ratio) > 0
    hot_bidder = (_last_person(config, ids) // HOT_BIDDER_RATIO) * HOT_BIDDER_RATIO + 1
    bidder = np.where(hot, hot_bidder, _random_person(config, ids, d))
    price = _prices(d)
    hot = d.below(HOT_CHANNELS_RATIO) > 0
    hot_i, other_i = d.below(len(HOT_CHANNELS)), d.below(CHANNELS_NUMBER)
    channel, url = text.channels(hot, hot_i, other_i)
    extra = _strings(text, d, _extra_lengths(d, 32, config.avg_bid_byte_size, n))
    return {
        "auction": auction + FIRST_AUCTION_ID,
        "bidder": bidder + FIRST_PERSON_ID,
        "price": price,
        "channel": channel,
        "url": url,
        "date_time": ts,
        "extra": extra,
    }


def generate_columns(config: NexmarkConfig, numbers: np.ndarray | Sequence[int],
                     arrow: bool = False) -> EventColumns:
    """The events at ``numbers`` (event numbers, any order, each < ``num_events``).

    Args:
        config: the stream's parameters.
        numbers: event numbers (int64).
        arrow: string columns as ``pyarrow.StringArray`` s instead of lists (needs
            pyarrow; the same strings).

    Returns:
        their events as columns, in the order of ``numbers``.
    """
    numbers = np.asarray(numbers, dtype=np.int64)
    g = config.out_of_order_group_size
    ids = (numbers // g) * g + (numbers * 953) % g if g > 1 else numbers
    ts = _timestamps(config, ids)
    rem = ids % config.total_proportion
    kind = np.full(len(ids), EventType.BID, dtype=np.int8)
    kind[rem < config.person_proportion + config.auction_proportion] = EventType.AUCTION
    kind[rem < config.person_proportion] = EventType.PERSON
    pool = _Pool.of(config.seed)
    text: Text = _ArrowText.of(pool) if arrow else _ListText(pool)
    positions = tuple(np.flatnonzero(kind == k) for k in (0, 1, 2))
    p, a, b = positions
    return EventColumns(
        kind,
        _persons(config, text, ids[p], ts[p]),
        _auctions(config, text, ids[a], ts[a]),
        _bids(config, text, ids[b], ts[b]),
        (p, a, b),
    )


_new_tuple = tuple.__new__


def _make(cls: type, columns: dict[str, Any]) -> list[Any]:
    """Records of the named-tuple ``cls`` from its columns (``tuple.__new__`` mapped in C:
    a third of the cost of ``cls._make`` in a comprehension)."""
    fields: tuple[str, ...] = cls._fields  # type: ignore[attr-defined]
    cols = [c.tolist() if isinstance(c, np.ndarray) else c for c in (columns[f] for f in fields)]
    return list(map(_new_tuple, repeat(cls), zip(*cols, strict=True)))


def to_records(columns: EventColumns) -> list[Event]:
    """The events as :class:`Person`, :class:`Auction` and :class:`Bid` records, in order."""
    out: list[Any] = [None] * len(columns)
    for kind, cls, data in ((0, Person, columns.persons), (1, Auction, columns.auctions),
                            (2, Bid, columns.bids)):
        where = columns.positions[kind]
        if not len(where):
            continue
        records = _make(cls, data)
        if len(where) == len(out):
            return records
        for i, record in zip(where.tolist(), records, strict=True):
            out[i] = record
    return out
