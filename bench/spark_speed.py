"""The flights job on Spark local mode against the embedded run, on three years of flights:
records/s with Spark's start-up excluded (and reported apart), local[2] against local[1].

    python -m bench.spark_speed [--data CSV] [--limit N] [--repeats 3] [--batch N]
                                [--masters local[2],local[1]] [--read-partitions default,1,2]
                                [--python-plan] [--one-query] [--reader csv|lines]
                                [--restarts 10] [--state-stores auto,rocksdb]
                                [--conf KEY=VALUE ...]

The input (``--data``, else written once to ``data/flights-3y.csv`` by :func:`three_years`)
is the 2013 table and copies shifted by one and two years: 1,010,328 flights in event-time
order. Each run is the flights dataflow of ``examples/flights.py`` (the hourly windows with
built-in aggregations, the dead-letter output), from nothing to the last committed file, on
fresh output and checkpoint directories:

- embedded (the baseline): heap backend, checkpoints every second, parallelism 2, the
  vectorized CSV reader of the main job (and the line reader, with ``--reader lines``);
- on Spark, in a child process per master (a SparkContext's master is fixed): the JVM and
  session are started once and timed apart; each repeat is ``SparkRunner.run`` alone;
  with ``--one-query``, the first master also runs the dataflow as one query for both
  sinks (``SparkRunner(one_query=True)``) beside the default of one query per sink. Spark
  reads the file with ``--reader`` (default: the CSV reader, pyarrow blocks in Spark's
  tasks).

``--state-stores`` repeats each Spark run with other state stores (:data:`STATE_STORES`),
interleaved in the same session; ``--conf`` gives every Spark session more settings. After
the table: local[2] against local[1] by the medians, and where each query's time went in the
first repeat (Spark's ``durationMs`` phases summed over its micro-batches).

Beside wall-clock seconds, each run's CPU seconds (the process tree's, from ``/proc``, by
:func:`bench.spark_w1.tree_cpu_seconds`) and CPU seconds per wall-clock second: how many
cores a run kept busy (``local[1]`` runs one task at a time, but its Python workers, the
drivers of its queries and the JVM's own threads are processes and threads of their own).

Every Spark run's committed results and dead letters are compared with the embedded run's,
row for row (the embedded run with the same reader). Records/s counts the input lines.
Ratios are to the embedded CSV run's median.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .common import print_table
from .spark_w1 import tree_cpu_seconds

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def three_years(path: Path) -> Path:
    """Write (once) the 2013 flights and copies shifted by one and two years, in event-time
    order: 1,010,328 rows (2013 is no leap year, so every date exists a year on).

    Args:
        path: the CSV to write; left as is when it exists.

    Returns:
        ``path``.
    """
    if path.exists():
        return path
    sys.path.insert(0, str(EXAMPLES))
    import flights_data

    base = flights_data.prepare_flights(path.with_name("flights.csv"))
    lines = base.read_text(encoding="utf-8").splitlines()
    header, rows = lines[0], lines[1:]
    out = [header, *rows]
    for shift in (1, 2):
        # ``year`` is the first column and ``time_hour`` (UTC: a late flight of Dec 31 has
        # next year's) the last; both move by ``shift`` years
        for r in rows:
            cut = r.rindex(",") + 1
            out.append(f"{int(r[:4]) + shift}{r[4:cut]}{int(r[cut:cut + 4]) + shift}"
                       f"{r[cut + 4:]}")
    tmp = path.with_name("." + path.name + ".tmp")
    tmp.write_text("\n".join(out) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def _flights() -> Any:
    sys.path.insert(0, str(EXAMPLES))
    import flights

    return flights


def embedded_run(data: Path, work: Path, reader: str) -> tuple[float, float]:
    """One embedded run; returns its wall-clock and CPU seconds."""
    from reactive import CheckpointConfig
    from reactive.backends.heap import HeapStateBackend

    flights = _flights()
    shutil.rmtree(work, ignore_errors=True)
    started, cpu = time.perf_counter(), tree_cpu_seconds()
    asyncio.run(flights.build_flow(data, work / "out", reader=reader).run(
        checkpoints=CheckpointConfig(interval=1.0, directory=work / "chk"),
        state_backend=HeapStateBackend()))
    return time.perf_counter() - started, tree_cpu_seconds() - cpu


def spark_child(args: argparse.Namespace) -> None:
    """In a child process: start one session, run the job ``--repeats`` times; print JSON."""
    flights = _flights()
    from reactive.connectors.spark import (
        ResultLog,
        SparkRunner,
        list_part_files,
        local_session,
    )

    started = time.perf_counter()
    spark = local_session(args.master, app_name="bench-spark-speed",
                          extra_conf=dict(c.split("=", 1) for c in args.conf))
    startup = time.perf_counter() - started
    work = Path(args.work)
    equal, shapes = True, {}
    phases: dict[str, dict[str, dict[str, float]]] = {}

    def rows(d: Path) -> list[Any]:
        return sorted(tuple(r) for r in ResultLog(spark, d).read()
                      .drop("checkpoint_id", "subtask").collect())

    def lines(d: Path) -> list[str]:  # JSON lines; the real table has no dead letters
        return sorted(line for p in list_part_files(d)
                      for line in p.path.read_text(encoding="utf-8").splitlines())

    variants = args.state_stores.split(",")
    by_variant: dict[str, list[float]] = {v: [] for v in variants}
    cpu_by_variant: dict[str, list[float]] = {v: [] for v in variants}
    for i in range(args.repeats):
        for variant in variants:  # interleaved: a load change hits every variant alike
            out = work / f"spark-{i}-{variant}"
            shutil.rmtree(out, ignore_errors=True)
            store, conf = STATE_STORES[variant]
            for key, value in conf.items():  # a streaming query copies the session's conf
                spark.conf.set(key, value)
            started, cpu = time.perf_counter(), tree_cpu_seconds()
            try:
                job = SparkRunner(spark, out / "chk", max_records_per_batch=args.batch,
                                  native=not args.python_plan, state_store=store,
                                  read_partitions=(None if args.read_partitions == "default"
                                                   else int(args.read_partitions)),
                                  one_query=args.one_query,
                                  restart_attempts=args.restarts).run(
                    flights.build_flow(Path(args.data), out / "out", reader=args.reader))
            finally:
                for key in conf:
                    spark.conf.unset(key)
            by_variant[variant].append(time.perf_counter() - started)
            cpu_by_variant[variant].append(tree_cpu_seconds() - cpu)
            shapes = job.shapes
            if i == 0:
                phases[variant] = _phases(job)
                embedded = Path(args.embedded)
                equal = equal and (rows(out / "out") == rows(embedded / "out") and
                                   lines(out / "out" / "_dead_letters") ==
                                   lines(embedded / "out" / "_dead_letters"))
            shutil.rmtree(out, ignore_errors=True)
    runs = by_variant[variants[0]]
    print(json.dumps({"startup": startup, "runs": runs, "variants": by_variant,
                      "cpu": cpu_by_variant,
                      "equal": equal, "shapes": shapes, "phases": phases}))


#: ``--state-stores`` variants: SparkRunner's ``state_store`` and Spark settings
STATE_STORES: dict[str, tuple[str, dict[str, str]]] = {
    # the runner's default: the in-memory store here (every keyed operator runs natively)
    "auto": ("auto", {}),
    "rocksdb": ("rocksdb", {}),
    # the RocksDB store committing a changelog per micro-batch, a snapshot now and then
    "rocksdb-changelog": ("rocksdb", {
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true"}),
    # Spark's default: the HDFS-backed store (state in memory, a delta file per commit)
    "hdfs": ("default", {}),
}


def _phases(job: Any) -> dict[str, dict[str, float]]:
    """Where each query's time went over its micro-batches, from Spark's progress reports:
    seconds per phase of ``durationMs`` (``addBatch`` runs the micro-batch's tasks,
    ``latestOffset`` and ``queryPlanning`` plan it, ``walCommit`` and ``commitOffsets``
    write the offset and commit logs), summed, and the micro-batches."""
    out: dict[str, dict[str, float]] = {}
    for uid, reports in job.progress().items():
        sums: dict[str, float] = {"micro-batches": float(len(reports))}
        for p in reports:
            for phase, millis in json.loads(p.json).get("durationMs", {}).items():
                sums[phase] = sums.get(phase, 0.0) + millis / 1000
        out[uid] = sums
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=None, help="the flights CSV (default: three years)")
    p.add_argument("--limit", type=int, default=None,
                   help="only the first N rows of the data (a copy is written)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch", type=int, default=200_000, help="records per micro-batch")
    p.add_argument("--masters", default="local[2],local[1]")
    p.add_argument("--read-partitions", default="default",
                   help="comma-separated SparkRunner(read_partitions=) values to run "
                        "('default': the runner's, the dataflow's parallelism for the CSV "
                        "source)")
    p.add_argument("--python-plan", action="store_true",
                   help="Spark runs the window in Python (transformWithState), not natively")
    p.add_argument("--one-query", action="store_true",
                   help="also run both sinks as one Spark query (SparkRunner(one_query=True))")
    p.add_argument("--reader", choices=["csv", "lines"], default="csv",
                   help="how Spark reads the file (examples/flights.py --reader)")
    p.add_argument("--restarts", type=int, default=10,
                   help="SparkRunner(restart_attempts=): restarts after a Python worker that "
                        "did not connect back in time (a loaded machine)")
    p.add_argument("--state-stores", default="auto",
                   help="comma-separated state store variants each Spark run is repeated "
                        f"with, interleaved: {', '.join(STATE_STORES)}")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark setting for the session of every Spark run (repeatable)")
    p.add_argument("--spark-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--master", default="local[2]", help=argparse.SUPPRESS)
    p.add_argument("--work", default=None, help=argparse.SUPPRESS)
    p.add_argument("--embedded", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.spark_child:
        spark_child(args)
        return
    data = Path(args.data) if args.data else three_years(ROOT / "data" / "flights-3y.csv")
    work = Path(tempfile.mkdtemp(prefix="bench-spark-speed-"))
    try:
        if args.limit is not None:
            with open(data, encoding="utf-8") as f:
                head = [next(f) for _ in range(args.limit + 1)]
            data = work / "input.csv"
            data.write_text("".join(head), encoding="utf-8")
        with open(data, "rb") as f:
            records = sum(1 for _ in f)
        table: list[list[Any]] = []
        medians: dict[tuple[str, str, bool, str], float] = {}  # Spark runs' median seconds
        notes: list[str] = []  # each Spark run's first repeat: where its queries' time went

        def row(name: str, seconds: list[float], cpus: list[float], base: float | None,
                extra: str = "") -> None:
            med, cpu = statistics.median(seconds), statistics.median(cpus)
            table.append([name, f"{min(seconds):.1f} / {med:.1f} / {max(seconds):.1f}",
                          f"{records / max(seconds):,.0f} / {records / med:,.0f} / "
                          f"{records / min(seconds):,.0f}",
                          "1.000" if base is None else f"{base / med:.3f}",
                          f"{cpu:.1f} ({cpu / med:.2f})", extra])

        # the line reader embedded only when Spark reads lines (its results to compare)
        embedded: dict[str, list[float]] = {r: [] for r in dict.fromkeys(["csv", args.reader])}
        embedded_cpu: dict[str, list[float]] = {r: [] for r in embedded}
        for _ in range(args.repeats):
            for reader in embedded:
                wall, cpu = embedded_run(data, work / f"embedded-{reader}", reader)
                embedded[reader].append(wall)
                embedded_cpu[reader].append(cpu)
        base = statistics.median(embedded["csv"])
        row("embedded, CSV reader (p=2, heap)", embedded["csv"], embedded_cpu["csv"], None)
        print(" | ".join(map(str, table[-1])), file=sys.stderr, flush=True)
        if "lines" in embedded:
            row("embedded, line reader (p=2, heap)", embedded["lines"], embedded_cpu["lines"],
                base)
        for master, parts, one in [(m, n, o) for n in args.read_partitions.split(",")
                                   for m in args.masters.split(",")
                                   for o in ([False, True] if args.one_query
                                             and m == args.masters.split(",")[0]
                                             else [False])]:
            cmd = [sys.executable, "-m", "bench.spark_speed", "--spark-child", "--master",
                   master, "--data", str(data), "--repeats", str(args.repeats), "--batch",
                   str(args.batch), "--work", str(work), "--embedded",
                   str(work / f"embedded-{args.reader}"), "--read-partitions", parts,
                   "--reader", args.reader, "--restarts", str(args.restarts),
                   "--state-stores", args.state_stores,
                   *[f"--conf={c}" for c in args.conf]]
            if args.python_plan:
                cmd.append("--python-plan")
            if one:
                cmd.append("--one-query")
            done = subprocess.run(cmd, cwd=ROOT, check=False, capture_output=True, text=True)
            queries = "one query" if one else "a query per sink"
            if done.returncode != 0:
                # e.g. a Python worker that did not connect back in time on a loaded
                # machine: the other runs' rows still count
                print(f"the Spark run on {master} failed:\n{done.stderr[-4000:]}",
                      file=sys.stderr)
                errors = [line for line in done.stderr.splitlines()
                          if "Error" in line or "Exception" in line]
                why = (errors or ["?"])[-1][-160:]
                table.append([f"Spark {master}, {args.reader} reader, read partitions "
                              f"{parts}, {queries}", "failed", "-", "-", "-", why])
                continue
            result = json.loads(done.stdout.strip().splitlines()[-1])
            for variant, runs in result["variants"].items():
                medians[(master, parts, one, variant)] = statistics.median(runs)
                row(f"Spark {master}, {args.reader} reader, read partitions {parts}, "
                    f"{queries}, {variant} state store", runs, result["cpu"][variant], base,
                    f"start-up {result['startup']:.1f} s; equal: {result['equal']}; "
                    f"{', '.join(sorted(set(result['shapes'].values())))}")
                print(" | ".join(map(str, table[-1])), file=sys.stderr, flush=True)
            for variant, queries_phases in result.get("phases", {}).items():
                for uid, sums in queries_phases.items():
                    notes.append(
                        f"{master}, read partitions {parts}, {queries}, {variant}, query {uid}: "
                        + ", ".join(f"{k} {v:.1f}" + ("" if k == "micro-batches" else " s")
                                    for k, v in sorted(sums.items(), key=lambda kv: -kv[1])))
        print(f"flights job, {records - 1:,} flights ({data.name}), {args.repeats} repeats, "
              f"micro-batches of {args.batch:,}; machine shared with other jobs"
              + "".join(f"; {c}" for c in args.conf))
        print_table(["run", "seconds min / median / max", "records/s min / median / max",
                     "vs embedded CSV (median)", "CPU s, median (per wall s)", "notes"], table)
        first = args.masters.split(",")[0]
        for (master, parts, one, variant), med in medians.items():
            if master != first and (first, parts, one, variant) in medians:
                print(f"{first} against {master} (read partitions {parts}, "
                      f"{'one query' if one else 'a query per sink'}, {variant}): "
                      f"{med / medians[(first, parts, one, variant)]:.2f}x by the medians")
        for line in notes:
            print(line)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
