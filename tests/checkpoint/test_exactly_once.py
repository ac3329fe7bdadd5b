"""Exactly-once state under failure: a keyed count with injected failures and restarts."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from reactive import CheckpointConfig, Dataflow, RestartStrategy
from reactive.connectors.collections import ListSink
from tests.support import (
    FailureInjector,
    checkpoint_state,
    failing_count,
    final_counts,
    paced,
)


def _run_counting(words: list[str], tmp_path: Path, mode: str, seed: int):
    rnd = random.Random(seed)
    # failure points at least 4,000 records apart, so each ends its own attempt
    injector = FailureInjector(4_000 * k + rnd.randrange(2_000)
                               for k in rnd.sample(range(1, len(words) // 4_000), 4))
    sink = ListSink()
    flow = Dataflow("count", parallelism=2, max_parallelism=128, batch_size=256)
    (flow.source(paced(words, every=2_000)).uid("words")
         .key_by(lambda w: w)
         .process(failing_count(injector)).uid("count")
         .sink(sink))
    # the source waits for a completed checkpoint every 2,000 records: checkpoints complete
    # between two injected failures whatever the machine, so recovery restores real ones
    return flow, sink, injector, CheckpointConfig(interval=0.01, directory=tmp_path, mode=mode)


@pytest.mark.parametrize("mode", ["exactly_once", "synchronous"])
async def test_keyed_count_is_exact_after_failures(few_words, few_truth, tmp_path, mode):
    flow, sink, injector, config = _run_counting(few_words, tmp_path, mode, seed=11)
    job = await flow.run(checkpoints=config, restart=RestartStrategy.fixed(10, 0.0))
    assert injector.failures == 4
    assert job.metrics.restarts == 4
    # recovery restored real checkpoints, not only fresh starts
    assert job.metrics.restored_checkpoints
    assert final_counts(sink.records) == few_truth
    # the state itself, as the job's final checkpoint holds it, is exact
    assert checkpoint_state(tmp_path, "count", "count", "count") == few_truth


async def test_at_least_once_never_undercounts(few_words, few_truth, tmp_path):
    flow, _sink, _injector, config = _run_counting(few_words, tmp_path, "at_least_once", seed=12)
    job = await flow.run(checkpoints=config, restart=RestartStrategy.fixed(10, 0.0))
    assert job.metrics.restarts == 4
    counts = checkpoint_state(tmp_path, "count", "count", "count")
    assert counts.keys() == few_truth.keys()
    assert all(counts[k] >= few_truth[k] for k in few_truth)


async def test_without_failures_output_is_exact_and_once(few_words, few_truth, tmp_path):
    sink = ListSink()
    flow = Dataflow("plain", parallelism=3)
    flow.from_collection(few_words).key_by(lambda w: w).reduce(
        lambda a, b: a, name="first").sink(sink)
    flow2_sink = ListSink()
    flow2 = Dataflow("plain2", parallelism=2)
    (flow2.from_collection(few_words).map(lambda w: (w, 1))
          .key_by(lambda t: t[0]).reduce(lambda a, b: (a[0], a[1] + b[1]))
          .sink(flow2_sink))
    await flow.run(checkpoints=CheckpointConfig(interval=0.05, directory=tmp_path))
    await flow2.run()
    assert len(sink.records) == len(few_words)
    assert final_counts(flow2_sink.records) == few_truth
