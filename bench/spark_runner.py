"""The flights job on Spark local mode against the embedded run: records/s and start-up.

    python -m bench.spark_runner [--limit N] [--master local[2]] [--batch N]

Both runs read the same CSV (the first ``limit`` flights) and commit the same hourly
statistics and dead letters (checked: equal row for row). The embedded run (heap backend,
checkpoints every second, parallelism 2) is the baseline of the ratios; the Spark run
(``SparkRunner``, RocksDB state store, one query per sink) is measured from nothing: JVM and
session start-up, then the queries. Start-up is reported apart, and the Spark rate also
without it, so the table shows what a long stream on one machine pays and what a short one
does.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .common import peak_rss_mb, print_table

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--limit", type=int, default=50_000)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--batch", type=int, default=100_000, help="records per micro-batch")
    args = p.parse_args(argv)
    sys.path.insert(0, str(EXAMPLES))
    import flights
    import flights_data

    from reactive import CheckpointConfig
    from reactive.backends.heap import HeapStateBackend

    work = Path(tempfile.mkdtemp(prefix="bench-spark-runner-"))
    try:
        data = flights_data.prepare_flights(work / "flights.csv", limit=args.limit,
                                            malformed_every=1000)
        records = flights.count_lines(data)

        started = time.perf_counter()
        asyncio.run(flights.build_flow(data, work / "embedded").run(
            checkpoints=CheckpointConfig(interval=1.0, directory=work / "chk"),
            state_backend=HeapStateBackend()))
        embedded = time.perf_counter() - started
        rss_embedded = peak_rss_mb()

        started = time.perf_counter()
        from reactive.connectors.spark import ResultLog, SparkRunner, local_session

        spark = local_session(args.master, app_name="bench-spark-runner", shuffle_partitions=2)
        startup = time.perf_counter() - started
        job = SparkRunner(spark, work / "spark-chk", max_records_per_batch=args.batch).run(
            flights.build_flow(data, work / "spark"))
        on_spark = time.perf_counter() - started
        batches = max(len(v) for v in job.progress().values())

        def rows(d: Path) -> list[Any]:
            return sorted(tuple(r) for r in ResultLog(spark, d).read()
                          .drop("checkpoint_id", "subtask").collect())

        equal = rows(work / "spark") == rows(work / "embedded") and \
            rows(work / "spark" / "_dead_letters") == rows(work / "embedded" / "_dead_letters")
        print(f"flights job, {records:,} input lines, {args.master}, {batches} micro-batches "
              f"per query; outputs equal row for row: {equal}")
        print_table(
            ["run", "seconds", "records/s", "vs embedded"],
            [["embedded (heap, parallelism 2)", embedded, records / embedded, 1.0],
             ["Spark, with start-up", on_spark, records / on_spark, embedded / on_spark],
             ["Spark, queries only", on_spark - startup, records / (on_spark - startup),
              embedded / (on_spark - startup)],
             ["Spark start-up (JVM + session)", startup, "-", "-"]])
        print(f"driver peak RSS: {rss_embedded:,.0f} MiB after the embedded run, "
              f"{peak_rss_mb():,.0f} MiB at the end (Spark's JVM and workers not counted)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
