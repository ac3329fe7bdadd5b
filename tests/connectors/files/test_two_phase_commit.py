"""Two-phase-commit sinks (thesis 4.1.3-4.1.4, table 4.1) and the checkpoint lifecycle around
them: pre-commit in the snapshot, commit after completion (and on recovery), aborted
checkpoints, several checkpoints in flight, tolerable failed checkpoints.

The sink under test stages records in a shared "external system" (:class:`Probe`) and makes
them visible on commit; visible output is compared with the batch result, so a lost or a
duplicated record fails the test. Tests synchronize on events the sink and the source set,
never on sleeps.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import itertools
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from reactive import (
    CheckpointConfig,
    CheckpointError,
    CheckpointStorage,
    Dataflow,
    JobFailedError,
    RestartStrategy,
    Source,
    SourceReader,
    TwoPhaseCommitSink,
)
from reactive.sinks import SinkWriter
from reactive.two_phase_commit import TwoPhaseCommitWriter
from tests.support import Count, FailureInjector, failing_count, paced, zipf_words

Txn = dict[str, Any]


class Probe:
    """The external system a :class:`RecordingSink` writes to, the test's script of failures,
    and the events tests wait for. Shared by all sink instances and all attempts."""

    def __init__(self, checkpoints: Path | None = None, job: str = "") -> None:
        self.checkpoints = checkpoints
        self.job_name = job
        self.job: Any = None
        self.ids = itertools.count()
        self.staged: dict[str, list[Any]] = {}
        self.precommitted: dict[str, int] = {}  # txn id -> checkpoint id
        self.committed: dict[str, list[Any]] = {}
        self.commits: list[tuple[int, int, int | None]] = []  # (subtask, txn chk, notify chk)
        self.pre_commits: list[tuple[int, int, bool]] = []  # (subtask, checkpoint, succeeded)
        self.lingering_calls: list[tuple[int, int | None]] = []
        self.fail_pre_commit: set[int] = set()
        self.fail_commits = 0
        self.block_pre_commit: asyncio.Event | None = None
        self.notifying: dict[int, int | None] = {}
        self._marks: dict[tuple[str, int], set[int]] = collections.defaultdict(set)
        self._events: dict[tuple[str, int, int], asyncio.Event] = {}
        # the gated source
        self.batches: collections.deque[list[Any]] = collections.deque()
        self.ended = False
        self.source_snapshots = 0
        self.statuses_at_snapshot: list[list[str]] = []

    def visible(self) -> collections.Counter[Any]:
        """Every committed record (a multiset)."""
        return collections.Counter(r for recs in self.committed.values() for r in recs)

    def mark(self, kind: str, n: int, who: int) -> None:
        """Something of ``kind`` (a notification, a batch taken, ...) happened for ``n``."""
        self._marks[kind, n].add(who)
        for (k, m, count), ev in self._events.items():
            if k == kind and m == n and len(self._marks[kind, n]) >= count:
                ev.set()

    async def wait(self, kind: str, n: int, count: int = 1) -> None:
        """Wait until ``count`` distinct parties marked ``(kind, n)``."""
        if len(self._marks[kind, n]) >= count:
            return
        ev = self._events.setdefault((kind, n, count), asyncio.Event())
        await ev.wait()

    def push(self, batch: list[Any]) -> None:
        self.batches.append(batch)


class RecordingSink(TwoPhaseCommitSink[Txn]):
    """Stages each interval's records in the probe; commit makes them visible (idempotent).

    It checks that it commits only transactions of a checkpoint that completed on disk.
    """

    def __init__(self, probe: Probe, asynchronous: bool = False) -> None:
        self.probe = probe
        self.asynchronous = asynchronous

    def create_writer(self, subtask: int, parallelism: int) -> SinkWriter:
        instance = copy.copy(self)
        instance.subtask, instance.parallelism = subtask, parallelism
        return ObservedWriter(instance)

    async def _maybe_yield(self) -> None:
        if self.asynchronous:
            await asyncio.sleep(0)  # a real suspension point, as an async client has

    async def begin_transaction(self) -> Txn:
        await self._maybe_yield()
        txn_id = f"{self.subtask}/{next(self.probe.ids)}"
        self.probe.staged[txn_id] = []
        return {"id": txn_id, "subtask": self.subtask}

    async def write(self, txn: Txn, batch: list[Any]) -> None:
        await self._maybe_yield()
        self.probe.staged[txn["id"]].extend(batch)

    async def pre_commit(self, txn: Txn, checkpoint_id: int) -> None:
        probe = self.probe
        if checkpoint_id in probe.fail_pre_commit:
            probe.pre_commits.append((self.subtask, checkpoint_id, False))
            raise RuntimeError(f"injected pre-commit failure at checkpoint {checkpoint_id}")
        if probe.block_pre_commit is not None:
            await probe.block_pre_commit.wait()
        await self._maybe_yield()
        probe.pre_commits.append((self.subtask, checkpoint_id, True))
        probe.precommitted[txn["id"]] = checkpoint_id
        txn["checkpoint_id"] = checkpoint_id

    async def commit(self, txn: Txn) -> None:
        probe = self.probe
        cid = txn["checkpoint_id"]
        if probe.checkpoints is not None:
            done = [c.checkpoint_id for c in
                    CheckpointStorage(probe.checkpoints, probe.job_name).completed()]
            assert done and max(done) >= cid, f"commit of {cid} before it completed ({done})"
        probe.commits.append((self.subtask, cid, probe.notifying.get(self.subtask)))
        if probe.fail_commits:
            probe.fail_commits -= 1
            raise OSError("injected commit failure")
        await self._maybe_yield()
        if txn["id"] not in probe.committed:  # idempotent: a retry after recovery is a no-op
            probe.committed[txn["id"]] = list(probe.staged[txn["id"]])

    def abort(self, txn: Txn) -> None:
        self.probe.staged.pop(txn["id"], None)

    def abort_lingering(self, restored_checkpoint_id: int | None) -> None:
        probe = self.probe
        probe.lingering_calls.append((self.subtask, restored_checkpoint_id))
        for txn_id in list(probe.staged):
            if not txn_id.startswith(f"{self.subtask}/") or txn_id in probe.committed:
                continue
            cid = probe.precommitted.get(txn_id)
            if cid is None or restored_checkpoint_id is None or cid > restored_checkpoint_id:
                del probe.staged[txn_id]


class ObservedWriter(TwoPhaseCommitWriter[Txn]):
    """Marks each notification in the probe once the writer handled it."""

    sink: RecordingSink

    async def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        probe = self.sink.probe
        probe.notifying[self.sink.subtask] = checkpoint_id
        try:
            await super().notify_checkpoint_complete(checkpoint_id)
        finally:
            probe.notifying[self.sink.subtask] = None
        probe.mark("complete", checkpoint_id, self.sink.subtask)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        super().notify_checkpoint_aborted(checkpoint_id)
        self.sink.probe.mark("aborted", checkpoint_id, self.sink.subtask)


# Hand-written: its snapshot_state records into the probe when the source snapshots
# relative to the sink's transactions; the test checks that order.
class GatedSource(Source):
    """Emits the batches the test pushes into the probe, ``[]`` while there is none (so
    barriers are injected between them), and ends when ``probe.ended`` is set."""

    max_source_parallelism = 1

    def __init__(self, probe: Probe) -> None:
        self.probe = probe

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        return _GatedReader(self.probe)


class _GatedReader(SourceReader):
    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self.taken = 0

    async def read_batch(self, max_records: int) -> list[Any] | None:
        probe = self.probe
        if probe.batches:
            self.taken += 1
            probe.mark("taken", self.taken, 0)
            return probe.batches.popleft()
        return None if probe.ended else []

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        probe = self.probe
        probe.source_snapshots += 1
        if probe.job is not None:
            probe.statuses_at_snapshot.append([s.status for s in probe.job.metrics.checkpoints])
        probe.mark("source snapshot", probe.source_snapshots, 0)
        return [self.taken]

    def restore_state(self, entries: list[Any]) -> None:
        self.taken = entries[0]


def expected(records: Iterable[Any]) -> collections.Counter[Any]:
    """The batch result of the keyed count."""
    counts = collections.Counter(records)
    return collections.Counter((k, i) for k, c in counts.items() for i in range(1, c + 1))


def keys(n: int, start: int = 0) -> list[str]:
    return [f"k{i % 97}" for i in range(start, start + n)]


async def _start_gated(tmp_path: Path, probe: Probe, **config: Any) -> Any:
    probe.checkpoints, probe.job_name = tmp_path, "gated"
    flow = Dataflow("gated", parallelism=2, batch_size=64)
    (flow.source(GatedSource(probe)).uid("src").key_by(lambda k: k)
         .process(Count()).uid("count").sink(RecordingSink(probe)).uid("sink"))
    job = await flow.start(checkpoints=CheckpointConfig(interval=None, directory=tmp_path,
                                                        **config),
                           restart=RestartStrategy.none())
    probe.job = job
    return job


async def _push(probe: Probe, n: int, batch: list[Any]) -> None:
    """Push the n-th batch and wait until the source took it (it is then ahead of any
    barrier triggered afterwards)."""
    probe.push(batch)
    await probe.wait("taken", n)


# ---------------------------------------------------------------------- the writer alone
@pytest.mark.parametrize("asynchronous", [False, True])
async def test_writer_pre_commits_in_snapshot_and_commits_up_to_completed(asynchronous):
    probe = Probe()
    writer = RecordingSink(probe, asynchronous).create_writer(0, 1)
    assert isinstance(writer, TwoPhaseCommitWriter)
    await writer.write([1, 2])
    entries1 = await writer.snapshot_state(1)
    await writer.write([3])
    entries2 = await writer.snapshot_state(2)
    assert await writer.snapshot_state(3) == [{"kind": "epoch", "checkpoint_id": 3, "subtask": 0},
                                             *entries2[1:]]  # empty interval: no transaction
    assert [(e["kind"], e["checkpoint_id"]) for e in entries1] == [("epoch", 1), ("pending", 1)]
    assert [(e["kind"], e["checkpoint_id"]) for e in entries2] == [
        ("epoch", 2), ("pending", 1), ("pending", 2)]
    # an aborted checkpoint commits nothing; the next completed one commits it with its own
    writer.notify_checkpoint_aborted(1)
    assert probe.committed == {}
    await writer.notify_checkpoint_complete(2)
    assert list(probe.committed.values()) == [[1, 2], [3]]
    assert writer.pending == []
    assert probe.lingering_calls == [(0, None)]
    # a crash after checkpoint 2 completed, before its commit: recovery commits, idempotently
    restored = RecordingSink(probe, asynchronous).create_writer(0, 1)
    await restored.restore_state(entries2)
    assert [c[1] for c in probe.commits] == [1, 2, 1, 2]
    assert list(probe.committed.values()) == [[1, 2], [3]]
    assert probe.lingering_calls == [(0, None), (0, 2)]  # after the commits, once


async def test_open_transaction_is_aborted_on_close_and_finish_commits_the_tail():
    probe = Probe()
    writer = RecordingSink(probe).create_writer(0, 1)
    await writer.write(["lost"])
    writer.close()
    assert probe.staged == {} and probe.committed == {}
    writer = RecordingSink(probe).create_writer(0, 1)
    await writer.write(["a"])
    await writer.snapshot_state(4)
    await writer.notify_checkpoint_complete(4)
    await writer.write(["tail"])  # after the final checkpoint (an operator's end of input)
    await writer.finish()
    assert sorted(probe.visible()) == ["a", "tail"]
    assert probe.precommitted[max(probe.committed)] == 5


# ---------------------------------------------------------------------- in a job
@pytest.mark.parametrize("mode", ["exactly_once", "synchronous"])
async def test_pre_commit_failure_aborts_the_checkpoint_and_the_next_one_commits_once(tmp_path,
                                                                                      mode):
    probe = Probe()
    probe.fail_pre_commit = {1}
    job = await _start_gated(tmp_path, probe, mode=mode)
    a, b = keys(500), keys(300, start=500)
    await _push(probe, 1, a)
    with pytest.raises(CheckpointError, match="injected pre-commit failure"):
        await job.checkpoint()
    await probe.wait("aborted", 1, count=2)  # the abort reached both writers
    assert probe.visible() == collections.Counter()
    await _push(probe, 2, b)
    completed = await job.checkpoint()
    assert completed.checkpoint_id == 2
    await probe.wait("complete", 2, count=2)
    # interval 1's output went out with checkpoint 2, once
    assert probe.visible() == expected(a + b)
    assert {(s, c) for s, c, ok in probe.pre_commits if ok} == {(0, 2), (1, 2)}
    probe.ended = True
    await job.wait()
    assert [s.status for s in job.metrics.checkpoints] == ["aborted", "completed", "completed"]
    assert probe.visible() == expected(a + b)


async def test_several_checkpoints_in_flight_commit_in_order(tmp_path):
    probe = Probe()
    probe.block_pre_commit = asyncio.Event()
    job = await _start_gated(tmp_path, probe, max_concurrent=2)
    a, b = keys(400), keys(400, start=400)
    await _push(probe, 1, a)
    async with asyncio.TaskGroup() as tg:
        first = tg.create_task(job.checkpoint())
        await probe.wait("source snapshot", 1)
        await _push(probe, 2, b)
        # both sinks are stuck in the pre-commit of checkpoint 1, yet checkpoint 2 starts
        second = tg.create_task(job.checkpoint())
        await probe.wait("source snapshot", 2)
        assert probe.statuses_at_snapshot[-1] == ["pending", "pending"]
        probe.block_pre_commit.set()
    assert (first.result().checkpoint_id, second.result().checkpoint_id) == (1, 2)
    await probe.wait("complete", 2, count=2)
    # each transaction was committed by the notification of its own checkpoint
    for subtask in (0, 1):
        assert [(c, n) for s, c, n in probe.commits if s == subtask] == [(1, 1), (2, 2)]
    assert probe.visible() == expected(a + b)
    probe.ended = True
    await job.wait()
    assert probe.visible() == expected(a + b)


@pytest.mark.parametrize("tolerable", [0, 2])
async def test_job_fails_after_more_than_tolerable_consecutive_failures(tmp_path, tolerable):
    # `tolerable` failures, a success (which resets the count), `tolerable` failures again
    # (still tolerated), then one more: the job fails (Flink's tolerable-failure semantics)
    plan = [False] * tolerable + [True] + [False] * (tolerable + 1)
    probe = Probe()
    probe.fail_pre_commit = {i + 1 for i, ok in enumerate(plan) if not ok}
    job = await _start_gated(tmp_path, probe, tolerable_failed_checkpoints=tolerable)
    pushed: list[str] = []
    for i, ok in enumerate(plan):
        batch = keys(100, start=100 * i)
        pushed += batch
        await _push(probe, i + 1, batch)
        if ok:
            await job.checkpoint()
        else:
            with pytest.raises(CheckpointError):
                await job.checkpoint()
    with pytest.raises(JobFailedError) as info:
        await job.wait()
    assert isinstance(info.value.__cause__, CheckpointError)
    assert f"{tolerable + 1} consecutive checkpoints failed" in str(info.value.__cause__)
    assert [s.status == "completed" for s in job.metrics.checkpoints] == plan
    # what the one completed checkpoint covered is visible, once; nothing else
    first_ok = plan.index(True)
    assert probe.visible() == expected(pushed[: 100 * (first_ok + 1)])


async def test_commit_failure_after_completion_is_retried_after_recovery(tmp_path):
    words = zipf_words(60_000, 2_000, seed=3)
    probe = Probe(tmp_path, "retry")
    probe.fail_commits = 1
    flow = Dataflow("retry", parallelism=2, batch_size=256)
    (flow.from_collection(words).uid("src").key_by(lambda w: w)
         .process(Count()).uid("count").sink(RecordingSink(probe)).uid("sink"))
    job = await flow.run(checkpoints=CheckpointConfig(interval=0.02, directory=tmp_path),
                         restart=RestartStrategy.fixed(3, 0.0))
    assert job.metrics.restarts == 1
    assert job.metrics.restored_checkpoints  # the recovery restored the completed checkpoint
    failed_cid = probe.commits[0][1]
    # the transaction whose commit failed was committed on recovery, before processing
    assert any(cid == failed_cid and notify is None for _, cid, notify in probe.commits[1:])
    assert probe.visible() == expected(words)
    assert set(probe.staged) == set(probe.committed)  # lingering transactions were aborted


@pytest.mark.parametrize(("seed", "mode"), [(21, "exactly_once"), (22, "exactly_once"),
                                            (23, "synchronous")])
async def test_exactly_once_output_under_failures_and_concurrent_checkpoints(tmp_path, seed,
                                                                             mode):
    words = zipf_words(40_000, 3_000, seed=seed)
    rnd = random.Random(seed)
    # far apart, so each failure is alone in its attempt (one restart per failure); the
    # source waits for a completed checkpoint every 2,000 records, so each attempt restores
    # one taken after the previous failure
    injector = FailureInjector([rnd.randint(4_000, 12_000), rnd.randint(16_000, 24_000),
                                rnd.randint(28_000, 36_000)])
    probe = Probe(tmp_path, "failures")
    flow = Dataflow("failures", parallelism=3, batch_size=256)
    (flow.source(paced(words, every=2_000)).uid("src").key_by(lambda w: w)
         .process(failing_count(injector)).uid("count")
         .sink(RecordingSink(probe, asynchronous=seed % 2 == 0)).uid("sink"))
    # the synchronous baseline takes one checkpoint at a time and halts the sources for each:
    # a longer interval, so that the job does not spend its time halted
    synchronous = mode == "synchronous"
    config = CheckpointConfig(interval=0.02 if synchronous else 0.01, directory=tmp_path,
                              mode=mode, max_concurrent=1 if synchronous else 2)
    job = await flow.run(checkpoints=config, restart=RestartStrategy.fixed(10, 0.0))
    assert injector.failures == 3 and job.metrics.restarts == 3
    assert len(set(job.metrics.restored_checkpoints)) == 3
    assert probe.visible() == expected(words)
    assert set(probe.staged) == set(probe.committed)
