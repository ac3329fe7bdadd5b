"""Shared aggregation (Cutty, thesis chapter 5): FlatFAT, slicing at window begins only,
combine counts against a naive per-window aggregator, and shared windows in a pipeline."""

from __future__ import annotations

import collections
import math
import random
from typing import Any

import pytest

from bench.naive_windows import NaiveAggregator
from reactive import AggregateFunction, Dataflow, SlidingEventTimeWindows, TumblingEventTimeWindows
from reactive.connectors.collections import ListSink
from reactive.windowing import CountWindows
from reactive.windowing.cutty import CuttyAggregator, EventTimeCuttyAggregator
from reactive.windowing.flatfat import AggregateStats, FlatFAT
from tests.windowing.test_windows import SumAmount, as_dict, batch_windows, events


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
    # six times the longest window: every query slides through steady state, where the
    # combine counts of both grow linearly with the input (the ratio is ~85 at any length)
    values = [rnd.randrange(100) for _ in range(5_000)]
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


async def _crashing_run(tmp_path, defs: list[Any]) -> dict[Any, Any]:
    """One job through injected failures: ``defs`` (one definition: a window operator;
    several: the shared operator) reduced with a lambda into one exactly-once sink.
    Returns ``{(query, key, start, end): sum}`` of the committed results."""
    import random as _random

    from reactive import CheckpointConfig, RestartStrategy
    from tests.support import paced
    from tests.windowing.test_windows import GatedInjector, TxnListSink

    data = events(8_000, 6, seed=31, disorder=5.0)
    injector = GatedInjector(_random.Random(4).sample(range(1_000, 5_000), 2), tmp_path)
    add = lambda a, b: (a[0], a[1], a[2] + b[2])  # noqa: E731
    flow = Dataflow("agree", parallelism=2, batch_size=100)
    # the input waits for a completed checkpoint every 1,000 records: the injected failures
    # (each after a completed checkpoint) come however fast the records flow
    keyed = (flow.source(paced(data, every=1_000)).uid("src").map(injector)
             .assign_timestamps(lambda r: r[1], 5.0).key_by(lambda r: r[0]))
    sink = TxnListSink()
    (keyed.windows(defs) if len(defs) > 1 else keyed.window(defs[0])).reduce(add).uid(
        "windows").sink(sink)
    job = await flow.run(checkpoints=CheckpointConfig(interval=0.02, directory=tmp_path),
                         restart=RestartStrategy.fixed(5, 0))
    assert job.metrics.restarts == injector.failures
    out: dict[Any, Any] = {}
    for r in sink.committed:
        k = (r.query, r.key, r.start, r.end)
        assert k not in out, "a window was committed twice"
        out[k] = r.value[2]
    return out


@pytest.mark.parametrize("kind", ["time", "count"])
async def test_shared_and_per_window_paths_agree_with_lambdas_through_crashes(tmp_path, kind):
    """The shared (Cutty) path and one window operator per definition give the same
    results, with a lambda reducer, through failures and restores from checkpoints."""
    defs: list[Any] = ([SlidingEventTimeWindows.of(60, 20), TumblingEventTimeWindows.of(40)]
                       if kind == "time" else [CountWindows.of(7, 3), CountWindows.of(5)])
    via_cutty = await _crashing_run(tmp_path / "shared", defs)
    per_window: dict[Any, Any] = {}
    for q, d in enumerate(defs):
        one = await _crashing_run(tmp_path / f"single{q}", [d])
        per_window.update({(q, *k[1:]): v for k, v in one.items()})
    assert via_cutty == per_window
    if kind == "time":
        data = events(8_000, 6, seed=31, disorder=5.0)
        assert via_cutty == {(q, *k): v[0] for q, (size, slide) in enumerate([(60, 20), (40, 40)])
                             for k, v in batch_windows(data, size, slide).items()}


async def test_two_window_branches_in_one_job_are_exact_through_crashes(tmp_path):
    """Shared windows and a per-window operator on one keyed stream, each into its own
    exactly-once sink (both sinks have the same display name), through failures: each
    branch commits every window once. (The two sink tasks once had the same task id, so
    the checkpoint coordinator took one's acknowledgement for the other's and a recovery
    lost or repeated windows.)"""
    import random as _random

    from reactive import CheckpointConfig, RestartStrategy
    from tests.support import paced
    from tests.windowing.test_windows import GatedInjector, TxnListSink

    data = events(8_000, 6, seed=31, disorder=5.0)
    injector = GatedInjector(_random.Random(4).sample(range(1_000, 5_000), 2), tmp_path)
    add = lambda a, b: (a[0], a[1], a[2] + b[2])  # noqa: E731
    flow = Dataflow("branches", parallelism=2, batch_size=100)
    # the input waits for a completed checkpoint every 1,000 records: the injected failures
    # (each after a completed checkpoint) come however fast the records flow
    keyed = (flow.source(paced(data, every=1_000)).uid("src").map(injector)
             .assign_timestamps(lambda r: r[1], 5.0).key_by(lambda r: r[0]))
    shared, single = TxnListSink(), TxnListSink()
    keyed.windows([SlidingEventTimeWindows.of(60, 20), TumblingEventTimeWindows.of(40)]
                  ).reduce(add).uid("shared").sink(shared)
    keyed.window(SlidingEventTimeWindows.of(60, 20)).reduce(add).uid("single").sink(single)
    job = await flow.run(checkpoints=CheckpointConfig(interval=0.02, directory=tmp_path),
                         restart=RestartStrategy.fixed(5, 0))
    assert job.metrics.restarts == injector.failures >= 1
    for sink, specs in ((shared, [(60, 20), (40, 40)]), (single, [(60, 20)])):
        committed = collections.Counter((r.query, r.key, r.start, r.end, r.value[2])
                                        for r in sink.committed)
        assert max(committed.values()) == 1
        assert {(q, k, s, e): v for q, k, s, e, v in committed} == {
            (q, *k): v[0] for q, (size, slide) in enumerate(specs)
            for k, v in batch_windows(data, size, slide).items()}
