"""reactive.testing: the scripted TestingSource (EOF/ABORT) in real jobs with checkpoints and
restarts, the one-operator harness (keyed state, timers, windows, snapshot/restore at another
parallelism), and the packaged state-backend contract run the way a third-party backend runs
it (its own test module, pytest-asyncio in strict mode). Async tests are marked, so this
module also runs under strict mode."""

from __future__ import annotations

import asyncio
import collections
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Iterable
from typing import Any

import pytest

from reactive import (
    CheckpointConfig,
    Dataflow,
    JobFailedError,
    KeyedProcessFunction,
    RestartStrategy,
    RestoreError,
    StateAccessError,
    TumblingEventTimeWindows,
    UserFunctionError,
    ValueStateDescriptor,
    WindowResult,
)
from reactive.connectors.collections import ListSink
from reactive.runtime.operators.timestamps import TimestampsAndWatermarksOperator
from reactive.testing import (
    AbortExecution,
    ManualClock,
    OperatorSnapshot,
    OperatorTestHarness,
    TestingSource,
)
from reactive.time.clock import ManualClock as ClockManualClock
from reactive.time.watermarks import ACTIVE, IDLE
from reactive.windowing.functions import ReduceAggregate
from tests.support import Count, checkpoint_state, final_counts, zipf_words

EOF, ABORT, HOLD = TestingSource.EOF, TestingSource.ABORT, TestingSource.HOLD
CHECKPOINT = TestingSource.CHECKPOINT


# ---------------------------------------------------------------------------- TestingSource
@pytest.mark.asyncio
async def test_reader_stops_before_markers_and_raises_abort_once():
    source = TestingSource(["a", "b", EOF, "c", ABORT, "d"], batch_size=10)
    reader = source.create_reader(0, 1)
    assert await reader.read_batch(100) == ["a", "b"]  # the records before the marker first
    assert await reader.read_batch(100) is None  # EOF ends this run's stream
    assert reader.snapshot_state(1) == [3]  # ... and the position is past it
    resumed = source.create_reader(0, 1)
    resumed.restore_state([3])
    assert await resumed.read_batch(100) == ["c"]
    with pytest.raises(AbortExecution):
        await resumed.read_batch(100)
    assert source.aborts_raised == 1
    again = source.create_reader(0, 1)  # the restarted attempt, restored before the ABORT
    again.restore_state([3])
    assert await again.read_batch(100) == ["c", "d"]  # skipped: it raised once already
    assert await again.read_batch(100) is None
    assert source.aborts_raised == 1


@pytest.mark.asyncio
async def test_reader_batch_size_and_pickled_markers():
    import copy
    import pickle

    source = TestingSource(range(5), batch_size=2)
    reader = source.create_reader(0, 1)
    assert [await reader.read_batch(100) for _ in range(4)] == [[0, 1], [2, 3], [4], None]
    assert pickle.loads(pickle.dumps(EOF)) is EOF and copy.deepcopy(ABORT) is ABORT
    with pytest.raises(ValueError):
        TestingSource([], batch_size=0)


@pytest.mark.asyncio
async def test_reader_holds_at_hold_without_ending_or_moving():
    source = TestingSource(["a", "b", HOLD, "c"])
    reader = source.create_reader(0, 1)
    assert await reader.read_batch(100) == ["a", "b"]  # the records before the marker first
    for _ in range(3):
        assert await reader.read_batch(100) == []  # open, empty: the task serves barriers
    await asyncio.wait_for(source.wait_held(), timeout=1)  # a guard, already set
    assert reader.snapshot_state(1) == [2]  # the position stays at the marker
    assert pickle.loads(pickle.dumps(source)).items == source.items  # the event is not kept


@pytest.mark.asyncio
async def test_hold_keeps_a_job_running_until_stop_with_savepoint(tmp_path):
    words = zipf_words(1_000, 50, seed=6)
    source = TestingSource([*words, HOLD, "never"], batch_size=50)
    sink = ListSink()
    job = await _count_flow(source, sink, "hold").start(
        checkpoints=CheckpointConfig(interval=None, directory=tmp_path))
    await source.wait_held()
    assert job.status == "running"  # the marker did not end the stream
    await job.checkpoint()  # barriers pass the holding source
    await job.stop(savepoint=True, path=tmp_path / "sp")
    await job.wait()
    assert final_counts(sink.records) == dict(collections.Counter(words))  # not "never"


def _count_flow(source: TestingSource, sink: ListSink, name: str) -> Dataflow:
    flow = Dataflow(name, parallelism=2, batch_size=64)
    (flow.source(source).uid("src")
         .key_by(lambda w: w).process(Count()).uid("count")
         .sink(sink))
    return flow


@pytest.mark.asyncio
async def test_abort_fails_once_and_the_restart_counts_exactly_once(tmp_path):
    before, after = zipf_words(3_000, 200, seed=1), zipf_words(3_000, 200, seed=2)
    truth = dict(collections.Counter(before + after))
    # the source waits for a completed checkpoint before the ABORT: one is there to restore
    # on any machine
    source = TestingSource([*before, CHECKPOINT, ABORT, *after], batch_size=20)
    sink = ListSink()
    config = CheckpointConfig(interval=0.005, directory=tmp_path)
    job = await _count_flow(source, sink, "abort").run(
        checkpoints=config, restart=RestartStrategy.fixed(1, delay=0.0))
    assert source.aborts_raised == 1
    assert job.metrics.restarts == 1
    # the restart restored a checkpoint taken before the ABORT, read up to it again and
    # skipped it
    assert len(job.metrics.restored_checkpoints) == 1
    # exactly once in the state: the final checkpoint holds the true counts, and the
    # (at-least-once) output never counted a record twice
    assert checkpoint_state(tmp_path, "abort", "count", "count") == truth
    assert final_counts(sink.records) == truth


@pytest.mark.asyncio
async def test_abort_without_restarts_fails_the_job_naming_the_source(tmp_path):
    source = TestingSource(["a", ABORT, "b"])
    with pytest.raises(JobFailedError) as info:
        await _count_flow(source, ListSink(), "abort-fails").run(
            checkpoints=CheckpointConfig(interval=0.01, directory=tmp_path),
            restart=RestartStrategy.none())
    cause = info.value.__cause__
    assert isinstance(cause, UserFunctionError)
    assert isinstance(cause.__cause__, AbortExecution)


@pytest.mark.asyncio
async def test_eof_ends_a_run_and_a_resumed_run_continues_after_it(tmp_path):
    first, second, third = (zipf_words(1_000, 50, seed=s) for s in (3, 4, 5))
    items = [*first, EOF, *second[:500], ABORT, *second[500:], EOF, *third]
    config = CheckpointConfig(interval=0.005, directory=tmp_path)
    expected: list[str] = []
    for run, part in enumerate((first, second, third)):
        # a new source object per run, as a new process would have
        source, sink = TestingSource(items, batch_size=25), ListSink()
        job = await _count_flow(source, sink, "eof").run(
            checkpoints=config, resume=run > 0, restart=RestartStrategy.fixed(1, delay=0.0))
        expected += part
        truth = dict(collections.Counter(expected))
        assert checkpoint_state(tmp_path, "eof", "count", "count") == truth
        assert final_counts(sink.records) == {w: truth[w] for w in set(part)}
        assert source.aborts_raised == job.metrics.restarts == (1 if run == 1 else 0)


# ---------------------------------------------------------------------------- the harness
class EventTimeCount(KeyedProcessFunction):
    """Counts records ``(key, timestamp)`` per key and reports the count on an event-time
    timer ``delay`` seconds after each record; also says what watermark it saw."""

    def __init__(self, delay: float = 10.0) -> None:
        self.delay = delay

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def process_element(self, record: Any, ctx: Any) -> Iterable[Any]:
        n = self.count.value() + 1
        self.count.update(n)
        ctx.timer_service.register_event_time_timer(record[1] + self.delay)
        yield ("seen", ctx.current_key, n, ctx.timer_service.current_watermark())

    def on_timer(self, timestamp: float, ctx: Any) -> Iterable[Any]:
        yield ("timer", ctx.current_key, timestamp, self.count.value())


class ProcessingTimeout(KeyedProcessFunction):
    """Emits ``("timeout", key)`` 5 s of processing time after a key's first record."""

    def open(self, ctx: Any) -> None:
        self.armed = ctx.get_state(ValueStateDescriptor("armed", default=False))

    def process_element(self, record: Any, ctx: Any) -> None:
        if not self.armed.value():
            self.armed.update(True)
            ctx.timer_service.register_processing_time_timer(
                ctx.timer_service.current_processing_time() + 5.0)

    def on_timer(self, timestamp: float, ctx: Any) -> Iterable[Any]:
        yield ("timeout", ctx.current_key, timestamp)


def _counter(**options: Any) -> OperatorTestHarness:
    return OperatorTestHarness.for_keyed_process(Count(), lambda w: w, uid="count", **options)


@pytest.mark.asyncio
async def test_keyed_count_snapshot_restores_into_a_new_harness_and_continues():
    harness = _counter().open()
    assert harness.process_elements(["a", "b", "a"]) == [("a", 1), ("b", 1), ("a", 2)]
    snapshot = await harness.snapshot()
    assert harness.process_element("a") == [("a", 3)]  # after the snapshot: not in it
    harness.close()

    with _counter() as fresh:  # no restore: counting starts again
        assert fresh.process_element("a") == [("a", 1)]

    restored = _counter().open(restore_from=snapshot)
    assert restored.process_elements(["a", "b", "c"]) == [("a", 3), ("b", 2), ("c", 1)]
    assert restored.get_state(ValueStateDescriptor("count", default=0), "a").value() == 3
    second = await restored.snapshot()
    assert second.checkpoint_id == snapshot.checkpoint_id + 1
    restored.close()
    with _counter().open(restore_from=second) as again:
        assert again.process_element("c") == [("c", 2)]


@pytest.mark.asyncio
async def test_snapshot_restores_at_another_parallelism_and_combines_back():
    words = [f"w{i}" for i in range(40)]
    single = _counter().open()
    single.process_elements(words + words[:10])
    snapshot = await single.snapshot()
    single.close()

    halves = [_counter(subtask=i, parallelism=2).open(restore_from=snapshot) for i in range(2)]
    mine = [[w for w in words if h.owns_key(w)] for h in halves]
    assert sorted(mine[0] + mine[1]) == sorted(words) and mine[0] and mine[1]
    for h, keys in zip(halves, mine, strict=True):
        assert h.process_elements(keys) == [(w, 3 if w in words[:10] else 2) for w in keys]
        with pytest.raises(UserFunctionError) as info:  # the other instance's key
            h.process_element(next(w for w in words if not h.owns_key(w)))
        assert isinstance(info.value.__cause__, StateAccessError)
    combined = OperatorSnapshot.combine([await h.snapshot() for h in halves])
    for h in halves:
        h.close()

    with _counter().open(restore_from=combined) as merged:
        assert merged.process_elements(words) == [
            (w, 4 if w in words[:10] else 3) for w in words]
    with pytest.raises(RestoreError):  # key groups would not line up
        _counter(max_parallelism=64).open(restore_from=combined).close()


@pytest.mark.asyncio
async def test_combine_copies_snapshots_of_separate_directories(tmp_path):
    halves = [_counter(subtask=i, parallelism=2, directory=tmp_path / f"h{i}").open()
              for i in range(2)]
    for h in halves:
        h.process_elements([w for w in ("a", "b", "c", "d") if h.owns_key(w)])
    combined = OperatorSnapshot.combine([await h.snapshot() for h in halves])
    assert not combined.job_dir.is_relative_to(tmp_path)
    for h in halves:
        h.close()
    with _counter().open(restore_from=combined) as merged:
        assert merged.process_elements(["a", "b", "c", "d"]) == [
            ("a", 2), ("b", 2), ("c", 2), ("d", 2)]
    with pytest.raises(ValueError):
        OperatorSnapshot.combine([combined, combined])


@pytest.mark.asyncio
async def test_event_time_timer_fires_on_a_watermark_also_after_a_restore():
    harness = OperatorTestHarness.for_keyed_process(EventTimeCount(), lambda r: r[0]).open()
    assert harness.process_elements([("a", 1.0), ("b", 2.0), ("a", 3.0)]) == [
        ("seen", "a", 1, float("-inf")), ("seen", "b", 1, float("-inf")),
        ("seen", "a", 2, float("-inf"))]
    assert harness.num_event_time_timers() == 3
    assert harness.process_watermark(10.5) == []  # nothing due before 11
    assert harness.process_watermark(11.0) == [("timer", "a", 11.0, 2)]
    assert harness.watermarks == [10.5, 11.0]  # forwarded after the timers' output
    snapshot = await harness.snapshot()
    harness.close()

    # the timers and the operator's event time are in the snapshot
    restored = OperatorTestHarness.for_keyed_process(
        EventTimeCount(), lambda r: r[0]).open(restore_from=snapshot)
    assert restored.num_event_time_timers() == 2
    assert restored.process_element(("b", 20.0)) == [("seen", "b", 2, 11.0)]
    assert restored.process_watermark(13.0) == [("timer", "b", 12.0, 2), ("timer", "a", 13.0, 2)]
    assert restored.end_input() == [("timer", "b", 30.0, 2)]  # the final watermark
    assert restored.watermarks[-1] == float("inf")
    restored.close()


def test_processing_time_timer_fires_on_the_manual_clock():
    clock = ManualClock(100.0)
    with OperatorTestHarness.for_keyed_process(ProcessingTimeout(), lambda r: r,
                                               clock=clock) as harness:
        assert harness.process_elements(["a", "b", "a"]) == []
        assert harness.num_processing_time_timers() == 2
        assert harness.set_processing_time(104.0) == []
        assert harness.set_processing_time(105.0) == [("timeout", "a", 105.0),
                                                      ("timeout", "b", 105.0)]
        assert harness.output == [("timeout", "a", 105.0), ("timeout", "b", 105.0)]
        assert harness.take_output() and harness.output == []
    assert ManualClock is ClockManualClock  # re-exported


def test_window_operator_fires_on_watermarks():
    with OperatorTestHarness.for_window(
            lambda r: r[0], TumblingEventTimeWindows.of(10), lambda r: r[1],
            aggregate=ReduceAggregate(lambda a, b: (a[0], a[1] + b[1], a[2] + b[2])),
    ) as harness:
        harness.process_elements([("a", 1.0, 1), ("a", 5.0, 2), ("b", 7.0, 5), ("a", 12.0, 4)])
        assert harness.process_watermark(9.0) == []
        assert harness.process_watermark(10.0) == [
            WindowResult("a", 0.0, 10.0, ("a", 6.0, 3)), WindowResult("b", 0.0, 10.0, ("b", 7.0, 5))]
        harness.process_element(("a", 3.0, 100))  # late: counted, not emitted
        assert harness.operator.late_records == 1  # type: ignore[attr-defined]
        assert harness.end_input() == [WindowResult("a", 10.0, 20.0, ("a", 12.0, 4))]


def test_generated_watermarks_and_idleness_go_through_the_mailbox():
    clock = ManualClock()
    op = TimestampsAndWatermarksOperator("ts", "ts", lambda r: r, max_out_of_orderness=2.0,
                                         idleness=10.0, clock=clock)
    with OperatorTestHarness(op, clock=clock) as harness:
        assert harness.process_elements([5.0, 3.0, 9.0]) == [5.0, 3.0, 9.0]
        assert harness.watermarks == [7.0]  # emitted by the operator's mailbox action
        harness.process_watermark(100.0)  # upstream watermarks stop at a generator
        assert harness.watermarks == [7.0]
        harness.set_processing_time(10.0)  # the first check saw records
        assert harness.watermark_statuses == []
        harness.set_processing_time(20.0)  # none since: idle
        assert harness.watermark_statuses == [IDLE]
        harness.process_element(12.0)
        assert harness.watermark_statuses == [IDLE, ACTIVE] and harness.watermarks == [7.0, 10.0]


def test_map_forwards_watermarks_and_refuses_use_before_open():
    harness = OperatorTestHarness.for_map(lambda x: x * 2)
    with pytest.raises(RuntimeError):
        harness.process_element(1)
    with harness:
        assert harness.process_elements([1, 2, 3]) == [2, 4, 6]
        assert harness.process_watermark(3.0) == [] and harness.watermarks == [3.0]
    with pytest.raises(RuntimeError):
        harness.process_element(1)


# ---------------------------------------------------------------------------- contract
THIRD_PARTY_TESTS = '''
"""What a third-party backend package's test module looks like."""

from reactive.backends.heap import HeapStateBackend
from reactive.testing.backend_contract import StateBackendContract


class TestPackagedContractOnHeap(StateBackendContract):
    def create_state_backend(self, tmp_path):
        return HeapStateBackend()
'''


@pytest.mark.e2e
def test_the_packaged_contract_runs_from_a_third_party_module_in_strict_mode(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not the repository's settings
    (tmp_path / "test_my_backend.py").write_text(textwrap.dedent(THIRD_PARTY_TESTS))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "asyncio_mode=strict",
         "-q", "-rs", "test_my_backend.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "16 passed" in proc.stdout, proc.stdout
    assert "skipped" not in proc.stdout and "failed" not in proc.stdout, proc.stdout
