"""``job.results(...)``, read committed, at the edges: a failure between a checkpoint's
completion and the sink instance's notification, and an application that reads slowly or
stops reading."""

from __future__ import annotations

import asyncio
from typing import Any

from reactive import CheckpointConfig, Dataflow, RestartStrategy
from reactive.connectors.collections import ListSink
from reactive.testing import TestingSource
from reactive.two_phase_commit import TwoPhaseCommitSink


class _FlakyCommitSink(TwoPhaseCommitSink[dict[str, Any]]):
    """An in-memory two-phase-commit sink whose instance ``failing`` fails its first
    ``commit`` (a transient error: the job restarts and the restore commits again)."""

    def __init__(self, failing: int) -> None:
        # shared by the instances (shallow copies)
        self.committed: list[Any] = []
        self.committed_ids: set[tuple[int, int]] = set()
        self.failing = failing
        self.fails = [1]
        self.begun = [0]

    def begin_transaction(self) -> dict[str, Any]:
        self.begun[0] += 1
        return {"id": (self.subtask, self.begun[0]), "records": []}

    def write(self, txn: dict[str, Any], batch: list[Any]) -> None:
        txn["records"].extend(batch)

    def pre_commit(self, txn: dict[str, Any], checkpoint_id: int) -> None:
        pass

    def commit(self, txn: dict[str, Any]) -> None:
        if self.subtask == self.failing and self.fails[0]:
            self.fails[0] -= 1
            raise OSError("transient commit failure")
        if txn["id"] not in self.committed_ids:  # idempotent: a retry adds nothing twice
            self.committed_ids.add(txn["id"])
            self.committed.extend(txn["records"])

    def abort(self, txn: dict[str, Any]) -> None:
        txn["records"].clear()


async def _run_flaky(tmp_path, parallelism: int) -> tuple[list[Any], list[Any]]:
    n = 600
    items: list[Any] = []
    for i in range(n):
        items.append(i)
        if i % 100 == 99:
            items.append(TestingSource.CHECKPOINT)  # wait for a completed checkpoint
    sink = _FlakyCommitSink(failing=parallelism - 1)
    flow = Dataflow("tap-recovery", parallelism=parallelism)
    (flow.source(TestingSource(items, batch_size=10)).uid("src")
         .map(lambda x: x).uid("m")
         .sink(sink).uid("out"))
    job = await flow.start(checkpoints=CheckpointConfig(interval=0.05, directory=str(tmp_path)),
                           restart=RestartStrategy.fixed(5, 0.0))
    results = job.results("out", capacity=500)
    seen = [r async for r in results]
    await job.wait()
    assert job.metrics.restarts == 1
    return seen, sink.committed


async def test_records_of_a_checkpoint_whose_notification_a_failure_cut_off_are_released(
        tmp_path):
    """A commit that fails between the checkpoint's completion and the sink's notification
    fails the attempt; the restore releases the restored checkpoint's held records (as the
    two-phase-commit writer commits its pending transactions): every record once."""
    seen, committed = await _run_flaky(tmp_path, parallelism=1)
    assert sorted(committed) == list(range(600))
    assert sorted(seen) == list(range(600))


async def test_no_duplicate_when_one_instance_was_notified_and_another_was_not(tmp_path):
    """Two sink instances: one commits (and releases) checkpoint n, the other fails on it;
    the restore releases only what the failing one held."""
    seen, committed = await _run_flaky(tmp_path, parallelism=2)
    assert sorted(committed) == list(range(600))
    assert sorted(seen) == list(range(600))


def _counting_flow(n: int, out: ListSink) -> Dataflow:
    items: list[Any] = []
    for i in range(n):
        items.append(i)
        if i % 1_000 == 999:
            items.append(TestingSource.CHECKPOINT)  # checkpoints complete while records flow
    flow = Dataflow("slow-reader", parallelism=1)
    (flow.source(TestingSource(items, batch_size=100)).uid("src")
         .map(lambda x: x).uid("m")
         .sink(out).uid("out"))
    return flow


async def test_a_slow_reader_bounds_what_the_job_keeps_for_it(tmp_path):
    """The application reads one record per two loop turns while the job moves batches of
    100: the records the sink received and the application did not read yet stay within the
    iterator's capacity plus what no completed checkpoint covers yet (a checkpoint completes
    every 1,000 records); all arrive, in order. (Unbounded, about half the output waits.)"""
    n = 30_000
    out = ListSink()
    job = await _counting_flow(n, out).start(
        checkpoints=CheckpointConfig(interval=0.01, directory=str(tmp_path)))
    results = job.results("out", capacity=500)
    seen: list[Any] = []
    most_waiting = most_buffered = 0
    async for record in results:
        seen.append(record)
        most_waiting = max(most_waiting, len(out.records) - len(seen))
        most_buffered = max(most_buffered, results.buffered)
        for _ in range(2):  # a reader slower than the job
            await asyncio.sleep(0)
    await job.wait()
    assert seen == list(range(n))
    # released and unread: the capacity, then the records of one checkpoint (the barrier
    # may fall anywhere before a marker: up to two markers' worth) and a batch
    assert most_buffered <= 500 + 2 * 1_000 + 100
    # and what the sink holds for checkpoints not completed yet (up to two markers' worth)
    assert most_waiting <= 500 + 4 * 1_000 + 100

async def test_a_closed_iterator_no_longer_holds_the_job_back(tmp_path):
    """The application reads a record and closes the iterator: nothing more is kept for it
    and the job, whose output is far beyond the iterator's capacity, runs to its end."""
    out = ListSink()
    job = await _counting_flow(20_000, out).start(
        checkpoints=CheckpointConfig(interval=0.01, directory=str(tmp_path)))
    async with job.results("out", capacity=10) as results:
        async for first in results:
            assert first == 0
            break
    await asyncio.wait_for(job.wait(), timeout=60)  # a job held back would never end
    assert len(out.records) == 20_000
    assert results.closed and results.buffered == 0
    assert [r async for r in results] == []


async def test_asking_after_records_reached_the_sink_says_so(tmp_path, caplog):
    from reactive import PushSource

    source = PushSource()
    out = ListSink()
    flow = Dataflow("late-subscriber", parallelism=1)
    flow.source(source).uid("src").map(lambda x: x).uid("m").sink(out).uid("out")
    job = await flow.start(checkpoints=CheckpointConfig(interval=None, directory=str(tmp_path)))
    early = job.results("out")
    assert "asked after" not in caplog.text
    last = 0
    for i in range(5):
        last = await source.send(i)
    while source.durable <= last:
        await job.checkpoint()
    late = job.results("out")
    assert "results('out') asked after 5 records reached the sink" in caplog.text
    await source.send(5)
    source.close()
    assert [r async for r in early] == [0, 1, 2, 3, 4, 5]
    assert [r async for r in late] == [5]
    await job.wait()
