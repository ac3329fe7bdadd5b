"""The Nexmark benchmark of the per-record and the columnar API.

    python -m bench.nexmark [--queries q0,q1,q2,q3,q4,q5,q6,q7,q8] [--events 1000000]
                            [--apis record,columnar] [--rate 10000]
                            [--backends heap,rocksdb] [--repeats 3] [--interval 1.0] [--cpu 0]

Each run is one query in one API over ``--events`` generated events (one split,
parallelism 1) in a fresh child process pinned to one core (``--cpu``), with exactly-once
checkpoints every ``--interval`` seconds on the heap backend or the RocksDB backend
(incremental), results into a sink that counts them. The per-record API reads
:class:`NexmarkSource` (one record per event, :mod:`bench.nexmark.queries`); the columnar
API reads :class:`NexmarkArrowSource` (record batches of 16,384 events,
:mod:`bench.nexmark.columnar_queries`: q0, q1, q2, q5 and q7; the others have no columnar
form and are skipped). Runs are interleaved (query x backend x API, then Flink's run of the
same query and backend, then the next repeat) and the table gives, per query, API and
backend:

- events/s: events / the job's wall time (start to the end of its final checkpoint),
  min / median / max over the repeats;
- events/CPU-s: events / the CPU time the job used (user + system, every thread of the
  process: ours one core's worth at most, Flink's JVM as many as it uses: its task thread,
  JIT compilers, garbage collector and checkpointing), min / median / max: the figure a
  load on the shared machine changes least;
- p50 / p99 latency (ms, of the median run): **event time to emit**. Every result row has
  an event time T (ms): the bid's ``dateTime`` (q0, q1), the auction's ``dateTime`` (q3,
  recovered exactly from the auction id, ids being given in event-number order), the
  window's end (q5, q7, q8). T is mapped to wall time through the source: wall(T) is the
  wall time at which the source handed out the batch holding the first event with
  ``dateTime >= T`` (the events are in event-time order: one split, no out-of-orderness).
  A row's latency is the wall time at which the sink receives it minus wall(T): for a bid
  the time it spends in the job, for a window the time from the source reaching the
  window's end (the event whose watermark closes it) to the window's rows at the sink.
  One sample per sink batch (per record batch in the columnar API), its first row's,
  weighted by the batch's rows. q2, q4 and q6 rows carry no event time (auction and price;
  category or seller and an average): no latency is given for them;
- peak RSS (MiB) of the child, and the number of completed checkpoints;
- "vs generator": the median over the runs of the job's events/s over the generator's
  alone, measured in the same child on the same core just before the job (generating up
  to 200,000 of the events without the runtime, into records or into record batches as the
  API reads them: the ceiling of any query here; its own figures are the first rows), and
  a bar chart of the ratio columns in ``bench/results/nexmark.png`` (``--png``,
  ``--no-png``).

With ``--anchor flink`` the same queries also run on Flink 1.20 (PyFlink SQL, the texts in
:mod:`bench.nexmark.flink_job`, parallelism 1, hashmap and RocksDB incremental backends,
exactly-once checkpoints every second) over the same events written as JSON lines, in a
virtual environment the benchmark creates once (``--flink-venv``; ``pip install
apache-flink``, never a dependency of the project), one JVM for the whole invocation;
"vs Flink" and "vs Flink per CPU-s" are the ratios of the medians. Flink's figures are
events / (wall or CPU time over the file - the same over a one-event file): its job start
and stop are left out, its JSON parsing is in (ours generates the events).

``--rate`` is the events' event-time rate
(events/s); Flink's nexmark runs use 10 M/s, which over a run of a million events would
close no 10 s window before the end of input (nor measure a window's latency), so the
default is 10,000/s: a 10 s window holds 100,000 events and a million events span 100 s
of event time (50 q5 windows, 10 q7 and q8 windows).
"""

from __future__ import annotations

import argparse
import bisect
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
from typing import Any

from reactive.sinks import Sink, SinkWriter

ROOT = Path(__file__).resolve().parents[2]

APIS = ("record", "columnar")


def time_of(query: str, config: Any) -> Callable[[Any], int] | None:
    """The event time (ms) of a result row of ``query`` (a tuple), or None when its rows
    carry none (see the module's docstring)."""
    from reactive.connectors.nexmark.config import FIRST_AUCTION_ID

    def auction_time(row: Any) -> int:
        # the k-th auction is event a-th of its run of total_proportion events
        k = row[3] - FIRST_AUCTION_ID
        run, nth = divmod(k, config.auction_proportion)
        return int(config.timestamp_ms(run * config.total_proportion
                                       + config.person_proportion + nth))

    return {
        "q0": lambda r: r[3],
        "q1": lambda r: r[3],
        "q3": auction_time,
        "q5": lambda r: r[3],
        "q7": lambda r: r[3] - r[3] % 10_000 + 10_000,
        "q8": lambda r: r[2] + 10_000,
    }.get(query)


def first_time_ms(batch: Any) -> int:
    """The event time (ms) of a record batch's first row: its ``dateTime`` (q0, q1
    columnar) or its window's end (q5 columnar's ``endtime``)."""
    column = "endtime" if batch.schema.get_field_index("endtime") >= 0 else "dateTime"
    return int(batch.column(column)[0].value)


class SourceClock:
    """When (wall time) the source first emitted each event time: ``(event time ms, wall s)``
    per source batch, both non-decreasing (one split, in-order events)."""

    def __init__(self) -> None:
        self.times: list[int] = []
        self.walls: list[float] = []

    def wall_of(self, event_time_ms: int) -> float | None:
        i = bisect.bisect_left(self.times, event_time_ms)
        return self.walls[i] if i < len(self.walls) else None


class LatencySink(Sink):
    """Counts rows and samples their event-time-to-emit latency (one sample per batch: its
    first row's, weighted by the batch's rows)."""

    def __init__(self, clock: SourceClock, time_of: Callable[[Any], int] | None,
                 columnar: bool = False) -> None:
        self.clock = clock
        self.time_of = time_of
        self.columnar = columnar
        self.rows = 0
        self.samples: list[tuple[float, int]] = []

    def create_writer(self, subtask: int, parallelism: int) -> SinkWriter:
        return _LatencyWriter(self)


class _LatencyWriter(SinkWriter):
    def __init__(self, sink: LatencySink) -> None:
        self.sink = sink

    def write(self, batch: list[Any]) -> None:
        sink = self.sink
        if sink.columnar:
            for b in batch:
                sink.rows += b.num_rows
                if sink.time_of is not None and b.num_rows:
                    wall = sink.clock.wall_of(first_time_ms(b))
                    if wall is not None:
                        sink.samples.append((time.perf_counter() - wall, b.num_rows))
            return
        sink.rows += len(batch)
        if sink.time_of is None or not batch:
            return
        wall = sink.clock.wall_of(sink.time_of(batch[0]))
        if wall is not None:
            sink.samples.append((time.perf_counter() - wall, len(batch)))


def weighted_percentile(samples: list[tuple[float, int]], q: float) -> float | None:
    """The ``q`` quantile (0..1) of weighted samples ``(value, weight)``."""
    if not samples:
        return None
    ordered = sorted(samples)
    total = sum(w for _, w in ordered)
    seen = 0
    for value, weight in ordered:
        seen += weight
        if seen >= q * total:
            return value
    return ordered[-1][0]


def child_main(spec: dict[str, Any]) -> None:
    """One run in this (child) process; prints its figures as JSON on the last line."""
    from bench.common import peak_rss_mb
    from reactive import CheckpointConfig, Dataflow
    from reactive.connectors.nexmark import NexmarkConfig, NexmarkSource
    from reactive.connectors.nexmark.arrow import (
        NexmarkArrowSource,
        NexmarkBatchReader,
        nexmark_columnar,
    )
    from reactive.connectors.nexmark.source import NexmarkReader
    from reactive.sources import SourceReader

    from .columnar_queries import COLUMNAR_QUERIES
    from .queries import QUERIES

    if hasattr(os, "sched_setaffinity") and spec.get("cpu") is not None:
        os.sched_setaffinity(0, {spec["cpu"]})
    config = NexmarkConfig(num_events=spec["events"], first_event_rate=spec["rate"])
    clock = SourceClock()
    columnar = spec["api"] == "columnar"

    class TimedReader(NexmarkReader):
        async def read_batch(self, max_records: int) -> list[Any] | None:
            batch = await super().read_batch(max_records)
            if batch:
                clock.times.append(batch[-1].date_time)
                clock.walls.append(time.perf_counter())
            return batch

    class TimedSource(NexmarkSource):
        def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
            return TimedReader(self, [[0, 1, 0]])

    class TimedBatchReader(NexmarkBatchReader):
        async def read_batch(self, max_records: int) -> list[Any] | None:
            batch = await super().read_batch(max_records)
            if batch:
                clock.times.append(int(batch[-1].column("dateTime")[-1].value))
                clock.walls.append(time.perf_counter())
            return batch

    class TimedArrowSource(NexmarkArrowSource):
        def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
            return TimedBatchReader(self, [[0, 1, 0]])

    # the generator alone, on the same core just before the job: the run's ceiling
    generated = generator_rate(min(spec["events"], 200_000), spec["rate"], columnar)
    query = spec["query"]
    sink = LatencySink(clock, time_of(query, config), columnar)
    work = Path(spec["work"])
    flow = Dataflow(f"nexmark-{query}", parallelism=1)
    if columnar:
        events = nexmark_columnar(flow, TimedArrowSource(config, splits=1,
                                                         batch_size=spec["batch_size"]))
        COLUMNAR_QUERIES[query](events).sink(sink)
    else:
        QUERIES[query](flow.source(TimedSource(config, splits=1), uid="events")).sink(sink)
    backend = None
    if spec["backend"] == "rocksdb":
        from reactive.backends.rocksdb import RocksDBStateBackend

        backend = RocksDBStateBackend(path=work / "rocks", incremental=True)
    start, cpu_start = time.perf_counter(), time.process_time()
    job = flow.execute(checkpoints=CheckpointConfig(interval=spec["interval"],
                                                    directory=work / "chk"),
                       state_backend=backend)
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu_start  # every thread of the process (RocksDB's too)
    done = sum(1 for c in job.metrics.checkpoints if c.status == "completed")
    p50, p99 = (weighted_percentile(sink.samples, q) for q in (0.5, 0.99))
    print(json.dumps({"rate": spec["events"] / wall, "wall": wall, "rows": sink.rows,
                      "cpu": cpu, "cpu_rate": spec["events"] / cpu,
                      "generator": generated,
                      "p50_ms": None if p50 is None else p50 * 1e3,
                      "p99_ms": None if p99 is None else p99 * 1e3,
                      "rss_mb": peak_rss_mb(), "checkpoints": done}))


def generator_rate(events: int, rate: float, columnar: bool = False) -> float:
    """Events/s of generating ``events`` events without the runtime: records in 4,096-event
    chunks, or record batches of 16,384 events (``columnar``)."""
    import numpy as np

    from reactive.connectors.nexmark import NexmarkConfig
    from reactive.connectors.nexmark.arrow import to_record_batch
    from reactive.connectors.nexmark.generator import generate_columns, to_records
    from reactive.runtime.gc_tuning import throughput_gc

    config = NexmarkConfig(num_events=events, first_event_rate=rate)
    chunk = 16_384 if columnar else 4096

    def make(numbers: Any) -> Any:
        if columnar:
            return to_record_batch(generate_columns(config, numbers, arrow=True))
        return to_records(generate_columns(config, numbers))

    make(np.arange(chunk))  # the string pool and tables, made once
    with throughput_gc():
        start = time.perf_counter()
        for first in range(0, events, chunk):
            make(np.arange(first, min(first + chunk, events)))
        return events / (time.perf_counter() - start)


FLINK_VERSION = "1.20.3"
FLINK_BACKEND = {"heap": "hashmap", "rocksdb": "rocksdb"}


def flink_python(venv: Path) -> Path:
    """The python of the Flink anchor's virtual environment, created with pyflink installed
    on first use (``pip install apache-flink``; never a dependency of the project).

    Raises:
        SystemExit: when the environment cannot be created or pyflink not installed.
    """
    python = venv / "bin" / "python"
    check = [str(python), "-c", "import pyflink"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return python
    print(f"  creating {venv} with apache-flink=={FLINK_VERSION} (once)", file=sys.stderr)
    base = Path(getattr(sys, "_base_executable", sys.executable))
    steps = [[str(base), "-m", "venv", str(venv)],
             [str(python), "-m", "pip", "install", "-q", f"apache-flink=={FLINK_VERSION}"]]
    for step in steps:
        if subprocess.run(step, check=False).returncode != 0:
            raise SystemExit(f"the Flink anchor could not run: {' '.join(step)}")
    return python


class FlinkAnchor:
    """The same queries on Flink (PyFlink SQL, parallelism 1) over the same events written as
    JSON lines, one run per :meth:`run` in one JVM kept between runs (:mod:`.flink_job`), so
    that Flink's runs interleave with ours.

    Args:
        venv: the Flink virtual environment (created on first use).
        work: a directory for the event files and Flink's checkpoints.
        events, rate: the events (as our runs generate them).
    """

    def __init__(self, venv: Path, work: Path, events: int, rate: float) -> None:
        from reactive.connectors.nexmark import NexmarkConfig
        from reactive.connectors.nexmark.files import write_events

        python = flink_python(venv)
        path = write_events(NexmarkConfig(num_events=events, first_event_rate=rate),
                            work / "events.jsonl")
        empty = write_events(NexmarkConfig(num_events=1, first_event_rate=rate),
                             work / "empty.jsonl")
        self.process = subprocess.Popen(
            [str(python), str(Path(__file__).with_name("flink_job.py")), str(path), str(empty),
             str(events), str(work)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self._answer()  # {"ready": true} once the warm-up job ran

    def _answer(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("{"):
                answer: dict[str, Any] = json.loads(line)
                return answer
        assert self.process.stderr is not None
        raise SystemExit(f"the Flink anchor failed:\n{self.process.stderr.read()[-3000:]}")

    def run(self, query: str, backend: str) -> dict[str, Any]:
        """One run of ``query`` on Flink's state backend matching ours (``heap`` ->
        ``hashmap``): its wall and CPU seconds and events/s by each."""
        assert self.process.stdin is not None
        self.process.stdin.write(f"{query} {FLINK_BACKEND[backend]}\n")
        self.process.stdin.flush()
        return self._answer()

    def close(self) -> None:
        """End the Flink process (its standard input closes: it returns)."""
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    code = ("import json, sys; from bench.nexmark.run import child_main; "
            "child_main(json.loads(sys.argv[1]))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code, json.dumps(spec)], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"nexmark {spec['query']} on {spec['backend']} failed:\n"
                         f"{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print its table (Markdown)."""
    from bench.common import print_table

    from .columnar_queries import COLUMNAR_QUERIES
    from .queries import QUERIES

    ap = argparse.ArgumentParser(prog="python -m bench.nexmark", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queries", default=",".join(QUERIES))
    ap.add_argument("--apis", default=",".join(APIS),
                    help="record (per-record API), columnar (q0-q2, q5, q7), or both")
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--rate", type=float, default=10_000.0)
    ap.add_argument("--backends", default="heap,rocksdb")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--batch-size", type=int, default=16_384,
                    help="events per record batch of the columnar source")
    ap.add_argument("--cpu", type=int, default=0)
    ap.add_argument("--anchor", choices=["none", "flink"], default="none",
                    help="also run the queries on Flink (PyFlink SQL) in a separate venv")
    ap.add_argument("--png", type=Path, default=None,
                    help="bar chart of the ratio columns (default bench/results/nexmark.png)")
    ap.add_argument("--no-png", action="store_true")
    ap.add_argument("--flink-venv", type=Path,
                    default=Path.home() / ".cache" / "reactive" / "nexmark-flink-venv")
    args = ap.parse_args(argv)
    queries = args.queries.split(",")
    backends = args.backends.split(",")
    apis = args.apis.split(",")
    for q in queries:
        if q not in QUERIES:
            raise SystemExit(f"unknown query {q!r}; choose from {', '.join(QUERIES)}")
    for a in apis:
        if a not in APIS:
            raise SystemExit(f"unknown API {a!r}; choose from {', '.join(APIS)}")

    def runs_of(q: str) -> list[str]:
        return [a for a in apis if a == "record" or q in COLUMNAR_QUERIES]

    from .flink_job import QUERIES as FLINK_SQL

    results: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    flink: dict[tuple[str, str], list[dict[str, Any]]] = {}
    work = Path(tempfile.mkdtemp(prefix="nexmark-bench-"))
    anchor = FlinkAnchor(args.flink_venv, work, args.events, args.rate) \
        if args.anchor == "flink" else None
    try:
        # interleaved: each repeat runs every query, API and backend, Flink's run of the
        # same query and backend right after ours, so that a change of the machine's load
        # falls on both engines (q6 has no Flink SQL form Flink runs: an OVER window on an
        # updating input)
        for _ in range(args.repeats):
            for q in queries:
                for b in backends:
                    for a in runs_of(q):
                        run_dir = work / f"{q}-{a}-{b}"
                        shutil.rmtree(run_dir, ignore_errors=True)
                        run_dir.mkdir()
                        spec = {"query": q, "api": a, "backend": b, "events": args.events,
                                "rate": args.rate, "interval": args.interval, "cpu": args.cpu,
                                "batch_size": args.batch_size, "work": str(run_dir)}
                        r = run_child(spec)
                        results.setdefault((q, a, b), []).append(r)
                        print(f"  {q} {a} {b}: {r['rate']:,.0f} events/s, "
                              f"{r['cpu_rate']:,.0f} per CPU-s, {r['rows']:,} rows, "
                              f"{r['checkpoints']} checkpoints", file=sys.stderr)
                    if anchor is not None and q in FLINK_SQL:
                        f = anchor.run(q, b)
                        flink.setdefault((q, b), []).append(f)
                        print(f"  {q} Flink {FLINK_BACKEND[b]}: {f['rate']:,.0f} events/s, "
                              f"{f['cpu_rate']:,.0f} per CPU-s", file=sys.stderr)
    finally:
        if anchor is not None:
            anchor.close()
        shutil.rmtree(work, ignore_errors=True)

    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:,.0f}" if v >= 100 else f"{v:.1f}"

    def spread(values: list[float]) -> str:
        return "/".join(fmt(v) for v in (min(values), statistics.median(values), max(values)))

    rows: list[list[Any]] = []
    gens: dict[str, float] = {}
    for a in apis:
        generator = [r["generator"] for (_, api, _), runs in results.items() if api == a
                     for r in runs]
        if generator:
            gens[a] = statistics.median(generator)
            rows.append([f"generator, {a}s" if a == "record" else "generator, record batches",
                         spread(generator), "-", "1.00", "-", "-", "-", "-", "-", "-", "-"])
    for q in queries:
        for b in backends:
            anchor_runs = flink.get((q, b))
            for a in runs_of(q):
                runs = sorted(results[(q, a, b)], key=lambda r: r["rate"])
                rates = [r["rate"] for r in runs]
                cpu_rates = [r["cpu_rate"] for r in runs]
                med = runs[len(runs) // 2]
                ratio = cpu_ratio = "-"
                if anchor_runs:
                    flink_rate = statistics.median(f["rate"] for f in anchor_runs)
                    flink_cpu_rate = statistics.median(f["cpu_rate"] for f in anchor_runs)
                    ratio = f"{statistics.median(rates) / flink_rate:.2f}"
                    cpu_ratio = f"{statistics.median(cpu_rates) / flink_cpu_rate:.2f}"
                rows.append([f"{q} {a} {b}", spread(rates), spread(cpu_rates),
                             f"{statistics.median(r['rate'] / r['generator'] for r in runs):.2f}",
                             ratio, cpu_ratio, fmt(med["p50_ms"]), fmt(med["p99_ms"]),
                             fmt(med["rss_mb"]), med["checkpoints"], f"{med['rows']:,}"])
            if anchor_runs:
                gen = gens.get("record", next(iter(gens.values())))
                rates = [f["rate"] for f in anchor_runs]
                rows.append([f"{q} Flink {FLINK_BACKEND[b]}", spread(rates),
                             spread([f["cpu_rate"] for f in anchor_runs]),
                             f"{statistics.median(rates) / gen:.2f}", "1.00", "1.00",
                             "-", "-", "-", "-", "-"])
    title = (f"{args.events:,} events at {args.rate:,.0f} events/s of event time, parallelism "
             f"1 on core {args.cpu}, exactly-once checkpoints every {args.interval} s, "
             f"{args.repeats} repeats")
    print(f"\n{title}\n")
    text = print_table(["query, API, backend", "events/s min/median/max",
                        "events/CPU-s min/median/max", "vs generator", "vs Flink",
                        "vs Flink per CPU-s", "p50 ms", "p99 ms", "peak RSS MiB",
                        "checkpoints", "rows"], rows)
    if not args.no_png:
        from bench.figures import RESULTS, write_ratio_png

        write_ratio_png(text, args.png or RESULTS / "nexmark.png",
                        f"Nexmark, {args.events:,} events, 1 core, checkpoints every "
                        f"{args.interval} s")
