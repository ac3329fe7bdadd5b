"""Cyclic dataflows from a user's side: connected components by label propagation in a loop
(``Stream.iterate``) equal networkx's, without checkpoints, after a restore of a checkpoint
taken while records circulated (at another parallelism), and through kill -9 of the job's
process; a countdown loop is exact through failures with checkpoints every 10 ms; no
deadlock at channel capacity 1."""

from __future__ import annotations

import asyncio
import collections
import pickle
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from reactive import (
    CheckpointConfig,
    ConfigurationError,
    Dataflow,
    KeyedProcessFunction,
    RestartStrategy,
    ValueStateDescriptor,
)
from reactive.connectors.collections import ListSink
from reactive.connectors.files import CommittingFileSink
from reactive.testing import TestingSource
from tests.connectors.files.test_committing_file_sink import committed_records
from tests.pipelines import components_job
from tests.pipelines.components_job import SmallestLabel, build, loop_input, random_graph
from tests.support import checkpoint_state

JOB = Path(components_job.__file__)
KILL_TEST_VERTICES = 20_000
ROOT = JOB.parents[2]


def networkx_labels(edges: list[tuple[int, int]]) -> dict[int, int]:
    """Each vertex's component, named by its smallest vertex."""
    import networkx as nx  # imported when a test runs: ~0.8 s that collection need not pay

    return {v: min(c) for c in nx.connected_components(nx.Graph(edges)) for v in c}


def final_labels(updates: Any) -> dict[int, int]:
    out: dict[int, int] = {}
    for v, label in updates:
        out[v] = min(label, out.get(v, label))
    return out


@pytest.mark.parametrize(("parallelism", "capacity"), [(1, 8), (2, 8), (3, 1)])
async def test_components_equal_networkx(parallelism, capacity):
    """Capacity 1 with a step that sends each label to all neighbours: the feedback never
    blocks the tail, so the cycle cannot deadlock."""
    edges = random_graph(seed=1)
    sink = ListSink()
    await build(edges, sink, parallelism, channel_capacity=capacity).run()
    assert final_labels(sink.records) == networkx_labels(edges)
    # each update lowers a vertex's label: none is emitted twice
    assert max(collections.Counter(map(tuple, sink.records)).values()) == 1


class Countdown(KeyedProcessFunction):
    """``(key, n)``: one step of a countdown per pass through the loop; counts its steps in
    keyed state. With ``failures_wanted`` > 0 it fails at a step once a checkpoint has
    completed since the previous failure (the highest completed checkpoint id went up), so
    every recovery restores a real checkpoint whatever the machine's speed; a test feeds the
    loop behind ``TestingSource.CHECKPOINT`` markers so that work remains after each such
    checkpoint, however late it completes."""

    failures_wanted = 0
    steps = 0
    failures = 0
    checkpoints: Path | None = None
    completed_at_failure = 0

    @classmethod
    def reset(cls, failures_wanted: int, checkpoints: Path | None) -> None:
        cls.failures_wanted, cls.steps, cls.failures = failures_wanted, 0, 0
        cls.checkpoints, cls.completed_at_failure = checkpoints, 0

    @classmethod
    def _completed(cls) -> int:
        """The highest completed checkpoint's id (0: none): it only grows, whatever the
        retention deletes."""
        assert cls.checkpoints is not None
        return max((int(p.parent.name.removeprefix("chk-"))
                    for p in cls.checkpoints.glob("*/chk-*/_metadata")), default=0)

    def open(self, ctx: Any) -> None:
        self.done = ctx.get_state(ValueStateDescriptor("steps", default=0))

    def process_element(self, record: tuple[int, int], ctx: Any) -> Any:
        cls = Countdown
        cls.steps += 1
        if (cls.failures < cls.failures_wanted and cls.steps % 20 == 0
                and cls._completed() > cls.completed_at_failure):
            cls.failures += 1
            cls.completed_at_failure = cls._completed()
            raise RuntimeError(f"injected failure at step {cls.steps}")
        self.done.update(self.done.value() + 1)
        yield ("out", *record)
        if record[1] > 0:
            yield ("again", record[0], record[1] - 1)


async def test_a_countdown_loop_is_exact_through_failures_with_checkpoints_every_10_ms(
        tmp_path):
    """Every record passes the loop n + 1 times: a feedback record lost or replayed twice
    by a recovery would show in the output and in the state. The starts come in three parts,
    each after a checkpoint completed, so the loop still has work when the failures (one per
    newly completed checkpoint) are due."""
    Countdown.reset(2, tmp_path / "chk")
    starts = {k: 30 + k % 40 for k in range(200)}
    items = list(starts.items())
    gated = [*items[:100], TestingSource.CHECKPOINT, *items[100:150],
             TestingSource.CHECKPOINT, *items[150:]]
    flow = Dataflow("countdown", parallelism=2, batch_size=16, channel_capacity=2)

    def step(records: Any) -> tuple[Any, Any]:
        stepped = records.key_by(lambda r: r[0]).process(Countdown()).uid("steps")
        return (stepped.filter(lambda r: r[0] == "again").map(lambda r: (r[1], r[2])),
                stepped.filter(lambda r: r[0] == "out").map(lambda r: [r[1], r[2]]))

    (flow.source(TestingSource(gated), uid="starts")
         .iterate(step, uid="countdown")
         .sink(CommittingFileSink(tmp_path / "out")))
    job = await flow.run(checkpoints=CheckpointConfig(interval=0.01, directory=tmp_path / "chk"),
                         restart=RestartStrategy.fixed(5, 0.0))
    assert job.metrics.restarts == Countdown.failures == 2
    assert len(job.metrics.restored_checkpoints) == Countdown.failures
    assert committed_records(tmp_path / "out") == collections.Counter(
        (k, i) for k, n in starts.items() for i in range(n + 1))
    assert checkpoint_state(tmp_path / "chk", "countdown", "steps", "steps") == {
        k: n + 1 for k, n in starts.items()}


def _back_edge_log(chk: Any, uid: str | None = None) -> list[Any]:
    entries: list[Any] = []
    operators = chk.metadata.operators
    uid = uid or ("propagate" if "propagate" in operators else "countdown")
    for sub in operators[uid].subtasks.values():
        handle = sub.operator_state
        if handle is not None:
            states = pickle.loads((chk.job_dir / handle.files[0].path).read_bytes())
            entries += states.get("back-edge-log", ("split", []))[1]
    return entries


class ComputingLabel(SmallestLabel):
    """:class:`SmallestLabel` whose every step computes for 50 us (CPU work, as a real loop
    step does: labels circulate for about a second); :attr:`busy` is set at step
    :attr:`busy_at`."""

    steps = 0
    busy_at = 0
    busy: asyncio.Event | None = None

    def process_element(self, record: Any, ctx: Any) -> Iterable[Any]:
        end = time.perf_counter() + 50e-6
        while time.perf_counter() < end:
            pass
        cls = ComputingLabel
        cls.steps += 1
        if cls.steps == cls.busy_at and cls.busy is not None:
            cls.busy.set()
        return super().process_element(record, ctx)


async def test_a_checkpoint_holds_the_records_in_the_loop_and_restores_at_another_parallelism(
        tmp_path):
    edges = random_graph(seed=3)
    # busy once the input (edges, then the first labels) has passed and labels circulate:
    # 1,000 steps after it, about 5,000 before the loop runs dry
    ComputingLabel.steps, ComputingLabel.busy = 0, asyncio.Event()
    ComputingLabel.busy_at = len(loop_input(edges)) + 1_000
    flow = build(edges, ListSink(), parallelism=2, batch_size=8, channel_capacity=8,
                 labels=ComputingLabel())
    job = await flow.start(checkpoints=CheckpointConfig(interval=None, directory=tmp_path))
    # triggered while labels circulate (whatever the machine's speed): the barrier goes
    # around a busy loop, and the iteration head logs the records that come back before it
    await ComputingLabel.busy.wait()
    chk = await job.checkpoint()
    await job.wait()
    assert _back_edge_log(chk), "the checkpoint caught no record in the loop"
    assert all(r[0] == "label" for r in _back_edge_log(chk))
    # a fresh job restored from it, at parallelism 3, ends with networkx's components
    sink = ListSink()
    restored = build(edges, sink, parallelism=3, batch_size=8)
    await restored.run(checkpoints=CheckpointConfig(interval=None, directory=tmp_path / "2"),
                       restore_from=chk.path)
    state = checkpoint_state(tmp_path / "2", "components", "labels", "label")
    assert state == networkx_labels(edges)


def _run_until_done(out: Path, chk: Path, seed: int, interval: float) -> int:
    """Run the job's process, let it SIGKILL itself at seeded loop steps (three times),
    resume until it ends; returns the number of kills."""
    rnd = random.Random(seed)
    edges = components_job.kill_test_graph(seed, KILL_TEST_VERTICES)
    inputs = len(components_job.loop_input(edges))
    # the first crash while labels circulate (after the input, whose labels come last, has
    # been read); the next ones early in the resumed runs
    kill_points = [rnd.randrange(inputs, inputs + 40_000),
                   rnd.randrange(1_000, 40_000), rnd.randrange(1_000, 40_000)]
    kills = 0
    while True:
        kill_at = kill_points[kills] if kills < len(kill_points) else 0
        proc = subprocess.run(
            [sys.executable, str(JOB), str(out), str(chk), "2", str(interval), str(seed),
             str(KILL_TEST_VERTICES), str(kill_at)],
            cwd=ROOT, capture_output=True, timeout=300)
        if proc.returncode == -signal.SIGKILL:
            kills += 1
            continue
        assert proc.returncode == 0, proc.stderr.decode()[-3000:]
        return kills


@pytest.mark.e2e
@pytest.mark.parametrize("seed", [0])
def test_components_are_exact_through_kill_9(tmp_path, seed):
    kills = _run_until_done(tmp_path / "out", tmp_path / "chk", seed, 0.01)
    updates = committed_records(tmp_path / "out")
    assert final_labels(updates) == networkx_labels(
        components_job.kill_test_graph(seed, KILL_TEST_VERTICES))
    assert max(updates.values()) == 1
    assert kills >= 1  # the first run reached its kill point: it crashed mid-loop


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("seed", range(1, 9))
def test_components_are_exact_through_kill_9_more_seeds(tmp_path, seed):
    test_components_are_exact_through_kill_9(tmp_path, seed)


async def test_iterate_refusals(tmp_path):
    flow = Dataflow("refusals")
    numbers = flow.from_collection([1, 2, 3])
    with pytest.raises(ConfigurationError, match="two streams"):
        numbers.iterate(lambda s: s)  # type: ignore[arg-type, return-value]
    other = flow.from_collection([4])
    with pytest.raises(ConfigurationError, match="computed from loop_input"):
        numbers.iterate(lambda s: (other, s))

    async def lookup(x: int) -> int:
        return x

    with pytest.raises(ConfigurationError, match="map_async"):
        numbers.iterate(lambda s: (s.map_async(lookup).filter(lambda x: x < 0), s))
    # a loop needs aligned exactly-once checkpoints
    looping = Dataflow("at-least-once")
    (looping.from_collection([1]).iterate(lambda s: (s.filter(lambda x: False), s))
            .sink(ListSink()))
    with pytest.raises(Exception, match="aligned exactly-once"):
        await looping.run(checkpoints=CheckpointConfig(interval=None, directory=tmp_path,
                                                       mode="at_least_once"))


@pytest.mark.e2e
def test_imports_graph_example_equals_networkx_after_a_failure(tmp_path):
    """The example on real data (this machine's standard library): two loops, one failure
    on the way, components and transitive imports equal networkx's."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "imports_graph.py"), "--fail-at", "15000",
         "--interval", "0.05", "--output", str(tmp_path / "out"),
         "--checkpoint-dir", str(tmp_path / "chk")],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "restarts: 1" in result.stdout
    assert "validated against networkx" in result.stdout


async def test_event_time_after_a_loop_holds_until_the_loop_is_done():
    """Watermarks do not circulate: a record that goes around the loop keeps its old
    timestamp, so the loop holds event time back; an event-time window after the loop
    counts every pass, none of them late."""
    from reactive import AggregateFunction, TumblingEventTimeWindows

    class Count(AggregateFunction):
        def create_accumulator(self) -> int:
            return 0

        def add(self, value: Any, acc: int) -> int:
            return acc + 1

        def get_result(self, acc: int) -> int:
            return acc

        def merge(self, a: int, b: int) -> int:
            return a + b

    records = [(k % 5, k % 7, float(k)) for k in range(300)]
    flow = Dataflow("timed-loop", parallelism=2, batch_size=8)

    def step(loop: Any) -> tuple[Any, Any]:
        return (loop.filter(lambda r: r[1] > 0).map(lambda r: (r[0], r[1] - 1, r[2])), loop)

    windowed = (flow.from_collection(records).assign_timestamps(lambda r: r[2])
                .iterate(step).key_by(lambda r: r[0])
                .window(TumblingEventTimeWindows.of(50), timestamp=lambda r: r[2]))
    results, late = ListSink(), ListSink()
    windowed.aggregate(Count()).sink(results)
    windowed.late_data().sink(late)
    await flow.run()
    expected: collections.Counter[tuple[int, float]] = collections.Counter()
    for key, n, ts in records:
        expected[(key, ts // 50 * 50)] += n + 1
    assert {(r.key, r.start): r.value for r in results.records} == dict(expected)
    assert late.records == []


def _countdown_flow(source: TestingSource, sink: Any, parallelism: int) -> Dataflow:
    flow = Dataflow("countdown", parallelism=parallelism, batch_size=16)

    def step(records: Any) -> tuple[Any, Any]:
        stepped = records.key_by(lambda r: r[0]).process(Countdown()).uid("steps")
        return (stepped.filter(lambda r: r[0] == "again").map(lambda r: (r[1], r[2])),
                stepped.filter(lambda r: r[0] == "out").map(lambda r: [r[1], r[2]]))

    flow.source(source, uid="starts").iterate(step, uid="countdown").sink(sink)
    return flow


async def test_stop_with_savepoint_keeps_the_loop_and_resumes_it_at_another_parallelism(
        tmp_path):
    """Stop-with-savepoint while countdowns circulate, restore the savepoint at another
    parallelism: the committed output of both runs is every step exactly once."""
    Countdown.reset(0, None)
    starts = {k: 200 + k % 50 for k in range(100)}
    items = list(starts.items())
    # the starts, then an open stream (a live input with nothing new) until the stop
    source = TestingSource([*items, TestingSource.HOLD])
    first = _countdown_flow(source, CommittingFileSink(tmp_path / "out"), 2)
    job = await first.start(checkpoints=CheckpointConfig(interval=None,
                                                         directory=tmp_path / "chk"))
    await source.wait_held()
    savepoint = await job.stop(savepoint=True)
    assert savepoint is not None
    assert _back_edge_log(savepoint), "the savepoint caught no record in the loop"
    second = _countdown_flow(TestingSource(items), CommittingFileSink(tmp_path / "out"), 3)
    await second.run(checkpoints=CheckpointConfig(interval=None, directory=tmp_path / "chk2"),
                     restore_from=savepoint.path)
    assert committed_records(tmp_path / "out") == collections.Counter(
        (k, i) for k, n in starts.items() for i in range(n + 1))
