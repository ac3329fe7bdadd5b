"""Timers in KeyedProcessFunction: event time, processing time (fake clock, mailbox),
deletion, and exactly-once firing across a crash, a restore and a rescale."""

from __future__ import annotations

import collections
import random
from pathlib import Path
from typing import Any

from reactive import (
    CheckpointConfig,
    Dataflow,
    KeyedProcessFunction,
    ManualClock,
    RestartStrategy,
    SnapshotContext,
    ValueStateDescriptor,
    key_group_range_for_operator,
)
from reactive.backends.heap import HeapKeyedStateBackend
from reactive.connectors.collections import ListSink
from reactive.sources import Source, SourceReader
from reactive.time.timers import InternalTimerService
from tests.support import paced
from tests.windowing.test_windows import GatedInjector, TxnListSink


class BucketTimers(KeyedProcessFunction):
    """Counts records per key and 10-second bucket; a timer at the bucket's end emits
    ``(key, bucket end, count)`` and clears the count."""

    def open(self, ctx: Any) -> None:
        self.counts = ctx.get_state(ValueStateDescriptor("counts", default=()))

    def process_element(self, value: Any, ctx: Any) -> Any:
        end = (value[1] // 10 + 1) * 10
        ctx.timer_service.register_event_time_timer(end)
        counts = dict(self.counts.value())
        counts[end] = counts.get(end, 0) + 1
        self.counts.update(tuple(counts.items()))
        return None

    def on_timer(self, timestamp: float, ctx: Any) -> Any:
        assert ctx.timer_service.current_watermark() >= timestamp
        counts = dict(self.counts.value())
        yield (ctx.current_key, timestamp, counts.pop(timestamp))
        self.counts.update(tuple(counts.items()))


def expected_buckets(data: list[tuple[str, float]]) -> collections.Counter[Any]:
    return collections.Counter((k, (ts // 10 + 1) * 10) for k, ts in data)


def make_data(n: int, seed: int) -> list[tuple[str, float]]:
    rnd = random.Random(seed)
    return [(f"k{rnd.randrange(13)}", i / 3 - rnd.uniform(0, 4)) for i in range(n)]


async def test_event_time_timers_fire_once_per_key_and_time():
    data = make_data(6_000, 1)
    sink = ListSink()
    flow = Dataflow("timers", parallelism=3, batch_size=128)
    (flow.from_collection(data).assign_timestamps(lambda r: r[1], 4.0)
         .key_by(lambda r: r[0]).process(BucketTimers()).sink(sink))
    await flow.run()
    assert collections.Counter({(k, t): n for k, t, n in sink.records}) == expected_buckets(data)
    assert len(sink.records) == len(expected_buckets(data))


async def test_timers_fire_exactly_once_across_recovery(tmp_path: Path):
    data = make_data(30_000, 2)
    tick = GatedInjector(sorted(random.Random(3).sample(range(2_000, 12_000), 3)), tmp_path)
    sink = TxnListSink()
    flow = Dataflow("timers-crash", parallelism=2, batch_size=100)
    # the source waits for a completed checkpoint every 1,000 records: the injector, which
    # fails only after a checkpoint completed, then fails on any machine, however busy
    (flow.source(paced(data, every=1_000)).uid("src").map(tick)
         .assign_timestamps(lambda r: r[1], 4.0)
         .key_by(lambda r: r[0]).process(BucketTimers()).uid("buckets").sink(sink))
    job = await flow.run(checkpoints=CheckpointConfig(interval=0.05, directory=tmp_path),
                         restart=RestartStrategy.fixed(5, 0))
    # at least one crash restored a real checkpoint (the gate waits for one per failure)
    assert tick.failures >= 1 and job.metrics.restarts == tick.failures
    assert job.metrics.restored_checkpoints
    fired = collections.Counter((k, t) for k, t, _ in sink.committed)
    assert set(fired.values()) == {1}  # none duplicated
    assert {(k, t): n for k, t, n in sink.committed} == dict(expected_buckets(data))  # none lost


class DeleteTimers(KeyedProcessFunction):
    def process_element(self, value: Any, ctx: Any) -> Any:
        ctx.timer_service.register_event_time_timer(value[1] + 5)
        if value[2] == "cancel":
            ctx.timer_service.delete_event_time_timer(value[1] + 5)
        return None

    def on_timer(self, timestamp: float, ctx: Any) -> Any:
        yield (ctx.current_key, timestamp)


async def test_deleted_timers_do_not_fire():
    data = [("a", 1.0, "keep"), ("b", 2.0, "cancel"), ("c", 3.0, "keep")]
    sink = ListSink()
    flow = Dataflow("delete")
    (flow.from_collection(data).assign_timestamps(lambda r: r[1])
         .key_by(lambda r: r[0]).process(DeleteTimers()).sink(sink))
    await flow.run()
    assert sorted(sink.records) == [("a", 6.0), ("c", 8.0)]


# Hand-written: the reader moves the manual processing-time clock between batches, a
# per-batch hook a TestingSource does not have.
class ClockSource(Source):
    """Emits records one batch at a time and moves a manual clock forward after each."""

    max_source_parallelism = 1

    def __init__(self, batches: list[list[Any]], clock: ManualClock, step: float) -> None:
        self.batches = batches
        self.clock = clock
        self.step = step

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        return _ClockReader(self)


class _ClockReader(SourceReader):
    def __init__(self, src: ClockSource) -> None:
        self.src = src
        self.i = 0

    async def read_batch(self, max_records: int) -> list[Any] | None:
        if self.i >= len(self.src.batches):
            return None
        if self.i:
            self.src.clock.advance(self.src.step)
        self.i += 1
        return self.src.batches[self.i - 1]

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        return [self.i]

    def restore_state(self, entries: list[Any]) -> None:
        self.i = entries[0]


class ProcessingTimeout(KeyedProcessFunction):
    """Emits ``(key, registered at, timer time, clock when fired)`` ``record[1]`` seconds
    of processing time after a key's first record."""

    def open(self, ctx: Any) -> None:
        self.armed = ctx.get_state(ValueStateDescriptor("armed"))

    def process_element(self, value: Any, ctx: Any) -> Any:
        if self.armed.value() is None:
            now = ctx.timer_service.current_processing_time()
            self.armed.update(now)
            ctx.timer_service.register_processing_time_timer(now + value[1])
        return None

    def on_timer(self, timestamp: float, ctx: Any) -> Any:
        yield (ctx.current_key, self.armed.value(), timestamp,
               ctx.timer_service.current_processing_time())


async def test_processing_time_timers_fire_through_the_mailbox():
    clock = ManualClock(start=100.0)
    # the source moves the clock 1 s per batch, 40 batches: a and b time out (5 s), z
    # (1000 s) does not before the end, so it never fires (pending timers stay in state)
    batches = [[("a", 5.0)], [("b", 5.0)], [("z", 1000.0)]] + [[("x", 1e6)]] * 40
    sink = ListSink()
    flow = Dataflow("ptime", batch_size=1, buffer_timeout=0)
    flow.processing_clock = clock
    flow.source(ClockSource(batches, clock, 1.0)).key_by(lambda r: r[0]).process(
        ProcessingTimeout()).sink(sink)
    await flow.run()
    fired = collections.Counter(k for k, *_ in sink.records)
    assert fired == {"a": 1, "b": 1}
    for _, registered, timestamp, now in sink.records:
        assert timestamp == registered + 5.0 and now >= timestamp


def _fire_all(ranges: list[tuple[int, int]], handles: list[dict[str, Any]], job_dir: Path,
              maxp: int) -> list[tuple[Any, float]]:
    fired: list[tuple[Any, float]] = []
    for i, p in ranges:
        backend = HeapKeyedStateBackend(key_group_range_for_operator(i, p, maxp), maxp)
        backend.restore(handles, job_dir)
        svc = InternalTimerService(
            backend, ManualClock(), None,
            lambda ts, ns, b=backend: fired.append((b.current_key, ts)) or [],
            lambda ts, ns: [])
        svc.restore()
        svc.advance_watermark(float("inf"))
    return fired


async def test_timers_are_keyed_state_and_rescale(tmp_path: Path):
    maxp = 16
    keys = [f"key{i}" for i in range(40)]
    handles = []
    for i in range(2):  # two old instances, each with its key groups' timers
        backend = HeapKeyedStateBackend(key_group_range_for_operator(i, 2, maxp), maxp)
        svc = InternalTimerService(backend, ManualClock(), None, lambda ts, ns: [],
                                   lambda ts, ns: [])
        for k in keys:
            try:
                backend.set_current_key(k)
            except Exception:
                continue  # another instance owns it
            svc.register_event_time_timer(10.0)
            svc.register_event_time_timer(20.0)
            svc.register_event_time_timer(20.0)  # a duplicate registration is one timer
            svc.register_event_time_timer(30.0)
            svc.delete_event_time_timer(30.0)
        ctx = SnapshotContext(1, tmp_path, tmp_path / "chk-1", tmp_path / "shared", "op", i)
        handles.append(await backend.snapshot(ctx).write())
    # restore at parallelism 3: every timer fires once, in one of the new instances
    fired = _fire_all([(0, 3), (1, 3), (2, 3)], handles, tmp_path, maxp)
    assert sorted(fired) == sorted((k, t) for k in keys for t in (10.0, 20.0))


class _RecordingTimers:
    """A timer service kept outside the runtime (as the Spark runner's): it records the
    registrations per key and fires event-time timers when the watermark passes them, with
    their key as the current key."""

    def __init__(self, backend, clock, on_event_time):
        self.backend = backend
        self.clock = clock
        self.watermark = float("-inf")
        self.on_event_time = on_event_time
        self.registered: list[tuple[float, Any, Any]] = []
        self.closed = False

    def register_event_time_timer(self, timestamp, namespace=None, *, new=False):
        self.registered.append((timestamp, self.backend.current_key, namespace))

    def delete_event_time_timer(self, timestamp, namespace=None):
        self.registered.remove((timestamp, self.backend.current_key, namespace))

    def register_processing_time_timer(self, timestamp, namespace=None):
        raise AssertionError("no processing-time timers in this test")

    delete_processing_time_timer = register_processing_time_timer

    def advance_watermark(self, watermark):
        self.watermark = watermark
        due = sorted((t for t in self.registered if t[0] <= watermark), key=lambda t: t[0])
        self.registered = [t for t in self.registered if t[0] > watermark]
        out = []
        for timestamp, key, namespace in due:
            self.backend.set_current_key(key)
            out.extend(self.on_event_time(timestamp, namespace))
        return out

    def fire_processing_timers(self):
        return []

    def close(self):
        self.closed = True


def test_keyed_operators_take_their_timers_from_the_injected_factory():
    """A keyed process function and a window operator both get their timer service from
    ``timer_service_factory`` (Flink's InternalTimeServiceManager): what a runner outside
    the runtime (Spark) passes instead of patching the operators. The function's
    ``ctx.timer_service`` and the window's end-of-window timer go to it, and the firing
    outputs come back through the operator."""
    from reactive import KeyedProcessFunction, TimeDomain, TumblingEventTimeWindows
    from reactive.testing import OperatorTestHarness
    from reactive.windowing import AggregateFunction

    made: list[_RecordingTimers] = []

    def factory(op, clock, on_event_time, on_processing_time):
        made.append(_RecordingTimers(op.keyed_backend, clock, on_event_time))
        return made[-1]

    class RemindLater(KeyedProcessFunction):
        def process_element(self, value, ctx):
            ctx.timer_service.register_event_time_timer(value[1] + 10)
            return []

        def on_timer(self, timestamp, ctx):
            yield (ctx.current_key, timestamp, ctx.time_domain())

    class Total(AggregateFunction):
        def create_accumulator(self):
            return 0

        def add(self, value, accumulator):
            return accumulator + value[1]

        def get_result(self, accumulator):
            return accumulator

        def merge(self, a, b):
            return a + b

    process = OperatorTestHarness.for_keyed_process(RemindLater(), lambda r: r[0])
    process.operator.timer_service_factory = factory
    with process:
        process.process_elements([("a", 1.0), ("b", 5.0)])
        assert made[0].registered == [(11.0, "a", None), (15.0, "b", None)]
        assert process.process_watermark(12.0) == [("a", 11.0, TimeDomain.EVENT_TIME)]
    assert made[0].closed

    window = OperatorTestHarness.for_window(lambda r: r[0], TumblingEventTimeWindows.of(10),
                                            lambda r: r[1], aggregate=Total())
    window.operator.timer_service_factory = factory
    with window:
        window.process_elements([("a", 1.0), ("a", 2.0)])
        assert [(ts, key) for ts, key, _ in made[1].registered] == [(10.0, "a")]
        fired = window.process_watermark(10.0)
    assert [(r.key, r.start, r.end, r.value) for r in fired] == [("a", 0.0, 10.0, 3.0)]
