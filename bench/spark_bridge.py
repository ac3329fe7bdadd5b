"""The PySpark bridge: ingest and validate a committed result log, jsonl vs parquet, in Spark
local[2], against pyarrow reading (and checking) the same rows in the same run.

    python -m bench.spark_bridge [--rows 1000000] [--parts 20] [--master local[2]]

Writes ``--rows`` result rows ``{"word", "n", "value"}`` (key ``(word, n)``, unique) as
committed part files ``part-<subtask>-<checkpoint>.<ext>`` (2 subtasks, ``--parts`` files,
the committing file sink's naming and encodings: compact JSON lines, or parquet written by
pyarrow), then per format times:

- Spark ingest: ``ResultLog(spark, dir).read()`` and a ``count()`` (reads every row);
- Spark validate: ``validate_exactly_once`` against the expected rows computed in Spark
  from ``spark.range`` (reads the log again: nothing is cached);
- pyarrow read: all part files into one ``pyarrow.Table``;
- pyarrow validate: the same check in pyarrow (group by key, full outer join with the
  expected table, count missing/duplicated/mismatched).

JVM start-up is reported on its own and excluded; a small untimed query warms the JVM first
so the first format measured is not charged for it. Figures are seconds and rows/s; the
ratios (Spark / pyarrow) are what to compare across machines.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
import pyarrow.parquet as pq

from bench.common import peak_rss_mb, print_table
from reactive.connectors.spark import ResultLog, local_session, validate_exactly_once

VOCABULARY = 50_000


def rows_table(start: int, stop: int) -> pa.Table:
    """Rows ``start..stop-1``: word ``w<i mod V>``, n ``i div V + 1``, value ``7i mod 1000``."""
    ids = pa.array(range(start, stop), type=pa.int64())
    words = pc.binary_join_element_wise("w", pc.cast(pc.remainder(ids, VOCABULARY), pa.string()),
                                        "")
    return pa.table({
        "word": words,
        "n": pc.add(pc.divide(ids, VOCABULARY), 1),
        "value": pc.remainder(pc.multiply(ids, 7), 1000),
    })


def write_log(directory: Path, rows: int, parts: int) -> dict[str, Path]:
    """Write the same rows as a jsonl and a parquet result log; returns format -> directory."""
    out = {"jsonl": directory / "jsonl", "parquet": directory / "parquet"}
    for d in out.values():
        d.mkdir(parents=True)
    bounds = [rows * i // parts for i in range(parts + 1)]
    for i in range(parts):
        table = rows_table(bounds[i], bounds[i + 1])
        name = f"part-{i % 2}-{i // 2 + 1}"
        pq.write_table(table, out["parquet"] / f"{name}.parquet")
        with open(out["jsonl"] / f"{name}.jsonl", "w", encoding="utf-8") as f:
            for record in table.to_pylist():
                f.write(json.dumps(record, separators=(",", ":")))
                f.write("\n")
    return out


def pyarrow_read(directory: Path, fmt: str) -> pa.Table:
    files = sorted(directory.glob(f"part-*.{fmt}"))
    if fmt == "parquet":
        return pa.concat_tables(pq.read_table(f) for f in files)
    return pa.concat_tables(pj.read_json(f) for f in files)


def pyarrow_validate(actual: pa.Table, expected: pa.Table) -> dict[str, int]:
    """Missing, duplicated and mismatched rows by key (word, n), as validate_exactly_once."""
    key = ["word", "n"]
    a = actual.group_by(key).aggregate([("value", "count"), ("value", "min"), ("value", "max")])
    e = expected.group_by(key).aggregate([("value", "count"), ("value", "min")])
    j = e.join(a, key, join_type="full outer", left_suffix="_e", right_suffix="_a")
    e_n = pc.fill_null(j["value_count_e"], 0)
    a_n = pc.fill_null(j["value_count_a"], 0)
    zero = pa.scalar(0, pa.int64())

    def total(arr: Any) -> int:
        return int(pc.sum(arr).as_py() or 0)

    both = pc.and_(pc.greater(e_n, 0), pc.greater(a_n, 0))
    differs = pc.or_(pc.not_equal(j["value_min_e"], j["value_min_a"]),
                     pc.not_equal(j["value_min_e"], j["value_max"]))
    return {
        "missing": total(pc.max_element_wise(pc.subtract(e_n, a_n), zero)),
        "duplicated": total(pc.if_else(pc.greater(e_n, 0),
                                       pc.max_element_wise(pc.subtract(a_n, e_n), zero), zero)),
        "mismatched": total(pc.cast(pc.and_(both, pc.fill_null(differs, False)), pa.int64())),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--parts", type=int, default=20)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-spark-") as tmp:
        t = time.perf_counter()
        logs = write_log(Path(tmp), args.rows, args.parts)
        print(f"wrote {args.rows:,} rows in {args.parts} part files per format "
              f"in {time.perf_counter() - t:.1f} s")
        t = time.perf_counter()
        spark = local_session(args.master, shuffle_partitions=4)
        print(f"Spark {spark.version} session ({args.master}) started in "
              f"{time.perf_counter() - t:.1f} s (excluded below)")
        from pyspark.sql import functions as F

        ids = F.col("id")
        expected_df = spark.range(args.rows).select(
            F.concat(F.lit("w"), (ids % VOCABULARY).cast("string")).alias("word"),
            (F.floor(ids / VOCABULARY) + 1).cast("bigint").alias("n"),
            ((ids * 7) % 1000).cast("bigint").alias("value"))
        expected_tbl = rows_table(0, args.rows)
        # warm the JVM (class loading, JIT) on one small file, untimed
        validate_exactly_once(ResultLog(spark, logs["parquet"]).read(up_to=1),
                              expected_df.limit(10), key=["word", "n"])

        results = []
        for fmt in ("jsonl", "parquet"):
            t = time.perf_counter()
            df = ResultLog(spark, logs[fmt]).read()
            n = df.count()
            ingest = time.perf_counter() - t
            t = time.perf_counter()
            report = validate_exactly_once(df, expected_df, key=["word", "n"])
            validate = time.perf_counter() - t
            assert n == args.rows and report.ok, report
            t = time.perf_counter()
            table = pyarrow_read(logs[fmt], fmt)
            pa_read = time.perf_counter() - t
            t = time.perf_counter()
            check = pyarrow_validate(table, expected_tbl)
            pa_validate = time.perf_counter() - t
            assert table.num_rows == args.rows and not any(check.values()), check
            results.append((fmt, ingest, validate, pa_read, pa_validate))

    print(f"\nPySpark bridge: {args.rows:,} result rows, {args.parts} part files, "
          f"Spark {args.master} vs pyarrow (seconds; ratio = Spark / pyarrow)")
    rows = []
    for fmt, ingest, validate, pa_read, pa_validate in results:
        spark_total, pa_total = ingest + validate, pa_read + pa_validate
        rows.append((fmt, ingest, validate, spark_total, args.rows / spark_total,
                     pa_read, pa_validate, pa_total, ingest / pa_read, spark_total / pa_total))
    print_table(["format", "Spark ingest s", "Spark validate s", "Spark total s",
                 "Spark rows/s", "pyarrow read s", "pyarrow validate s", "pyarrow total s",
                 "ingest ratio", "total ratio"], rows)
    print(f"\npeak RSS of the Python driver {peak_rss_mb():.0f} MiB (the JVM is separate)")


if __name__ == "__main__":
    main()
