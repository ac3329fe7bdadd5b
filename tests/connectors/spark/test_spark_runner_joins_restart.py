"""An interval join on the Spark runner after a crash: the driver's process (Python and its
JVM) is SIGKILLed inside a micro-batch after some have committed, a second process starts the
same dataflow on the same checkpoint location (Spark's offset log for both inputs, the join's
state in its state store), and the committed pairs are those of a Python loop, each once.

Run as a script, this module is the driver: ``python
tests/connectors/spark/test_spark_runner_joins_restart.py DATA OUT CHECKPOINTS`` (the kill
point comes in ``REACTIVE_TEST_KILL_AFTER_COMMIT``).
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.connectors.spark.test_spark_runner_restart import (
    BATCH,
    KILL_ENV,
    LINES,
    ROOT,
    committed_batches,
    split_files,
    split_input,
    write_input,
)

pytestmark = pytest.mark.e2e

LOWER, UPPER = -1.0, 1.5


def build(data: Path, out: Path) -> Any:
    """Each half of the lines (:func:`split_files`) read, parsed and given event time on its
    own (a bound of 2 s, the input's disorder stays under 1 s), joined by key within
    ``[LOWER, UPPER]`` seconds."""
    from reactive import Dataflow
    from reactive.connectors.files import CommittingFileSink

    kill_once = os.environ.get(KILL_ENV)
    driver_group = os.getpgrp()  # read where build() runs: in the driver

    def parse(line: str) -> list[Any]:
        if kill_once is not None and os.path.exists(kill_once):
            # a later micro-batch is being processed: crash inside it, before its commit
            # (the driver's group first, then the Python worker's own)
            os.killpg(driver_group, signal.SIGKILL)
            os.killpg(os.getpgrp(), signal.SIGKILL)
        parts = line.split(",")
        return [(parts[0], float(parts[1]), int(parts[2]))] if len(parts) == 3 else []

    flow = Dataflow("restart")
    a, b = (flow.read_text_file(f, name=f"input-{f.stem}").flat_map(parse, name=f"parse-{f.stem}")
            .assign_timestamps(lambda r: r[1], max_out_of_orderness=2)
            for f in split_files(data))
    (a.key_by(lambda r: r[0]).interval_join(b.key_by(lambda r: r[0])).between(LOWER, UPPER)
      .process(lambda x, y: {"key": x[0], "a": x[1], "b": y[1]}, name="near")
      .sink(CommittingFileSink(out)).uid("out"))
    return flow


def driver(data: Path, out: Path, checkpoints: Path) -> None:
    """The driver process: run the join on Spark to the end of its input (killed inside a
    micro-batch when :data:`KILL_ENV` names a commit-log entry that exists)."""
    from reactive.connectors.spark import SparkRunner, local_session

    spark = local_session("local[2]", app_name="reactive-join-restart", shuffle_partitions=2)
    # half the lines per file: BATCH // 2 records a micro-batch keeps the kill mid-way
    job = SparkRunner(spark, checkpoints, max_records_per_batch=BATCH // 2).run(
        build(data, out))
    assert job.shapes["out"] == "stream-stream join", job.shapes


def start_driver(data: Path, out: Path, checkpoints: Path,
                 kill_after: int | None = None) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(KILL_ENV, None)
    if kill_after is not None:
        env[KILL_ENV] = str(checkpoints / "restart" / "out" / "commits" / str(kill_after))
    # a process group of its own: the kill takes the driver's JVM down with it
    return subprocess.Popen([sys.executable, __file__, str(data), str(out), str(checkpoints)],
                            env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def parse_line(line: str) -> tuple[str, float, int]:
    key, ts, value = line.split(",")
    return key, float(ts), int(value)


def test_interval_join_driver_killed_mid_way_resumes_exactly_once(tmp_path: Path) -> None:
    from tests.connectors.spark.test_spark_runner import committed

    data, out, chk = tmp_path / "input.csv", tmp_path / "out", tmp_path / "chk"
    rows = write_input(data, seed=31)
    split_input(data)
    commits = chk / "restart" / "out" / "commits"
    first = start_driver(data, out, chk, kill_after=1)
    code = first.wait(timeout=900)
    assert code == -signal.SIGKILL, f"the driver ended (exit code {code}) instead of being killed"
    before = committed_batches(commits)
    assert 2 <= before < LINES // BATCH, "the kill did not come mid-way"
    second = start_driver(data, out, chk)
    assert second.wait(timeout=900) == 0
    assert committed_batches(commits) > before  # continued, did not start over

    side_a, side_b = ([tuple(parse_line(line)) for line in f.read_text().splitlines()
                       if line.count(",") == 2] for f in split_files(data))
    assert sorted(side_a + side_b) == sorted(rows)
    expected = collections.Counter(
        json.dumps({"key": x[0], "a": x[1], "b": y[1]}, sort_keys=True)
        for x in side_a for y in side_b if x[0] == y[0] and LOWER <= y[1] - x[1] <= UPPER)
    # every committed record (Spark's file sink, through its metadata log), with repeats
    actual = collections.Counter(json.dumps(r, sort_keys=True) for r in committed(out))
    assert actual == expected
    assert sum(expected.values()) > 150


if __name__ == "__main__":
    driver(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
