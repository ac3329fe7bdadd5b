"""A columnar stream on the Spark runner: an Arrow source's record batches through
``map_batches`` steps as Spark's ``mapInArrow`` (then ``to_records`` and per-record
steps), the committed output equal to the embedded
run's row for row and to a plain Python computation; a result of the wrong schema fails the
query naming the operator."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reactive import Dataflow
from reactive.connectors.files import CommittingFileSink
from reactive.connectors.spark import SparkJobError, SparkRunner
from tests.connectors.spark.test_spark_runner import committed, run_both
from tests.support import pickled_by_value

pa = pytest.importorskip("pyarrow")
pc = pytest.importorskip("pyarrow.compute")

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def spark(spark: Any) -> Iterator[Any]:
    """The test session's SparkSession; the workers unpickle this module's functions by value."""
    with pickled_by_value(__name__):
        yield spark


ROWS = 700
TABLE = pa.table({"id": pa.array(range(ROWS), pa.int64()),
                  "x": pa.array([(i * 37) % 101 / 4 for i in range(ROWS)], pa.float64())})
SCALED = pa.schema([("id", pa.int64()), ("y", pa.float64())])


def scale(batch: Any) -> Any:
    y = pc.add(pc.multiply(batch.column("x"), 2.0), pc.cast(batch.column("id"), pa.float64()))
    return pa.RecordBatch.from_arrays([batch.column("id"), y], schema=SCALED)


def large(batch: Any) -> Any:
    return batch.filter(pc.greater(batch.column("y"), 300.0))


def scaled(name: str, out: Path) -> Dataflow:
    flow = Dataflow(name)
    (flow.from_arrow(TABLE, batch_size=64).map_batches(scale, SCALED, name="scale")
         .map_batches(large, name="large").sink(CommittingFileSink(out)).uid("out"))
    return flow


async def test_map_batches_run_as_map_in_arrow_equal_embedded_and_a_python_loop(
        spark: Any, tmp_path: Path) -> None:
    embedded, on_spark = await run_both(scaled, tmp_path, spark, batch=350)
    expected = [{"id": i, "y": x * 2 + i} for i, x in
                zip(TABLE.column("id").to_pylist(), TABLE.column("x").to_pylist(), strict=True)
                if x * 2 + i > 300]
    rows = committed(on_spark)
    assert rows == committed(embedded)
    assert sorted(rows, key=lambda r: r["id"]) == expected
    assert len(rows) > 100


def as_records(name: str, out: Path) -> Dataflow:
    flow = Dataflow(name)
    (flow.from_arrow(TABLE, batch_size=64).map_batches(scale, SCALED, name="scale")
         .to_records().filter(lambda r: r["id"] % 3 == 0, name="thirds")
         .map(lambda r: [r["id"], round(r["y"], 3)], name="pair")
         .sink(CommittingFileSink(out)).uid("out"))
    return flow


async def test_to_records_then_per_record_steps_equal_embedded(
        spark: Any, tmp_path: Path) -> None:
    embedded, on_spark = await run_both(as_records, tmp_path, spark, batch=350)
    expected = [[i, round(x * 2 + i, 3)] for i, x in
                zip(TABLE.column("id").to_pylist(), TABLE.column("x").to_pylist(), strict=True)
                if i % 3 == 0]
    rows = committed(on_spark)
    assert rows == committed(embedded)
    assert sorted(rows) == expected


def test_a_batch_of_the_wrong_schema_fails_the_query_naming_the_operator(
        spark: Any, tmp_path: Path) -> None:
    flow = Dataflow("wrong-schema")
    (flow.from_arrow(TABLE, batch_size=64).map_batches(lambda b: b, SCALED, name="declared")
         .sink(CommittingFileSink(tmp_path / "out")))
    with pytest.raises(SparkJobError) as info:
        SparkRunner(spark, tmp_path / "chk").run(flow)
    assert "'declared'" in str(info.value)
