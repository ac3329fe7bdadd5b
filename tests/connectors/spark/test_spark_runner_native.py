"""Native plans: a tumbling event-time window aggregated by built-in aggregations runs on
Spark as ``groupBy(window, key).agg(...)`` and commits what the embedded runtime commits,
row for row, late records included; what Spark SQL cannot run the same way keeps the
Python operator, and says why."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reactive import (
    AggregateFunction,
    CheckpointConfig,
    Dataflow,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
)
from reactive.connectors.files import CommittingFileSink
from reactive.connectors.spark import SparkRunner, list_part_files
from reactive.connectors.spark.native_plan import native_window
from reactive.connectors.spark.translation import translate
from reactive.windowing.aggregates import (
    Aggregates,
    count,
    first,
    last,
    max_of,
    mean,
    min_of,
    sum_of,
)
from tests.support import pickled_by_value

SIZE, DELAY = 10.0, 3.0


def _events() -> list[tuple[str, float, int | None, float]]:
    """``(key, ts, amount or None, price)``: mostly in order, a little disorder within the
    bound, and every 37th record 25-60 s behind (late for its window, or not, depending on
    the records before it)."""
    rng = random.Random(11)
    out, t = [], 1000.0
    for i in range(900):
        t += rng.choice([0.25, 0.5, 1.0])
        ts = t - rng.choice([0.0, 0.0, 2.0])
        if i % 37 == 36:
            ts = t - rng.choice([25.0, 40.0, 60.0])
        amount = None if i % 11 == 3 else rng.randrange(-50, 100)
        out.append((f"k{rng.randrange(4)}", ts, amount, rng.randrange(0, 400) / 4))
    return out


EVENTS = _events()
#: the same without the records beyond the bound
IN_ORDER = [e for i, e in enumerate(EVENTS) if i % 37 != 36]


def stats() -> Aggregates:
    return Aggregates(count(), count(lambda e: e[2]), sum_of(lambda e: e[2], dtype="int"),
                      sum_of(lambda e: e[3]), mean(lambda e: e[2]), min_of(lambda e: e[2], "int"),
                      max_of(lambda e: e[3]), first(lambda e: e[2], "int"),
                      last(lambda e: e[2], "int"))


def windows(name: str, out: Path, aggregate: AggregateFunction | None = None,
            events: list[Any] = EVENTS) -> Dataflow:
    flow = Dataflow(name, parallelism=2)
    (flow.from_collection(events).assign_timestamps(lambda e: e[1], max_out_of_orderness=DELAY)
         .key_by(lambda e: e[0]).window(TumblingEventTimeWindows.of(SIZE))
         .aggregate(aggregate or stats(), name="per-ten-seconds").uid("per-ten-seconds")
         .map(lambda w: [w.key, w.start, w.end, *w.value])
         .sink(CommittingFileSink(out)).uid("out"))
    return flow


def by_loop(events: list[Any] = EVENTS) -> list[list[Any]]:
    """The embedded rule, in plain Python: a record is late when its window ended at or
    before the largest timestamp before it minus the bound."""
    watermark, acc = float("-inf"), {}
    for key, ts, amount, price in events:
        start = ts - ts % SIZE
        if start + SIZE > watermark:
            acc.setdefault((key, start), []).append((amount, price))
        watermark = max(watermark, ts - DELAY)
    out = []
    for (key, start), rows in acc.items():
        amounts = [a for a, _ in rows if a is not None]
        prices = [p for _, p in rows]
        out.append([key, start, start + SIZE, len(rows), len(amounts),
                    sum(amounts) if amounts else None, sum(prices),
                    sum(amounts) / len(amounts) if amounts else None,
                    min(amounts, default=None), max(prices),
                    amounts[0] if amounts else None, amounts[-1] if amounts else None])
    return sorted(out, key=json.dumps)


def committed(directory: Path) -> list[Any]:
    rows = [json.loads(line) for p in list_part_files(directory)
            for line in p.path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return sorted(rows, key=json.dumps)


# ---------------------------------------------------------------- built-ins, embedded
def test_builtin_aggregates_embedded_equal_a_python_loop_late_records_dropped(
        tmp_path: Path) -> None:
    import asyncio

    asyncio.run(windows("embedded", tmp_path / "out").run(
        checkpoints=CheckpointConfig(interval=0.05, directory=tmp_path / "chk")))
    expected = by_loop()
    assert committed(tmp_path / "out") == expected
    # the input has late records, some dropped and some not (within their window's life)
    assert sum(r[3] for r in expected) < len(EVENTS)


def test_aggregates_merge_is_the_aggregate_of_the_concatenation() -> None:
    agg = stats()
    rows = EVENTS[:200]
    for cut in (0, 1, 77, 200):
        a = b = agg.create_accumulator()
        for r in rows[:cut]:
            a = agg.add(r, a)
        for r in rows[cut:]:
            b = agg.add(r, b)
        whole = agg.create_accumulator()
        for r in rows:
            whole = agg.add(r, whole)
        assert agg.get_result(agg.merge(a, b)) == agg.get_result(whole)


def test_builtin_aggregate_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match="needs a field"):
        sum_of(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dtype"):
        mean("x", dtype="decimal")
    with pytest.raises(ValueError, match="at least one"):
        Aggregates()


# ---------------------------------------------------------------- which plans are native
class UserSum(AggregateFunction):
    def create_accumulator(self) -> Any:
        return 0

    def add(self, value: Any, acc: Any) -> Any:
        return acc + 1

    def merge(self, a: Any, b: Any) -> Any:
        return a + b

    def get_result(self, acc: Any) -> Any:
        return acc


def _keyed_window(build: Any) -> tuple[Any, str]:
    flow = Dataflow("which")
    keyed = (flow.from_collection(EVENTS)
             .assign_timestamps(lambda e: e[1], max_out_of_orderness=DELAY)
             .key_by(lambda e: e[0]))
    build(keyed).map(str).sink(CommittingFileSink("/nonexistent"))
    return native_window(translate(flow)[0])


@pytest.mark.parametrize("build, why", [
    (lambda k: k.window(TumblingEventTimeWindows.of(SIZE)).aggregate(UserSum()),
     "user function"),
    (lambda k: k.window(SlidingEventTimeWindows.of(SIZE, 5)).aggregate(stats()),
     "only tumbling"),
    (lambda k: k.window(TumblingEventTimeWindows.of(SIZE)).allowed_lateness(5)
     .aggregate(stats()), "allowed lateness"),
])
def test_what_spark_sql_cannot_run_the_same_way_stays_in_python(build: Any, why: str) -> None:
    window, reason = _keyed_window(build)
    assert window is None and why in reason


def test_tumbling_builtin_window_is_native() -> None:
    window, reason = _keyed_window(
        lambda k: k.window(TumblingEventTimeWindows.of(SIZE)).aggregate(stats()))
    assert window is not None and reason == ""
    assert (window.size, window.offset, window.delay) == (SIZE, 0.0, DELAY)


# ---------------------------------------------------------------- on Spark
@pytest.fixture(scope="module")
def spark(spark: Any) -> Iterator[Any]:
    """The test session's SparkSession; the workers unpickle this module's functions by value."""
    with pickled_by_value(__name__):
        yield spark


@pytest.mark.parametrize("batch", [130, 900])
async def test_native_window_equals_embedded_row_for_row_late_records_included(
        spark: Any, tmp_path: Path, batch: int) -> None:
    embedded, on_spark = tmp_path / "embedded", tmp_path / "spark"
    await windows("embedded", embedded).run(
        checkpoints=CheckpointConfig(interval=0.05, directory=tmp_path / "chk"))
    job = SparkRunner(spark, tmp_path / "spark-chk", max_records_per_batch=batch).run(
        windows("spark", on_spark))
    assert job.shapes == {"out": "native window aggregation"}
    assert committed(on_spark) == committed(embedded) == by_loop()


async def test_native_window_read_in_two_parts_equals_embedded_within_the_bound(
        spark: Any, tmp_path: Path) -> None:
    embedded, on_spark = tmp_path / "embedded", tmp_path / "spark"
    await windows("embedded", embedded, events=IN_ORDER).run(
        checkpoints=CheckpointConfig(interval=0.05, directory=tmp_path / "chk"))
    job = SparkRunner(spark, tmp_path / "spark-chk", max_records_per_batch=300,
                      read_partitions=2).run(windows("spark", on_spark, events=IN_ORDER))
    assert job.shapes == {"out": "native window aggregation"}
    assert committed(on_spark) == committed(embedded) == by_loop(IN_ORDER)
