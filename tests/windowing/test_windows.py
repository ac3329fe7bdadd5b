"""Windows: results equal a plain-Python batch group-by, in order, shuffled, and across a
crash and recovery; allowed lateness; late records on the side output, counted exactly."""

from __future__ import annotations

import collections
import random
from pathlib import Path
from typing import Any

import pytest

from reactive import (
    AggregateFunction,
    CheckpointConfig,
    ConfigurationError,
    Dataflow,
    EventTimeSessionWindows,
    ProcessWindowFunction,
    RestartStrategy,
    SlidingEventTimeWindows,
    TimeWindow,
    TumblingEventTimeWindows,
    WindowResult,
)
from reactive.connectors.collections import ListSink
from reactive.sinks import Sink, SinkWriter
from tests.support import paced


class GatedInjector:
    """Raises at seeded record numbers, each time only once a checkpoint completed since
    the previous failure (so every recovery restores real state, whatever the speed)."""

    def __init__(self, fail_at: list[int], checkpoint_dir: Path) -> None:
        self.fail_at = sorted(fail_at)
        self.dir = checkpoint_dir
        self.seen = 0
        self.failures = 0
        self.completed_at_failure = 0

    def _completed(self) -> int:
        return len(list(self.dir.glob("*/chk-*/_metadata")))

    def __call__(self, record: Any) -> Any:
        self.seen += 1
        if (self.fail_at and self.seen >= self.fail_at[0] and self.seen % 50 == 0
                and self._completed() > self.completed_at_failure):
            self.fail_at.pop(0)
            self.failures += 1
            self.completed_at_failure = self._completed()
            raise RuntimeError(f"injected failure #{self.failures} at record {self.seen}")
        return record


class TxnListSink(Sink):
    """A two-phase-commit list sink for tests: records written in an epoch are committed
    when its checkpoint completes (or at the end), so ``committed`` is exactly-once."""

    def __init__(self) -> None:
        self.committed: list[Any] = []
        self.pending: dict[tuple[int, int], list[Any]] = {}

    def create_writer(self, subtask: int, parallelism: int) -> SinkWriter:
        return _TxnWriter(self, subtask)


class _TxnWriter(SinkWriter):
    def __init__(self, sink: TxnListSink, subtask: int) -> None:
        self.sink = sink
        self.subtask = subtask
        self.buffer: list[Any] = []

    def write(self, batch: list[Any]) -> None:
        self.buffer.extend(batch)

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        self.sink.pending[(self.subtask, checkpoint_id)] = self.buffer
        self.buffer = []
        return [(self.subtask, checkpoint_id)]

    def _commit(self, up_to: int) -> None:
        for k in sorted(k for k in self.sink.pending if k[0] == self.subtask and k[1] <= up_to):
            self.sink.committed.extend(self.sink.pending.pop(k))

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self._commit(checkpoint_id)

    def restore_state(self, entries: list[Any]) -> None:
        for key in entries:  # pre-committed in a completed checkpoint: commit (idempotent)
            if key in self.sink.pending:
                self.sink.committed.extend(self.sink.pending.pop(key))
        # epochs pre-committed after the restored checkpoint (aborted checkpoints) are
        # replayed from the restored positions: abort them, or they would commit twice
        restored = max((k[1] for k in entries), default=0)
        for k in [k for k in self.sink.pending if k[0] == self.subtask and k[1] > restored]:
            del self.sink.pending[k]

    def finish(self) -> None:
        self.sink.committed.extend(self.buffer)
        self.buffer = []


class SumAmount(AggregateFunction):
    """Sum of ``record[2]``, with a record count (the thesis's lift/combine/lower)."""

    def create_accumulator(self) -> Any:
        return (0, 0)

    def add(self, value: Any, acc: Any) -> Any:
        return (acc[0] + value[2], acc[1] + 1)

    def get_result(self, acc: Any) -> Any:
        return acc

    def merge(self, a: Any, b: Any) -> Any:
        return (a[0] + b[0], a[1] + b[1])


def events(n: int, keys: int, seed: int, disorder: float = 0.0) -> list[tuple[str, float, int]]:
    """``(key, timestamp, amount)`` with timestamps ~ i (seconds), shuffled within
    ``disorder`` seconds: record i's timestamp is in ``[i - disorder, i]``."""
    rnd = random.Random(seed)
    return [(f"k{rnd.randrange(keys)}", i - rnd.uniform(0, disorder) if disorder else float(i),
             rnd.randrange(1, 100)) for i in range(n)]


def batch_windows(data: list[tuple[str, float, int]], size: float, slide: float
                  ) -> dict[tuple[str, float, float], tuple[int, int]]:
    """The batch answer: group by (key, window) for periodic windows."""
    out: dict[tuple[str, float, float], tuple[int, int]] = {}
    for k, ts, amount in data:
        last = ts - ts % slide
        start = last
        while start > ts - size:
            s, c = out.get((k, start, start + size), (0, 0))
            out[(k, start, start + size)] = (s + amount, c + 1)
            start -= slide
    return out


def as_dict(results: list[WindowResult]) -> dict[tuple[Any, float, float], Any]:
    d = {(r.key, r.start, r.end): r.value for r in results}
    assert len(d) == len(results), "a window fired twice"
    return d


@pytest.mark.parametrize("disorder", [0.0, 20.0])
@pytest.mark.parametrize(("size", "slide"), [(50, 50), (60, 20)])
async def test_periodic_windows_equal_batch_group_by(disorder, size, slide):
    data = events(30_000, 7, seed=3, disorder=disorder)
    sink = ListSink()
    flow = Dataflow("win", parallelism=2, batch_size=256)
    assigner = (TumblingEventTimeWindows.of(size) if size == slide
                else SlidingEventTimeWindows.of(size, slide))
    windowed = (flow.from_collection(data).assign_timestamps(lambda r: r[1], disorder)
                .key_by(lambda r: r[0]).window(assigner))
    windowed.aggregate(SumAmount()).sink(sink)
    late = ListSink()
    windowed.late_data().sink(late)
    await flow.run()
    assert late.records == []  # disorder never exceeds the bound
    assert as_dict(sink.records) == batch_windows(data, size, slide)


async def test_reduce_and_process_windows():
    data = events(5_000, 3, seed=4, disorder=5.0)
    reduced, processed = ListSink(), ListSink()

    class Collect(ProcessWindowFunction):
        def process(self, key: Any, window: TimeWindow, elements: list[Any]) -> Any:
            yield (key, window.start, window.end, sorted(e[2] for e in elements))

    flow = Dataflow("rp", parallelism=2, batch_size=100)
    keyed = (flow.from_collection(data).assign_timestamps(lambda r: r[1], 5.0)
             .key_by(lambda r: r[0]))
    keyed.window(TumblingEventTimeWindows.of(100)).reduce(
        lambda a, b: (a[0], max(a[1], b[1]), a[2] + b[2])).sink(reduced)
    keyed.window(TumblingEventTimeWindows.of(100)).process(Collect()).sink(processed)
    await flow.run()
    truth = batch_windows(data, 100, 100)
    assert {k: v[2] for k, v in as_dict(reduced.records).items()} == {
        k: v[0] for k, v in truth.items()}
    groups = collections.defaultdict(list)
    for k, ts, amount in data:
        groups[(k, ts - ts % 100, ts - ts % 100 + 100)].append(amount)
    assert {(k, s, e): v for k, s, e, v in processed.records} == {
        k: sorted(v) for k, v in groups.items()}


def batch_sessions(data: list[tuple[str, float, int]], gap: float) -> dict[Any, tuple[int, int]]:
    out: dict[Any, tuple[int, int]] = {}
    by_key = collections.defaultdict(list)
    for k, ts, amount in data:
        by_key[k].append((ts, amount))
    for k, rows in by_key.items():
        rows.sort()
        start, end, total, count = rows[0][0], rows[0][0] + gap, 0, 0
        for ts, amount in rows:
            if ts > end:
                out[(k, start, end)] = (total, count)
                start, total, count = ts, 0, 0
            end = max(end, ts + gap)
            total, count = total + amount, count + 1
        out[(k, start, end)] = (total, count)
    return out


async def test_session_windows_equal_batch_sessions():
    rnd = random.Random(5)
    data, t = [], 0.0
    for _ in range(4_000):
        t += rnd.choice([0.5, 1.0, 2.0, 30.0])  # bursts separated by gaps > 10 s
        data.append((f"k{rnd.randrange(4)}", t, rnd.randrange(10)))
    shuffled = sorted(data, key=lambda r: r[1] + rnd.uniform(0, 3))  # disorder <= 3 s
    sink = ListSink()
    flow = Dataflow("sessions", parallelism=2, batch_size=64)
    (flow.from_collection(shuffled).assign_timestamps(lambda r: r[1], 3.0)
         .key_by(lambda r: r[0]).window(EventTimeSessionWindows.with_gap(10.0))
         .aggregate(SumAmount()).sink(sink))
    await flow.run()
    assert as_dict(sink.records) == batch_sessions(data, 10.0)


async def test_late_records_reach_the_side_output_exactly():
    # On-time records are never more than 5 s behind the largest timestamp; the late ones
    # are older than every window that could still take them (size 10, lateness 5).
    rnd = random.Random(9)
    data: list[tuple[str, float, int]] = []
    late_expected = []
    for i in range(6_000):
        data.append((f"k{i % 3}", i - rnd.uniform(0, 5), 1))
        if i > 1_000 and i % 97 == 0:
            rec = (f"k{i % 3}", float(i - 400 - rnd.randrange(300)), 1000)
            data.append(rec)
            late_expected.append(rec)
    sink, late = ListSink(), ListSink()
    flow = Dataflow("late", parallelism=2, batch_size=64)
    (flow.from_collection(data).assign_timestamps(lambda r: r[1], 5.0)
         .key_by(lambda r: r[0]).window(TumblingEventTimeWindows.of(10))
         .allowed_lateness(5).side_output_late_data(late)
         .aggregate(SumAmount()).sink(sink))
    await flow.run()
    assert sorted(late.records) == sorted(late_expected)
    on_time = [r for r in data if r[2] != 1000]
    final = {}
    for r in sink.records:  # late firings re-emit a window: the last one counts
        final[(r.key, r.start, r.end)] = r.value
    assert final == batch_windows(on_time, 10, 10)


async def test_allowed_lateness_updates_fired_windows():
    # a record 12 s late for window [0, 10) with lateness 5 (watermark 15 - 2 = 13 < 15)
    data = [("a", 1.0, 1), ("a", 11.0, 1), ("a", 15.0, 1), ("a", 9.0, 5), ("a", 40.0, 1),
            ("a", 2.0, 7)]
    sink, late = ListSink(), ListSink()
    flow = Dataflow("lateness", batch_size=1, buffer_timeout=0)
    (flow.from_collection(data).assign_timestamps(lambda r: r[1], 2.0)
         .key_by(lambda r: r[0]).window(TumblingEventTimeWindows.of(10))
         .allowed_lateness(5).side_output_late_data(late)
         .aggregate(SumAmount()).sink(sink))
    await flow.run()
    first = [r for r in sink.records if r.start == 0]
    assert [r.value for r in first] == [(1, 1), (6, 2)]  # fired, then fired again
    assert late.records == [("a", 2.0, 7)]  # after watermark 38: beyond the lateness


async def test_late_records_without_side_output_are_counted(caplog):
    data = [("a", 100.0, 1), ("a", 1.0, 1)]
    sink = ListSink()
    flow = Dataflow("counted", batch_size=1, buffer_timeout=0)
    (flow.from_collection(data).assign_timestamps(lambda r: r[1])
         .key_by(lambda r: r[0]).window(TumblingEventTimeWindows.of(10))
         .aggregate(SumAmount()).sink(sink))
    job = await flow.run()
    assert [r.start for r in sink.records] == [100]
    assert "late record" in caplog.text
    assert job is not None


async def test_windows_exact_after_crash_and_recovery(tmp_path: Path):
    data = events(40_000, 11, seed=21, disorder=10.0)
    injector = GatedInjector(random.Random(2).sample(range(2_000, 16_000), 3), tmp_path)
    tick = injector
    sink = TxnListSink()
    flow = Dataflow("crash", parallelism=2, batch_size=200)
    # paced by completed checkpoints: the gated failures need one before they fire, on any
    # machine (a plain collection could pass its 40,000 records before the first completes)
    (flow.source(paced(data, every=2_000)).uid("src").map(tick)
         .assign_timestamps(lambda r: r[1], 10.0)
         .key_by(lambda r: r[0]).window(SlidingEventTimeWindows.of(300, 100))
         .aggregate(SumAmount()).uid("windows").sink(sink))
    job = await flow.run(checkpoints=CheckpointConfig(interval=0.05, directory=tmp_path),
                         restart=RestartStrategy.fixed(5, 0))
    assert injector.failures >= 1 and job.metrics.restarts == injector.failures
    assert job.metrics.restored_checkpoints
    assert as_dict(sink.committed) == batch_windows(data, 300, 100)


async def test_count_windows_equal_batch():
    data = events(3_000, 4, seed=8)
    tumbling, sliding = ListSink(), ListSink()
    flow = Dataflow("count", parallelism=2, batch_size=50)
    keyed = flow.from_collection(data).key_by(lambda r: r[0])
    keyed.count_window(10).aggregate(SumAmount()).sink(tumbling)
    keyed.count_window(10, 3).reduce(lambda a, b: (a[0], a[1], a[2] + b[2])).sink(sliding)
    await flow.run()
    per_key = collections.defaultdict(list)
    for k, _, amount in data:
        per_key[k].append(amount)
    exp_t = {(k, s, s + 10): (sum(v[s:s + 10]), 10)
             for k, v in per_key.items() for s in range(0, len(v) - 9, 10)}
    exp_s = {(k, s, s + 10): sum(v[s:s + 10])
             for k, v in per_key.items() for s in range(0, len(v) - 9, 3)}
    assert as_dict(tumbling.records) == exp_t
    assert {k: v[2] for k, v in as_dict(sliding.records).items()} == exp_s


def test_window_api_errors():
    flow = Dataflow("errors")
    keyed = flow.from_collection([1]).map(lambda x: x).key_by(lambda x: x)
    with pytest.raises(ConfigurationError, match="assign_timestamps"):
        keyed.window(TumblingEventTimeWindows.of(10))
    with pytest.raises(ConfigurationError):
        TumblingEventTimeWindows.of(0)
    with pytest.raises(ConfigurationError):
        flow.from_collection([1]).assign_timestamps(float, max_out_of_orderness=-1)
    ok = flow.from_collection([1]).assign_timestamps(float).key_by(lambda x: x)
    with pytest.raises(ConfigurationError):
        ok.windows([TumblingEventTimeWindows.of(10), EventTimeSessionWindows.with_gap(1)])
    w = ok.window(TumblingEventTimeWindows.of(10))
    with pytest.raises(ConfigurationError, match="after aggregate"):
        w.late_data()
