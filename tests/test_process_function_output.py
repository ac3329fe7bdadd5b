"""What process functions may return: they yield their outputs, or return None, a list or
another iterator. Any other return value fails the job naming the operator, the record and
the type, instead of being taken apart into records (a tuple ``(word, n)`` into two records,
a string into characters)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from reactive import (
    Dataflow,
    JobFailedError,
    KeyedProcessFunction,
    ProcessFunction,
    ProcessWindowFunction,
    TimeWindow,
    TumblingEventTimeWindows,
    UserFunctionError,
)
from reactive.connectors.collections import ListSink

WORDS = ["a", "bb", "a", "ccc"]
MESSAGE = "process_element must yield its outputs (or return None or a list)"


class Returning(ProcessFunction):
    """Returns ``make(value)`` from process_element."""

    def __init__(self, make: Callable[[Any], Any]) -> None:
        self.make = make

    def process_element(self, value: Any, ctx: Any) -> Any:
        return self.make(value)


class KeyedReturning(KeyedProcessFunction):
    def __init__(self, make: Callable[[Any], Any]) -> None:
        self.make = make

    def process_element(self, value: Any, ctx: Any) -> Any:
        return self.make(value)


def _run_process(fn: ProcessFunction, keyed: bool) -> tuple[Dataflow, ListSink]:
    flow = Dataflow("outputs", parallelism=1)
    sink = ListSink()
    stream = flow.from_collection(WORDS)
    if keyed:
        stream = stream.key_by(lambda w: w)
    stream.process(fn, name="emit").sink(sink)
    return flow, sink


REFUSED = [
    ("tuple", lambda w: (w, len(w))),
    ("str", lambda w: w),
    ("bytes", lambda w: w.encode()),
    ("dict", lambda w: {w: 1}),
    ("int", lambda w: len(w)),
    ("set", lambda w: {w}),
    ("frozenset", lambda w: frozenset([w])),
    ("range", lambda w: range(len(w))),
]


@pytest.mark.parametrize("keyed", [False, True])
@pytest.mark.parametrize(("kind", "make"), REFUSED, ids=[k for k, _ in REFUSED])
async def test_a_returned_value_that_is_not_a_list_fails_the_job(keyed, kind, make):
    cls = KeyedReturning if keyed else Returning
    flow, sink = _run_process(cls(make), keyed)
    with pytest.raises(JobFailedError) as info:
        await flow.run()
    error = info.value.__cause__
    assert isinstance(error, UserFunctionError)
    assert error.operator == "emit" and error.record == "a"
    message = str(error)
    assert MESSAGE in message and f"returned a {kind}:" in message
    assert sink.records == []


@pytest.mark.parametrize("keyed", [False, True])
@pytest.mark.parametrize(("make", "out"), [
    (lambda w: [(w, len(w))], [(w, len(w)) for w in WORDS]),
    (lambda w: None, []),
    (lambda w: (), []),  # empty: no output either way
    (lambda w: iter([w, w]), [w for w in WORDS for _ in "xx"]),
    (lambda w: map(str.upper, [w]), [w.upper() for w in WORDS]),
    (lambda w: (x for x in [w]), WORDS),
], ids=["list", "none", "empty-tuple", "iterator", "map", "generator"])
async def test_yielded_and_listed_outputs_pass(keyed, make, out):
    cls = KeyedReturning if keyed else Returning
    flow, sink = _run_process(cls(make), keyed)
    await flow.run()
    assert sink.records == out


class TupleTimer(KeyedProcessFunction):
    """Registers an event-time timer and returns a tuple from ``on_timer``."""

    def process_element(self, value: Any, ctx: Any) -> Any:
        ctx.timer_service.register_event_time_timer(value[1] + 1)
        return None

    def on_timer(self, timestamp: float, ctx: Any) -> Any:
        return (ctx.current_key, timestamp)


async def test_a_tuple_returned_by_on_timer_fails_the_job():
    flow = Dataflow("timer", parallelism=1)
    sink = ListSink()
    (flow.from_collection([("k", 1.0), ("k", 5.0)]).assign_timestamps(lambda r: r[1], 0.0)
         .key_by(lambda r: r[0]).process(TupleTimer(), name="timers").sink(sink))
    with pytest.raises(JobFailedError) as info:
        await flow.run()
    message = str(info.value.__cause__)
    assert "'timers'" in message and "timer 2.0 of key 'k'" in message
    assert "on_timer must yield its outputs" in message and "returned a tuple" in message
    assert sink.records == []


class TupleWindow(ProcessWindowFunction):
    def process(self, key: Any, window: TimeWindow, elements: list[Any]) -> Any:
        return (key, len(elements))


async def test_a_tuple_returned_by_a_window_function_fails_the_job():
    flow = Dataflow("window", parallelism=1)
    sink = ListSink()
    (flow.from_collection([("k", 1.0), ("k", 5.0), ("k", 15.0)])
         .assign_timestamps(lambda r: r[1], 0.0).key_by(lambda r: r[0])
         .window(TumblingEventTimeWindows.of(10)).process(TupleWindow(), name="per-window")
         .sink(sink))
    with pytest.raises(JobFailedError) as info:
        await flow.run()
    message = str(info.value.__cause__)
    assert "'per-window'" in message
    assert "process must yield its outputs" in message and "returned a tuple" in message
    assert sink.records == []


async def test_a_tuple_returned_by_a_count_window_function_fails_the_job():
    flow = Dataflow("count-window", parallelism=1)
    sink = ListSink()
    (flow.from_collection(["k"] * 6).key_by(lambda r: r).count_window(3)
         .process(TupleWindow(), name="per-3").sink(sink))
    with pytest.raises(JobFailedError, match="process must yield its outputs"):
        await flow.run()
    assert sink.records == []
