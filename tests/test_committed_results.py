"""``job.results(...)``, read committed, at the edges: a failure between a checkpoint's
completion and the sink instance's notification, and an application that reads slowly or
stops reading."""

from __future__ import annotations

from typing import Any

from reactive import CheckpointConfig, Dataflow, RestartStrategy
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
    results = job.results("out")
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
