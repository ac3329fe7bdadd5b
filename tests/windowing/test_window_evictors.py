"""Evictors (the cases of Flink's ``EvictingWindowOperatorTest`` this API expresses): what
the window function sees, and what stays in the window for the next firing, equal a plain
Python list computation."""

from __future__ import annotations

from typing import Any

from reactive.windowing import (
    CountEvictor,
    CountTrigger,
    DeltaEvictor,
    GlobalWindows,
    ProcessWindowFunction,
    TimeEvictor,
    TimeWindow,
    TumblingEventTimeWindows,
)
from tests.windowing.test_window_triggers import harness


class Amounts(ProcessWindowFunction):
    def process(self, key: Any, window: TimeWindow, elements: list[Any]) -> Any:
        yield [e[2] for e in elements]


def test_count_evictor_before_keeps_the_last_n_for_every_firing():
    h = harness(GlobalWindows.create(), trigger=CountTrigger.of(2),
                evictor=CountEvictor.of(3), process=Amounts())
    h.open()
    assert h.process_elements([("a", 0.0, i) for i in range(1, 8)]) == [
        [1, 2], [2, 3, 4], [4, 5, 6]]


def test_count_evictor_after_sees_everything_then_trims():
    h = harness(GlobalWindows.create(), trigger=CountTrigger.of(2),
                evictor=CountEvictor.of(1, do_evict_after=True), process=Amounts())
    h.open()
    assert h.process_elements([("a", 0.0, i) for i in range(1, 6)]) == [[1, 2], [2, 3, 4]]


def test_time_evictor_keeps_records_younger_than_the_newest_minus_size():
    h = harness(TumblingEventTimeWindows.of(100), evictor=TimeEvictor.of(3),
                process=Amounts())
    h.open()
    h.process_elements([("a", 1.0, 1), ("a", 5.0, 2), ("a", 3.0, 3), ("a", 7.5, 4)])
    # newest 7.5: a record with timestamp <= 4.5 goes
    assert h.process_watermark(100.0) == [[2, 4]]


def test_delta_evictor_and_aggregate_over_kept_records():
    h = harness(GlobalWindows.create(), trigger=CountTrigger.of(3),
                evictor=DeltaEvictor.of(10, lambda a, b: abs(a[2] - b[2])))
    h.open()
    out = h.process_elements([("a", 0.0, v) for v in (1, 30, 25, 28, 2, 27)])
    # firing 1 sees [1, 30, 25]: last 25, 1 goes -> sum 55 of 2; firing 2 sees
    # [30, 25, 28, 2, 27]: last 27, 2 goes -> 110 of 4
    assert [r.value for r in out] == [(55, 2), (110, 4)]
