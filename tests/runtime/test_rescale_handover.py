"""The in-memory hand-over of ``job.rescale`` (:mod:`reactive.runtime.handover`): on the
heap backend the new instances take over the old instances' key groups (and timers) by
reference at the rescale barrier, with no restore of the rescale checkpoint; every other
case restores the checkpoint and says why. Exactly once either way."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from reactive import (
    CheckpointConfig,
    Dataflow,
    KeyedProcessFunction,
    PushSource,
    ReconfigurationError,
    RestartStrategy,
    TumblingEventTimeWindows,
    ValueStateDescriptor,
)
from reactive.backends.heap import HeapStateBackend
from reactive.backends.rocksdb import RocksDBStateBackend
from reactive.connectors.collections import ListSink
from reactive.connectors.files import CommittingFileSink
from reactive.state.backend import KeyedStateBackend, KeyedStateSnapshot
from tests.connectors.files.test_committing_file_sink import committed_records
from tests.runtime.test_job_rescale import WORDS, _expected, _flow, _send_rounds
from tests.support import Count, FailureInjector, failing_count
from tests.windowing.test_windows import SumAmount

STEPS: list[Any] = [4, {"count": 3}, 1, {"count": 2, "files": 3}]


async def _rescale_steps(tmp_path: Path, incremental: bool = False,
                         **rescale: Any) -> tuple[Any, list[int]]:
    """W1 over a push source, rescaled through ``STEPS`` with 3 rounds of words before
    each and after the last; checks that counts and committed output are exact."""
    source = PushSource()
    out = tmp_path / "out"
    job = await _flow("handover", source, out).start(
        checkpoints=CheckpointConfig(interval=0.05, directory=str(tmp_path / "chk"),
                                     retained=100),
        state_backend=HeapStateBackend(incremental=incremental))
    results = job.results("out")
    ids = []
    for step in STEPS:
        await _send_rounds(source, 3)
        ids.append((await job.rescale(step, **rescale)).checkpoint_id)
        assert job.status == "running"
    await _send_rounds(source, 3)
    source.close()
    got = [r async for r in results]
    await job.wait()
    rounds = 3 * (len(STEPS) + 1)
    for w in WORDS:
        assert [n for k, n in got if k == w] == list(range(1, rounds + 1))
    assert sorted(got) == _expected(rounds)
    assert committed_records(out) == collections.Counter(_expected(rounds))
    assert job.parallelism == {"src": 1, "count": 2, "out": 1, "files": 3}
    assert job.metrics.restarts == 0
    return job, ids


@pytest.mark.parametrize("incremental", [False, True])
async def test_a_heap_rescale_hands_the_state_over_without_a_restore(tmp_path, incremental):
    job, ids = await _rescale_steps(tmp_path, incremental)
    # every rescale took the state over in memory: no attempt restored a checkpoint
    assert job.metrics.handed_over == ids
    assert job.metrics.restored_checkpoints == []
    assert job._runner.rescale_transfers == [(i, "in memory") for i in ids]
    assert all("restore" not in phases and "hand-over" in phases
               for phases in job._runner.rescale_phases)


async def test_state_transfer_checkpoint_restores_the_rescale_checkpoint(tmp_path):
    job, ids = await _rescale_steps(tmp_path, state_transfer="checkpoint")
    assert job.metrics.handed_over == []
    assert job.metrics.restored_checkpoints == ids
    assert all(why.startswith("checkpoint restored: state_transfer='checkpoint'")
               for _, why in job._runner.rescale_transfers)


async def test_a_rocksdb_rescale_restores_the_checkpoint_and_says_why(tmp_path):
    source = PushSource()
    out = tmp_path / "out"
    job = await _flow("handover-rocksdb", source, out).start(
        checkpoints=CheckpointConfig(interval=None, directory=str(tmp_path / "chk")),
        state_backend=RocksDBStateBackend(path=tmp_path / "db"))
    results = job.results("out")
    await _send_rounds(source, 3)
    completed = await job.rescale(3)
    await _send_rounds(source, 3)
    source.close()
    assert sorted([r async for r in results]) == _expected(6)
    await job.wait()
    assert job.metrics.restored_checkpoints == [completed.checkpoint_id]
    assert job.metrics.handed_over == []
    [(cid, why)] = job._runner.rescale_transfers
    assert cid == completed.checkpoint_id
    assert "RocksDB" in why and "cannot hand its key groups over" in why
    assert committed_records(out) == collections.Counter(_expected(6))


def _windows(source: PushSource, sink: Any, parallelism: int) -> Dataflow:
    flow = Dataflow("handover-windows", parallelism=parallelism)
    (flow.source(source).uid("src").assign_timestamps(lambda r: r[1], 2.0)
     .key_by(lambda r: r[0]).windows([TumblingEventTimeWindows.of(10)])
     .aggregate(SumAmount()).uid("windows").sink(sink).uid("out"))
    return flow


def _records(first: int, last: int) -> list[tuple[str, float, int]]:
    return [(f"k{i}", float(t), t % 7 + 1) for t in range(first, last) for i in range(12)]


@pytest.mark.parametrize("transfer", ["auto", "checkpoint"])
async def test_event_time_timers_move_with_their_key_groups(tmp_path, transfer):
    """Windows whose end timers were registered before a rescale fire once after it, at
    the instances that took their key groups over: the output equals a run that never
    rescaled."""
    async def run(rescale: bool) -> tuple[list[Any], Any]:
        source, sink = PushSource(), ListSink()
        job = await _windows(source, sink, 2).start(
            checkpoints=CheckpointConfig(interval=None, directory=str(tmp_path / str(rescale))),
            state_backend=HeapStateBackend())
        results = job.results("out")
        for r in _records(0, 25):
            await source.send(r)
        if rescale:
            await job.rescale(3, state_transfer=transfer)
        for r in _records(25, 60):
            await source.send(r)
        source.close()
        got = [r async for r in results]
        await job.wait()
        return got, job

    expected, _ = await run(False)
    got, job = await run(True)
    assert sorted(map(repr, got)) == sorted(map(repr, expected))
    # windows [20, 30) of every key were open at the barrier (watermark < 25)
    assert len(expected) == 12 * 6
    assert bool(job.metrics.handed_over) == (transfer == "auto")


class _Remind(KeyedProcessFunction):
    """Counts per key and registers a processing-time timer an hour ahead per key (it
    never fires in the test; it is pending at the rescale's barrier)."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def process_element(self, word: str, ctx: Any) -> Iterable[Any]:
        n = self.count.value() + 1
        self.count.update(n)
        ctx.timer_service.register_processing_time_timer(
            ctx.timer_service.current_processing_time() + 3600.0)
        yield (word, n)


async def test_pending_processing_time_timers_make_the_rescale_restore(tmp_path):
    """A processing-time timer could fire between the barrier and the switch, changing
    state the barrier's capture shares: the rescale restores its checkpoint instead."""
    source = PushSource()
    flow = Dataflow("handover-timers", parallelism=2)
    (flow.source(source).uid("src").key_by(lambda w: w).process(_Remind()).uid("count")
     .sink(ListSink()).uid("out"))
    job = await flow.start(checkpoints=CheckpointConfig(interval=None,
                                                        directory=str(tmp_path / "chk")),
                           state_backend=HeapStateBackend())
    results = job.results("out")
    await _send_rounds(source, 2)
    completed = await job.rescale(3)
    await _send_rounds(source, 2)
    source.close()
    assert sorted([r async for r in results]) == _expected(4)
    await job.wait()
    assert job.metrics.restored_checkpoints == [completed.checkpoint_id]
    assert job.metrics.handed_over == []
    [(_, why)] = job._runner.rescale_transfers
    assert "operator 'count' has processing-time timers" in why


@pytest.mark.parametrize("incremental", [False, True])
async def test_a_failure_after_handed_over_rescales_restores_exactly(tmp_path, incremental):
    """A failure after two handed-over rescales and a checkpoint of the new instances
    restores that checkpoint, exactly once."""
    injector = FailureInjector([len(WORDS) * 9 + 25])
    source = PushSource()
    out = tmp_path / "out"
    job = await _flow("handover-then-fail", source, out, failing_count(injector)).start(
        checkpoints=CheckpointConfig(interval=None, directory=str(tmp_path / "chk")),
        state_backend=HeapStateBackend(incremental=incremental),
        restart=RestartStrategy.fixed(1, delay=0.0))
    results = job.results("out")
    await _send_rounds(source, 4)
    first = await job.rescale(3)
    await _send_rounds(source, 3)
    second = await job.rescale(1)
    await _send_rounds(source, 1)
    after = await job.checkpoint()
    await _send_rounds(source, 3)  # the count fails in the second of these rounds
    source.close()
    got = [r async for r in results]
    await job.wait()
    assert injector.failures == 1
    assert job.metrics.handed_over == [first.checkpoint_id, second.checkpoint_id]
    assert job.metrics.restored_checkpoints == [after.checkpoint_id]
    assert sorted(got) == _expected(11)
    assert committed_records(out) == collections.Counter(_expected(11))


class _GatedSnapshot(KeyedStateSnapshot):
    """A heap snapshot whose asynchronous part starts once ``gate`` is set; the first one
    to start while ``fail`` is set fails (and clears it)."""

    def __init__(self, inner: KeyedStateSnapshot, gate: asyncio.Event,
                 fail: asyncio.Event) -> None:
        self.inner = inner
        self.gate = gate
        self.fail = fail

    async def write(self) -> dict[str, Any]:
        await self.gate.wait()
        if self.fail.is_set():
            self.fail.clear()
            self.inner.discard()
            raise OSError("injected: the snapshot cannot be written")
        return await self.inner.write()

    def discard(self) -> None:
        self.inner.discard()


class _GatedHeap(HeapStateBackend):
    """The heap backend, its snapshots written only while ``gate`` is set."""

    def __init__(self, gate: asyncio.Event, fail: asyncio.Event | None = None) -> None:
        super().__init__()
        self.gate = gate
        self.fail = fail or asyncio.Event()

    def create_keyed_backend(self, **kwargs: Any) -> KeyedStateBackend:
        backend = super().create_keyed_backend(**kwargs)
        snapshot = backend.snapshot

        def gated(ctx: Any) -> KeyedStateSnapshot:
            return _GatedSnapshot(snapshot(ctx), self.gate, self.fail)

        backend.snapshot = gated  # type: ignore[method-assign]
        return backend


async def _take(results: Any, n: int) -> list[Any]:
    return [await anext(results) for _ in range(n)]


async def test_the_rescaled_tasks_run_while_the_rescale_checkpoint_is_written(tmp_path):
    """Handed over in memory, the new tasks start at the rescale's barrier: records flow
    through them while the old instances' snapshots are still to be written; those
    snapshots hold the state at the barrier (copy-on-write through the new instances),
    and output stays exactly once."""
    gate = asyncio.Event()
    gate.set()
    source = PushSource()
    out = tmp_path / "out"
    job = await _flow("at-barrier", source, out).start(
        checkpoints=CheckpointConfig(interval=None, directory=str(tmp_path / "chk")),
        state_backend=_GatedHeap(gate))
    live = job.results("out", committed=False)
    committed = job.results("out")
    await _send_rounds(source, 2)
    assert len(await _take(live, 2 * len(WORDS))) == 2 * len(WORDS)
    gate.clear()  # the rescale checkpoint's asynchronous parts wait
    rescale = asyncio.ensure_future(job.rescale(3))
    async with asyncio.timeout(30):  # on a switch after the checkpoint: never
        while job.parallelism["count"] != 3:  # the new tasks took over
            await asyncio.sleep(0.005)
        await _send_rounds(source, 1)
        after = await _take(live, len(WORDS))
    assert sorted(after) == sorted((w, 3) for w in WORDS)
    assert not rescale.done()
    gate.set()
    completed = await rescale
    # the rescale checkpoint holds the counts at its barrier, not the ones after it
    assert {await job.query_state("count", "count", w) for w in WORDS} == {2}
    assert await job.query_state("count", "count", "w0", committed=False) == 3
    await _send_rounds(source, 1)
    source.close()
    got = [r async for r in committed]
    await job.wait()
    assert sorted(got) == _expected(4)
    assert committed_records(out) == collections.Counter(_expected(4))
    assert job.metrics.handed_over == [completed.checkpoint_id]
    assert job._runner.rescale_transfers == [(completed.checkpoint_id, "in memory")]
    assert job.metrics.restarts == 0


class _FencingFileSink(CommittingFileSink):
    """A file sink that declares, as a Kafka sink does, that its new instances must not
    start while old ones hold pre-committed transactions."""

    overlapping_instances = False


async def test_a_sink_that_cannot_overlap_makes_the_switch_wait_for_the_checkpoint(tmp_path):
    """A two-phase-commit sink without ``overlapping_instances``: the state is still handed
    over in memory, but the new tasks start after the rescale's checkpoint committed."""
    source = PushSource()
    out = tmp_path / "out"
    flow = Dataflow("fencing", parallelism=2)
    counts = (flow.source(source).uid("src").key_by(lambda w: w).process(Count()).uid("count"))
    counts.sink(_FencingFileSink(out)).uid("files")
    job = await flow.start(
        checkpoints=CheckpointConfig(interval=None, directory=str(tmp_path / "chk")),
        state_backend=HeapStateBackend())
    await _send_rounds(source, 2)
    first = await job.rescale(3)
    await _send_rounds(source, 1)
    second = await job.rescale(1)
    await _send_rounds(source, 1)
    source.close()
    await job.wait()
    assert committed_records(out) == collections.Counter(_expected(4))
    assert job.metrics.handed_over == [first.checkpoint_id, second.checkpoint_id]
    assert all("teardown" in p and "barrier" not in p for p in job._runner.rescale_phases)


async def test_a_rescale_checkpoint_failing_after_the_switch_restarts_exactly(tmp_path):
    """The new tasks ran from the barrier on, and then the rescale's checkpoint failed: the
    attempt restarts from the last completed checkpoint at its parallelism, the new
    tasks' output is never committed, and the input after it is processed again, once."""
    gate, fail = asyncio.Event(), asyncio.Event()
    gate.set()
    source = PushSource()
    out = tmp_path / "out"
    job = await _flow("fails-after-switch", source, out).start(
        checkpoints=CheckpointConfig(interval=None, directory=str(tmp_path / "chk")),
        state_backend=_GatedHeap(gate, fail), restart=RestartStrategy.fixed(1, delay=0.0))
    committed = job.results("out")
    await _send_rounds(source, 2)
    before = await job.checkpoint()
    await _send_rounds(source, 1)
    gate.clear()
    rescale = asyncio.ensure_future(job.rescale(3))
    async with asyncio.timeout(30):
        while job.parallelism["count"] != 3:  # the new tasks took over
            await asyncio.sleep(0.005)
    await _send_rounds(source, 1)
    fail.set()
    gate.set()
    with pytest.raises(ReconfigurationError, match="the attempt fails and restarts"):
        await rescale
    await _send_rounds(source, 1)
    source.close()
    got = [r async for r in committed]
    await job.wait()
    assert sorted(got) == _expected(5)
    assert committed_records(out) == collections.Counter(_expected(5))
    assert job.metrics.restarts == 1
    assert job.metrics.restored_checkpoints == [before.checkpoint_id]
    assert job.metrics.handed_over == []
    assert job.parallelism["count"] == 2
