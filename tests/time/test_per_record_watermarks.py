"""Per-record watermarks of ``assign_timestamps``: batching never changes which records are
late. The same input run with one record per batch and with 1024 per batch gives the same
window firings and the same late records, and both equal a plain-Python loop that applies
the watermark ``max timestamp so far - bound`` before every record."""

from __future__ import annotations

import collections
import random
from typing import Any

import pytest

from reactive import (
    AggregateFunction,
    Dataflow,
    EventTimeSessionWindows,
    KeyedProcessFunction,
    ManualClock,
    TumblingEventTimeWindows,
    UserFunctionError,
)
from reactive.connectors.collections import ListSink
from reactive.runtime.operators.timestamps import TimestampsAndWatermarksOperator
from reactive.testing import OperatorTestHarness

SIZE, LATENESS, BOUND = 10.0, 3.0, 4.0


class SumAmount(AggregateFunction):
    def create_accumulator(self) -> Any:
        return 0

    def add(self, value: Any, acc: Any) -> Any:
        return acc + value[2]

    def get_result(self, acc: Any) -> Any:
        return acc

    def merge(self, a: Any, b: Any) -> Any:
        return a + b


def disordered(n: int, seed: int) -> list[tuple[str, float, int]]:
    """``(key, timestamp, amount)``: mostly within the bound, every ~25th record far behind
    (some late, some within the allowed lateness, some on time for a later window)."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        ts = i * 0.5 - rnd.uniform(0, BOUND)
        if rnd.random() < 0.04:
            ts -= rnd.uniform(0, 20)
        out.append((f"k{rnd.randrange(3)}", round(ts, 3), rnd.randrange(1, 50)))
    return out


def per_record_tumbling(data: list[tuple[str, float, int]]
                        ) -> tuple[dict[tuple[str, float], list[int]], list[Any]]:
    """The batch answer: firings per (key, window start), in order, and the late records.

    Before every record the watermark is ``max(earlier timestamps) - BOUND``; a window fires
    when the watermark reaches its end, fires again for each record within the allowed
    lateness (accumulating), and a record whose window ended ``LATENESS`` or more before the
    watermark is late."""
    sums: dict[tuple[str, float], int] = collections.defaultdict(int)
    fired: set[tuple[str, float]] = set()
    firings: dict[tuple[str, float], list[int]] = collections.defaultdict(list)
    late = []
    high = float("-inf")

    def advance(wm: float) -> None:
        for w in sorted(w for w in sums if w not in fired and w[1] + SIZE <= wm):
            fired.add(w)
            firings[w].append(sums[w])

    for rec in data:
        key, ts, amount = rec
        start = ts - ts % SIZE
        wm = high - BOUND
        advance(wm)
        if start + SIZE + LATENESS <= wm:
            late.append(rec)
        else:
            sums[(key, start)] += amount
            if (key, start) in fired:
                firings[(key, start)].append(sums[(key, start)])
        high = max(high, ts)
    advance(float("inf"))
    return dict(firings), late


async def run_tumbling(data: list[Any], batch_size: int, window_parallelism: int
                       ) -> tuple[dict[tuple[str, float], list[int]], list[Any]]:
    sink, late = ListSink(), ListSink()
    flow = Dataflow("per-record-wm", parallelism=1, batch_size=batch_size)
    (flow.from_collection(data).assign_timestamps(lambda r: r[1], BOUND)
         .key_by(lambda r: r[0]).window(TumblingEventTimeWindows.of(SIZE))
         .allowed_lateness(LATENESS).side_output_late_data(late)
         .aggregate(SumAmount()).set_parallelism(window_parallelism).sink(sink))
    await flow.run()
    firings: dict[tuple[str, float], list[int]] = collections.defaultdict(list)
    for r in sink.records:
        firings[(r.key, r.start)].append(r.value)
    return dict(firings), late.records


@pytest.mark.parametrize("window_parallelism", [1, 2])
async def test_batch_size_never_changes_late_records_or_firings(window_parallelism):
    data = disordered(4_000, seed=17)
    expected_firings, expected_late = per_record_tumbling(data)
    assert expected_late, "the input must have late records"
    assert any(len(v) > 1 for v in expected_firings.values()), "and late firings"
    one = await run_tumbling(data, 1, window_parallelism)
    many = await run_tumbling(data, 1024, window_parallelism)
    assert sorted(many[1]) == sorted(one[1]) == sorted(expected_late)
    assert many[0] == one[0] == expected_firings


async def test_batch_size_never_changes_session_windows():
    data = disordered(3_000, seed=5)

    async def run(batch_size: int) -> tuple[list[Any], list[Any]]:
        sink, late = ListSink(), ListSink()
        flow = Dataflow("per-record-sessions", parallelism=1, batch_size=batch_size)
        (flow.from_collection(data).assign_timestamps(lambda r: r[1], BOUND)
             .key_by(lambda r: r[0]).window(EventTimeSessionWindows.with_gap(1.0))
             .allowed_lateness(1.0).side_output_late_data(late)
             .aggregate(SumAmount()).sink(sink))
        await flow.run()
        return sorted((r.key, r.start, r.end, r.value) for r in sink.records), late.records

    one, many = await run(1), await run(1024)
    assert one[1], "the input must have late records"
    assert many == one


class WatermarkAtRecord(KeyedProcessFunction):
    """Emits each record with the watermark its operator had seen when it arrived."""

    def process_element(self, value: Any, ctx: Any) -> Any:
        yield value, ctx.timer_service.current_watermark()


async def test_record_behind_the_watermark_sees_the_watermark_before_it():
    # In one batch: 100 raises the watermark to 95, so 50 (behind it) must come after 95,
    # as with one record per batch; records ahead of the watermark need no split.
    data = [("a", 10.0), ("a", 100.0), ("a", 50.0), ("a", 101.0), ("a", 102.0), ("a", 20.0)]
    sink = ListSink()
    flow = Dataflow("split", batch_size=1024)
    (flow.from_collection(data).assign_timestamps(lambda r: r[1], 5.0)
         .key_by(lambda r: r[0]).process(WatermarkAtRecord()).sink(sink))
    await flow.run()
    seen = dict(sink.records)
    assert seen[("a", 50.0)] == 95.0
    assert seen[("a", 20.0)] == 97.0
    assert [r for r, _ in sink.records] == data


def generator(bound: float) -> TimestampsAndWatermarksOperator:
    return TimestampsAndWatermarksOperator("ts", "ts", lambda r: r, bound, None, ManualClock())


def test_a_batch_is_cut_only_before_records_behind_the_watermark():
    with OperatorTestHarness(generator(5.0)) as harness:
        # 50 is behind 95 (after 100), 20 behind 97 (after 102); 96 is not behind 95
        batch = [10.0, 100.0, 96.0, 50.0, 101.0, 102.0, 20.0, 103.0]
        assert harness.process_elements(batch) == batch
        assert harness.watermarks == [95.0, 97.0, 98.0]  # 98: after the batch
        assert harness.operator.records_out == len(batch)
        # the next batch is judged against the watermark already sent: no cut for 94
        assert harness.process_elements([94.0, 104.0]) == [94.0, 104.0]
        assert harness.watermarks == [95.0, 97.0, 98.0, 99.0]


def test_a_failing_timestamp_function_names_its_record():
    op = TimestampsAndWatermarksOperator("ts", "ts", lambda r: 1.0 / r, 0.0, None, ManualClock())
    with OperatorTestHarness(op) as harness, pytest.raises(UserFunctionError) as info:
        harness.process_elements([1.0, 2.0, 0.0, 4.0])
    assert "record 0.0" in str(info.value) and "'ts'" in str(info.value)
