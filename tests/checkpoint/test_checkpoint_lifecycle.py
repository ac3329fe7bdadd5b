"""What a caller of the job handle relies on around checkpoints: awaits that never hang,
operator state captured at the barrier, commits that finish before a stop or the end, and
cancellation that is never swallowed."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Iterable
from typing import Any

import pytest

from reactive import (
    CheckpointConfig,
    CheckpointStorage,
    Dataflow,
    ProcessFunction,
    RestartStrategy,
)
from reactive.connectors.collections import ListSink
from reactive.errors import CheckpointError, JobFailedError, StateSerializationError
from reactive.sources import Source, SourceReader
from reactive.testing import TestingSource
from reactive.two_phase_commit import TwoPhaseCommitSink
from tests.support import paced


# Hand-written: the reader must block inside read_batch, so that no barrier can be
# injected and the checkpoint stays pending, then fail; a TestingSource never blocks there.
class GatedSource(Source):
    """Emits one batch, then waits on ``gate`` (so no barrier can be injected) and raises."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.reading = asyncio.Event()

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        return _GatedReader(self)


class _GatedReader(SourceReader):
    def __init__(self, source: GatedSource) -> None:
        self.source = source
        self.sent = False

    async def read_batch(self, max_records: int) -> list[Any] | None:
        if not self.sent:
            self.sent = True
            return [1, 2, 3]
        self.source.reading.set()
        await self.source.gate.wait()
        raise RuntimeError("the source's input broke")

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        return [self.sent]

    def restore_state(self, entries: list[Any]) -> None:
        self.sent = bool(entries[0])


@pytest.mark.parametrize("attempts", [0, 1])
async def test_pending_checkpoint_fails_when_the_attempt_fails(tmp_path, attempts):
    source = GatedSource()
    flow = Dataflow("gated")
    flow.source(source, uid="src").sink(ListSink())
    job = await flow.start(checkpoints=CheckpointConfig(interval=None, directory=tmp_path),
                           restart=RestartStrategy.fixed(attempts, 0.0))
    await source.reading.wait()
    waiting = asyncio.ensure_future(job.checkpoint())
    source.gate.set()
    # a guard against a hang, not a timing assumption: the failure resolves it at once
    with pytest.raises(CheckpointError):
        await asyncio.wait_for(waiting, timeout=30)
    await job.cancel()


class InPlaceCounter(ProcessFunction):
    """Counts records in a mutable operator-state entry changed in place."""

    def open(self, ctx: Any) -> None:
        state = ctx.get_operator_state("progress")
        if not state.get():
            state.add({"counted": 0})
        self.entry = state.get()[0]

    def process_element(self, value: Any, ctx: Any) -> Iterable[Any]:
        self.entry["counted"] += 1
        yield value


async def test_operator_state_is_captured_at_the_barrier(tmp_path):
    """Every checkpoint's counter equals the source position it was taken with: entries
    changed in place after the barrier never leak into the snapshot."""
    flow = Dataflow("inplace", batch_size=50)
    # the source waits for a completed checkpoint every 10,000 records: five complete while
    # records flow (and more at the 2 ms interval), however fast or slow the machine
    source = paced(range(60_000), every=10_000)
    (flow.source(source, uid="src")
         .process(InPlaceCounter()).uid("counter")
         .sink(ListSink()))
    await flow.run(checkpoints=CheckpointConfig(interval=0.002, directory=tmp_path,
                                                retained=1000))
    completed = CheckpointStorage(tmp_path, "inplace").completed()
    assert len(completed) >= 5
    for chk in completed:
        states = {}
        for uid in ("src", "counter"):
            handle = chk.metadata.operators[uid].subtasks[0].operator_state
            states[uid] = pickle.loads((chk.job_dir / handle.files[0].path).read_bytes())
        position = states["src"]["source-position"][1][0]  # an index among the markers
        read = sum(1 for item in source.items[:position] if item is not TestingSource.CHECKPOINT)
        counted = states["counter"]["progress"][1][0]["counted"]
        assert counted == read, f"checkpoint {chk.checkpoint_id}"


class SlowCommitSink(TwoPhaseCommitSink[list[Any]]):
    """A sink whose commit is a coroutine that takes a while (remote storage, say)."""

    def __init__(self) -> None:
        self.committed: list[Any] = []

    def begin_transaction(self) -> list[Any]:
        return []

    def write(self, txn: list[Any], batch: list[Any]) -> None:
        txn.extend(batch)

    def pre_commit(self, txn: list[Any], checkpoint_id: int) -> None:
        pass

    async def commit(self, txn: list[Any]) -> None:
        for _ in range(5):
            await asyncio.sleep(0.01)  # the remote call's latency, not a race guard
        self.committed.extend(txn)
        txn.clear()  # a retried commit after a restore must not add it twice

    def abort(self, txn: list[Any]) -> None:
        txn.clear()


async def test_stop_with_savepoint_waits_for_coroutine_commits(tmp_path):
    sink = SlowCommitSink()
    flow = Dataflow("stopping")
    # records, then an open stream: the job runs until it is stopped
    flow.source(TestingSource([*range(20_000), TestingSource.HOLD], batch_size=10),
                uid="src").sink(sink).uid("sink")
    job = await flow.start(checkpoints=CheckpointConfig(interval=None, directory=tmp_path))
    while sum(c["records_in"] for c in job.metrics.operators.values()) < 200:
        await asyncio.sleep(0.005)
    savepoint = await job.stop(savepoint=True, path=tmp_path / "sp")
    await job.wait()
    position = pickle.loads((savepoint.path / "src-0.opstate").read_bytes())
    # every record before the savepoint's barrier is committed, none after it
    assert sink.committed == list(range(position["source-position"][1][0]))


async def test_end_of_job_waits_for_coroutine_commits(tmp_path):
    sink = SlowCommitSink()
    flow = Dataflow("ending", parallelism=2)
    flow.from_collection(range(5_000)).uid("src").rebalance().sink(sink).uid("sink")
    await flow.run(checkpoints=CheckpointConfig(interval=0.01, directory=tmp_path))
    assert sorted(sink.committed) == list(range(5_000))


# Hand-written: the test is about how a reader that is slow to stop on cancellation is
# awaited (a SourceReader behaviour, not a record script).
class SlowTeardownSource(Source):
    """Its reader takes a while to stop when cancelled (it flushes something remote)."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.release = asyncio.Event()

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        return _SlowTeardownReader(self)


class _SlowTeardownReader(SourceReader):
    def __init__(self, source: SlowTeardownSource) -> None:
        self.source = source

    async def read_batch(self, max_records: int) -> list[Any] | None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.source.cancelled.set()
            await asyncio.shield(self.source.release.wait())
            raise
        return None

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        return []

    def restore_state(self, entries: list[Any]) -> None:
        pass


async def test_cancel_propagates_the_callers_own_cancellation():
    source = SlowTeardownSource()
    flow = Dataflow("teardown")
    flow.source(source, uid="src").sink(ListSink())
    job = await flow.start()
    caller = asyncio.ensure_future(job.cancel())
    await source.cancelled.wait()  # the job is tearing down; the caller awaits it
    caller.cancel()
    source.release.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert caller.cancelled()


class Unpicklable(ProcessFunction):
    def open(self, ctx: Any) -> None:
        state = ctx.get_operator_state("handles")
        state.update([lambda: None])  # a function object: not picklable

    def process_element(self, value: Any, ctx: Any) -> Iterable[Any]:
        yield value


async def test_unpicklable_operator_state_fails_the_job_at_once(tmp_path):
    flow = Dataflow("unpicklable")
    flow.from_collection(range(50_000)).uid("src").process(Unpicklable()).uid("op") \
        .sink(ListSink())
    job = await flow.start(checkpoints=CheckpointConfig(interval=0.01, directory=tmp_path),
                           restart=RestartStrategy.fixed(3, 0.0))
    with pytest.raises(JobFailedError) as info:
        await job.wait()
    cause = info.value.__cause__
    assert isinstance(cause, StateSerializationError)
    assert "'op'" in str(cause) and "'handles'" in str(cause)
    assert info.value.attempts == 1  # a restart would only fail the same way
