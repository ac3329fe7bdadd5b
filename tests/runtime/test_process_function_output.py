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
from reactive.two_input_functions import CoProcessFunction

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


# ---------------------------------------------------------------- the ``out`` collector


class CollectingCount(KeyedProcessFunction):
    """A keyed count that appends ``(word, n)`` to ``out`` and emits the final count of
    each key from an event-time timer, through ``on_timer``'s ``out`` too."""

    def open(self, ctx: Any) -> None:
        from reactive import ValueStateDescriptor

        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def process_element(self, value: Any, ctx: Any, out: list[Any]) -> None:
        n = self.count.value() + 1
        self.count.update(n)
        out.append((value[0], n))
        ctx.timer_service.register_event_time_timer(100.0)

    def on_timer(self, timestamp: float, ctx: Any, out: list[Any]) -> None:
        out.append(("final", ctx.current_key, self.count.value()))


async def test_process_functions_may_append_their_outputs_to_out():
    words = [w for i in range(500) for w in ("a", "bb", "a", f"w{i % 7}")]
    flow = Dataflow("collect", parallelism=2)
    sink = ListSink()
    (flow.from_collection([(w, float(i)) for i, w in enumerate(words)])
         .assign_timestamps(lambda r: min(r[1], 99.0), 0.0)
         .key_by(lambda r: r[0]).process(CollectingCount(), name="count").sink(sink))
    await flow.run()
    counts: dict[str, int] = {}
    expected = []
    for w in words:
        counts[w] = counts.get(w, 0) + 1
        expected.append((w, counts[w]))
    running = [r for r in sink.records if r[0] != "final"]
    finals = [r for r in sink.records if r[0] == "final"]
    # per key, in input order (keys interleave across the two instances)
    for key in counts:
        assert [r for r in running if r[0] == key] == [r for r in expected if r[0] == key]
    assert sorted(finals) == sorted(("final", k, n) for k, n in counts.items())


class CollectingEcho(ProcessFunction):
    def process_element(self, value: Any, ctx: Any, out: list[Any]) -> None:
        out.append(value)
        out.append(value.upper())


async def test_an_unkeyed_process_function_may_collect():
    flow = Dataflow("collect", parallelism=1)
    sink = ListSink()
    flow.from_collection(WORDS).process(CollectingEcho()).sink(sink)
    await flow.run()
    assert sink.records == [x for w in WORDS for x in (w, w.upper())]


class CollectingAndReturning(ProcessFunction):
    def process_element(self, value: Any, ctx: Any, out: list[Any]) -> Any:
        out.append(value)
        return [value]


async def test_a_collecting_function_that_returns_outputs_fails_the_job():
    flow = Dataflow("collect", parallelism=1)
    sink = ListSink()
    flow.from_collection(WORDS).process(CollectingAndReturning(), name="both").sink(sink)
    with pytest.raises(JobFailedError) as info:
        await flow.run()
    error = info.value.__cause__
    assert isinstance(error, UserFunctionError) and error.record == "a"
    assert "takes an 'out' collector" in str(error) and "returned a list" in str(error)
    assert sink.records == []


class CollectingAndYielding(ProcessFunction):
    def process_element(self, value: Any, ctx: Any, out: list[Any]) -> Any:
        yield value


async def test_a_function_that_collects_and_yields_is_refused_before_any_record():
    flow = Dataflow("collect", parallelism=1)
    sink = ListSink()
    flow.from_collection(WORDS).process(CollectingAndYielding()).sink(sink)
    with pytest.raises(JobFailedError) as info:
        await flow.run()
    assert "both takes an 'out' collector and yields" in str(info.value)
    assert sink.records == []


class CollectingCoProcess(CoProcessFunction):
    def process_element1(self, value: Any, ctx: Any, out: list[Any]) -> None:
        out.append(("left", value))

    def process_element2(self, value: Any, ctx: Any) -> Any:
        yield ("right", value)


async def test_a_two_input_function_may_collect_on_one_input_and_yield_on_the_other():
    flow = Dataflow("co", parallelism=1)
    sink = ListSink()
    left = flow.from_collection(WORDS, name="left")
    right = flow.from_collection([1, 2, 3], name="right")
    left.connect(right).process(CollectingCoProcess()).sink(sink)
    await flow.run()
    assert sorted(sink.records) == sorted([("left", w) for w in WORDS]
                                          + [("right", n) for n in (1, 2, 3)])
