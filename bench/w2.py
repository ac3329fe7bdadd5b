"""W2: the flights job without Spark, reading the CSV in vectorized pyarrow blocks or line by
line, against a plain Python loop over the same file.

    python -m bench.w2 [--repeats 3] [--limit N] [--backends heap,rocksdb]
                       [--readers csv,lines] [--interval 1.0] [--parallelism 2]
                       [--block-size 1048576]

The pipeline is ``examples/flights.py``'s (``build_flow``): the flights CSV (written once by
``flights_data.prepare_flights`` to ``data/flights.csv``, or a ``--limit`` prefix of it) ->
parse -> key by (origin, carrier) -> hourly event-time windows (flights, cancelled, mean and
max departure delay) -> the exactly-once committing parquet sink, dead letters to JSON
lines, checkpoints every ``--interval`` seconds on the heap or RocksDB (incremental)
backend. ``--readers`` names the file readers compared: ``csv`` (the CSV source: pyarrow
blocks, ``flights_from_table``) and ``lines`` (the line-file source, ``parse_flight`` per
line).

The baseline, run in the same invocation: a plain Python loop reading the file with the
``csv`` module and computing the same aggregation in a dict (the same validation rules, the
hour's epoch memoized per distinct ``time_hour``). Each configuration runs ``--repeats``
times, interleaved with the others; the table gives min/median/max records/s, the ratio of
the median to the baseline's median, and each reader's ratio to ``lines`` on the same
backend. The job's results are checked against the baseline's on every run.
"""

from __future__ import annotations

import argparse
import calendar
import csv
import functools
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import print_table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

import flights  # noqa: E402
import flights_data  # noqa: E402

Key = tuple[str, str, int]


def plain_loop(data: Path) -> tuple[float, dict[Key, tuple[int, int]]]:
    """Records/s of a csv-module loop computing the hourly statistics in a dict, and its
    (flights, cancelled) per (origin, carrier, window start)."""
    started = time.perf_counter()
    acc: dict[Key, list[Any]] = {}
    hours: dict[str, int] = {}
    rows = 0
    with open(data, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader)
        col = {name: i for i, name in enumerate(header)}
        i_origin, i_carrier, i_hour = col["origin"], col["carrier"], col["time_hour"]
        i_minute, i_dep, i_delay = col["minute"], col["dep_time"], col["dep_delay"]
        width = len(header)
        for row in reader:
            rows += 1
            if len(row) != width or not row[i_origin] or not row[i_carrier]:
                continue  # a dead letter
            text = row[i_hour]
            hour = hours.get(text)
            if hour is None:
                hour = hours[text] = calendar.timegm(
                    time.strptime(text, "%Y-%m-%dT%H:%M:%SZ"))
            ts = hour + 60 * int(row[i_minute])
            cancelled = row[i_dep] == "NA"
            raw = row[i_delay]
            delay = None if cancelled or raw == "NA" else float(raw)
            key = (row[i_origin], row[i_carrier], ts - ts % 3600)
            a = acc.get(key)
            if a is None:
                a = acc[key] = [0, 0, 0.0, 0, None]
            a[0] += 1
            a[1] += cancelled
            if delay is not None:
                a[2] += delay
                a[3] += 1
                if a[4] is None or delay > a[4]:
                    a[4] = delay
    rate = rows / (time.perf_counter() - started)
    return rate, {k: (a[0], a[1]) for k, a in acc.items()}


async def run_job(data: Path, work: Path, reader: str, backend: str, interval: float,
                  parallelism: int) -> tuple[float, int]:
    """Records/s of one run of the flights job, and how many checkpoints completed."""
    from reactive import CheckpointConfig

    shutil.rmtree(work, ignore_errors=True)
    chk = work / "chk"
    flow = flights.build_flow(data, work / "out", parallelism, reader=reader)
    rows = flights.count_lines(data) - 1
    started = time.perf_counter()
    job = await flow.run(checkpoints=CheckpointConfig(interval=interval, directory=chk),
                         state_backend=flights.make_backend(backend, chk))
    rate = rows / (time.perf_counter() - started)
    return rate, len(job.metrics.completed_checkpoints)


def committed_counts(output: Path) -> dict[Key, tuple[int, int]]:
    """(flights, cancelled) per window of a run's committed results."""
    import pyarrow.parquet as pq

    table = pq.read_table([str(p) for p in output.glob("part-*.parquet")])
    cols = [table.column(c).to_pylist() for c in
            ("origin", "carrier", "window_start", "flights", "cancelled")]
    return {(o, c, w): (n, x) for o, c, w, n, x in zip(*cols, strict=True)}


def spread(values: list[float]) -> tuple[float, float, float]:
    return min(values), statistics.median(values), max(values)


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description="W2: the flights job against a plain loop")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--limit", type=int, default=None,
                   help="use the first N flights (default: all 336,776)")
    p.add_argument("--backends", default="heap,rocksdb")
    p.add_argument("--readers", default="csv,lines")
    p.add_argument("--interval", type=float, default=1.0, help="checkpoint interval, s")
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--block-size", type=int, default=None,
                   help="bytes per block of the CSV source (default: the example's)")
    args = p.parse_args(argv)
    default = flights.DEFAULT_DATA
    data = flights_data.prepare_flights(
        default if args.limit is None else default.with_name(f"flights-{args.limit}.csv"),
        args.limit)
    if args.block_size is not None:
        flights.csv_source = functools.partial(flights.csv_source, block_size=args.block_size)
    backends, readers = args.backends.split(","), args.readers.split(",")
    from reactive.runtime.loop import run_coroutine

    base: list[float] = []
    rates: dict[tuple[str, str], list[float]] = {(b, r): [] for b in backends for r in readers}
    checkpoints: dict[tuple[str, str], list[int]] = {k: [] for k in rates}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            rate, expected = plain_loop(data)
            base.append(rate)
            for key in rates:
                work = Path(tmp) / f"{key[0]}-{key[1]}"
                rate, done = run_coroutine(run_job(data, work, key[1], key[0], args.interval,
                                                   args.parallelism))
                got = committed_counts(work / "out")
                if got != expected:
                    raise SystemExit(f"W2: {key} committed other results than the plain loop")
                rates[key].append(rate)
                checkpoints[key].append(done)
    rows = flights.count_lines(data) - 1
    print(f"W2: {rows:,} flights ({data.name}), checkpoints every {args.interval} s, "
          f"parallelism {args.parallelism}, {args.repeats} repeats (records/s)")
    b_min, b_med, b_max = spread(base)
    table = [["plain loop (csv module, dict)", "-", b_min, b_med, b_max, 1.0, "-", "-"]]
    for (backend, reader), values in rates.items():
        lo, med, hi = spread(values)
        lines = rates.get((backend, "lines"))
        vs_lines = med / statistics.median(lines) if lines else "-"
        table.append([f"flights job, {reader} reader", backend, lo, med, hi, med / b_med,
                      vs_lines, statistics.median(checkpoints[(backend, reader)])])
    return print_table(["run", "backend", "min", "median", "max", "vs plain loop",
                        "vs lines reader", "checkpoints"], table)


if __name__ == "__main__":
    main()
