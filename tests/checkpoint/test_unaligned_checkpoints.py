"""Unaligned checkpoints (``CheckpointConfig(unaligned=True)``, Flink's FLIP-76): barriers
overtake the records queued in the channels, which are stored with the snapshot and replayed
on restore. Exactly once through an injected failure, a restore at another parallelism and
SIGKILL, against a batch computation of the same input."""

from __future__ import annotations

import asyncio
import collections
import os
import pickle
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from reactive import (
    CheckpointConfig,
    CheckpointStorage,
    ConfigurationError,
    Dataflow,
    JobFailedError,
    RestartStrategy,
)
from reactive.checkpoint.channel_state import InFlightEntry, assign_in_flight
from reactive.connectors.collections import ListSink
from reactive.connectors.files import CommittingFileSink
from reactive.keygroups import KeyGroupAssigner
from reactive.runtime.channel import Channel, InputGate, OvertakingBarrier
from reactive.runtime.events import CheckpointBarrier
from reactive.testing import TestingSource
from tests.connectors.files.test_committing_file_sink import (
    committed_records,
    expected_output,
    hidden_files,
)
from tests.pipelines import committing_file_job as pipeline
from tests.runtime.test_connected_streams import Enrich, users_and_clicks
from tests.support import Count, FailureInjector, checkpoint_state, paced, zipf_words

#: CPU seconds the keyed count spends per record: slower than the source, so the channels in
#: front of it stay full and every unaligned checkpoint has records in flight. Measured on the
#: thread's CPU clock, not the wall clock: on a loaded machine a wall-clock wait ends while
#: the process is descheduled, the count catches up with the source and drains its channels.
RECORD_COST = 20e-6


def slow_count(injector: FailureInjector | None = None) -> Count:
    class SlowCount(Count):
        inj = injector  # a class attribute: shared by every instance and attempt

        def process_element(self, value: Any, ctx: Any) -> Any:
            if self.inj is not None:
                self.inj.tick()
            end = time.thread_time() + RECORD_COST
            while time.thread_time() < end:
                pass
            return super().process_element(value, ctx)

    return SlowCount()


def _signalling_count(reached: asyncio.Event, at: int) -> Count:
    """:func:`slow_count` that sets ``reached`` once its instances have taken ``at`` records
    in all."""

    class SignallingCount(type(slow_count())):  # type: ignore[misc]
        taken = 0  # a class attribute: shared by every instance

        def process_element(self, value: Any, ctx: Any) -> Any:
            SignallingCount.taken += 1
            if SignallingCount.taken == at:
                reached.set()
            return super().process_element(value, ctx)

    return SignallingCount()


def _flow(words: list[str], fn: Count, parallelism: int, name: str = "unaligned",
          paced_every: int | None = 8_000) -> Dataflow:
    """One source (parallelism 1) -> a map at ``parallelism`` (a rebalance edge) -> key_by ->
    a slow keyed count: both kinds of in-flight records, split and keyed. The source waits
    for a completed checkpoint every ``paced_every`` records (None: never)."""
    flow = Dataflow(name, parallelism=parallelism, max_parallelism=16, batch_size=128)
    source = paced(words, every=paced_every) if paced_every else TestingSource(words)
    (flow.source(source).uid("src").set_parallelism(1)
         .map(lambda w: w).uid("map")
         .key_by(lambda w: w).process(fn).uid("count").sink(ListSink()))
    return flow


def _in_flight(chk: Any) -> dict[str, int]:
    """Operator uid -> how many of its instances stored in-flight records in ``chk``."""
    out: dict[str, int] = {}
    for uid, op in chk.metadata.operators.items():
        n = sum(1 for sub in op.subtasks.values() if sub.channel_state is not None)
        if n:
            out[uid] = n
    return out


def _config(directory: Path) -> CheckpointConfig:
    return CheckpointConfig(interval=0.05, directory=directory, retained=20, unaligned=True)


# ---------------------------------------------------------------------- the channel
async def test_an_overtaking_barrier_is_delivered_before_the_queued_records() -> None:
    ch = Channel(capacity=8)
    gate = InputGate([ch])
    await ch.put([1])
    await ch.put([2])
    first, second = CheckpointBarrier(1, 0.0, unaligned=True), CheckpointBarrier(2, 0.0, unaligned=True)
    ch.put_unbounded([3])  # over no capacity limit: the producer's unsent buffer
    ch.put_overtaking(first)
    await ch.put([4])
    ch.put_overtaking(second)  # behind the first overtaking barrier, ahead of the records
    gate.block(0)  # a blocked channel still delivers an overtaking barrier
    _, a = await gate.get()
    _, b = await gate.get()
    assert isinstance(a, OvertakingBarrier) and a.barrier is first and a.overtaken == 3
    assert ch.overtaken(a.overtaken) == [[1], [2], [3]]
    assert isinstance(b, OvertakingBarrier) and b.barrier is second and b.overtaken == 4
    assert ch.overtaken(b.overtaken) == [[1], [2], [3], [4]]
    gate.unblock_all()
    assert [(await gate.get())[1] for _ in range(4)] == [[1], [2], [3], [4]]


def test_unaligned_checkpoints_are_exactly_once() -> None:
    with pytest.raises(ConfigurationError, match="unaligned"):
        CheckpointConfig(unaligned=True, mode="at_least_once")


# ---------------------------------------------------------------------- in process
async def test_state_is_exact_after_failures_restored_from_unaligned_checkpoints(tmp_path) -> None:
    """Two failovers, each restoring an unaligned checkpoint that holds records in flight
    towards the count: the failover replays them (lost, the counts would be short; twice,
    too high).

    In each attempt the test triggers the checkpoint once the counts have taken 500 records
    (their input channels full, as in
    :func:`test_unaligned_checkpoints_complete_under_backpressure_and_are_marked`), then has
    the next record fail; with no periodic checkpoints, that is the one restored."""
    words = zipf_words(40_000, 500, seed=3)

    reached = asyncio.Event()  # the current attempt's counts took 500 records

    class FailingOnDemand(type(slow_count())):  # type: ignore[misc]
        # class attributes, shared by every instance of every attempt
        attempt = 0  # bumped by each injected failure
        taken = 0  # records taken by the current attempt's instances
        fail_next = False
        failures = 0

        def open(self, ctx: Any) -> None:
            super().open(ctx)
            self.opened_in = FailingOnDemand.attempt  # instances of a failed attempt stop counting

        def process_element(self, value: Any, ctx: Any) -> Any:
            cls = FailingOnDemand
            if cls.fail_next:
                cls.fail_next = False
                cls.failures += 1
                cls.attempt += 1
                cls.taken = 0
                raise RuntimeError(f"injected failure #{cls.failures}")
            if self.opened_in == cls.attempt:
                cls.taken += 1
                if cls.taken == 500:
                    reached.set()
            return super().process_element(value, ctx)

    job = await _flow(words, FailingOnDemand(), 2, paced_every=None).start(
        checkpoints=CheckpointConfig(interval=None, directory=tmp_path, unaligned=True),
        restart=RestartStrategy.fixed(3, 0.0))
    taken = []
    for _ in (1, 2):
        await reached.wait()  # in the second round: 500 records into the restarted attempt
        taken.append(await job.checkpoint())
        in_flight = _in_flight(CheckpointStorage.load(taken[-1].path))
        assert "count" in in_flight, in_flight
        reached.clear()
        FailingOnDemand.fail_next = True
    await job.wait()
    assert FailingOnDemand.failures == 2 and job.metrics.restarts == 2
    assert job.metrics.restored_checkpoints == [c.checkpoint_id for c in taken]
    assert checkpoint_state(tmp_path, "unaligned", "count", "count") == collections.Counter(words)


@pytest.mark.parametrize(("p", "p2"), [(2, 3), (3, 2)])
async def test_in_flight_records_are_redistributed_on_a_restore_at_another_parallelism(
        tmp_path, p, p2) -> None:
    """A checkpoint with records in flight towards the count, taken at parallelism ``p``
    and restored at ``p2``: its in-flight records go to the instances owning their keys.

    The first run takes no periodic checkpoint: the test triggers one once the counts have
    taken 500 records (their input channels full, as in
    :func:`test_unaligned_checkpoints_complete_under_backpressure_and_are_marked`), then
    cancels the run."""
    words = zipf_words(40_000, 500, seed=5)
    reached = asyncio.Event()
    first = await _flow(words, _signalling_count(reached, 500), p, paced_every=None).start(
        checkpoints=CheckpointConfig(interval=None, directory=tmp_path, unaligned=True))
    await reached.wait()
    taken = await first.checkpoint()
    await first.cancel()
    restored = CheckpointStorage.load(taken.path)
    assert "count" in _in_flight(restored), _in_flight(restored)
    job = await _flow(words, slow_count(), p2, paced_every=None).run(
        checkpoints=_config(tmp_path), restore_from=restored.path)
    assert job.metrics.restored_checkpoints == [restored.checkpoint_id]
    assert checkpoint_state(tmp_path, "unaligned", "count", "count") == collections.Counter(words)


async def test_unaligned_checkpoints_complete_under_backpressure_and_are_marked(tmp_path) -> None:
    """A checkpoint taken under backpressure is unaligned (records in flight stored); the
    final checkpoint is aligned (it must cover every record: nothing in flight).

    The test triggers the checkpoint once the counts have taken 500 of the 20,000 records:
    a count takes 20 us a record, so a batch of 128 outlasts its time slice
    (``TIME_SLICE``) and between two of its batches the source and the maps hand on at least
    one more. The channels before the counts are full then and stay full until the input
    ends (the source is not paced: it never waits with channels the counts could drain), so
    the overtaking barrier passes queued batches whatever the load."""
    words = zipf_words(20_000, 300, seed=9)
    reached = asyncio.Event()
    job = await _flow(words, _signalling_count(reached, 500), 2, paced_every=None).start(
        checkpoints=CheckpointConfig(interval=None, directory=tmp_path, unaligned=True))
    await reached.wait()
    taken = await job.checkpoint()
    assert "count" in _in_flight(CheckpointStorage.load(taken.path)), _in_flight(
        CheckpointStorage.load(taken.path))
    await job.wait()
    completed = CheckpointStorage(tmp_path, "unaligned").completed()
    assert _in_flight(completed[-1]) == {}
    assert len(job.metrics.completed_checkpoints) == len(job.metrics.checkpoints)
    assert checkpoint_state(tmp_path, "unaligned", "count", "count") == collections.Counter(words)


# ---------------------------------------------------------------------- SIGKILL
SCRIPT = Path(pipeline.__file__)
ROOT = SCRIPT.parents[2]
RECORDS = 60_000


def _run(out: Path, chk: Path, parallelism: int, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(out), str(chk), "jsonl", str(RECORDS),
         str(parallelism), "heap"],
        env={**os.environ, "PYTHONPATH": str(ROOT), "REACTIVE_TEST_KILL": "none:0",
             "REACTIVE_TEST_UNALIGNED": "1", "REACTIVE_TEST_RECORD_US": "20", **env},
        capture_output=True, text=True, timeout=180, check=False,
    )


@pytest.mark.e2e
def test_killed_process_resumed_at_another_parallelism_commits_exactly_once(tmp_path) -> None:
    """SIGKILL after unaligned checkpoints with records in flight completed; the resumed
    run (parallelism 2 -> 3) replays them and commits every record once."""
    out, chk = tmp_path / "out", tmp_path / "chk"
    first = _run(out, chk, 2, REACTIVE_TEST_KILL="record:40000")
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    done = CheckpointStorage(chk, pipeline.JOB).completed()
    assert any(_in_flight(c) for c in done), [_in_flight(c) for c in done]
    second = _run(out, chk, 3)
    assert second.returncode == 0, second.stderr[-3000:]
    assert committed_records(out) == expected_output(pipeline.words(RECORDS))
    assert hidden_files(out) == []


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_repeated_kills_with_a_rescale_on_every_restart_commit_exactly_once(tmp_path, seed) -> None:
    """Seeded SIGKILLs at records, each run resumed at another parallelism; the last run
    finishes. Every committed record appears once."""
    rnd = random.Random(seed)
    out, chk = tmp_path / "out", tmp_path / "chk"
    parallelisms = [2, 3, 1, 4, 2]
    for p in parallelisms[:-1]:
        run = _run(out, chk, p, REACTIVE_TEST_KILL=f"record:{rnd.randint(5_000, 25_000)}")
        assert run.returncode in (0, -signal.SIGKILL), run.stderr[-3000:]
        if run.returncode == 0:
            break
    else:
        last = _run(out, chk, parallelisms[-1])
        assert last.returncode == 0, last.stderr[-3000:]
    assert committed_records(out) == expected_output(pipeline.words(RECORDS))
    assert hidden_files(out) == []


async def test_a_dataflow_with_an_iteration_refuses_unaligned_checkpoints(tmp_path) -> None:
    flow = Dataflow("loop", parallelism=1)
    flow.from_collection([1, 2, 3]).iterate(
        lambda s: (s.map(lambda v: v - 1).filter(lambda v: v > 0),
                   s.filter(lambda v: v <= 0))).sink(ListSink())
    with pytest.raises(JobFailedError) as info:
        await asyncio.wait_for(flow.run(checkpoints=_config(tmp_path)), 60)
    assert isinstance(info.value.__cause__, ConfigurationError)
    assert "iteration" in str(info.value.__cause__)


# ---------------------------------------------------------------------- two inputs
class SlowEnrich(Enrich):
    """The connected streams' keyed join, slow enough that both inputs queue up."""

    def process_element1(self, user: tuple[int, str], ctx: Any) -> Any:
        _burn()
        return super().process_element1(user, ctx)

    def process_element2(self, click: tuple[int, str], ctx: Any) -> Any:
        _burn()
        return super().process_element2(click, ctx)


def _burn() -> None:
    end = time.perf_counter() + 2 * RECORD_COST
    while time.perf_counter() < end:
        pass


async def test_a_two_input_operator_replays_each_input_to_its_own_side(tmp_path) -> None:
    """In-flight records of both inputs of a keyed co-process are stored with their side and
    replayed to it on restore (a user replayed as a click would change the output).

    The join takes 40 us per record, so a batch of 512 takes it about ten time slices
    (``TIME_SLICE``), while the source hands each channel a batch every two of its reads: the
    source soon waits on full channels (two batches each). The checkpoint is triggered once
    an enrich instance has joined 600 clicks, with 6,000 to read, so its overtaking barrier
    passes queued batches on any machine: the order of the loop's steps decides that, not
    their duration. The job is cancelled after that checkpoint, and a second run restores
    it and finishes the input."""
    users, clicks = users_and_clicks(seed=4)
    expected = collections.Counter((f"user-{u}", url) for u, url in clicks)
    reached = asyncio.Event()

    class SignallingEnrich(SlowEnrich):
        def open(self, ctx: Any) -> None:
            super().open(ctx)
            self.joined = 0

        def process_element2(self, click: tuple[int, str], ctx: Any) -> Any:
            self.joined += 1
            if self.joined == 600:
                reached.set()
            return super().process_element2(click, ctx)

    def flow() -> Dataflow:
        f = Dataflow("enrich", parallelism=2, batch_size=512, channel_capacity=2)
        user_stream = f.source(TestingSource(users), uid="users")
        click_stream = f.source(TestingSource(clicks), uid="clicks")
        (user_stream.key_by(lambda u: u[0])
            .connect(click_stream.key_by(lambda c: c[0]))
            .process(SignallingEnrich()).uid("enrich")
            .sink(CommittingFileSink(tmp_path / "out")).uid("files"))
        return f

    config = CheckpointConfig(interval=None, directory=tmp_path / "chk", unaligned=True)
    job = await flow().start(checkpoints=config)
    await reached.wait()
    taken = await job.checkpoint()
    await job.cancel()
    done = {c.checkpoint_id: c for c in CheckpointStorage(tmp_path / "chk", "enrich").completed()}
    assert "enrich" in _in_flight(done[taken.checkpoint_id]), _in_flight(done[taken.checkpoint_id])
    resumed = await flow().run(checkpoints=config, restore_from=taken.path)
    assert resumed.metrics.restored_checkpoints == [taken.checkpoint_id]
    assert committed_records(tmp_path / "out") == collections.Counter(
        tuple(r) for r in expected.elements())


# ---------------------------------------------------------------------- redistribution
@pytest.mark.parametrize(("p_old", "p_new"), [(2, 3), (3, 2), (4, 1), (1, 4), (3, 3)])
def test_in_flight_records_are_each_assigned_once_at_any_parallelism(p_old, p_new) -> None:
    """Keyed records go to the owner of their key group; forward/rebalance records to one
    instance each; broadcast records to every instance once."""
    maxp = 16
    group = KeyGroupAssigner(maxp)
    old = []
    for s in range(p_old):
        keyed = [f"k{s}-{i}" for i in range(50)]
        split = [("split", s, i) for i in range(7)]
        bcast = [("broadcast", i) for i in range(3)]
        old.append([
            InFlightEntry(0, "keyed", pickle.dumps(keyed), [group(k) for k in keyed]),
            InFlightEntry(1, "split", pickle.dumps(split), None),
            InFlightEntry(0, "broadcast", pickle.dumps(bcast), None),
        ])
    got = [assign_in_flight(old, i, p_new, maxp) for i in range(p_new)]
    keyed_out = [(i, r) for i in range(p_new) for side, rs in got[i] for r in rs
                 if isinstance(r, str)]
    assert sorted(r for _, r in keyed_out) == sorted(f"k{s}-{i}" for s in range(p_old)
                                                      for i in range(50))
    assert all(group(r) * p_new // maxp == i for i, r in keyed_out)
    split_out = [r for i in range(p_new) for side, rs in got[i] for r in rs
                 if isinstance(r, tuple) and r[0] == "split"]
    assert sorted(split_out) == sorted(("split", s, i) for s in range(p_old) for i in range(7))
    assert all(side == 1 for i in range(p_new) for side, rs in got[i]
               if rs and isinstance(rs[0], tuple) and rs[0][0] == "split")
    for i in range(p_new):
        assert [r for _, rs in got[i] for r in rs
                if isinstance(r, tuple) and r[0] == "broadcast"] == [("broadcast", j)
                                                                      for j in range(3)]
