"""Shared aggregation (Cutty, thesis chapter 5): FlatFAT, slicing at window begins only,
combine counts against a naive per-window aggregator, and shared windows in a pipeline."""

from __future__ import annotations

import math
import random
from typing import Any

from bench.naive_windows import NaiveAggregator
from reactive import AggregateFunction, Dataflow, SlidingEventTimeWindows, TumblingEventTimeWindows
from reactive.connectors.collections import ListSink
from reactive.windowing import (
    AggregateStats,
    CountWindows,
    CuttyAggregator,
    EventTimeCuttyAggregator,
    FlatFAT,
)

from .test_windows import SumAmount, as_dict, batch_windows, events


class Concat(AggregateFunction):
    """String concatenation: associative, not commutative (checks combine order)."""

    def create_accumulator(self) -> Any:
        return ""

    def add(self, value: Any, acc: Any) -> Any:
        return acc + str(value)

    def get_result(self, acc: Any) -> Any:
        return acc

    def merge(self, a: Any, b: Any) -> Any:
        return a + b


class Sum(AggregateFunction):
    def create_accumulator(self) -> Any:
        return 0

    def add(self, value: Any, acc: Any) -> Any:
        return acc + value

    def get_result(self, acc: Any) -> Any:
        return acc

    def merge(self, a: Any, b: Any) -> Any:
        return a + b


def test_flatfat_matches_brute_force_with_purge_and_growth():
    rnd = random.Random(1)
    fat = FlatFAT(lambda a, b: a + b, AggregateStats(), capacity=4)
    leaves: dict[int, str] = {}
    for step in range(3_000):
        op = rnd.random()
        if op < 0.5 or not leaves:
            leaves[fat.append(f"<{step}>")] = f"<{step}>"
        elif op < 0.6:
            i = rnd.choice(list(leaves))
            leaves[i] = f"[{step}]"
            fat.update(i, leaves[i])
        elif op < 0.7:
            upto = rnd.randint(fat.first, fat.next)
            fat.purge(upto)
            leaves = {i: v for i, v in leaves.items() if i >= upto}
        else:
            lo = rnd.randint(fat.first, fat.next)
            hi = rnd.randint(lo, fat.next)
            expect = "".join(leaves[i] for i in range(lo, hi)) or None
            assert fat.query(lo, hi) == expect


def test_cutty_equals_naive_for_random_periodic_queries():
    rnd = random.Random(2)
    queries = [CountWindows.of(rnd.randint(2, 40), rnd.randint(1, 15)) for _ in range(12)]
    values = list(range(2_000))
    cutty, naive = CuttyAggregator(queries, Concat()), NaiveAggregator(queries, Concat())
    got, want = [], []
    i = 0
    while i < len(values):  # uneven batches
        n = rnd.randint(1, 97)
        got += cutty.add_all(values[i:i + n])
        want += naive.add_all(values[i:i + n])
        i += n
    assert sorted(got) == sorted(want)
    assert {(q, s, e) for q, s, e, _ in want} == {
        (q, s, s + spec.size) for q, spec in enumerate(queries)
        for s in range(0, len(values) - spec.size + 1, spec.slide)}


def test_one_partial_per_slide_and_logarithmic_window_cost():
    # range r = 50, slide s = 20 (r not a multiple of s): Cutty cuts only at window begins,
    # one slice per slide, so a window spans ceil(r/s) = 3 partials; Pairs cuts at begins
    # and ends (every 10 records here), 2 partials per slide.
    r, s, n = 50, 20, 10_000
    cutty = CuttyAggregator([CountWindows.of(r, s)], Sum())
    out = cutty.add_all(list(range(n)))
    windows = len(range(0, n - r + 1, s))
    assert len(out) == windows == cutty.stats.windows
    assert cutty.stats.adds == n  # each record combined exactly once
    cutty_cuts = set(range(0, n, s))
    pairs_cuts = cutty_cuts | {b + r for b in range(0, n, s) if b + r < n}
    assert cutty.stats.slices == n // s == len(cutty_cuts)  # one write per slide: r/s per window
    # Pairs: begins and ends, 2r/s per window (less the ends past the input)
    assert len(pairs_cuts) == 2 * len(cutty_cuts) - len([b for b in cutty_cuts if b + r >= n])
    # each result: a FlatFAT range query plus the running partial, O(log #slices) merges;
    # stored slices are r/s at most, so each store write and query is bounded by log2 of
    # the (small) store capacity
    per_window = cutty.stats.merges / windows
    assert per_window <= 2 * math.log2(cutty.store.fat.cap) + 2
    naive = NaiveAggregator([CountWindows.of(r, s)], Sum())
    assert sorted(naive.add_all(list(range(n)))) == sorted(out)
    # the naive aggregator folds each record into each of its windows: ~r/s adds per record
    assert naive.stats.adds == sum(min(r, n - b) for b in range(0, n, s))


def test_exact_store_writes_and_adds_for_tumbling_and_sliding():
    # tumbling r = s = 8 over 64 records: one store write per window (r/s = 1), each
    # record added once; the store's path updates cost at most log2(capacity) merges each
    cutty = CuttyAggregator([CountWindows.of(8)], Sum())
    res = cutty.add_all(list(range(64)))
    assert [v for *_, v in res] == [sum(range(b, b + 8)) for b in range(0, 64, 8)]
    assert (cutty.stats.adds, cutty.stats.slices, cutty.stats.windows) == (64, 8, 8)
    log_cap = math.log2(cutty.store.fat.cap)
    assert cutty.stats.merges <= cutty.stats.slices * log_cap
    # sliding r = 4s: 4 partials per window (r/s), one write per slide
    c2 = CuttyAggregator([CountWindows.of(8, 2)], Sum())
    res = c2.add_all(list(range(64)))
    assert [v for *_, v in res] == [sum(range(b, b + 8)) for b in range(0, 57, 2)]
    assert (c2.stats.adds, c2.stats.slices, c2.stats.windows) == (64, 32, 29)
    log_cap = math.log2(c2.store.fat.cap)
    assert c2.stats.merges <= (c2.stats.slices + c2.stats.windows) * (2 * log_cap + 1)


def test_sharing_saves_combines_at_100_queries():
    rnd = random.Random(3)
    queries = [CountWindows.of(rnd.randrange(200, 801, 100), rnd.choice([10, 20, 50, 100, 200]))
               for _ in range(100)]
    values = [rnd.randrange(100) for _ in range(20_000)]
    cutty, naive = CuttyAggregator(queries, Sum()), NaiveAggregator(queries, Sum())
    assert sorted(cutty.add_all(values)) == sorted(naive.add_all(values))
    assert naive.stats.combines >= 10 * cutty.stats.combines


def test_event_time_cutty_with_disorder_equals_brute_force():
    rnd = random.Random(4)
    queries = [SlidingEventTimeWindows.of(30, 10), TumblingEventTimeWindows.of(25),
               SlidingEventTimeWindows.of(60, 15)]
    aggr = EventTimeCuttyAggregator(queries, Sum())
    got = []
    ts_values = [(i + rnd.uniform(-5, 0), rnd.randrange(10)) for i in range(0, 3_000)]
    ts_values += [(5_000.0 + i, 1) for i in range(50)]  # after a long empty stretch
    wm = float("-inf")
    for i, (ts, v) in enumerate(ts_values):
        aggr.add(ts, v)
        if i % 37 == 0:
            wm = max(wm, ts - 6)
            got += aggr.advance(wm)
    got += aggr.advance(float("inf"))
    want = {}
    for q, spec in enumerate(queries):
        for ts, v in ts_values:
            for w in spec.assign_windows(ts):
                want[(q, w.start, w.end)] = want.get((q, w.start, w.end), 0) + v
    assert {(q, s, e): acc for q, s, e, acc in got} == want
    assert len(got) == len(want)


async def test_shared_windows_in_a_pipeline_equal_batch():
    data = events(20_000, 5, seed=6, disorder=8.0)
    sink = ListSink()
    flow = Dataflow("shared", parallelism=2, batch_size=256)
    specs = [(60, 20), (40, 40), (100, 25)]
    (flow.from_collection(data).assign_timestamps(lambda r: r[1], 8.0)
         .key_by(lambda r: r[0])
         .windows([SlidingEventTimeWindows.of(s, sl) for s, sl in specs])
         .aggregate(SumAmount()).sink(sink))
    await flow.run()
    for q, (size, slide) in enumerate(specs):
        assert as_dict([r for r in sink.records if r.query == q]) == batch_windows(
            data, size, slide)
