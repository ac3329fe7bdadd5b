"""W2: the flights job without Spark, reading the CSV in vectorized pyarrow blocks or line by
line, against a plain Python loop over the same file.

    python -m bench.w2 [--repeats 3] [--limit N] [--backends heap,rocksdb]
                       [--readers csv,lines] [--interval 1.0] [--parallelism 2]
                       [--block-size 1048576] [--baseline REV] [--breakdown]
                       [--plain-gc tuned|default]

e.g. ``python -m bench.w2 --repeats 3 --backends heap --readers csv --baseline HEAD
--breakdown`` (the working tree against the last commit, and where the time goes).

The pipeline is ``examples/flights.py``'s (``build_flow``): the flights CSV (written once by
``flights_data.prepare_flights`` to ``data/flights.csv``, or a ``--limit`` prefix of it) ->
parse -> key by (origin, carrier) -> hourly event-time windows (flights, cancelled, mean and
max departure delay) -> the exactly-once committing parquet sink, dead letters to JSON
lines, checkpoints every ``--interval`` seconds on the heap or RocksDB (incremental)
backend (``--backends heap,rocksdb,rocksdb:/dev/shm``: the last with RocksDB's working
directories on a tmpfs, as Flink advises local fast storage for them). ``--readers`` names
the file readers compared: ``csv`` (the CSV source: pyarrow
blocks, ``flights_from_table``), ``lines`` (the line-file source, ``parse_flight`` per
line) and ``columnar`` (the columnar job, ``build_flow(api="columnar")``: record batches from
the CSV source through columnar windows; the windows' state is columnar arrays in memory,
snapshotted as Arrow IPC, whichever backend the job names: on RocksDB the job's other state,
the source's offsets and the sink's transactions, is RocksDB's).

The baseline, run in the same invocation: a plain Python loop reading the file with the
``csv`` module and computing the same aggregation in a dict (the same validation rules, the
hour's epoch memoized per distinct ``time_hour``), under the garbage-collector settings the
job runs with (``reactive.runtime.gc_tuning.throughput_gc``; ``--plain-gc default`` for
CPython's). A second row times the job's own reader and functions without the runtime
(``user_functions_loop``: pyarrow blocks, ``flights_from_table``, the job's filters,
timestamp and key functions, ``DelayStats``, ``to_row``, a dict for the state), under the
same settings: what a runtime calling those functions per record cannot beat. Each job runs
in a fresh child process (the same imports and a fresh heap for every run); ``--baseline
REV`` also runs the job of the tree at git revision ``REV`` (its ``reactive``,
``backends``, ``connectors`` and ``examples``, extracted with ``git archive``; no git state
changes) so a change is measured against the code before it on the same machine at the same
time. Each configuration runs ``--repeats`` times, interleaved with the others; the table
gives min/median/max records/s (rows read / the run's wall time from ``flow.run`` to its
end), the ratio of the median to the plain loop's median, each reader's ratio to ``lines``
on the same backend, and each run's ratio to the baseline revision's. The job's results are
checked against the plain loop's on every run.

``--breakdown`` runs the working tree's job once more in this process with CPU timers
(``time.thread_time``) around each operator's batch and watermark calls, the source's block
conversion, the exchange's partitioning and the sink writer, and prints CPU microseconds
per input record per component (the rest of the event loop thread is the runtime: the
loop, channels, checkpoints; worker threads are counted apart). The timers add a little of
their own.
"""

from __future__ import annotations

import argparse
import calendar
import contextlib
import csv
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

Key = tuple[str, str, int]


def examples(root: Path = ROOT) -> tuple[ModuleType, ModuleType]:
    """The ``flights`` and ``flights_data`` example modules of the tree at ``root``."""
    sys.path.insert(0, str(root / "examples"))
    import flights
    import flights_data

    return flights, flights_data


def plain_loop(data: Path) -> tuple[float, float, dict[Key, tuple[int, int]]]:
    """Records/s (wall time) and records per CPU second of a csv-module loop computing the
    hourly statistics in a dict, and its (flights, cancelled) per (origin, carrier, window
    start)."""
    started, cpu = time.perf_counter(), time.process_time()
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
    return rate, rows / (time.process_time() - cpu), {k: (a[0], a[1]) for k, a in acc.items()}


def user_functions_loop(flights: ModuleType, flights_data: ModuleType, data: Path
                        ) -> tuple[float, float]:
    """Records/s (wall time) and records per CPU second of the job's own work without the
    runtime: the file read in pyarrow blocks (the CSV source's options, one thread), the
    example's ``flights_from_table`` per block, then per flight the functions the job calls
    (the crash injector's ``tick``, the dead-letter and flight filters, the timestamp
    function of ``assign_timestamps`` and of the window, the key selector,
    ``DelayStats.add``), a dict per (key, hour) for the window state, and per window
    ``create_accumulator``, ``get_result``, its ``WindowResult`` and ``to_row``. What a
    runtime that calls these functions per record cannot beat (``bench.w1``'s second row,
    for W2).

    Raises:
        SystemExit: if a block holds a malformed row (this loop has no dead-letter path).
    """
    import pyarrow as pa
    import pyarrow.csv as pacsv

    from reactive.windowing.functions import window_result

    started, cpu = time.perf_counter(), time.process_time()
    read = pacsv.ReadOptions(use_threads=False, block_size=1 << 20)
    convert = pacsv.ConvertOptions(include_columns=list(flights_data.CSV_COLUMNS),
                                   column_types=dict(flights_data.CSV_COLUMN_TYPES),
                                   null_values=[])
    # the lambdas of flights.build_flow, with the same bodies
    def malformed(r: Any) -> bool:
        return isinstance(r, flights.DeadLetter)

    def valid(r: Any) -> bool:
        return isinstance(r, flights_data.Flight)

    def timestamp(f: Any) -> Any:
        return f.ts

    def key_of(f: Any) -> tuple[Any, Any]:
        return (f.origin, f.carrier)

    tick = flights.CrashAt.tick
    agg = flights.DelayStats()
    add, create, result = agg.add, agg.create_accumulator, agg.get_result
    windows: dict[tuple[Any, float], Any] = {}
    rows = 0
    for batch in pacsv.open_csv(data, read_options=read, convert_options=convert):
        try:
            block = flights_data.flights_from_table(pa.Table.from_batches([batch]))
        except flights_data.MalformedRow as exc:
            raise SystemExit(f"W2: a malformed row in {data} ({exc}): the user-functions "
                             "loop has no dead-letter path") from None
        rows += len(block)
        for f in block:
            if not tick(f) or malformed(f) or not valid(f):
                continue
            timestamp(f)  # assign_timestamps
            ts = timestamp(f)
            w = (key_of(f), ts - ts % 3600.0)
            acc = windows.get(w)
            windows[w] = add(f, create() if acc is None else acc)
    for (key, start), acc in windows.items():
        flights.to_row(window_result(key, start, start + 3600.0, result(acc)))
    return rows / (time.perf_counter() - started), rows / (time.process_time() - cpu)


async def run_job(flights: ModuleType, data: Path, work: Path, reader: str, backend: str,
                  interval: float, parallelism: int) -> tuple[float, float, int]:
    """Records/s (wall time) and records per CPU second (this process, all threads) of one
    run of the flights job, and how many checkpoints completed. ``backend``: ``heap``,
    ``rocksdb`` (working directories beside the checkpoints, as the example's) or
    ``rocksdb:DIR`` (working directories under ``DIR``, e.g. a tmpfs such as /dev/shm)."""
    from reactive import CheckpointConfig

    shutil.rmtree(work, ignore_errors=True)
    chk = work / "chk"
    if reader == "columnar":
        flow = flights.build_flow(data, work / "out", parallelism, reader="csv",
                                  api="columnar")
    else:
        flow = flights.build_flow(data, work / "out", parallelism, reader=reader)
    rows = flights.count_lines(data) - 1
    # built (and its modules imported) before the clock starts, as the dataflow is
    if backend.startswith("rocksdb:"):
        from reactive.backends.rocksdb import RocksDBStateBackend

        local = Path(backend.partition(":")[2]) / f"w2-{os.getpid()}"
        shutil.rmtree(local, ignore_errors=True)
        state_backend = RocksDBStateBackend(path=local, incremental=True)
    else:
        state_backend = flights.make_backend(backend, chk)
    started, cpu = time.perf_counter(), time.process_time()
    job = await flow.run(checkpoints=CheckpointConfig(interval=interval, directory=chk),
                         state_backend=state_backend)
    rate = rows / (time.perf_counter() - started)
    return rate, rows / (time.process_time() - cpu), len(job.metrics.completed_checkpoints)


def child_main(spec: dict[str, Any]) -> None:
    """One job run in this (child) process; prints ``{"rate", "cpu_rate", "checkpoints",
    "reactive"}`` as JSON on the last line."""
    flights, _ = examples(Path(spec["tree"]))
    if spec["block_size"] is not None:
        setattr(flights, "csv_source",  # noqa: B010 - a module of the tree, typed loosely
                functools.partial(flights.csv_source, block_size=spec["block_size"]))
        if spec["reader"] == "columnar":
            import flights_columnar

            setattr(flights_columnar, "csv_source",  # noqa: B010
                    functools.partial(flights_columnar.csv_source,
                                      block_size=spec["block_size"]))
    import reactive
    from reactive.runtime.loop import run_coroutine

    rate, cpu_rate, done = run_coroutine(run_job(
        flights, Path(spec["data"]), Path(spec["work"]), spec["reader"], spec["backend"],
        spec["interval"], spec["parallelism"]))
    print(json.dumps({"rate": rate, "cpu_rate": cpu_rate, "checkpoints": done,
                      "reactive": reactive.__file__}))


def tree_at(revision: str, into: Path) -> Path:
    """The tree at git ``revision`` extracted under ``into`` (``git archive``), with an
    importable ``site/reactive`` whose ``backends`` and ``connectors`` are the revision's (as
    ``pyproject.toml``'s ``package-dir`` installs them). Returns the tree's root.

    Raises:
        subprocess.CalledProcessError: if git does not know ``revision``.
    """
    tree = into / "tree"
    tree.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", revision, "reactive", "backends",
                              "connectors", "examples"], cwd=ROOT, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    site = tree / "site"
    site.mkdir()
    (site / "reactive").symlink_to(tree / "reactive")
    for sub in ("backends", "connectors"):
        (tree / "reactive" / sub).symlink_to(tree / sub)
    return tree


def run_child(tree: Path, site: Path | None, spec: dict[str, Any]
              ) -> tuple[float, float, int]:
    """Run one job in a child process with the code of ``tree`` (``site``: the importable
    ``reactive`` of a baseline tree; None: the working tree). Returns records/s, records
    per CPU second and the completed checkpoints.

    Raises:
        SystemExit: if the child fails or imported ``reactive`` from elsewhere.
    """
    spec = {**spec, "tree": str(tree)}
    # the child's working directory is its work folder: no `reactive` folder there shadows
    # the one it should import; the bench package comes last on the path for the same reason
    path = ([str(site)] if site is not None else []) + [str(ROOT)]
    code = ("import sys, json; sys.path[:0] = " + json.dumps(path[:-1]) + "; sys.path.append("
            + json.dumps(path[-1]) + "); from bench.w2 import child_main; child_main("
            "json.loads(sys.argv[1]))")
    work = Path(spec["work"])
    work.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", code, json.dumps(spec)], cwd=work, env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"W2: the job of {tree} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    expected = (site if site is not None else ROOT) / "reactive"
    if Path(result["reactive"]).resolve().parent != expected.resolve():
        raise SystemExit(f"W2: the child imported {result['reactive']}, not {expected}")
    return float(result["rate"]), float(result["cpu_rate"]), int(result["checkpoints"])


def committed_counts(output: Path) -> dict[Key, tuple[int, int]]:
    """(flights, cancelled) per window of a run's committed results."""
    import pyarrow.parquet as pq

    table = pq.read_table([str(p) for p in output.glob("part-*.parquet")])
    cols = [table.column(c).to_pylist() for c in
            ("origin", "carrier", "window_start", "flights", "cancelled")]
    return {(o, c, w): (n, x) for o, c, w, n, x in zip(*cols, strict=True)}


def spread(values: list[float]) -> tuple[float, float, float]:
    return min(values), statistics.median(values), max(values)


Config = tuple[str, str, str]
"""(code: "working tree" or "at REV", backend, reader)"""


def ratio_table(rates: dict[Config | None, list[float]], checkpoints: dict[Config, list[int]],
                baseline: str | None, calls: list[float] | None = None) -> list[list[Any]]:
    """The rows of a result table: min/median/max of each configuration (None: the plain
    loop; ``calls``: :func:`user_functions_loop`) and the ratios of its median to the plain
    loop's, the lines reader's on the same code and backend, and the baseline revision's on
    the same backend and reader."""
    b_min, b_med, b_max = spread(rates[None])
    table: list[list[Any]] = [["plain loop (csv module, dict)", "-", "-", b_min, b_med, b_max,
                               1.0, "-", "-", "-"]]
    if calls:
        lo, med, hi = spread(calls)
        table.append(["the job's reader and functions alone (no runtime)", "-", "-", lo, med,
                      hi, med / b_med, "-", "-", "-"])
    for config, values in rates.items():
        if config is None:
            continue
        tree_name, backend, reader = config
        lo, med, hi = spread(values)
        lines = rates.get((tree_name, backend, "lines"))
        vs_lines = med / statistics.median(lines) if lines else "-"
        old = rates.get((f"at {baseline}", backend, reader))
        vs_old = med / statistics.median(old) if old and tree_name == "working tree" else "-"
        table.append([f"flights job, {reader} reader", tree_name, backend, lo, med, hi,
                      med / b_med, vs_lines, vs_old, statistics.median(checkpoints[config])])
    return table


# ---------------------------------------------------------------------- breakdown
def _timed(totals: dict[str, float], label: Callable[[Any], str], fn: Any) -> Any:
    """``fn`` (a method) with the CPU time of its thread added to ``totals[label(self)]``."""
    clock = time.thread_time

    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any) -> Any:
        t = clock()
        try:
            return fn(self, *args)
        finally:
            key = label(self)
            totals[key] = totals.get(key, 0.0) + clock() - t
    return wrapper


def breakdown(data: Path, work: Path, reader: str, backend: str, interval: float,
              parallelism: int) -> list[list[Any]]:
    """Rows ``[component, us per record, share]`` of one in-process run of the job: CPU
    time of the event loop's thread (a busy machine inflates wall times, not these), then
    that of the other threads (checkpoint and file writes)."""
    from reactive.connectors.files import CommittingFileSink
    from reactive.connectors.files.csv_records import BlockConverter
    from reactive.runtime.loop import run_coroutine
    from reactive.runtime.operators import StreamOperator
    from reactive.runtime.record_writer import RecordWriter

    flights, _ = examples()
    totals: dict[str, float] = {}
    patched: list[tuple[type, str, Any]] = []

    def patch(cls: type, name: str, label: Callable[[Any], str]) -> None:
        fn = cls.__dict__.get(name)
        if fn is None or getattr(fn, "__wrapped__", None) is not None:
            return
        patched.append((cls, name, fn))
        setattr(cls, name, _timed(totals, label, fn))

    def subclasses(cls: type) -> list[type]:
        out = [cls]
        sub: type
        for sub in cls.__subclasses__():
            out += subclasses(sub)
        return out

    flow = flights.build_flow(data, work / "warm", parallelism, reader=reader)
    del flow  # imports the operator classes the job uses
    for cls in subclasses(StreamOperator):
        patch(cls, "process_batch", lambda op: f"{op.name}: records")
        patch(cls, "process_watermark", lambda op: f"{op.name}: watermarks (timers)")
    patch(BlockConverter, "convert", lambda c: "source: parse and convert a block")
    patch(RecordWriter, "add", lambda w: "exchange: partition")
    patch(CommittingFileSink, "write", lambda s: f"sink {s.directory.name}: encode and write")
    rows = flights.count_lines(data) - 1
    try:
        started, cpu = time.thread_time(), time.process_time()
        run_coroutine(run_job(flights, data, work / "breakdown", reader, backend, interval,
                              parallelism))
        total = time.thread_time() - started
        others = time.process_time() - cpu - total
    finally:
        for cls, name, fn in patched:
            setattr(cls, name, fn)
    table = [[k, v / rows * 1e6, v / total] for k, v in
             sorted(totals.items(), key=lambda kv: -kv[1])]
    rest = total - sum(totals.values())
    table.append(["rest (loop, channels, checkpoints)", rest / rows * 1e6,
                  rest / total])
    table.append(["total (event loop thread)", total / rows * 1e6, 1.0])
    table.append(["other threads (checkpoint and file writes)", others / rows * 1e6,
                  others / total])
    return table


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
    p.add_argument("--baseline", default=None, metavar="REV",
                   help="also run the job of the tree at this git revision (e.g. HEAD)")
    p.add_argument("--plain-gc", choices=["tuned", "default"], default="tuned",
                   help="the plain loop's collector settings: those the job runs with "
                        "(reactive.runtime.gc_tuning, the default) or CPython's defaults")
    p.add_argument("--breakdown", action="store_true",
                   help="also print microseconds per record per component (one run)")
    args = p.parse_args(argv)
    flights, flights_data = examples()
    default = flights.DEFAULT_DATA
    data = flights_data.prepare_flights(
        default if args.limit is None else default.with_name(f"flights-{args.limit}.csv"),
        args.limit)
    backends, readers = args.backends.split(","), args.readers.split(",")
    trees = ["working tree"] + ([f"at {args.baseline}"] if args.baseline else [])
    configs = [(t, b, r) for b in backends for r in readers for t in trees]
    # (wall, cpu) -> config (None: the plain loop) -> records/s of each repeat
    rates: dict[str, dict[Config | None, list[float]]] = {
        m: {c: [] for c in [None, *configs]} for m in ("wall", "cpu")}
    checkpoints: dict[Config, list[int]] = {c: [] for c in configs}
    calls: dict[str, list[float]] = {"wall": [], "cpu": []}  # user_functions_loop
    with tempfile.TemporaryDirectory() as tmp:
        baseline_tree = tree_at(args.baseline, Path(tmp) / "baseline") if args.baseline \
            else None
        from reactive.runtime.gc_tuning import throughput_gc

        for _ in range(args.repeats):
            # the plain loop gets the collector settings the job runs with (or CPython's)
            with throughput_gc() if args.plain_gc == "tuned" else contextlib.nullcontext():
                wall, cpu, expected = plain_loop(data)
            rates["wall"][None].append(wall)
            rates["cpu"][None].append(cpu)
            with throughput_gc() if args.plain_gc == "tuned" else contextlib.nullcontext():
                wall, cpu = user_functions_loop(flights, flights_data, data)
            calls["wall"].append(wall)
            calls["cpu"].append(cpu)
            for config in configs:
                tree_name, backend, reader = config
                work = Path(tmp) / "-".join(config).replace(" ", "_").replace("/", "_")
                spec = {"data": str(data), "work": str(work), "reader": reader,
                        "backend": backend, "interval": args.interval,
                        "parallelism": args.parallelism, "block_size": args.block_size}
                if tree_name == "working tree":
                    wall, cpu, done = run_child(ROOT, None, spec)
                else:
                    assert baseline_tree is not None
                    wall, cpu, done = run_child(baseline_tree, baseline_tree / "site", spec)
                got = committed_counts(work / "out")
                if got != expected:
                    raise SystemExit(f"W2: {config} committed other results than the plain "
                                     "loop")
                rates["wall"][config].append(wall)
                rates["cpu"][config].append(cpu)
                checkpoints[config].append(done)
        rows = flights.count_lines(data) - 1
        texts = []
        for measure, title in (("wall", "records/s, wall time"),
                               ("cpu", "records per CPU second of the process")):
            print(f"\nW2: {rows:,} flights ({data.name}), checkpoints every {args.interval} s, "
                  f"parallelism {args.parallelism}, {args.repeats} repeats ({title})")
            texts.append(print_table(
                ["run", "code", "backend", "min", "median", "max", "vs plain loop",
                 "vs lines reader", f"vs {args.baseline}", "checkpoints"],
                ratio_table(rates[measure], checkpoints, args.baseline, calls[measure])))
        text = "\n\n".join(texts)
        if args.breakdown:
            print(f"\nbreakdown (working tree, {backends[0]}, {readers[0]} reader, one run in "
                  "this process; CPU us per input record)")
            text += "\n\n" + print_table(
                ["component", "us/record", "share"],
                breakdown(data, Path(tmp) / "breakdown", readers[0], backends[0],
                          args.interval, args.parallelism))
    return text


def print_table(headers: list[str], rows: list[list[Any]]) -> str:
    """:func:`bench.common.print_table` (imported late: it imports ``reactive``)."""
    from bench.common import print_table as table

    return table(headers, rows)


if __name__ == "__main__":
    main()
