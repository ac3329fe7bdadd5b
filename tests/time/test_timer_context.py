"""``ctx.timestamp()`` and ``ctx.time_domain()`` in ``on_timer`` (Flink's
``OnTimerContext.timestamp()`` / ``timeDomain()``): a function with an event-time and a
processing-time timer at the same time tells them apart."""

from __future__ import annotations

from typing import Any

import pytest

from reactive import (
    Dataflow,
    JobFailedError,
    KeyedProcessFunction,
    ManualClock,
    StateAccessError,
    TimeDomain,
    ValueStateDescriptor,
)
from reactive.connectors.collections import ListSink
from tests.time.test_timers import ClockSource


class BothTimeouts(KeyedProcessFunction):
    """On a key's first record, sets an event-time and a processing-time timer at the
    same number ``deadline`` (``record[2]``); each firing reports its domain and time."""

    def open(self, ctx: Any) -> None:
        self.armed = ctx.get_state(ValueStateDescriptor("armed"))

    def process_element(self, value: Any, ctx: Any) -> Any:
        if self.armed.value() is None:
            self.armed.update(True)
            ctx.timer_service.register_event_time_timer(value[2])
            ctx.timer_service.register_processing_time_timer(value[2])
        return None

    def on_timer(self, timestamp: float, ctx: Any) -> Any:
        yield ctx.current_key, ctx.time_domain(), ctx.timestamp(), timestamp


async def test_on_timer_sees_the_timers_time_and_domain():
    clock = ManualClock(start=0.0)
    # records (key, event time, deadline); the clock moves 1 s per batch, 30 batches
    batches = [[("a", 1.0, 8.0)], [("b", 2.0, 12.0)], [("c", 3.0, 500.0)]]
    batches += [[("x", 4.0 + i, 1e9)] for i in range(27)]
    sink = ListSink()
    flow = Dataflow("timer-ctx", batch_size=1, buffer_timeout=0)
    flow.processing_clock = clock
    (flow.source(ClockSource(batches, clock, 1.0)).assign_timestamps(lambda r: r[1])
         .key_by(lambda r: r[0]).process(BothTimeouts()).sink(sink))
    await flow.run()
    fired = sorted((k, d.value, ts) for k, d, ts, _ in sink.records)
    # event time ends at +inf, so every event-time timer fires; processing time stops at
    # 29 s, so the processing-time timers at 500 and 1e9 never fire
    assert fired == sorted([
        ("a", "event_time", 8.0), ("b", "event_time", 12.0), ("c", "event_time", 500.0),
        ("x", "event_time", 1e9),
        ("a", "processing_time", 8.0), ("b", "processing_time", 12.0),
    ])
    assert all(ctx_ts == ts for _, _, ctx_ts, ts in sink.records)
    assert {d for _, d, _, _ in sink.records} == {TimeDomain.EVENT_TIME, TimeDomain.PROCESSING_TIME}


class TimestampInProcessElement(KeyedProcessFunction):
    def process_element(self, value: Any, ctx: Any) -> Any:
        yield ctx.timestamp()


async def test_timestamp_outside_on_timer_is_a_clear_error():
    flow = Dataflow("no-timer")
    (flow.from_collection([("a", 1.0)]).assign_timestamps(lambda r: r[1])
         .key_by(lambda r: r[0]).process(TimestampInProcessElement()).sink(ListSink()))
    with pytest.raises(JobFailedError) as info:
        await flow.run()
    cause = info.value.__cause__
    assert "TimestampInProcessElement" in str(cause) and "('a', 1.0)" in str(cause)
    assert isinstance(cause.__cause__, StateAccessError)
    assert "on_timer" in str(cause.__cause__)
