"""The main job's validation: the committed results compared, row for row, with the same
aggregation computed in batch by Spark from the input file, and the report printed at the
end of ``examples/flights.py``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from flights_data import RESULT_COLUMNS, count_lines, result_schema


def expected_with_spark(spark: Any, data: Path) -> Any:
    """The same aggregation, in batch, by Spark from the input file."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    schema = T.StructType([T.StructField(c, t) for c, t in [
        ("year", T.IntegerType()), ("month", T.IntegerType()), ("day", T.IntegerType()),
        ("dep_time", T.StringType()), ("sched_dep_time", T.IntegerType()),
        ("dep_delay", T.StringType()), ("arr_time", T.StringType()),
        ("sched_arr_time", T.StringType()), ("arr_delay", T.StringType()),
        ("carrier", T.StringType()), ("flight", T.StringType()), ("tailnum", T.StringType()),
        ("origin", T.StringType()), ("dest", T.StringType()), ("air_time", T.StringType()),
        ("distance", T.StringType()), ("hour", T.StringType()), ("minute", T.IntegerType()),
        ("time_hour", T.StringType())]])
    df = spark.read.csv(str(data), header=True, schema=schema, mode="PERMISSIVE")
    ts = F.unix_timestamp(F.col("time_hour"), "yyyy-MM-dd'T'HH:mm:ss'Z'") + F.col("minute") * 60
    valid = df.where(F.col("year").isNotNull() & F.col("minute").isNotNull()
                     & F.col("time_hour").isNotNull() & (F.col("origin") != "")
                     & (F.col("carrier") != "")).withColumn("ts", ts).where(F.col("ts").isNotNull())
    cancelled = F.col("dep_time") == "NA"
    delay = F.when(cancelled | (F.col("dep_delay") == "NA"), None).otherwise(
        F.col("dep_delay").cast("double"))
    start = (F.floor(F.col("ts") / 3600) * 3600).cast("long")
    return (valid.withColumn("window_start", start)
                 .withColumn("delay", delay)
                 .groupBy("origin", "carrier", "window_start")
                 .agg(F.count(F.lit(1)).alias("flights"),
                      F.sum(cancelled.cast("long")).alias("cancelled"),
                      F.avg("delay").alias("mean_dep_delay"),
                      F.max("delay").alias("max_dep_delay"))
                 .withColumn("window_end", F.col("window_start") + 3600)
                 .select(*RESULT_COLUMNS))


def validate_and_report(args: argparse.Namespace, figures: dict[str, Any],
                        kafka_rows: list[dict[str, Any]] | None = None,
                        kafka_dead: list[Any] | None = None) -> bool:
    """Validate the committed results with Spark and print the report; True when exact.
    The results are the committed part files of ``args.output``, or the rows read committed
    from the Kafka results topic (``kafka_rows``, with the dead letters ``kafka_dead``)."""
    from pyspark.sql import functions as F

    from reactive.connectors.spark import ResultLog, local_session, validate_exactly_once

    spark = local_session(extra_conf={"spark.sql.session.timeZone": "UTC"})
    if kafka_rows is None:
        actual = ResultLog(spark, args.output).read()
    else:
        import pyarrow as pa

        actual = spark.createDataFrame(pa.Table.from_pylist(kafka_rows, schema=result_schema()))
    expected = expected_with_spark(spark, Path(args.data))
    report = validate_exactly_once(actual, expected,
                                   key=["origin", "carrier", "window_start"])
    print(report)
    print("\ntop delayed routes (mean departure delay over the year, minutes):")
    top = (actual.groupBy("origin", "carrier")
                 .agg((F.sum(F.col("mean_dep_delay") * (F.col("flights") - F.col("cancelled")))
                       / F.sum(F.col("flights") - F.col("cancelled"))).alias("mean_delay"),
                      F.sum("flights").alias("flights"))
                 .where(F.col("flights") >= 1000)
                 .orderBy(F.desc("mean_delay")).limit(5).collect())
    for row in top:
        print(f"  {row['origin']} {row['carrier']:<3} {row['mean_delay']:6.1f}  "
              f"({row['flights']:,} flights)")
    f = figures
    if f.get("runner") == "spark":
        print(f"\nSpark ({args.spark_master}): {f['micro_batches']} micro-batches per query, "
              f"session start {f['session_seconds']:.1f} s of {f['seconds']:.1f} s")
    else:
        print(f"\ncheckpoints taken (last run): {f['checkpoints']}; median alignment "
              f"{f['median_alignment_ms']:.2f} ms, sync pause {f['median_sync_ms']:.2f} ms, "
              f"async part {f['median_async_ms']:.1f} ms")
        print(f"last checkpoint: state {f['last_full_bytes']:,} bytes (full), "
              f"{f['last_incremental_bytes']:,} bytes written (incremental)")
    from reactive.connectors.spark import list_part_files

    dead = (len(kafka_dead) if kafka_dead is not None else
            sum(count_lines(p.path) for p in list_part_files(Path(args.output, "_dead_letters"))))
    print(f"records/s (last run): {f['records'] / f['seconds']:,.0f}; dead letters "
          f"committed: {dead}; crashes: {f.get('crashes', 0)}")
    return bool(report.ok)
