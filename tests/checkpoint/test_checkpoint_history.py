"""``job.metrics`` keeps the latest checkpoints' statistics (a bounded history) and running
totals over all of them; a scrape copies only what is bounded."""

from __future__ import annotations

import asyncio
import copy
import pickle
import urllib.request

import pytest

from reactive import CheckpointConfig, Dataflow, PushSource
from reactive.checkpoint.stats import CheckpointHistory, CheckpointStats
from reactive.connectors.collections import DiscardingSink
from reactive.errors import ConfigurationError


def _ended(cid: int, status: str, duration: float = 1.0, size: int = 100,
           reason: str | None = None) -> CheckpointStats:
    return CheckpointStats(cid, status=status, duration=duration, sync=0.01 * cid, size=size,
                           failure_reason=reason)


def test_the_history_keeps_the_latest_and_the_totals_count_every_one():
    history = CheckpointHistory(size=3)
    late = CheckpointStats(2)  # pending when it falls out of the window, completed later
    history.append(_ended(1, "completed", duration=2.0, size=10))
    history.append(late)
    for cid in range(3, 101):
        if cid % 10 == 0:
            history.append(_ended(cid, "aborted", reason="CHECKPOINT_EXPIRED"))
        else:
            history.append(_ended(cid, "completed"))
    assert [c.checkpoint_id for c in history] == [98, 99, 100]
    before = history.totals()
    assert before.in_progress == 1 and before.completed == 1 + 88
    late.status, late.duration, late.size = "completed", 3.0, 1_000
    totals = history.totals()
    assert totals.in_progress == 0
    assert totals.completed == 90 and totals.aborted == 10
    assert totals.failures == {"CHECKPOINT_EXPIRED": 10}
    assert totals.duration == pytest.approx(2.0 + 3.0 + 88 * 1.0)
    assert totals.size == 10 + 1_000 + 88 * 100
    assert totals.max_sync == pytest.approx(0.99)
    assert totals.last_completed is not None and totals.last_completed.checkpoint_id == 99
    assert history.totals() == totals  # asking again counts nothing twice
    copied = pickle.loads(pickle.dumps(history))
    assert [c.checkpoint_id for c in copied] == [98, 99, 100] and copied.size == 3
    assert copied.totals() == totals == copy.deepcopy(history).totals()


def test_the_history_size_is_checked():
    with pytest.raises(ConfigurationError, match="history"):
        CheckpointConfig(history=0)


async def test_a_long_running_job_keeps_a_bounded_history_and_exact_totals(tmp_path):
    parser = pytest.importorskip("prometheus_client.parser")
    from reactive.metrics_exporter import _Snapshot, serve_metrics

    source = PushSource()
    flow = Dataflow("history")
    flow.source(source).uid("src").map(lambda x: x).uid("m").sink(DiscardingSink()).uid("out")
    job = await flow.start(checkpoints=CheckpointConfig(interval=None, directory=tmp_path,
                                                        history=4))
    sizes = []
    for i in range(12):
        await source.send(i)
        done = await job.checkpoint()
        sizes += [c.size for c in job.metrics.checkpoints if c.checkpoint_id == done.checkpoint_id]
    assert [c.checkpoint_id for c in job.metrics.checkpoints] == list(range(9, 13))
    totals = job.metrics.totals
    assert totals.completed == 12 and totals.aborted == 0
    assert len(sizes) == 12 and totals.size == sum(sizes) > 0
    assert job.metrics.summary()["checkpoints"] == 12
    # a scrape copies the bounded history, not every checkpoint ever taken
    job.metrics.checkpoints.extend(CheckpointStats(1_000 + i, status="completed")
                                   for i in range(10_000))
    assert len(_Snapshot.of(job).checkpoints) == 4
    assert job.metrics.totals.completed == 12 + 10_000
    server = serve_metrics(job, port=0)
    try:
        text = await asyncio.to_thread(
            lambda: urllib.request.urlopen(server.url, timeout=30).read().decode())
    finally:
        await asyncio.to_thread(server.close)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in parser.text_string_to_metric_families(text)
               for s in family.samples}
    assert samples[("reactive_checkpoints_total", (("status", "completed"),))] == 10_012
    assert samples[("reactive_last_checkpoint_id", ())] == 1_000 + 9_999
    assert samples[("reactive_completed_checkpoint_size_bytes_total", ())] == sum(sizes)
    source.close()
    await job.wait()
