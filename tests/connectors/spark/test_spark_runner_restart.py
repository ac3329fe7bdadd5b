"""The Spark runner after a crash: the driver's process (Python and its JVM) is SIGKILLed
mid-way, a second process starts the same dataflows on the same checkpoint locations, and the
committed output validates exactly once against a batch computation.

One crashed run serves the default run's plan shapes: one driver runs every shape's dataflow
side by side (each its own input, output and checkpoint location under one directory), is
killed once every query has committed the same micro-batch, and a second driver resumes them
all; each shape's output is then validated by a test of its own. Each input is three
micro-batches: the kill comes inside the third, after the second committed output (so a
replay of committed output shows as a duplicate), and the resumed driver replays it. One
more query of the same run writes two sinks and is where the kill comes from: between its
sinks' commits of the third micro-batch, while the others wait inside theirs.

Run as a script, this module is the driver: ``python tests/connectors/spark/test_spark_runner_restart.py
BASE SHAPE [SHAPE ...]`` (each shape's files under ``BASE/SHAPE``, see :func:`shape_paths`; the
kill point comes in ``REACTIVE_TEST_KILL_AFTER_COMMIT``).
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
#: the environment variable naming the micro-batch after whose commit (in every query's commit
#: log) the driver crashes
KILL_ENV = "REACTIVE_TEST_KILL_AFTER_COMMIT"
#: the environment variable naming a micro-batch after whose first sink's commit (of two
#: sinks written by one query) the driver crashes, before the second sink's
KILL_BETWEEN_ENV = "REACTIVE_TEST_KILL_BETWEEN_SINKS"
#: input lines of a default-run shape: three micro-batches of :data:`BATCH`
LINES = 1500
BATCH = 500
#: input lines of the ``slow`` seeded runs: six micro-batches, the kill after any but the last
SLOW_LINES = 3000
#: the plan shapes one crashed run restarts (see :func:`build`), in the order the driver
#: starts them: the union's two sources first, while nothing else runs (see :func:`driver`).
#: ``"two-sinks"`` runs in the ``slow`` seeded runs: one query writing two sinks is here
#: with the CSV source (``"csv"``) and, killed between its sinks, the line-file source
#: (:data:`BETWEEN`)
SHAPES = ("union", "join", "python", "native", "csv", "key-groups")
#: the shape of the crashed run whose query is killed between its two sinks' commits (as
#: ``"two-sinks"``): the kill comes from its writer, the other queries wait for it
BETWEEN = "sinks-between"
#: the shapes whose dataflow writes two sinks from one query
ONE_QUERY = ("two-sinks", "csv", BETWEEN)
#: the ``"join"`` shape's interval: a record of the first file joins those of the second
#: ``[JOIN_LOWER, JOIN_UPPER]`` seconds after it
JOIN_LOWER, JOIN_UPPER = -1.0, 1.5
#: how long a query's initialization may take (:func:`sources_started`), seconds
INIT_TIMEOUT = 600.0


def write_input(path: Path, seed: int, lines: int = LINES) -> list[tuple[str, float, int]]:
    """``lines`` ``key,ts,value`` lines in event-time order (a little disorder), a few of
    them malformed (:func:`malformed_lines`); returns the well-formed records."""
    rng = random.Random(seed)
    rows, text = [], []
    for i in range(lines):
        if i % 997 == 5:
            text.append(f"malformed {i}")
            continue
        row = (f"k{rng.randrange(12)}", round(i * 0.5 - rng.random(), 3), rng.randrange(100))
        rows.append(row)
        text.append(f"{row[0]},{row[1]},{row[2]}")
    path.write_text("\n".join(text) + "\n")
    return rows


def build(data: Path, out: Path, shape: str = "python",
          kill_entries: tuple[str, str] | None = None,
          started: Path | None = None) -> Any:
    """The dataflow; ``shape`` ``"native"`` aggregates with built-in aggregations (a native
    Spark SQL plan), ``"python"`` with a user function (``transformWithState``), and
    ``"two-sinks"`` as ``"native"`` with the malformed lines written to a dead-letter sink
    (``out/_dead_letters``) too: both sinks from one query; ``"csv"`` as ``"two-sinks"``
    with the file read by the CSV file source (pyarrow blocks in the Spark tasks, the
    malformed lines its ``InvalidRow`` dead letters); ``"union"`` as ``"python"`` with the
    lines split between two files (:func:`split_input`), each read, parsed and given event
    time on its own, then unioned (Spark's union of two reads, a watermark per input);
    ``"key-groups"`` with a running total per key and minute in a process function without
    timers (one row per record: the key-group shape, ``transformWithStateInPandas``);
    ``"join"`` the two files of ``"union"`` in an interval join by key (a Spark
    stream-stream join: both offsets in one offset log, the join's state in its state store;
    a bound of 2 s, the input's disorder stays under 1 s).

    ``kill_entries``: this query's commit-log entry of the kill batch and the kill gate (a
    :func:`pass_gate` file the driver opens once every query, of all dataflows it runs,
    committed that batch): the first record parsed once this query's entry exists waits at
    the gate, then SIGKILLs the driver. ``started``: a gate the driver opens once every
    query's sources are running; no record is parsed before."""
    from reactive import (
        AggregateFunction,
        Dataflow,
        KeyedProcessFunction,
        TumblingEventTimeWindows,
        ValueStateDescriptor,
    )
    from reactive.connectors.files import CommittingFileSink
    from reactive.windowing.aggregates import Aggregates, count, sum_of

    class Total(AggregateFunction):
        def create_accumulator(self) -> Any:
            return (0, 0)

        def add(self, value: Any, acc: Any) -> Any:
            return (acc[0] + 1, acc[1] + value[2])

        def merge(self, a: Any, b: Any) -> Any:
            return (a[0] + b[0], a[1] + b[1])

        def get_result(self, acc: Any) -> Any:
            return acc

    class RunningTotal(KeyedProcessFunction):
        def open(self, ctx: Any) -> None:
            self.acc = ctx.get_state(ValueStateDescriptor("acc", default=(0, 0)))

        def process_element(self, r: Any, ctx: Any) -> Any:
            n, total = self.acc.value()
            self.acc.update((n + 1, total + r[2]))
            key, start = ctx.current_key
            return [{"key": key, "start": start, "n": n + 1, "total": total + r[2]}]

    own, kill_gate = kill_entries if kill_entries is not None else (None, None)
    driver_group = os.getpgrp()  # read where build() runs: in the driver
    # the kill comes from the writer of BETWEEN's query, between its sinks (kill_between_sinks)
    killed_between = os.environ.get(KILL_BETWEEN_ENV) is not None

    def crash_point() -> None:
        if started is not None:
            pass_gate(started)
        if own is None or kill_gate is None or not os.path.exists(own):
            return
        # a later micro-batch of this query is being processed: crash inside it, before its
        # commit, once every other query committed the kill batch too (a barrier: a query
        # that got there first waits here, its task holding one of the driver's task slots,
        # so none runs to the end of its input before the slowest is mid-way).
        pass_gate(kill_gate)
        if killed_between:  # block inside this micro-batch until the kill ends the process
            threading.Event().wait()
        # This runs in a Python worker, whose daemon has a process group of its own: the
        # driver's group (Python and the JVM) first, then the workers'
        os.killpg(driver_group, signal.SIGKILL)
        os.killpg(os.getpgrp(), signal.SIGKILL)

    def parse(line: str) -> list[Any]:
        crash_point()
        parts = line.split(",")
        if len(parts) == 3:
            return [(parts[0], float(parts[1]), int(parts[2]))]
        return [("malformed", line)] if shape in ("two-sinks", BETWEEN) else []

    def parse_row(record: Any) -> list[Any]:
        from reactive.connectors.files import InvalidRow

        crash_point()
        if isinstance(record, InvalidRow):
            return [("malformed", record.raw.decode().rstrip("\r\n"))]
        return [record]

    def event_time(r: Any) -> float:
        return float(r[1])

    # parallelism 2: the CSV source is read in two tasks per micro-batch (the default)
    flow = Dataflow("restart", parallelism=2 if shape == "csv" else 1)
    if shape == "join":
        a, b = (flow.read_text_file(f, name=f"input-{f.stem}").flat_map(parse, name=f"parse-{f.stem}")
                .assign_timestamps(event_time, max_out_of_orderness=2)
                for f in split_files(data))
        (a.key_by(lambda r: r[0]).interval_join(b.key_by(lambda r: r[0]))
          .between(JOIN_LOWER, JOIN_UPPER)
          .process(lambda x, y: {"key": x[0], "a": x[1], "b": y[1]}, name="near")
          .sink(CommittingFileSink(out)).uid("out"))
        return flow
    if shape == "union":
        a, b = (flow.read_text_file(f, name=f"input-{f.stem}").flat_map(parse, name=f"parse-{f.stem}")
                .assign_timestamps(event_time, max_out_of_orderness=2)
                for f in split_files(data))
        (a.union(b).key_by(lambda r: r[0]).window(TumblingEventTimeWindows.of(60))
          .aggregate(Total()).uid("totals")
          .map(lambda w: {"key": w.key, "start": int(w.start), "n": w.value[0],
                          "total": w.value[1]})
          .sink(CommittingFileSink(out)).uid("out"))
        return flow
    if shape == "csv":
        from reactive.connectors.files import CsvFileSource

        # small blocks: a micro-batch of BATCH lines is a few blocks, so the kill falls
        # between committed micro-batches as with the line-file source
        csv = CsvFileSource(data, header=False, column_names=["key", "ts", "value"],
                            column_types={"key": "string", "ts": "float64", "value": "int64"},
                            block_size=2048, errors="dead_letter")
        parsed = flow.source(csv, name="input-csv").flat_map(parse_row, name="parse")
    else:
        parsed = flow.read_text_file(data).flat_map(parse, name="parse")
    if shape in ONE_QUERY:
        (parsed.filter(lambda r: len(r) == 2, name="malformed")
               .map(lambda r: {"line": r[1]}, name="dead-letter")
               .sink(CommittingFileSink(out / "_dead_letters")).uid("dead"))
        parsed = parsed.filter(lambda r: len(r) == 3, name="valid")
    if shape == "key-groups":
        (parsed.assign_timestamps(lambda r: r[1], max_out_of_orderness=2)
               .key_by(lambda r: (r[0], int(r[1] - r[1] % 60))).process(RunningTotal())
               .uid("totals").sink(CommittingFileSink(out)).uid("out"))
        return flow
    (parsed.assign_timestamps(lambda r: r[1], max_out_of_orderness=2)
         .key_by(lambda r: r[0]).window(TumblingEventTimeWindows.of(60))
         .aggregate(Total() if shape == "python"
                    else Aggregates(count(), sum_of(lambda r: r[2], dtype="int"))).uid("totals")
         .map(lambda w: {"key": w.key, "start": int(w.start), "n": w.value[0],
                         "total": w.value[1]})
         .sink(CommittingFileSink(out)).uid("out"))
    return flow


def malformed_lines(lines: int) -> list[str]:
    """The malformed lines :func:`write_input` writes among ``lines`` lines."""
    return [f"malformed {i}" for i in range(lines) if i % 997 == 5]


def pass_gate(path: str | Path) -> None:
    """Return once the gate at ``path`` is open: a barrier between processes (the driver and
    the Python workers of every query's tasks). The driver keeps it shut by holding an
    exclusive ``flock`` on the file (:class:`Gate`); this blocks in ``flock`` for a shared
    lock, so the kernel wakes every waiter when the driver lets go (or dies)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    finally:
        os.close(fd)


class Gate:
    """The driver's side of a :func:`pass_gate` gate at ``path``: shut from :meth:`shut` to
    :meth:`open`. The descriptor holding the lock is not inherited by the processes the
    driver starts (Python's default), so only this process holds the gate shut."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def shut(self) -> Gate:
        self._fd = os.open(self.path, os.O_CREAT | os.O_RDWR)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def open(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the lock
            self._fd = None


#: the shapes whose lines are split between two files (:func:`split_input`)
SPLIT = ("union", "join")


def split_files(data: Path) -> tuple[Path, Path]:
    """The two files of the ``"union"`` and ``"join"`` shapes, beside ``data``."""
    return data.with_name("input-a.csv"), data.with_name("input-b.csv")


def split_input(data: Path) -> None:
    """Write ``data``'s lines alternately to the two files of :func:`split_files`."""
    lines = data.read_text().splitlines(keepends=True)
    for i, path in enumerate(split_files(data)):
        path.write_text("".join(lines[i::2]))


def shape_paths(base: Path, shape: str) -> tuple[Path, Path, Path]:
    """A shape's input file, output directory and checkpoint location under ``base``."""
    return base / shape / "input.csv", base / shape / "out", base / shape / "chk"


def commits_of(base: Path, shape: str) -> Path:
    """Spark's commit log of the query of ``shape`` under ``base``."""
    return query_location(shape_paths(base, shape)[2], shape) / "commits"


def driver(base: Path, shapes: Sequence[str]) -> None:
    """The driver process: run each shape's dataflow on Spark side by side (one runner
    each, one session) to the end of its input. With :data:`KILL_ENV` set to a micro-batch
    id, the first record parsed once every query has committed that micro-batch SIGKILLs the
    driver's process group (Python and the JVM), then its Python workers': a crash inside
    the next micro-batch, at a known point (a query that gets there first waits for the
    others at the kill gate inside its next micro-batch, see :func:`build`; a listener of
    the queries' progress opens the gate). Spark's progress events are delivered
    asynchronously, so a kill from the listener itself came after every batch had committed
    on a fast run: it only opens the gate, and a waiting record kills."""
    from pyspark.sql.streaming import StreamingQueryListener

    from reactive.connectors.spark import SparkRunner, local_session
    from reactive.connectors.spark.key_group_plan import KEY_GROUP_SHAPE

    kill_after = os.environ.get(KILL_ENV)
    # shut until every query committed the kill batch; open at once without one
    kill_gate = Gate(base / "kill-gate").shut()
    if kill_after is None:
        kill_gate.open()
    between = os.environ.get(KILL_BETWEEN_ENV)
    if between is not None:
        kill_between_sinks(int(between), kill_gate.path)
    started = Gate(base / "started").shut()  # opened once every query's sources run

    class KillBatchCommitted(StreamingQueryListener):  # type: ignore[misc]
        """Opens the kill gate once every query reported micro-batch ``kill_after``'s
        progress, which Spark posts after the batch's commit-log entry (queries that did
        wait inside their next micro-batch, at the gate)."""

        def __init__(self) -> None:
            self.committed: set[str] = set()

        def onQueryProgress(self, event: Any) -> None:
            if kill_after is not None and event.progress.batchId >= int(kill_after):
                self.committed.add(str(event.progress.id))  # the id survives restarts
                if len(self.committed) == len(shapes):
                    kill_gate.open()

        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    listener = KillBatchCommitted()
    # two task slots per query: those waiting at the kill barrier hold theirs (a union's
    # two reads hold two) while the last gets to it
    spark = local_session(f"local[{2 * len(shapes)}]", app_name="reactive-restart",
                          shuffle_partitions=2)
    jobs, starts = {}, {}
    for shape in shapes:
        data, out, checkpoints = shape_paths(base, shape)
        # BETWEEN's records pass: its writer is where the kill comes from
        entries = ((str(commits_of(base, shape) / kill_after), str(kill_gate.path))
                   if kill_after and shape != BETWEEN else None)
        # a session each (one SparkContext): a query's name (its sink's uid) is unique
        # among a session's active queries
        # the union's and the join's two files hold half the lines each: half the records
        # a micro-batch (from each) keeps their input three micro-batches, as the others'
        session = spark.newSession()
        session.streams.addListener(listener)  # listeners are a session's
        runner = SparkRunner(session, checkpoints,
                             max_records_per_batch=BATCH // 2 if shape in SPLIT else BATCH,
                             one_query=shape in ONE_QUERY)
        starts[shape] = (lambda runner=runner, data=data, out=out, shape=shape,
                         entries=entries: runner.start(build(data, out, shape, entries,
                                                             started.path)))
        # one query's start at a time, while no records are processed (they wait for
        # `started`): a query starts its sources' Python workers, which Spark gives a fixed
        # 10 s to connect back; on a busy machine one can miss it, and the query, which has
        # read nothing, is started again
        for _ in range(3):
            jobs[shape] = starts[shape]()
            if all(sources_started(q) for q in set(jobs[shape].queries.values())):
                break
            jobs[shape].stop()
    started.open()
    # two restarts per query: on a busy machine each query's first micro-batch starts Python
    # workers at once with the others'
    await_all(jobs, starts, restarts=2 * len(shapes))
    for shape, job in jobs.items():
        wanted = ("transformWithState" if shape in ("python", "union")
                  else KEY_GROUP_SHAPE if shape == "key-groups"
                  else "stream-stream join" if shape == "join"
                  else "native window aggregation")
        assert job.shapes["out"] == wanted, job.shapes
        if shape in ONE_QUERY:
            assert job.queries["out"] is job.queries["dead"], "the sinks ran as two queries"


def await_all(jobs: dict[str, Any], starts: dict[str, Any], restarts: int = 3) -> None:
    """Wait until every job's queries end; a job whose Python worker did not connect back
    in time (a planning worker, on a busy machine) is started again from its checkpoint
    (``starts[shape]()``), as :meth:`SparkRunner.run` does, at most ``restarts`` times in
    all, while the others keep running (they may be waiting for it at the kill barrier)."""
    from reactive.connectors.spark.runner import is_transient

    pending = dict(jobs)
    while pending:
        for shape, job in list(pending.items()):
            if any(q.isActive for q in set(job.queries.values())):
                continue
            try:
                job.wait()
            except Exception as exc:
                if restarts <= 0 or not is_transient(exc):
                    raise
                restarts -= 1
                pending[shape] = jobs[shape] = starts[shape]()
                continue
            finally:
                job.stop()
            del pending[shape]
        # block until one still-active query ends (or 0.2 s, to look at the others): a
        # query's own termination event, not a sleep
        active = [q for job in pending.values() for q in set(job.queries.values())
                  if q.isActive]
        if active:
            with contextlib.suppress(Exception):  # a failure: the loop's job.wait() raises it
                active[0].awaitTermination(0.2)


def sources_started(query: Any) -> bool:
    """Wait until ``query`` has initialized its sources; False when it failed doing so.

    Spark posts no event for the end of a query's initialization, so its status is looked
    at every 50 ms, in a wait that ends at once when the query terminates.

    Raises:
        RuntimeError: when it is still initializing after :data:`INIT_TIMEOUT` seconds.
    """
    deadline = time.monotonic() + INIT_TIMEOUT
    while query.isActive and query.status["message"].startswith("Initializing"):
        if time.monotonic() > deadline:
            raise RuntimeError(f"query {query.name} still initializing after "
                               f"{INIT_TIMEOUT} s")
        with contextlib.suppress(Exception):  # a failure: query.exception() below has it
            query.awaitTermination(0.05)
    return bool(query.isActive) or query.exception() is None


def kill_between_sinks(batch_id: int, kill_gate: Path) -> None:
    """Make the one-query writers SIGKILL the driver's process group once the first sink
    committed micro-batch ``batch_id``, before the second sink writes it, and once the
    kill gate is open (every query committed the kill batch, see :func:`build`: the other
    queries wait for the kill inside their next micro-batch, before their writer, so only
    :data:`BETWEEN`'s writer gets to ``batch_id``)."""
    from reactive.connectors.spark import one_query

    class Killing:
        def __init__(self, sink: Any) -> None:
            self.sink = sink

        def addBatch(self, n: int, rows: Any) -> None:
            self.sink.addBatch(n, rows)
            if n == batch_id:
                pass_gate(kill_gate)
                os.killpg(os.getpgrp(), signal.SIGKILL)

    file_sinks = one_query._SinkWriter._file_sinks

    def first_killing(self: Any, spark: Any) -> list[Any]:
        first, *rest = file_sinks(self, spark)
        return [Killing(first), *rest]

    one_query._SinkWriter._file_sinks = first_killing  # type: ignore[method-assign]


def query_location(checkpoints: Path, shape: str) -> Path:
    """The Spark checkpoint location of the dataflow's (one) query."""
    return checkpoints / "restart" / ("dead+out" if shape in ONE_QUERY else "out")


def start_driver(base: Path, shapes: Sequence[str], kill_after: int | None = None,
                 kill_between: int | None = None) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(KILL_ENV, None)
    env.pop(KILL_BETWEEN_ENV, None)
    if kill_between is not None:
        env[KILL_BETWEEN_ENV] = str(kill_between)
    if kill_after is not None:
        env[KILL_ENV] = str(kill_after)
    # a process group of its own: the kill takes the driver's JVM down with it
    return subprocess.Popen([sys.executable, __file__, str(base), *shapes],
                            env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def committed_batches(commits: Path) -> int:
    """The micro-batches in Spark's commit log: its entries are named by batch id (the
    directory also holds a hidden ``.<id>.crc`` checksum file per entry)."""
    return sum(1 for p in commits.iterdir() if p.name.isdigit())


def sink_batches(out: Path) -> set[int]:
    """The micro-batches the file sink writing ``out`` committed (its ``_spark_metadata``
    log, whose entries are named by batch id)."""
    log = out / "_spark_metadata"
    return {int(p.name) for p in log.iterdir() if p.name.isdigit()} if log.exists() else set()


@dataclass
class CrashedRun:
    """Dataflows run by one driver that was SIGKILLed mid-way, then resumed by a second.

    Attributes:
        base: the directory of every shape's files (:func:`shape_paths`).
        lines: each shape's input lines.
        rows: each shape's well-formed input records.
        committed_at_kill: the micro-batches each shape's query had committed at the kill.
        sinks_at_kill: the micro-batches each shape's results sink and dead-letter sink had
            committed at the kill.
    """

    base: Path
    lines: int
    rows: dict[str, list[tuple[str, float, int]]]
    committed_at_kill: dict[str, int]
    sinks_at_kill: dict[str, tuple[set[int], set[int]]]


def crash_and_resume(base: Path, shapes: Sequence[str], seed: int, kill_after: int | None,
                     kill_between: int | None = None, lines: int = LINES) -> CrashedRun:
    """Write each shape's input (``lines`` lines), run the shapes in a driver that is killed
    mid-way (after commit ``kill_after`` of every query, or between the two sinks' writes of
    micro-batch ``kill_between``), then resume them all in a second driver."""
    rows = {}
    for shape in shapes:
        data = shape_paths(base, shape)[0]
        data.parent.mkdir(parents=True)
        rows[shape] = write_input(data, seed, lines)
        if shape in SPLIT:
            split_input(data)
    first = start_driver(base, shapes, kill_after, kill_between)
    code = first.wait(timeout=900)
    assert code == -signal.SIGKILL, f"the driver ended (exit code {code}) instead of being killed"
    committed = {shape: committed_batches(commits_of(base, shape)) for shape in shapes}
    sinks = {}
    for shape in shapes:
        out = shape_paths(base, shape)[1]
        sinks[shape] = (sink_batches(out), sink_batches(out / "_dead_letters"))
    second = start_driver(base, shapes)
    assert second.wait(timeout=900) == 0
    return CrashedRun(base, lines, rows, committed, sinks)


def check_resumed(run: CrashedRun, spark: Any, shape: str, kill_after: int | None = None,
                  kill_between: int | None = None) -> None:
    """Assert that ``shape``'s query was killed mid-way and resumed after its committed
    micro-batches, and that its committed output is the batch computation's, exactly once
    (and every malformed line in its dead-letter output once)."""
    from reactive.connectors.spark import ResultLog, validate_exactly_once

    _, out, _ = shape_paths(run.base, shape)
    batches_before = run.committed_at_kill[shape]
    assert batches_before < run.lines // BATCH, "the kill came after the input was consumed"
    if kill_after is not None:  # the kill came inside a later micro-batch than kill_after
        assert batches_before > kill_after
    if kill_between is not None:  # one sink committed the batch Spark had not
        results, dead_letters = run.sinks_at_kill[shape]
        assert kill_between in dead_letters
        assert kill_between not in results
        assert batches_before == kill_between
    # the restarted driver continued after the committed batches, it did not start over
    assert committed_batches(commits_of(run.base, shape)) > batches_before

    if shape == "join":  # every pair of a Python loop, each once
        check_join(run, out)
        return
    expected: dict[tuple[str, int], list[int]] = {}
    for key, ts, value in run.rows[shape]:
        acc = expected.setdefault((key, int(ts - ts % 60)), [0, 0])
        acc[0] += 1
        acc[1] += value
    if shape == "key-groups":  # a row per record: each key's running counts 1..n, once
        rows = sorted((r["key"], r["start"], r["n"], r["total"])
                      for r in ResultLog(spark, out).read().collect())
        running: dict[tuple[str, int], list[tuple[int, int]]] = {}
        for key, start, n, total in rows:
            running.setdefault((key, start), []).append((n, total))
        assert {k: len(v) for k, v in running.items()} == {k: v[0] for k, v in expected.items()}
        for k, seen in running.items():
            assert [n for n, _ in seen] == list(range(1, len(seen) + 1)), k
            assert seen[-1][1] == expected[k][1], k
        return
    expected_df = spark.createDataFrame(
        [(k, s, n, t) for (k, s), (n, t) in expected.items()],
        "key string, start bigint, n bigint, total bigint")
    actual = ResultLog(spark, out).read()
    report = validate_exactly_once(actual, expected_df, key=["key", "start"])
    assert report.ok, str(report)
    if shape in ONE_QUERY:  # every malformed line committed once
        dead = [r["line"] for r in ResultLog(spark, out / "_dead_letters").read().collect()]
        assert sorted(dead) == sorted(malformed_lines(run.lines))


def check_join(run: CrashedRun, out: Path) -> None:
    """Assert that the ``"join"`` shape's committed pairs are a Python loop's, each once."""
    from tests.connectors.spark.test_spark_runner import committed

    side_a, side_b = ([parse_line(line) for line in f.read_text().splitlines()
                       if line.count(",") == 2]
                      for f in split_files(shape_paths(run.base, "join")[0]))
    assert sorted(side_a + side_b) == sorted(run.rows["join"])
    expected = collections.Counter(
        json.dumps({"key": x[0], "a": x[1], "b": y[1]}, sort_keys=True)
        for x in side_a for y in side_b
        if x[0] == y[0] and JOIN_LOWER <= y[1] - x[1] <= JOIN_UPPER)
    # every committed record (Spark's file sink, through its metadata log), with repeats
    actual = collections.Counter(json.dumps(r, sort_keys=True) for r in committed(out))
    assert actual == expected
    assert sum(expected.values()) > 100


def parse_line(line: str) -> tuple[str, float, int]:
    key, ts, value = line.split(",")
    return key, float(ts), int(value)


@pytest.fixture(scope="module")
def crashed_run(tmp_path_factory: pytest.TempPathFactory) -> CrashedRun:
    """Every shape of :data:`SHAPES` and :data:`BETWEEN` run by one driver killed once every
    query committed micro-batch 1, between BETWEEN's two sinks' commits of micro-batch 2,
    resumed by a second: two JVMs for the seven tests below."""
    return crash_and_resume(tmp_path_factory.mktemp("restart"), (*SHAPES, BETWEEN), seed=19,
                            kill_after=1, kill_between=2)


# the transformWithState shape, whose state is the runner's own; Spark's native window
# aggregation; the one query writing two sinks (the CSV source); a union of
# two sources (both offsets in one offset log); an interval join of two sources (Spark's
# stream-stream join, its state in the state store); the key-group shape (a running total per key
# and minute, its state one value per key group): each validated on the shared crashed run
@pytest.mark.parametrize("shape", SHAPES)
def test_driver_killed_mid_way_resumes_exactly_once(
        crashed_run: CrashedRun, spark: Any, shape: str) -> None:
    check_resumed(crashed_run, spark, shape, kill_after=1)


def test_driver_killed_between_two_sinks_commits_resumes_exactly_once(
        crashed_run: CrashedRun, spark: Any) -> None:
    # the dead-letter sink committed micro-batch 2 (the last of the input's, holding a
    # malformed line), the results sink and Spark's commit log had not: the replayed batch
    # is skipped by the one and written by the other
    check_resumed(crashed_run, spark, BETWEEN, kill_between=2)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_driver_killed_at_seeded_batches_resumes_exactly_once(
        tmp_path: Path, spark: Any, seed: int) -> None:
    # the four shapes of one seed killed together after the seed's batch
    shapes = ["python", "native", "two-sinks", "csv"]
    kill_after = random.Random(seed).randrange(0, SLOW_LINES // BATCH - 2)
    run = crash_and_resume(tmp_path, shapes, seed=seed, kill_after=kill_after, lines=SLOW_LINES)
    for shape in shapes:
        check_resumed(run, spark, shape, kill_after=kill_after)


if __name__ == "__main__":
    driver(Path(sys.argv[1]), sys.argv[2:])
