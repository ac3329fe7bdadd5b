"""The Spark runner after a crash: the driver's process (Python and its JVM) is SIGKILLed
mid-way, a second process starts the same dataflow on the same checkpoint location, and the
committed output validates exactly once against a batch computation.

Run as a script, this module is the driver: ``python tests/test_spark_runner_restart.py
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

ROOT = Path(__file__).resolve().parent.parent
#: the environment variable naming the commit-log entry after which the driver crashes
KILL_ENV = "REACTIVE_TEST_KILL_AFTER_COMMIT"
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
    Spark SQL plan), ``"python"`` with a user function (``transformWithState``)."""
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
        return [(parts[0], float(parts[1]), int(parts[2]))] if len(parts) == 3 else []

    flow = Dataflow("restart")
    (flow.read_text_file(data).flat_map(parse, name="parse")
         .assign_timestamps(lambda r: r[1], max_out_of_orderness=2)
         .key_by(lambda r: r[0]).window(TumblingEventTimeWindows.of(60))
         .aggregate(Total() if shape == "python"
                    else Aggregates(count(), sum_of(lambda r: r[2], dtype="int"))).uid("totals")
         .map(lambda w: {"key": w.key, "start": int(w.start), "n": w.value[0],
                         "total": w.value[1]})
         .sink(CommittingFileSink(out)).uid("out"))
    return flow


def driver(data: Path, out: Path, checkpoints: Path, shape: str) -> None:
    """The driver process: run the dataflow on Spark to the end of its input. With
    :data:`KILL_ENV` set to a micro-batch's entry in the sink's commit log, the first record
    parsed once that entry exists SIGKILLs the driver's process group (Python and the JVM),
    then its Python workers': a crash inside the next micro-batch, at a known point. Spark's
    progress events are delivered asynchronously, so a kill from its listener came after
    every batch had committed on a fast run."""
    from reactive.connectors.spark import SparkRunner, local_session

    spark = local_session("local[2]", app_name="reactive-restart", shuffle_partitions=2)
    job = SparkRunner(spark, checkpoints, max_records_per_batch=BATCH).run(
        build(data, out, shape))
    wanted = "native window aggregation" if shape == "native" else "transformWithState"
    assert job.shapes["out"] == wanted, job.shapes


def start_driver(data: Path, out: Path, checkpoints: Path, shape: str,
                 kill_after: int | None = None) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(KILL_ENV, None)
    if kill_after is not None:
        env[KILL_ENV] = str(checkpoints / "restart" / "out" / "commits" / str(kill_after))
    # a process group of its own: the kill takes the driver's JVM down with it
    return subprocess.Popen([sys.executable, __file__, str(data), str(out), str(checkpoints),
                             shape],
                            env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def committed_batches(commits: Path) -> int:
    """The micro-batches in Spark's commit log: its entries are named by batch id (the
    directory also holds a hidden ``.<id>.crc`` checksum file per entry)."""
    return sum(1 for p in commits.iterdir() if p.name.isdigit())


def check_restart(tmp_path: Path, spark: Any, seed: int, kill_after: int,
                  shape: str = "python") -> None:
    from reactive.connectors.spark import ResultLog, validate_exactly_once

    data, out, chk = tmp_path / "input.csv", tmp_path / "out", tmp_path / "chk"
    rows = write_input(data, seed)
    commits = chk / "restart" / "out" / "commits"
    first = start_driver(data, out, chk, shape, kill_after)
    code = first.wait(timeout=600)
    assert code == -signal.SIGKILL, f"the driver ended (exit code {code}) instead of being killed"
    batches_before = committed_batches(commits)
    assert batches_before < LINES // BATCH, "the kill came after the input was consumed"
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


# each case starts two drivers (two JVMs): the default run restarts the transformWithState
# shape, whose state is the runner's own; Spark's native window aggregation restarts in -m slow
@pytest.mark.parametrize("shape", ["python", pytest.param("native", marks=pytest.mark.slow)])
def test_driver_killed_mid_way_resumes_exactly_once(
        tmp_path: Path, spark: Any, shape: str) -> None:
    check_restart(tmp_path, spark, seed=19, kill_after=1, shape=shape)


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["python", "native"])
@pytest.mark.parametrize("seed", range(4))
def test_driver_killed_at_seeded_batches_resumes_exactly_once(
        tmp_path: Path, spark: Any, seed: int, shape: str) -> None:
    check_restart(tmp_path, spark, seed=seed,
                  kill_after=random.Random(seed).randrange(0, LINES // BATCH - 2), shape=shape)


if __name__ == "__main__":
    driver(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4])
