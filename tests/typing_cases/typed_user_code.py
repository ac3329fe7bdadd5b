"""User code that the typed API must check: ``tests/project/test_typed_api.py`` runs mypy on it.

Every ``assert_type`` must hold, and a line marked ``# expect-error: <code>`` must be
reported with exactly that error code (and no other line may be): the marked lines are the
mistakes the types exist to catch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, assert_type

from reactive import (
    AggregateFunction,
    AggregatingState,
    AggregatingStateDescriptor,
    CheckpointConfig,
    Dataflow,
    KeyedProcessFunction,
    KeyedStream,
    ListState,
    ListStateDescriptor,
    MapState,
    MapStateDescriptor,
    ReducingState,
    ReducingStateDescriptor,
    RuntimeContext,
    Sink,
    SinkWriter,
    Source,
    SourceReader,
    StateTtlConfig,
    Stream,
    ValueState,
    ValueStateDescriptor,
)
from reactive.connectors.files import CommittingFileSink
from reactive.windowing import ProcessWindowContext, ProcessWindowFunction, TimeWindow


class Mean(AggregateFunction[float, tuple[float, int], float]):
    def create_accumulator(self) -> tuple[float, int]:
        return 0.0, 0

    def add(self, value: float, accumulator: tuple[float, int]) -> tuple[float, int]:
        return accumulator[0] + value, accumulator[1] + 1

    def get_result(self, accumulator: tuple[float, int]) -> float:
        return accumulator[0] / accumulator[1]

    def merge(self, a: tuple[float, int], b: tuple[float, int]) -> tuple[float, int]:
        return a[0] + b[0], a[1] + b[1]


class Count(KeyedProcessFunction[str, str, tuple[str, int]]):
    """Counts words per key, with one state of every kind."""

    def open(self, ctx: RuntimeContext) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))
        assert_type(self.count, ValueState[int])
        self.last = ctx.get_state(ValueStateDescriptor[str | None]("last"))
        assert_type(self.last, ValueState[str | None])
        self.seen = ctx.get_state(ListStateDescriptor[str]("seen"))
        assert_type(self.seen, ListState[str])
        self.by_length = ctx.get_state(MapStateDescriptor[int, str]("by_length"))
        assert_type(self.by_length, MapState[int, str])
        self.longest = ctx.get_state(ReducingStateDescriptor[str](
            "longest", lambda a, b: max(a, b, key=len)))
        assert_type(self.longest, ReducingState[str])
        self.mean = ctx.get_state(AggregatingStateDescriptor("mean", Mean()))
        assert_type(self.mean, AggregatingState[float, float])

    def process_element(self, value: str, ctx: RuntimeContext) -> Iterator[tuple[str, int]]:
        n = self.count.value() + 1
        self.count.update(n)
        self.count.update(str(n))  # expect-error: arg-type
        self.seen.add(value)
        self.seen.add(len(value))  # expect-error: arg-type
        assert_type(self.by_length.get(len(value)), str | None)
        assert_type(self.by_length.get(len(value), ""), str)
        self.by_length.put(value, value)  # expect-error: arg-type
        self.mean.add(float(len(value)))
        assert_type(self.mean.get(), float | None)
        yield value, n


class Firings(ProcessWindowFunction):
    """Counts the firings of each window in per-window state."""

    def process(self, key: Any, window: TimeWindow, elements: list[Any],  # type: ignore[override]
                ctx: ProcessWindowContext) -> Iterator[tuple[Any, int]]:
        fired = ctx.window_state(ValueStateDescriptor("fired", default=0))
        assert_type(fired, ValueState[int])
        fired.update(fired.value() + 1)
        seen = ctx.global_state(MapStateDescriptor[str, int]("seen"))
        assert_type(seen, MapState[str, int])
        seen.put("windows", 1.5)  # expect-error: arg-type
        yield key, fired.value()


# a user's own source: the typed Source interface is what this case checks
class Numbers(Source[int]):
    def create_reader(self, subtask: int, parallelism: int) -> SourceReader[int]:
        raise NotImplementedError


class Printer(Sink[str]):
    def create_writer(self, subtask: int, parallelism: int) -> SinkWriter[str]:
        raise NotImplementedError


async def main() -> None:
    flow = Dataflow("typed")
    words = flow.from_collection(["a", "bb", "a"])
    assert_type(words, Stream[str])
    lengths = words.map(len)
    assert_type(lengths, Stream[int])
    assert_type(lengths.filter(lambda n: n > 1), Stream[int])
    assert_type(words.flat_map(lambda w: list(w)), Stream[str])
    keyed = words.key_by(lambda w: w[0])
    assert_type(keyed, KeyedStream[str, str])
    counts = keyed.process(Count())
    assert_type(counts, Stream[tuple[str, int]])
    assert_type(keyed.reduce(lambda a, b: a + b), Stream[str])
    assert_type(flow.source(Numbers()), Stream[int])
    assert_type(flow.read_text_file("words.txt"), Stream[str])
    assert_type(flow.read_text_file("words.txt", with_offsets=True), Stream[tuple[int, str]])
    words.sink(Printer())
    lengths.sink(Printer())  # expect-error: arg-type
    words.map(lambda w: w + 1)  # expect-error: operator
    lengths.process(Count())  # expect-error: arg-type
    words.sink(CommittingFileSink("out", format="csv"))  # expect-error: arg-type
    StateTtlConfig(60, time_characteristic="wall_clock")  # expect-error: arg-type
    await flow.run(checkpoints=CheckpointConfig(interval=1.0, directory="chk"), resume=True)
    await flow.run(resume="yes")  # expect-error: arg-type
    await flow.run(restor_from="chk")  # expect-error: call-arg
