"""``union`` on the Spark runner: both inputs' records in one stream (one read per source,
unioned), the committed output equal to the embedded run's row for row and to a plain
Python computation; per-record steps after the union, and a keyed operator after it with a
watermark per input; what still cannot run is refused before anything runs, naming the
operator."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reactive import AggregateFunction, Dataflow, TumblingEventTimeWindows
from reactive.connectors.files import CommittingFileSink
from reactive.connectors.spark import SparkRunner, TranslationError
from tests.connectors.spark.test_spark_runner import committed, run_both
from tests.support import Count, pickled_by_value

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def spark(spark: Any) -> Iterator[Any]:
    """The test session's SparkSession; the workers unpickle this module's functions by value."""
    with pickled_by_value(__name__):
        yield spark


LINES = [f"{i},{i % 9}" if i % 13 else f"bad {i}" for i in range(400)]
NUMBERS = list(range(1000, 1250))


def parse(line: str) -> list[int]:
    first, _, rest = line.partition(",")
    return [int(first) * 10 + int(rest)] if rest else []


def three_inputs(data: Path) -> Any:
    def build(name: str, out: Path) -> Dataflow:
        flow = Dataflow(name, parallelism=2)
        lines = flow.read_text_file(data).flat_map(parse, name="parse")
        numbers = flow.from_collection(NUMBERS).filter(lambda x: x % 3 != 0, name="thirds")
        more = flow.from_collection(range(50)).map(lambda x: -x, name="negate")
        (lines.union(numbers, more).map(lambda x: {"v": x, "odd": x % 2}, name="wrap")
              .filter(lambda r: r["v"] % 5 != 1, name="fives")
              .sink(CommittingFileSink(out)).uid("out"))
        return flow
    return build


async def test_union_of_three_inputs_equals_embedded_and_a_python_loop(
        spark: Any, tmp_path: Path) -> None:
    data = tmp_path / "lines.txt"
    data.write_text("\n".join(LINES) + "\n")
    embedded, on_spark = await run_both(three_inputs(data), tmp_path, spark, batch=250)
    values = ([v for line in LINES for v in parse(line)]
              + [x for x in NUMBERS if x % 3 != 0] + [-x for x in range(50)])
    expected = sorted(({"v": v, "odd": v % 2} for v in values if v % 5 != 1),
                      key=lambda r: (r["v"], r["odd"]))
    rows = committed(on_spark)
    assert rows == committed(embedded)
    assert sorted(rows, key=lambda r: (r["v"], r["odd"])) == expected


class SumCount(AggregateFunction):
    def create_accumulator(self) -> Any:
        return (0, 0.0)

    def add(self, value: Any, acc: Any) -> Any:
        return (acc[0] + 1, acc[1] + value[2])

    def merge(self, a: Any, b: Any) -> Any:
        return (a[0] + b[0], a[1] + b[1])

    def get_result(self, acc: Any) -> Any:
        return acc


# two sensors' readings in event-time order each; the second ends well before the first,
# so its end of input must not fire the windows the first still adds to
FAST = [(f"s{i % 3}", i * 0.5, float(i % 7)) for i in range(600)]
SLOW = [(f"s{i % 4}", i * 1.5 + 0.25, float(i % 5)) for i in range(90)]


def event_time(reading: tuple[str, float, float]) -> float:
    return reading[1]


def windows_after_union(name: str, out: Path) -> Dataflow:
    # the window finds its timestamp function through the union: one function on both
    flow = Dataflow(name, parallelism=2)
    fast = flow.from_collection(FAST).assign_timestamps(event_time, max_out_of_orderness=1)
    slow = flow.from_collection(SLOW).assign_timestamps(event_time, max_out_of_orderness=3)
    (fast.union(slow).key_by(lambda r: r[0]).window(TumblingEventTimeWindows.of(20))
         .aggregate(SumCount(), name="per-20s").uid("windows")
         .map(lambda w: [w.key, w.start, w.value[0], w.value[1]])
         .sink(CommittingFileSink(out)).uid("out"))
    return flow


async def test_event_time_windows_after_a_union_equal_embedded(
        spark: Any, tmp_path: Path) -> None:
    embedded, on_spark = await run_both(windows_after_union, tmp_path, spark, batch=300)
    acc: dict[tuple[str, float], list[float]] = {}
    for key, ts, value in FAST + SLOW:
        a = acc.setdefault((key, ts - ts % 20), [0, 0.0])
        a[0] += 1
        a[1] += value
    expected = sorted([k, s, n, t] for (k, s), (n, t) in acc.items())
    rows = committed(on_spark)
    assert rows == committed(embedded)
    assert sorted(rows) == expected


def counts_after_union(name: str, out: Path) -> Dataflow:
    flow = Dataflow(name, parallelism=2)
    a = flow.from_collection([f"w{i % 7}" for i in range(300)])
    b = flow.from_collection([f"w{i % 5}" for i in range(120)]).map(str.upper, name="upper")
    (a.union(b).key_by(lambda w: w).process(Count()).uid("count")
      .sink(CommittingFileSink(out)).uid("out"))
    return flow


async def test_keyed_count_after_a_union_equals_embedded(spark: Any, tmp_path: Path) -> None:
    embedded, on_spark = await run_both(counts_after_union, tmp_path, spark, batch=150)
    totals = collections.Counter([f"w{i % 7}" for i in range(300)]
                                 + [f"W{i % 5}" for i in range(120)])
    expected = sorted([k, n] for k, c in totals.items() for n in range(1, c + 1))
    rows = committed(on_spark)
    assert rows == committed(embedded)
    assert sorted(rows) == expected


@pytest.mark.parametrize("build, operator, why", [
    (lambda f: f.from_collection([1]).key_by(str).process(Count(), name="count")
                .union(f.from_collection([2])).sink(CommittingFileSink("/nonexistent")),
     "count", "keyed operator before union"),
    (lambda f: f.from_collection([1]).union(f.from_collection([2]))
                .assign_timestamps(float).key_by(str)
                .window(TumblingEventTimeWindows.of(1)).aggregate(SumCount(), name="late-ts")
                .sink(CommittingFileSink("/nonexistent")),
     "late-ts", "on each input before the union"),
    (lambda f: f.from_collection([1]).assign_timestamps(float)
                .union(f.from_collection([2])).key_by(str).process(Count(), name="half-ts")
                .sink(CommittingFileSink("/nonexistent")),
     "half-ts", "on some of its inputs only"),
])
def test_what_a_union_cannot_run_is_refused_naming_the_operator(
        build: Any, operator: str, why: str, tmp_path: Path) -> None:
    flow = Dataflow("refused")
    build(flow)
    with pytest.raises(TranslationError) as info:
        SparkRunner(None, tmp_path).start(flow)  # type: ignore[arg-type]
    assert info.value.operator == operator
    assert why in str(info.value)
    assert not list(tmp_path.iterdir())
