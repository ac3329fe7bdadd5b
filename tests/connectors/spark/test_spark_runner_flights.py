"""The main job on Spark: ``examples/flights.py``'s dataflow, run embedded and by the Spark
runner on the same input (with malformed rows), commits the same hourly statistics and the
same dead letters, row for row."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from reactive import CheckpointConfig
from reactive.connectors.spark import ResultLog, SparkRunner

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def rows(spark: Any, directory: Path) -> list[tuple[Any, ...]]:
    df = ResultLog(spark, directory).read().drop("checkpoint_id", "subtask")
    return sorted(tuple(r) for r in df.collect())


@pytest.fixture(scope="module")
def flights() -> ModuleType:
    """``examples/flights.py``."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        import flights
    finally:
        sys.path.remove(str(EXAMPLES))
    return flights


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 3,000 flights with every 400th row malformed, written once for the module
    (the whole table is unzipped and sorted for it): read-only."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        import flights_data
    finally:
        sys.path.remove(str(EXAMPLES))
    return flights_data.prepare_flights(tmp_path_factory.mktemp("flights") / "flights.csv",
                                        limit=3_000, malformed_every=400)


@pytest.fixture(scope="module")
def embedded_run(flights: ModuleType, data: Path, tmp_path_factory: pytest.TempPathFactory
                 ) -> Callable[[str], Awaitable[Path]]:
    """The output directory of the embedded run of :func:`data` with a reader, run the first
    time a test asks for that reader (both Spark variants compare against it): read-only."""
    outputs: dict[str, Path] = {}

    async def run(reader: str) -> Path:
        if reader not in outputs:
            base = tmp_path_factory.mktemp(f"embedded-{reader}")
            await flights.build_flow(data, base / "out", reader=reader).run(
                checkpoints=CheckpointConfig(interval=0.1, directory=base / "chk"))
            outputs[reader] = base / "out"
        return outputs[reader]

    return run


# both readers with a query per sink, as the example runs on Spark; one query for both sinks
# (a parse, dead letters and a native window) is validated through a driver kill with either
# reader in test_spark_runner_restart ("csv" and "sinks-between")
@pytest.mark.parametrize(("reader", "one_query"), [("lines", False), ("csv", False)])
async def test_flights_on_spark_equal_the_embedded_run_row_for_row(
        spark: Any, tmp_path: Path, flights: ModuleType, data: Path,
        embedded_run: Callable[[str], Awaitable[Path]], reader: str, one_query: bool) -> None:
    embedded, on_spark = await embedded_run(reader), tmp_path / "spark"
    job = SparkRunner(spark, tmp_path / "spark-chk", max_records_per_batch=1_500,
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
