"""Event-time joins on the Spark runner (Spark stream-stream inner joins with watermarks): the
interval join and the tumbling and sliding window joins give the embedded run's output, row
for row, and a plain Python computation's, on input in order and out of order within each
input's bound, over many micro-batches (so pairs meet across batches and Spark's state
cleanup is exercised); what a Spark join cannot do is refused before anything runs, naming
the operator and saying how."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from reactive import CheckpointConfig, Dataflow, SlidingEventTimeWindows, TumblingEventTimeWindows
from reactive.connectors.files import CommittingFileSink
from reactive.connectors.spark import SparkJobError, SparkRunner, TranslationError
from reactive.two_input_functions import JoinContext, ProcessJoinFunction
from tests.connectors.spark.test_spark_runner import committed, run_both
from tests.support import pickled_by_value

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def spark(spark: Any) -> Iterator[Any]:
    """The test session's SparkSession; the workers unpickle this module's functions by value."""
    with pickled_by_value(__name__):
        yield spark


BOUND = 4.0  # seconds: each input's max_out_of_orderness
#: records of each input a micro-batch: the orders and the shipments in two each (so the
#: join's state crosses a micro-batch), then the end-of-input markers' and the final
#: watermark's micro-batches; each micro-batch is a fixed cost of about a second
BATCH = 120


def shuffled(rows: list[tuple[str, float, int]], seed: int) -> list[tuple[str, float, int]]:
    """``rows`` (in event-time order) out of order, each row at most ``BOUND`` seconds
    behind the largest event time before it: blocks of rows spanning less than the bound,
    shuffled inside."""
    rng = random.Random(seed)
    out: list[tuple[str, float, int]] = []
    block: list[tuple[str, float, int]] = []
    for r in rows:
        if block and r[1] - block[0][1] >= BOUND:
            rng.shuffle(block)
            out.extend(block)
            block = []
        block.append(r)
    rng.shuffle(block)
    return out + block


# orders and shipments of five customers: an order at t joins the shipments of its customer
# at t - 1 <= t' <= t + 6 (interval join) or in its window (window joins)
ORDERS = [(f"c{i % 5}", i * 0.75, i) for i in range(240)]
SHIPMENTS = [(f"c{(i * 3) % 5}", i * 1.25 + 0.5, 1000 + i) for i in range(150)]


def event_time(r: tuple[str, float, int]) -> float:
    return r[1]


def customer(r: tuple[str, float, int]) -> str:
    return r[0]


def inputs(flow: Dataflow, seed: int | None) -> tuple[Any, Any]:
    orders = ORDERS if seed is None else shuffled(ORDERS, seed)
    shipments = SHIPMENTS if seed is None else shuffled(SHIPMENTS, seed + 1)
    return (flow.from_collection(orders).assign_timestamps(event_time, max_out_of_orderness=BOUND),
            flow.from_collection(shipments).map(tuple, name="as-tuple")
                .assign_timestamps(event_time, max_out_of_orderness=BOUND))


def pair(left: Any, right: Any) -> list[Any]:
    return [left[0], left[2], right[2]]


def interval_join(seed: int | None) -> Any:
    def build(name: str, out: Path) -> Dataflow:
        flow = Dataflow(name, parallelism=2)
        orders, shipments = inputs(flow, seed)
        (orders.key_by(customer).interval_join(shipments.key_by(customer))
               .between(-1.0, 6.0, upper_inclusive=False).process(pair, name="matched")
               .filter(lambda r: r[2] % 7 != 3, name="not-sevens")
               .sink(CommittingFileSink(out)).uid("out"))
        return flow
    return build


def expected_interval() -> list[Any]:
    return sorted([o[0], o[2], s[2]] for o in ORDERS for s in SHIPMENTS
                  if o[0] == s[0] and -1.0 <= s[1] - o[1] < 6.0 and s[2] % 7 != 3)


@pytest.mark.parametrize("seed", [None, 11], ids=["in-order", "out-of-order"])
async def test_interval_join_equals_embedded_and_a_python_loop(
        spark: Any, tmp_path: Path, seed: int | None) -> None:
    build = interval_join(seed)
    embedded, on_spark = tmp_path / "embedded", tmp_path / "spark"
    await build("embedded", embedded).run(
        checkpoints=CheckpointConfig(interval=0.05, directory=tmp_path / "chk"))
    job = SparkRunner(spark, tmp_path / "spark-chk", max_records_per_batch=BATCH).run(
        build("spark", on_spark))
    rows = committed(on_spark)
    assert rows == committed(embedded)
    assert sorted(rows) == expected_interval()
    assert len(rows) > 100
    # the watermarks and the time-range condition let Spark drop what can no longer join:
    # its state holds a few seconds of rows at the end, not the whole input
    summary = job.summary()["out"]
    assert job.shapes == {"out": "stream-stream join"}
    assert summary["micro_batches"] > len(ORDERS) // BATCH  # and the end of input's
    assert 0 < summary["state_rows"] < (len(ORDERS) + len(SHIPMENTS)) // 4


class Timestamps(ProcessJoinFunction):
    """Both timestamps and the key from the join's context; two outputs per pair."""

    def process_element(self, left: Any, right: Any, ctx: JoinContext) -> Iterable[Any]:
        yield {"key": ctx.current_key, "l": ctx.left_timestamp, "r": ctx.right_timestamp}
        if ctx.timestamp == ctx.right_timestamp:
            yield {"key": ctx.current_key, "late_side": "right"}


def interval_process_function(name: str, out: Path) -> Dataflow:
    flow = Dataflow(name, parallelism=2)
    orders, shipments = inputs(flow, 5)
    (orders.key_by(customer).interval_join(shipments.key_by(customer))
           .between(0.0, 2.5, lower_inclusive=False).process(Timestamps(), name="stamps")
           .sink(CommittingFileSink(out)).uid("out"))
    return flow


async def test_process_join_function_sees_both_timestamps_and_the_key(
        spark: Any, tmp_path: Path) -> None:
    embedded, on_spark = await run_both(interval_process_function, tmp_path, spark,
                                          batch=BATCH)
    expected = []
    for o in ORDERS:
        for s in SHIPMENTS:
            if o[0] == s[0] and 0.0 < s[1] - o[1] <= 2.5:
                expected.append({"key": o[0], "l": o[1], "r": s[1]})
                expected.append({"key": o[0], "late_side": "right"})
    rows = committed(on_spark)
    assert rows == committed(embedded)
    assert sorted(map(repr, rows)) == sorted(map(repr, expected))


def window_join(assigner: Any, seed: int | None) -> Any:
    def build(name: str, out: Path) -> Dataflow:
        flow = Dataflow(name, parallelism=2)
        orders, shipments = inputs(flow, seed)
        (orders.join(shipments).where(customer).equal_to(customer).window(assigner)
               .apply(pair, name="same-window")
               .sink(CommittingFileSink(out)).uid("out"))
        return flow
    return build


def expected_window(size: float, slide: float) -> list[Any]:
    out = []
    for o in ORDERS:
        for s in SHIPMENTS:
            if o[0] != s[0]:
                continue
            # windows [k*slide, k*slide + size) holding both
            first = max(o[1], s[1]) - size
            k = int(first // slide) + 1
            while k * slide <= min(o[1], s[1]):
                out.append([o[0], o[2], s[2]])
                k += 1
    return sorted(out)


@pytest.mark.parametrize("assigner, size, slide, seed", [
    (TumblingEventTimeWindows.of(10), 10.0, 10.0, 3),
    (SlidingEventTimeWindows.of(10, 5), 10.0, 5.0, 8),
], ids=["tumbling-out-of-order", "sliding-out-of-order"])
async def test_window_join_equals_embedded_and_a_python_loop(
        spark: Any, tmp_path: Path, assigner: Any, size: float, slide: float,
        seed: int | None) -> None:
    embedded, on_spark = await run_both(window_join(assigner, seed), tmp_path, spark, batch=BATCH)
    rows = committed(on_spark)
    assert rows == committed(embedded)
    assert sorted(rows) == expected_window(size, slide)
    assert len(rows) > 100


def _flow() -> tuple[Dataflow, Any, Any]:
    flow = Dataflow("refused")
    a = flow.from_collection(ORDERS).assign_timestamps(event_time, max_out_of_orderness=1)
    b = flow.from_collection(SHIPMENTS).assign_timestamps(event_time, max_out_of_orderness=1)
    return flow, a, b


class Opens(ProcessJoinFunction):
    def open(self, ctx: Any) -> None:
        self.subtask = ctx.subtask_index

    def process_element(self, left: Any, right: Any, ctx: JoinContext) -> Iterable[Any]:
        yield self.subtask


def _late(flow: Dataflow, a: Any, b: Any) -> None:
    built = a.join(b).where(customer).equal_to(customer).window(TumblingEventTimeWindows.of(5))
    built.apply(pair, name="late-join").sink(CommittingFileSink("/nonexistent/a"))
    built.late_data().sink(CommittingFileSink("/nonexistent/b"))


def _opens(flow: Dataflow, a: Any, b: Any) -> None:
    (a.key_by(customer).interval_join(b.key_by(customer)).between(0, 1)
      .process(Opens(), name="opens").sink(CommittingFileSink("/nonexistent/a")))


def _union_before(flow: Dataflow, a: Any, b: Any) -> None:
    c = flow.from_collection(SHIPMENTS).assign_timestamps(event_time, max_out_of_orderness=1)
    (a.key_by(customer).interval_join(b.union(c).key_by(customer)).between(0, 1)
      .process(pair, name="unioned").sink(CommittingFileSink("/nonexistent/a")))


def _keyed_after(flow: Dataflow, a: Any, b: Any) -> None:
    (a.key_by(customer).interval_join(b.key_by(customer)).between(0, 1)
      .process(pair, name="join").key_by(lambda r: r[0]).reduce(lambda x, y: x, name="after")
      .sink(CommittingFileSink("/nonexistent/a")))


@pytest.mark.parametrize("build, operator, why", [
    (_late, "late-join", "late_data() is not translated"),
    (_opens, "opens", "Opens.open() is not translated"),
    (_union_before, "unioned", "its right input comes from union"),
    (_keyed_after, "after", "a keyed operator after join 'join'"),
], ids=["late-data", "open", "union-input", "keyed-after"])
def test_what_a_spark_join_cannot_do_is_refused_naming_the_operator(
        build: Any, operator: str, why: str, tmp_path: Path) -> None:
    flow, a, b = _flow()
    build(flow, a, b)
    with pytest.raises(TranslationError) as info:
        SparkRunner(None, tmp_path).start(flow)  # type: ignore[arg-type]
    assert info.value.operator == operator
    assert why in str(info.value)
    assert not list(tmp_path.iterdir())


def strict_pair(left: Any, right: Any) -> list[Any]:
    if (left[2], right[2]) == (40, 1025):
        raise ValueError("no order 40 with shipment 1025")
    return pair(left, right)


def test_a_failing_join_function_fails_the_job_naming_the_operator_and_the_pair(
        spark: Any, tmp_path: Path) -> None:
    flow = Dataflow("failing", parallelism=2)
    orders, shipments = inputs(flow, None)
    (orders.key_by(customer).interval_join(shipments.key_by(customer)).between(-1.0, 6.0)
           .process(strict_pair, name="strict-join")
           .sink(CommittingFileSink(tmp_path / "out")).uid("out"))
    # a pair that joins: one customer, the shipment 1.75 s after the order
    assert ORDERS[40] == ("c0", 30.0, 40) and SHIPMENTS[25] == ("c0", 31.75, 1025)
    with pytest.raises(SparkJobError) as info:
        SparkRunner(spark, tmp_path / "chk", max_records_per_batch=100).run(flow)
    text = str(info.value)
    assert "operator 'strict-join'" in text and "no order 40 with shipment 1025" in text
    assert "('c0', 30.0, 40)" in text  # the pair's left record


def at_the_bound(name: str, out: Path) -> Dataflow:
    # one record of each input per micro-batch: the rows at 6 s come third, exactly the
    # bound (4 s) behind the rows at 10 s, so not late embedded (late means strictly behind
    # the watermark); Spark filters late rows with the watermark of two micro-batches back
    flow = Dataflow(name)
    orders = flow.from_collection([("c0", 10.0, 1), ("c0", 10.0, 2), ("c0", 6.0, 3)])
    shipments = flow.from_collection([("c1", 10.0, 100), ("c1", 10.0, 101), ("c0", 6.0, 102)])
    (orders.assign_timestamps(event_time, max_out_of_orderness=BOUND).key_by(customer)
           .interval_join(shipments.assign_timestamps(event_time, max_out_of_orderness=BOUND)
                          .key_by(customer))
           .between(-1.0, 1.0).process(pair, name="matched")
           .sink(CommittingFileSink(out)).uid("out"))
    return flow


async def test_rows_exactly_the_bound_behind_join_as_embedded(
        spark: Any, tmp_path: Path) -> None:
    embedded, on_spark = await run_both(at_the_bound, tmp_path, spark, batch=1)
    assert committed(on_spark) == committed(embedded) == [["c0", 3, 102]]
