"""Tumbling event-time windows with an aggregate fold each batch per (key, window): one read
and one write of the window's contents and one timer registration per run of a key's
records in a window, with the results, their order, the timers and exactly-once recovery
of the per-record path."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from reactive import (
    AggregateFunction,
    CheckpointConfig,
    Dataflow,
    RestartStrategy,
    TumblingEventTimeWindows,
    UserFunctionError,
    WindowResult,
)
from reactive.connectors.collections import ListSink
from reactive.testing import OperatorTestHarness
from reactive.time.timers import InternalTimerService
from reactive.windowing.functions import window_result
from reactive.windowing.window_operator import LateRecord
from tests.support import paced
from tests.windowing.test_windows import GatedInjector, SumAmount, TxnListSink, as_dict, batch_windows


def in_order(n: int, keys: int, seed: int) -> list[tuple[str, float, int]]:
    """``(key, timestamp, amount)``, one record per second in timestamp order."""
    rnd = random.Random(seed)
    return [(f"k{rnd.randrange(keys)}", float(i), rnd.randrange(1, 100)) for i in range(n)]


async def test_a_pipeline_registers_one_timer_per_key_window_and_batch(monkeypatch):
    registered = 0
    register = InternalTimerService.register_event_time_timer

    def counting(self: InternalTimerService, *args: Any, **kwargs: Any) -> None:
        nonlocal registered
        registered += 1
        register(self, *args, **kwargs)

    monkeypatch.setattr(InternalTimerService, "register_event_time_timer", counting)
    data = in_order(20_000, 3, seed=5)
    sink = ListSink()
    flow = Dataflow("folded", parallelism=2, batch_size=500)
    (flow.from_collection(data).assign_timestamps(lambda r: r[1])
         .key_by(lambda r: r[0]).window(TumblingEventTimeWindows.of(100))
         .aggregate(SumAmount()).sink(sink))
    await flow.run()
    assert as_dict(sink.records) == batch_windows(data, 100, 100)
    # 200 windows of 3 keys, ~33 records each: per record this would be 20,000
    windows = len(sink.records)
    assert windows <= registered <= 2 * windows


async def test_tumbling_windows_exact_after_crash_and_recovery(tmp_path: Path):
    data = [(k, ts + random.Random(int(ts)).uniform(-8, 0), a)
            for k, ts, a in in_order(40_000, 13, seed=23)]
    injector = GatedInjector(random.Random(4).sample(range(2_000, 16_000), 3), tmp_path)
    sink = TxnListSink()
    flow = Dataflow("crash-tumbling", parallelism=2, batch_size=300)
    # paced: a checkpoint completes every 4,000 records, so the failures (which each wait
    # for a new completed checkpoint) happen before the input ends on any machine
    (flow.source(paced(data, every=4_000)).uid("src").map(injector)
         .assign_timestamps(lambda r: r[1], 10.0)
         .key_by(lambda r: r[0]).window(TumblingEventTimeWindows.of(60))
         .aggregate(SumAmount()).uid("windows").sink(sink))
    job = await flow.run(checkpoints=CheckpointConfig(interval=0.05, directory=tmp_path),
                         restart=RestartStrategy.fixed(5, 0))
    assert injector.failures >= 1 and job.metrics.restarts == injector.failures
    assert job.metrics.restored_checkpoints
    assert as_dict(sink.committed) == batch_windows(data, 60, 60)


class _CountingState:
    """A map state that counts reads and writes (wraps the operator's window contents)."""

    def __init__(self, state: Any) -> None:
        self.state = state
        self.gets = self.puts = 0

    def get(self, *args: Any) -> Any:
        self.gets += 1
        return self.state.get(*args)

    def put(self, *args: Any) -> None:
        self.puts += 1
        self.state.put(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.state, name)


def window_harness(lateness: float = 0.0, late_output: bool = True,
                   agg: AggregateFunction | None = None) -> OperatorTestHarness:
    h = OperatorTestHarness.for_window(lambda r: r[0], TumblingEventTimeWindows.of(10),
                                       lambda r: r[1], aggregate=agg or SumAmount(),
                                       allowed_lateness=lateness,
                                       late_side_output=late_output)
    return h.open()


def test_a_batch_reads_and_writes_each_window_once():
    h = window_harness()
    counting = _CountingState(h.operator.contents)
    h.operator.contents = counting
    batch = [(k, float(t), 1) for t in range(20) for k in ("a", "b")]
    assert h.process_elements(batch) == []
    assert (counting.gets, counting.puts) == (4, 4)  # 2 keys x 2 windows, not 40
    assert h.num_event_time_timers() == 4
    out = h.process_watermark(20.0)
    assert sorted((r.key, r.start, r.value) for r in out) == [
        ("a", 0.0, (10, 10)), ("a", 10.0, (10, 10)), ("b", 0.0, (10, 10)),
        ("b", 10.0, (10, 10))]
    assert h.num_event_time_timers() == 0


def _per_record(h: OperatorTestHarness) -> OperatorTestHarness:
    h.operator.grouped = False  # the per-record path (_process_inline) of the same operator
    return h


def _run(h: OperatorTestHarness, steps: list[tuple[str, Any]]) -> list[Any]:
    out: list[Any] = []
    for kind, value in steps:
        if kind == "batch":
            out += [("batch", r) for r in h.process_elements(value)]
        else:
            out += [("watermark", r) for r in h.process_watermark(value)]
    out += [("end", r) for r in h.end_input()]
    return [(k, (r.key, r.start, r.end, r.value) if isinstance(r, WindowResult)
             else ("late", r.record) if isinstance(r, LateRecord) else r) for k, r in out]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("lateness", [0.0, 7.0])
def test_folding_gives_the_per_record_results_in_the_same_order(seed, lateness):
    # disordered batches with records for ended windows (late firings within the lateness,
    # late records beyond it) between on-time ones, and watermarks between the batches
    rnd = random.Random(seed)
    steps: list[tuple[str, Any]] = []
    high = 0.0
    for _ in range(40):
        batch = []
        for _ in range(rnd.randrange(1, 30)):
            high += rnd.uniform(0, 2)
            batch.append((rnd.choice("abcd"), high - rnd.uniform(0, 25), rnd.randrange(9)))
        steps.append(("batch", batch))
        steps.append(("watermark", high - 5))
    grouped = _run(window_harness(lateness), steps)
    per_record = _run(_per_record(window_harness(lateness)), steps)
    assert grouped == per_record
    assert any(r[0] == "late" for _, r in grouped)  # the steps did reach both paths


def test_timers_fire_in_the_order_of_the_per_record_path():
    # timers due at the same time fire in registration order: the order of the first
    # records of each (key, window), in both paths
    batch = [(k, 1.0, 1) for k in ("c", "a", "b", "a", "c", "d")]
    grouped = _run(window_harness(), [("batch", batch), ("watermark", 10.0)])
    per_record = _run(_per_record(window_harness()), [("batch", batch),
                                                      ("watermark", 10.0)])
    assert [r[1][0] for r in grouped] == ["c", "a", "b", "d"]
    assert grouped == per_record


class FailsOn(AggregateFunction):
    def create_accumulator(self) -> Any:
        return 0

    def add(self, value: Any, acc: Any) -> Any:
        if value[2] == 13:
            raise ValueError("unlucky")
        return acc + value[2]

    def get_result(self, acc: Any) -> Any:
        return acc

    def merge(self, a: Any, b: Any) -> Any:
        return a + b


def test_an_aggregate_failure_names_its_record():
    h = window_harness(agg=FailsOn())
    with pytest.raises(UserFunctionError) as info:
        h.process_elements([("a", 1.0, 1), ("b", 2.0, 2), ("a", 3.0, 13), ("a", 4.0, 4)])
    assert info.value.record == ("a", 3.0, 13)


def test_a_failure_in_the_groups_before_a_late_record_names_its_record():
    # the record for the ended window [0, 10) folds the groups before it, where add fails
    h = window_harness(agg=FailsOn())
    h.process_watermark(12.0)
    with pytest.raises(UserFunctionError) as info:
        h.process_elements([("a", 21.0, 13), ("b", 3.0, 1), ("a", 22.0, 4)])
    assert info.value.record == ("a", 21.0, 13)


def test_a_timer_registered_as_new_twice_fires_once():
    h = window_harness()
    timers = h.operator.timers
    h.keyed_backend.set_current_key("a")  # type: ignore[union-attr]
    timers.register_event_time_timer(5.0, "w", new=True)
    timers.register_event_time_timer(5.0, "w", new=True)
    assert h.num_event_time_timers() == 1
    fired: list[Any] = []
    timers.on_event_time = lambda ts, ns: fired.append((ts, ns)) or []
    timers.advance_watermark(6.0)
    assert fired == [(5.0, "w")]


def test_window_result_builds_the_dataclass():
    assert window_result(("a", 1), 0.0, 10.0, (3, 4)) == WindowResult(("a", 1), 0.0, 10.0,
                                                                     (3, 4))
