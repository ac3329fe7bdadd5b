"""The Spark runner after a crash: the driver's process (Python and its JVM) is SIGKILLed
mid-way, a second process starts the same dataflow on the same checkpoint location, and the
committed output validates exactly once against a batch computation.

Run as a script, this module is the driver: ``python tests/connectors/spark/test_spark_runner_restart.py
DATA OUT CHECKPOINTS`` (the kill point comes in ``REACTIVE_TEST_KILL_AFTER_COMMIT``).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
#: the environment variable naming the commit-log entry after which the driver crashes
KILL_ENV = "REACTIVE_TEST_KILL_AFTER_COMMIT"
#: the environment variable naming a micro-batch after whose first sink's commit (of two
#: sinks written by one query) the driver crashes, before the second sink's
KILL_BETWEEN_ENV = "REACTIVE_TEST_KILL_BETWEEN_SINKS"
LINES = 3000
BATCH = 500


def write_input(path: Path, seed: int) -> list[tuple[str, float, int]]:
    """``key,ts,value`` lines in event-time order (a little disorder), plus a few malformed
    lines; returns the well-formed records."""
    rng = random.Random(seed)
    rows, text = [], []
    for i in range(LINES):
        if i % 997 == 5:
            text.append(f"malformed {i}")
            continue
        row = (f"k{rng.randrange(12)}", round(i * 0.5 - rng.random(), 3), rng.randrange(100))
        rows.append(row)
        text.append(f"{row[0]},{row[1]},{row[2]}")
    path.write_text("\n".join(text) + "\n")
    return rows


def build(data: Path, out: Path, shape: str = "python") -> Any:
    """The dataflow; ``shape`` ``"native"`` aggregates with built-in aggregations (a native
    Spark SQL plan), ``"python"`` with a user function (``transformWithState``), and
    ``"two-sinks"`` as ``"native"`` with the malformed lines written to a dead-letter sink
    (``out/_dead_letters``) too: both sinks from one query; ``"csv"`` as ``"two-sinks"``
    with the file read by the CSV file source (pyarrow blocks in the Spark tasks, the
    malformed lines its ``InvalidRow`` dead letters); ``"union"`` as ``"python"`` with the
    lines split between two files (:func:`split_input`), each read, parsed and given event
    time on its own, then unioned (Spark's union of two reads, a watermark per input)."""
    from reactive import AggregateFunction, Dataflow, TumblingEventTimeWindows
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

    kill_once = os.environ.get(KILL_ENV)
    driver_group = os.getpgrp()  # read where build() runs: in the driver

    def parse(line: str) -> list[Any]:
        if kill_once is not None and os.path.exists(kill_once):
            # a later micro-batch is being processed: crash inside it, before its commit.
            # This runs in a Python worker, whose daemon has a process group of its own:
            # the driver's group (Python and the JVM) first, then the workers'
            os.killpg(driver_group, signal.SIGKILL)
            os.killpg(os.getpgrp(), signal.SIGKILL)
        parts = line.split(",")
        if len(parts) == 3:
            return [(parts[0], float(parts[1]), int(parts[2]))]
        return [("malformed", line)] if shape == "two-sinks" else []

    def parse_row(record: Any) -> list[Any]:
        from reactive.connectors.files import InvalidRow

        if kill_once is not None and os.path.exists(kill_once):
            os.killpg(driver_group, signal.SIGKILL)
            os.killpg(os.getpgrp(), signal.SIGKILL)
        if isinstance(record, InvalidRow):
            return [("malformed", record.raw.decode().rstrip("\r\n"))]
        return [record]

    def event_time(r: Any) -> float:
        return float(r[1])

    # parallelism 2: the CSV source is read in two tasks per micro-batch (the default)
    flow = Dataflow("restart", parallelism=2 if shape == "csv" else 1)
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
    if shape in ("two-sinks", "csv"):
        (parsed.filter(lambda r: len(r) == 2, name="malformed")
               .map(lambda r: {"line": r[1]}, name="dead-letter")
               .sink(CommittingFileSink(out / "_dead_letters")).uid("dead"))
        parsed = parsed.filter(lambda r: len(r) == 3, name="valid")
    (parsed.assign_timestamps(lambda r: r[1], max_out_of_orderness=2)
         .key_by(lambda r: r[0]).window(TumblingEventTimeWindows.of(60))
         .aggregate(Total() if shape == "python"
                    else Aggregates(count(), sum_of(lambda r: r[2], dtype="int"))).uid("totals")
         .map(lambda w: {"key": w.key, "start": int(w.start), "n": w.value[0],
                         "total": w.value[1]})
         .sink(CommittingFileSink(out)).uid("out"))
    return flow


def split_files(data: Path) -> tuple[Path, Path]:
    """The two files of the ``"union"`` shape, beside ``data``."""
    return data.with_name("input-a.csv"), data.with_name("input-b.csv")


def split_input(data: Path) -> None:
    """Write ``data``'s lines alternately to the two files of :func:`split_files`."""
    lines = data.read_text().splitlines(keepends=True)
    for i, path in enumerate(split_files(data)):
        path.write_text("".join(lines[i::2]))


def driver(data: Path, out: Path, checkpoints: Path, shape: str) -> None:
    """The driver process: run the dataflow on Spark to the end of its input. With
    :data:`KILL_ENV` set to a micro-batch's entry in the sink's commit log, the first record
    parsed once that entry exists SIGKILLs the driver's process group (Python and the JVM),
    then its Python workers': a crash inside the next micro-batch, at a known point. Spark's
    progress events are delivered asynchronously, so a kill from its listener came after
    every batch had committed on a fast run."""
    from reactive.connectors.spark import SparkRunner, local_session

    between = os.environ.get(KILL_BETWEEN_ENV)
    if between is not None:
        kill_between_sinks(int(between))
    spark = local_session("local[2]", app_name="reactive-restart", shuffle_partitions=2)
    job = SparkRunner(spark, checkpoints, max_records_per_batch=BATCH,
                      one_query=shape in ("two-sinks", "csv")).run(build(data, out, shape))
    wanted = ("transformWithState" if shape in ("python", "union")
              else "native window aggregation")
    assert job.shapes["out"] == wanted, job.shapes
    if shape in ("two-sinks", "csv"):
        assert job.queries["out"] is job.queries["dead"], "the sinks ran as two queries"


def kill_between_sinks(batch_id: int) -> None:
    """Make the one query's writer SIGKILL the driver's process group once the first sink
    committed micro-batch ``batch_id``, before the second sink writes it."""
    from reactive.connectors.spark import one_query

    class Killing:
        def __init__(self, sink: Any) -> None:
            self.sink = sink

        def addBatch(self, n: int, rows: Any) -> None:
            self.sink.addBatch(n, rows)
            if n == batch_id:
                os.killpg(os.getpgrp(), signal.SIGKILL)

    file_sinks = one_query._SinkWriter._file_sinks

    def first_killing(self: Any, spark: Any) -> list[Any]:
        first, *rest = file_sinks(self, spark)
        return [Killing(first), *rest]

    one_query._SinkWriter._file_sinks = first_killing  # type: ignore[method-assign]


def query_location(checkpoints: Path, shape: str) -> Path:
    """The Spark checkpoint location of the dataflow's (one) query."""
    return checkpoints / "restart" / ("dead+out" if shape in ("two-sinks", "csv") else "out")


def start_driver(data: Path, out: Path, checkpoints: Path, shape: str,
                 kill_after: int | None = None, kill_between: int | None = None
                 ) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(KILL_ENV, None)
    env.pop(KILL_BETWEEN_ENV, None)
    if kill_between is not None:
        env[KILL_BETWEEN_ENV] = str(kill_between)
    if kill_after is not None:
        env[KILL_ENV] = str(query_location(checkpoints, shape) / "commits" / str(kill_after))
    # a process group of its own: the kill takes the driver's JVM down with it
    return subprocess.Popen([sys.executable, __file__, str(data), str(out), str(checkpoints),
                             shape],
                            env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def committed_batches(commits: Path) -> int:
    """The micro-batches in Spark's commit log: its entries are named by batch id (the
    directory also holds a hidden ``.<id>.crc`` checksum file per entry)."""
    return sum(1 for p in commits.iterdir() if p.name.isdigit())


def check_restart(tmp_path: Path, spark: Any, seed: int, kill_after: int | None,
                  shape: str = "python", kill_between: int | None = None) -> None:
    from reactive.connectors.spark import ResultLog, validate_exactly_once

    data, out, chk = tmp_path / "input.csv", tmp_path / "out", tmp_path / "chk"
    rows = write_input(data, seed)
    if shape == "union":
        split_input(data)
    commits = query_location(chk, shape) / "commits"
    first = start_driver(data, out, chk, shape, kill_after, kill_between)
    code = first.wait(timeout=600)
    assert code == -signal.SIGKILL, f"the driver ended (exit code {code}) instead of being killed"
    batches_before = committed_batches(commits)
    assert batches_before < LINES // BATCH, "the kill came after the input was consumed"
    if kill_between is not None:  # one sink committed the batch Spark had not
        dead_log = out / "_dead_letters" / "_spark_metadata"
        assert (dead_log / str(kill_between)).exists()
        assert not (out / "_spark_metadata" / str(kill_between)).exists()
        assert batches_before == kill_between
    second = start_driver(data, out, chk, shape)
    assert second.wait(timeout=600) == 0
    # the restarted driver continued after the committed batches, it did not start over
    assert committed_batches(commits) > batches_before

    expected: dict[tuple[str, int], list[int]] = {}
    for key, ts, value in rows:
        acc = expected.setdefault((key, int(ts - ts % 60)), [0, 0])
        acc[0] += 1
        acc[1] += value
    expected_df = spark.createDataFrame(
        [(k, s, n, t) for (k, s), (n, t) in expected.items()],
        "key string, start bigint, n bigint, total bigint")
    actual = ResultLog(spark, out).read()
    report = validate_exactly_once(actual, expected_df, key=["key", "start"])
    assert report.ok, str(report)
    if shape in ("two-sinks", "csv"):  # every malformed line committed once
        dead = [r["line"] for r in ResultLog(spark, out / "_dead_letters").read().collect()]
        assert sorted(dead) == sorted(f"malformed {i}" for i in range(LINES) if i % 997 == 5)


# each case starts two drivers (two JVMs): the default run restarts the transformWithState
# shape, whose state is the runner's own, the one query writing two sinks, and a union of two
# sources (both offsets in one offset log); Spark's native window aggregation restarts in
# -m slow
@pytest.mark.parametrize("shape", ["python", pytest.param("native", marks=pytest.mark.slow),
                                   "two-sinks", "csv", "union"])
def test_driver_killed_mid_way_resumes_exactly_once(
        tmp_path: Path, spark: Any, shape: str) -> None:
    check_restart(tmp_path, spark, seed=19, kill_after=1, shape=shape)


def test_driver_killed_between_two_sinks_commits_resumes_exactly_once(
        tmp_path: Path, spark: Any) -> None:
    # the dead-letter sink committed micro-batch 2, the results sink and Spark's commit log
    # had not: the replayed batch is skipped by the one and written by the other
    check_restart(tmp_path, spark, seed=23, kill_after=None, shape="two-sinks",
                  kill_between=2)


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["python", "native", "two-sinks", "csv"])
@pytest.mark.parametrize("seed", range(4))
def test_driver_killed_at_seeded_batches_resumes_exactly_once(
        tmp_path: Path, spark: Any, seed: int, shape: str) -> None:
    check_restart(tmp_path, spark, seed=seed,
                  kill_after=random.Random(seed).randrange(0, LINES // BATCH - 2), shape=shape)


if __name__ == "__main__":
    driver(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4])
