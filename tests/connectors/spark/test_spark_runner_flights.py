"""The main job on Spark: ``examples/flights.py``'s dataflow, run embedded and by the Spark
runner on the same input (with malformed rows), commits the same hourly statistics and the
same dead letters, row for row."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from reactive import CheckpointConfig
from reactive.connectors.spark import ResultLog, SparkRunner

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def rows(spark: Any, directory: Path) -> list[tuple[Any, ...]]:
    df = ResultLog(spark, directory).read().drop("checkpoint_id", "subtask")
    return sorted(tuple(r) for r in df.collect())


@pytest.mark.parametrize(("reader", "one_query"),
                         [("lines", False), ("lines", True), ("csv", False), ("csv", True)])
async def test_flights_on_spark_equal_the_embedded_run_row_for_row(
        spark: Any, tmp_path: Path, reader: str, one_query: bool) -> None:
    sys.path.insert(0, str(EXAMPLES))
    try:
        import flights
        import flights_data
    finally:
        sys.path.remove(str(EXAMPLES))
    data = flights_data.prepare_flights(tmp_path / "flights.csv", limit=3_000,
                                        malformed_every=400)
    embedded, on_spark = tmp_path / "embedded", tmp_path / "spark"
    await flights.build_flow(data, embedded, reader=reader).run(
        checkpoints=CheckpointConfig(interval=0.1, directory=tmp_path / "chk"))
    job = SparkRunner(spark, tmp_path / "spark-chk", max_records_per_batch=1_000,
                      one_query=one_query).run(
                          flights.build_flow(data, on_spark, reader=reader))
    # the hourly windows (built-in aggregations) run as Spark SQL
    assert job.shapes == {"dead-letter-sink": "per-record",
                          "results-sink": "native window aggregation"}
    # one query reads and parses the input once and writes both sinks
    assert (job.queries["dead-letter-sink"] is job.queries["results-sink"]) == one_query
    results = rows(spark, on_spark)
    assert results == rows(spark, embedded)
    assert sum(r[4] for r in results) == 3_000 - 3_000 // 400  # every valid flight counted
    dead = rows(spark, on_spark / "_dead_letters")
    assert dead == rows(spark, embedded / "_dead_letters")
    assert len(dead) == 3_000 // 400
