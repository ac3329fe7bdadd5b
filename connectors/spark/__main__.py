"""Command line of the PySpark bridge.

    python -m reactive.connectors.spark validate --results out/ --expected expected.jsonl --key a,b
        [--format jsonl|parquet] [--schema DDL] [--after-checkpoint N] [--up-to N]
        [--master local[*]] [--samples 5]

Reads the committed result log in ``--results`` and the expected rows (a JSON-lines file of
objects, a parquet file, or a directory of either), validates exactly-once by ``--key`` and
prints the report. Exit status: 0 when exactly-once holds, 1 when it does not (with a
one-line reason on stderr), 2 on an error (missing directory, unreadable file, bad option).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from reactive.errors import ReactiveError

from .result_log import ResultLog
from .session import local_session
from .validation import validate_exactly_once

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["main"]


def _parser(prog: str = "python -m reactive.connectors.spark") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog,
                                     description="The PySpark bridge of reactive.")
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser("validate", help="check a committed result log against expected rows")
    v.add_argument("--results", required=True, type=Path,
                   help="the committing file sink's directory")
    v.add_argument("--expected", required=True, type=Path,
                   help="expected rows: .jsonl/.json (objects) or .parquet, file or directory")
    v.add_argument("--key", required=True, help="comma-separated key columns")
    v.add_argument("--format", choices=["jsonl", "parquet"], default=None,
                   help="the result log's format (default: from the file extensions)")
    v.add_argument("--expected-format", choices=["jsonl", "parquet"], default=None,
                   help="the expected rows' format (default: from the extension)")
    v.add_argument("--schema", default=None,
                   help='DDL schema of the results, e.g. "word string, count bigint"')
    v.add_argument("--after-checkpoint", type=int, default=None,
                   help="only parts of checkpoints after this id")
    v.add_argument("--up-to", type=int, default=None, help="only parts up to this checkpoint id")
    v.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    v.add_argument("--samples", type=int, default=5, help="example rows per failure kind")
    return parser


def _read_expected(spark: SparkSession, path: Path, fmt: str | None) -> DataFrame:
    if not path.exists():
        raise FileNotFoundError(f"expected rows {path} do not exist")
    if fmt is None:
        suffixes = {path.suffix} if path.is_file() else {p.suffix for p in path.iterdir()
                                                         if not p.name.startswith((".", "_"))}
        fmt = "parquet" if suffixes == {".parquet"} else "jsonl"
    if fmt == "parquet":
        return spark.read.parquet(str(path))
    return spark.read.option("mode", "FAILFAST").json(str(path))


def main(argv: Sequence[str] | None = None, prog: str = "python -m reactive.connectors.spark") -> int:
    """Run the command line; returns the exit status.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).
        prog: the program name help and usage show (``reactive`` when run as
            ``reactive validate``).
    """
    args = _parser(prog).parse_args(argv)
    key = [k.strip() for k in args.key.split(",") if k.strip()]
    try:
        spark = local_session(args.master)
        actual = ResultLog(spark, args.results, format=args.format, schema=args.schema).read(
            after_checkpoint=args.after_checkpoint, up_to=args.up_to)
        expected = _read_expected(spark, args.expected, args.expected_format)
        report = validate_exactly_once(actual, expected, key, sample_size=args.samples)
    except (ReactiveError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report)
    if report.ok:
        return 0
    print(report.reason(), file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
