"""Triggers, processing-time, global and dynamic-gap windows, late firings and the process
window context: results equal a plain-Python computation of Flink's semantics (the cases of
Flink's ``WindowOperatorTest`` that this API expresses), and trigger state survives
snapshots and restores at another parallelism on both state backends."""

from __future__ import annotations

import collections
import random
from pathlib import Path
from typing import Any

import pytest

from reactive import Dataflow, ReducingStateDescriptor, ValueStateDescriptor
from reactive.backends.heap import HeapStateBackend
from reactive.connectors.collections import ListSink
from reactive.testing import OperatorSnapshot, OperatorTestHarness
from reactive.time.clock import ManualClock
from reactive.windowing import (
    ContinuousEventTimeTrigger,
    CountEvictor,
    CountTrigger,
    CountWindows,
    EventTimeSessionWindows,
    GlobalWindows,
    ProcessingTimeSessionWindows,
    ProcessWindowFunction,
    PurgingTrigger,
    SlidingProcessingTimeWindows,
    TimeWindow,
    Trigger,
    TriggerResult,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
)
from reactive.windowing.triggers import TriggerContext
from reactive.windowing.window_operator import SideOutput, WindowOperator
from tests.windowing.test_windows import SumAmount, as_dict, batch_sessions, events


def wresults(out: list[Any]) -> list[tuple[Any, float, float, Any]]:
    return [(r.key, r.start, r.end, r.value) for r in out if hasattr(r, "value")
            and not isinstance(r, SideOutput)]


def harness(assigner: Any, *, trigger: Any = None, evictor: Any = None,
            process: Any = None, lateness: float = 0.0, discarding: bool = False,
            clock: ManualClock | None = None, **options: Any) -> OperatorTestHarness:
    clock = clock or ManualClock()
    op = WindowOperator("window", "window", lambda r: r[0], assigner,
                        (lambda r: r[1]) if assigner.is_event_time else None,
                        aggregate=None if process else SumAmount(), process=process,
                        allowed_lateness=lateness, clock=clock, late_side_output=lambda: True,
                        trigger=trigger, evictor=evictor, discarding=discarding)
    return OperatorTestHarness(op, clock=clock, **options)


# ------------------------------------------------------------------ count trigger / global
async def test_count_trigger_on_global_windows_equals_flink_sliding_count_windows():
    """Flink's countWindow(5, 2) is the global window + CountTrigger(2) + CountEvictor(5);
    CountWindows.of(5, 2, partial=True) must fire the same windows (partial ones first)."""
    data = events(2_000, 4, seed=11)
    evicting, shared = ListSink(), ListSink()
    flow = Dataflow("flink-count", parallelism=2, batch_size=37)
    keyed = flow.from_collection(data).key_by(lambda r: r[0])
    (keyed.window(GlobalWindows.create()).trigger(CountTrigger.of(2))
          .evictor(CountEvictor.of(5)).aggregate(SumAmount()).sink(evicting))
    keyed.window(CountWindows.of(5, 2, partial=True)).aggregate(SumAmount()).sink(shared)
    await flow.run()
    per_key = collections.defaultdict(list)
    for k, _, amount in data:
        per_key[k].append(amount)
    want = collections.Counter()
    for k, v in per_key.items():
        for n in range(2, len(v) + 1, 2):  # a firing every 2 records, the last 5 of them
            last = v[max(0, n - 5):n]
            want[(k, sum(last), len(last))] += 1
    assert collections.Counter((r.key, *r.value) for r in evicting.records) == want
    assert collections.Counter((r.key, *r.value) for r in shared.records) == want
    for r in shared.records:  # windows end at multiples of the slide, begin >= 0
        assert r.end % 2 == 0 and r.start == max(0, r.end - 5)


def test_purging_count_trigger_is_a_tumbling_count_window():
    h = harness(GlobalWindows.create(), trigger=PurgingTrigger.of(CountTrigger.of(3)))
    h.open()
    out = h.process_elements([("a", 0.0, i) for i in range(1, 8)])
    assert [r[3] for r in wresults(out)] == [(6, 3), (15, 3)]
    assert wresults(h.end_input()) == []  # the global window never ends: 7 stays


# ------------------------------------------------------------------ continuous event time
def test_continuous_event_time_trigger_fires_early_and_at_the_end():
    h = harness(TumblingEventTimeWindows.of(10), trigger=ContinuousEventTimeTrigger.of(3))
    h.open()
    h.process_elements([("a", 1.0, 1), ("a", 2.0, 2)])
    assert [r[3] for r in wresults(h.process_watermark(3.0))] == [(3, 2)]
    h.process_element(("a", 4.0, 4))
    assert wresults(h.process_watermark(5.0)) == []
    assert [r[3] for r in wresults(h.process_watermark(6.5))] == [(7, 3)]
    h.process_element(("a", 9.0, 10))
    assert [r[3] for r in wresults(h.process_watermark(10.0))] == [(17, 4), (17, 4)]


# ------------------------------------------------------------------ processing time
def test_processing_time_tumbling_and_sliding_windows():
    clock = ManualClock(0.0)
    h = harness(TumblingProcessingTimeWindows.of(3), clock=clock)
    h.open()
    h.set_processing_time(1.0)
    h.process_elements([("a", 0.0, 1), ("b", 0.0, 10)])
    h.set_processing_time(2.5)
    h.process_element(("a", 0.0, 2))
    assert sorted(wresults(h.set_processing_time(3.0))) == [
        ("a", 0.0, 3.0, (3, 2)), ("b", 0.0, 3.0, (10, 1))]
    h.process_element(("a", 0.0, 5))
    assert wresults(h.set_processing_time(7.0)) == [("a", 3.0, 6.0, (5, 1))]
    assert h.num_processing_time_timers() == 0  # cleaned up at the end

    clock = ManualClock(0.0)
    s = harness(SlidingProcessingTimeWindows.of(4, 2), clock=clock)
    s.open()
    s.set_processing_time(1.0)
    s.process_element(("a", 0.0, 1))
    s.set_processing_time(3.0)
    s.process_element(("a", 0.0, 2))
    assert wresults(s.set_processing_time(4.0)) == [("a", 0.0, 4.0, (3, 2))]
    assert wresults(s.set_processing_time(6.0)) == [("a", 2.0, 6.0, (2, 1))]


def test_processing_time_session_windows_merge():
    clock = ManualClock(0.0)
    h = harness(ProcessingTimeSessionWindows.with_gap(3), clock=clock)
    h.open()
    h.process_element(("a", 0.0, 1))
    h.set_processing_time(2.0)
    h.process_element(("a", 0.0, 2))  # [2, 5) merges with [0, 3)
    h.set_processing_time(4.0)
    assert wresults(h.take_output()) == []
    assert wresults(h.set_processing_time(5.0)) == [("a", 0.0, 5.0, (3, 2))]


# ------------------------------------------------------------------ dynamic gap
async def test_dynamic_gap_sessions_equal_batch_sessions_per_gap():
    rnd = random.Random(7)
    data, t = [], 0.0
    for _ in range(3_000):
        t += rnd.choice([0.5, 1.0, 2.0, 40.0])
        data.append((f"k{rnd.randrange(3)}", t, rnd.randrange(10)))
    sink = ListSink()
    flow = Dataflow("dyn", parallelism=2, batch_size=50)
    (flow.from_collection(data).assign_timestamps(lambda r: r[1])
         .key_by(lambda r: r[0])
         .window(EventTimeSessionWindows.with_dynamic_gap(lambda r: 10.0))
         .aggregate(SumAmount()).sink(sink))
    await flow.run()
    assert as_dict(sink.records) == batch_sessions(data, 10.0)


def test_dynamic_gap_comes_from_the_record_and_bad_gaps_fail_naming_it():
    h = harness(EventTimeSessionWindows.with_dynamic_gap(lambda r: r[2]))
    h.open()
    h.process_elements([("a", 0.0, 5), ("a", 4.0, 1), ("a", 20.0, 2)])
    assert wresults(h.process_watermark(30.0)) == [
        ("a", 0.0, 5.0, (6, 2)), ("a", 20.0, 22.0, (2, 1))]
    with pytest.raises(Exception, match="gap must be > 0"):
        h.process_element(("a", 40.0, 0))


# ------------------------------------------------------------------ late firings
@pytest.mark.parametrize("discarding", [False, True])
def test_late_firings_accumulating_or_discarding(discarding):
    h = harness(TumblingEventTimeWindows.of(10), lateness=5, discarding=discarding)
    h.open()
    h.process_elements([("a", 1.0, 1), ("a", 2.0, 2)])
    assert [r[3] for r in wresults(h.process_watermark(10.0))] == [(3, 2)]
    late = [r[3] for r in wresults(h.process_element(("a", 3.0, 4)))]
    assert late == ([(4, 1)] if discarding else [(7, 3)])
    h.process_watermark(15.0)  # cleaned up: now late for good
    out = h.process_element(("a", 4.0, 8))
    assert wresults(out) == [] and [r.record for r in out] == [("a", 4.0, 8)]


# ------------------------------------------------------------------ process window context
class Firings(ProcessWindowFunction):
    """Counts its firings per window (window state) and per key (global state), sends
    windows with a large sum to a side output."""

    def __init__(self) -> None:
        self.per_window = ReducingStateDescriptor("firings", lambda a, b: a + b)
        self.per_key = ValueStateDescriptor("windows-fired", default=0)
        self.cleared: list[tuple[float, float]] = []

    def process(self, key: Any, window: TimeWindow, elements: list[Any], ctx: Any) -> Any:
        fired = ctx.window_state(self.per_window)
        fired.add(1)
        total = ctx.global_state(self.per_key)
        total.update(total.value() + 1)
        s = sum(e[2] for e in elements)
        if s > 100:
            ctx.output("big", (key, window.start, s))
        yield (key, window.start, s, fired.get(), total.value(), ctx.current_watermark())

    def clear(self, ctx: Any) -> None:
        ctx.window_state(self.per_window).clear()
        self.cleared.append((ctx.window.start, ctx.window.end))


def test_process_window_context_state_side_output_and_clear():
    fn = Firings()
    h = harness(TumblingEventTimeWindows.of(10), process=fn, lateness=5)
    h.open()
    h.process_elements([("a", 1.0, 1), ("a", 12.0, 200)])
    assert h.process_watermark(10.0) == [("a", 0.0, 1, 1, 1, 10.0)]
    assert h.process_element(("a", 2.0, 3)) == [("a", 0.0, 4, 2, 2, 10.0)]  # late firing
    out = h.process_watermark(20.0)
    assert [o for o in out if not isinstance(o, SideOutput)] == [("a", 10.0, 200, 1, 3, 20.0)]
    assert [(o.tag, o.value) for o in out if isinstance(o, SideOutput)] == [
        ("big", ("a", 10.0, 200))]
    assert h.operator.fn.cleared == [(0.0, 10.0)]  # at 10 + 5 (the instance's copy)
    h.process_watermark(25.0)
    assert h.operator.fn.cleared == [(0.0, 10.0), (10.0, 20.0)]


async def test_side_output_of_a_process_window_function_in_a_pipeline():
    data = events(3_000, 3, seed=12)
    main, big = ListSink(), ListSink()
    flow = Dataflow("side", parallelism=2, batch_size=64)
    windowed = (flow.from_collection(data).assign_timestamps(lambda r: r[1])
                .key_by(lambda r: r[0]).window(TumblingEventTimeWindows.of(100)))
    windowed.process(Firings()).sink(main)
    windowed.side_output("big").sink(big)
    await flow.run()
    sums = collections.Counter()
    for k, ts, amount in data:
        sums[(k, ts - ts % 100)] += amount
    assert sorted((k, s, v) for k, s, v, *_ in main.records) == sorted(
        (k, s, v) for (k, s), v in sums.items())
    assert sorted(big.records) == sorted((k, s, v) for (k, s), v in sums.items() if v > 100)


# ------------------------------------------------------------------ user trigger, rescaled
class EveryNthOrEnd(Trigger):
    """A user trigger with trigger state: fires every ``n`` records of a window (a count
    in a value state) and at the window's end."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.count = ValueStateDescriptor("seen", default=0)

    def on_element(self, element: Any, timestamp: float, window: TimeWindow,
                   ctx: TriggerContext) -> TriggerResult:
        ctx.register_event_time_timer(window.end)
        seen = ctx.get_partitioned_state(self.count)
        seen.update(seen.value() + 1)
        return TriggerResult.FIRE if seen.value() % self.n == 0 else TriggerResult.CONTINUE

    def on_event_time(self, time: float, window: TimeWindow,
                      ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.FIRE if time == window.end else TriggerResult.CONTINUE

    def clear(self, window: TimeWindow, ctx: TriggerContext) -> None:
        ctx.get_partitioned_state(self.count).clear()
        ctx.delete_event_time_timer(window.end)


def _backend(kind: str, directory: Path) -> Any:
    if kind == "heap":
        return HeapStateBackend()
    from reactive.backends.rocksdb import RocksDBStateBackend
    return RocksDBStateBackend(path=directory / "rocksdb")


def _run(instances: list[OperatorTestHarness], records: list[Any],
         watermarks: dict[int, float]) -> list[Any]:
    out: list[Any] = []
    for i, r in enumerate(records):
        for h in instances:
            if h.owns_key(r[0]):
                out += h.process_element(r)
        if i in watermarks:
            for h in instances:
                out += h.process_watermark(watermarks[i])
    return out


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
async def test_user_trigger_restores_at_another_parallelism_with_identical_output(backend,
                                                                                 tmp_path):
    rnd = random.Random(3)
    records = [(f"k{rnd.randrange(9)}", float(i // 3), rnd.randrange(5)) for i in range(600)]
    watermarks = {i: float(i // 3 - 2) for i in range(0, 600, 25)}
    cut = 311

    def make(p: int, i: int) -> OperatorTestHarness:
        return harness(TumblingEventTimeWindows.of(20), trigger=EveryNthOrEnd(4),
                       parallelism=p, subtask=i, max_parallelism=16,
                       state_backend=_backend(backend, tmp_path))

    whole = [make(1, 0).open()]
    expected = _run(whole, records, watermarks) + whole[0].end_input()

    first = [make(2, i).open() for i in range(2)]
    got = _run(first, records[:cut], {i: w for i, w in watermarks.items() if i < cut})
    snapshot = OperatorSnapshot.combine([await h.snapshot(1) for h in first])
    for h in first:
        h.close()
    second = [make(3, i).open(restore_from=snapshot) for i in range(3)]
    got += _run(second, records[cut:], {i - cut: w for i, w in watermarks.items() if i >= cut})
    for h in second:
        got += h.end_input()
    key = lambda r: (r.key, r.start, r.end, r.value)  # noqa: E731
    assert sorted(map(key, got)) == sorted(map(key, expected))
    assert len(expected) > 150  # early firings every 4 records and at the ends
