"""The Nexmark queries as batch computations with pandas over the same events: the
reference every streaming query's output is checked against (each returns the multiset of
result rows the query must emit, in the query's row shape; see :mod:`.queries`)."""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

import pandas as pd

from reactive.connectors.nexmark import Auction, Bid, Person

from .queries import HOP_MS, Q3_STATES, Q6_LAST, WINDOW_MS

__all__ = ["Tables", "expected", "q4_closed", "q4_totals"]

Rows = collections.Counter[tuple[Any, ...]]


class Tables:
    """The events as three DataFrames (persons, auctions, bids; columns as the records)."""

    def __init__(self, events: Sequence[Any]) -> None:
        self.persons = pd.DataFrame([e for e in events if type(e) is Person],
                                    columns=list(Person._fields))
        self.auctions = pd.DataFrame([e for e in events if type(e) is Auction],
                                     columns=list(Auction._fields))
        self.bids = pd.DataFrame([e for e in events if type(e) is Bid], columns=list(Bid._fields))


def _rows(df: pd.DataFrame, columns: list[str]) -> Rows:
    return collections.Counter(
        tuple(v.item() if hasattr(v, "item") else v for v in row)
        for row in df[columns].itertuples(index=False, name=None))


def _q0(t: Tables) -> Rows:
    return _rows(t.bids, ["auction", "bidder", "price", "date_time", "extra"])


def _q1(t: Tables) -> Rows:
    b = t.bids.assign(price=t.bids.price * 0.908)
    return _rows(b, ["auction", "bidder", "price", "date_time", "extra"])


def _q2(t: Tables) -> Rows:
    return _rows(t.bids[t.bids.auction % 123 == 0], ["auction", "price"])


def _q3(t: Tables) -> Rows:
    p = t.persons[t.persons.state.isin(sorted(Q3_STATES))]
    a = t.auctions[t.auctions.category == 10]
    m = a.merge(p, left_on="seller", right_on="id", suffixes=("_a", "_p"))
    return _rows(m, ["name", "city", "state", "id_a"])


def q4_closed(t: Tables) -> Rows:
    """q4's first step: ``(auction, category, final price)`` per auction with a bid in its
    lifetime (``MAX(B.price) ... GROUP BY A.id, A.category``)."""
    m = t.auctions.merge(t.bids, left_on="id", right_on="auction", suffixes=("_a", "_b"))
    m = m[(m.date_time_b >= m.date_time_a) & (m.date_time_b <= m.expires)]
    g = m.groupby(["id", "category"], as_index=False).price.max()
    return _rows(g, ["id", "category", "price"])


def q4_totals(t: Tables) -> dict[int, tuple[int, int]]:
    """q4 per category: ``(number of closed auctions, sum of their final prices)``."""
    out: dict[int, tuple[int, int]] = {}
    for (_, category, price), n in q4_closed(t).items():
        count, total = out.get(category, (0, 0))
        out[category] = (count + n, total + price * n)
    return out


def _q6(t: Tables) -> Rows:
    m = t.auctions.merge(t.bids, left_on="id", right_on="auction", suffixes=("_a", "_b"))
    m = m[(m.date_time_b >= m.date_time_a) & (m.date_time_b <= m.expires)]
    closed = m.groupby(["id", "seller", "expires"], as_index=False).price.max()
    out: Rows = collections.Counter()
    for seller, g in closed.sort_values(["expires", "id"]).groupby("seller", sort=False):
        prices = [int(p) for p in g.price]
        for i in range(len(prices)):
            last = prices[max(0, i + 1 - Q6_LAST):i + 1]
            out[(int(seller), sum(last) / len(last))] += 1
    return out


def _q5(t: Tables) -> Rows:
    b = t.bids[["auction", "date_time"]]
    last = b.date_time - b.date_time % HOP_MS
    hops = pd.concat([b.assign(start=last - j * HOP_MS) for j in range(WINDOW_MS // HOP_MS)])
    counts = hops.groupby(["start", "auction"], as_index=False).size()
    top = counts.groupby("start")["size"].transform("max")
    hot = counts[counts["size"] == top].assign(end=lambda d: d.start + WINDOW_MS)
    return _rows(hot, ["auction", "size", "start", "end"])


def _q7(t: Tables) -> Rows:
    b = t.bids.assign(window=t.bids.date_time - t.bids.date_time % WINDOW_MS)
    top = b.groupby("window")["price"].transform("max")
    return _rows(b[b.price == top], ["auction", "bidder", "price", "date_time", "extra"])


def _q8(t: Tables) -> Rows:
    p = t.persons.assign(start=t.persons.date_time - t.persons.date_time % WINDOW_MS)
    a = t.auctions.assign(start=t.auctions.date_time - t.auctions.date_time % WINDOW_MS)
    sellers = a[["seller", "start"]].drop_duplicates()
    m = p.merge(sellers, left_on=["id", "start"], right_on=["seller", "start"])
    return _rows(m, ["id", "name", "start"])


_QUERIES = {"q0": _q0, "q1": _q1, "q2": _q2, "q3": _q3, "q5": _q5, "q6": _q6, "q7": _q7, "q8": _q8}


def expected(query: str, tables: Tables) -> Rows:
    """The rows ``query`` must emit over the events of ``tables`` (q4: its first step's,
    see :func:`q4_closed` and :func:`q4_totals`)."""
    if query == "q4":
        return q4_closed(tables)
    return _QUERIES[query](tables)
