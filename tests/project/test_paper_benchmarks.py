"""The pieces ``bench/papers.py`` measures with compute what they claim: the window-sharing
strategies give the windows a plain loop gives, and the evaluation pipelines deliver every
stamped record once, in every checkpointing mode."""

from __future__ import annotations

import collections
import random

import pytest

from bench import paper_experiments as E
from bench.window_sharing import NaiveWindows, SlicingWindows
from bench.windows import Sum
from reactive.windowing import CountWindows
from reactive.windowing.cutty import CuttyAggregator
from tests.support import checkpoint_state


def brute_force(records, queries):
    """Every window ``[k * slide, k * slide + size)`` with records that the stream passed
    (a record at or after its end arrived), summed with a plain loop."""
    last = records[-1][0]
    out = []
    for q, (size, slide) in enumerate(queries):
        start = 0.0
        while start + size <= last:
            inside = [v for t, v in records if start <= t < start + size]
            if inside:
                out.append((q, start, start + size, sum(inside)))
            start += slide
    return sorted(out)


def _fold(aggregator, records, batch=97):
    out = []
    for i in range(0, len(records), batch):
        out += aggregator.add_all(records[i:i + batch])
    return sorted((q, float(s), float(e), acc) for q, s, e, acc in out)


@pytest.mark.parametrize("stream", ["count", "event time with gaps"])
def test_every_sharing_strategy_gives_the_windows_of_a_plain_loop(stream):
    rnd = random.Random(7)
    queries = [(float(rnd.randrange(40, 161, 20)), float(rnd.randrange(20, 81, 20)))
               for _ in range(4)] + [(90.0, 30.0)]
    if stream == "count":
        records = [(float(i), rnd.randrange(100)) for i in range(1_500)]
    else:  # bursts and silences, as the flights have at night
        times = sorted(rnd.choice([rnd.uniform(0, 300), rnd.uniform(700, 1_500)])
                       for _ in range(1_200))
        records = [(t, rnd.randrange(10)) for t in times]
    expected = brute_force(records, queries)
    assert expected
    assert _fold(NaiveWindows(queries, Sum()), records) == expected
    for strategy in ("panes", "pairs", "cutty"):
        for store in ("lazy", "eager"):
            got = _fold(SlicingWindows(queries, Sum(), strategy, store), records)
            assert got == expected, (strategy, store)
    if stream == "count":
        # the runtime's Cutty also emits the windows ending exactly at the last position
        runtime = CuttyAggregator([CountWindows.of(int(r), int(s)) for r, s in queries], Sum())
        got = _fold(_Values(runtime), records)
        assert [w for w in got if w[2] <= records[-1][0]] == expected


class _Values:
    def __init__(self, inner):
        self.inner = inner

    def add_all(self, records):
        return self.inner.add_all([v for _, v in records])


@pytest.mark.parametrize("mode", [None, "exactly_once", "synchronous"])
def test_the_abs_evaluation_topology_delivers_every_record_once(tmp_path, mode):
    records, keys = 6_000, 50
    result = E.abs_topology(records, keys, 2, mode, 0.01, tmp_path)
    assert result.received == records
    assert len(result.checkpoints) >= (1 if mode else 0)
    assert result.p50 >= 0 and result.p99 >= result.p50
    if mode is not None:
        key = E.uniform_key(keys)
        expected = collections.Counter()
        for i in range(records):
            expected[key(i)] += 2  # the map doubles the value 1
        # the first aggregate's state in the final checkpoint: a plain group-by sum
        assert checkpoint_state(tmp_path, "abs-eval", "sum0", "sum") == dict(expected)


def test_the_sdg_pipeline_measures_each_update_once_and_keeps_its_state(tmp_path):
    result = E.sdg(1, 3_000, "synchronous", 0.02, tmp_path, rate=20_000)
    # the measured records are the updates only (not the 1,000 loaded values), each once
    assert result.received == 3_000
    assert len(result.checkpoints) >= 2
    # the state holds every loaded key's 1,000-byte value, rewritten in place by updates
    state = checkpoint_state(tmp_path, "sdg", "store", "value")
    assert sorted(state) == list(range(1_000))
    assert all(len(v) == 1_000 for v in state.values())
