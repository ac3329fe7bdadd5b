"""A Spark query that fails because a Python worker did not connect back in time (Spark
waits a fixed 10 s for it; a loaded machine can take longer to start an interpreter) is
restarted from its checkpoint by ``SparkRunner.run``, and the output stays exactly once;
any other failure is not retried."""

from __future__ import annotations

import collections
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reactive import Dataflow
from reactive.connectors.files import CommittingFileSink
from reactive.connectors.spark import SparkJob, SparkJobError, SparkRunner, list_part_files
from reactive.connectors.spark.runner import is_transient
from tests.support import Count, pickled_by_value

WORDS = [f"w{i % 9}" for i in range(120)]
#: records a micro-batch: four of them, the injected failure after the second
BATCH = 30
NOT_CONNECTED = ("[STREAM_FAILED] Query terminated with exception: Python worker failed to "
                 "connect back. SQLSTATE: XXKST")


@pytest.fixture(scope="module")
def spark(spark: Any) -> Iterator[Any]:
    """The test session's SparkSession; the workers unpickle this module's functions by value."""
    with pickled_by_value(__name__):
        yield spark


def keyed_count(out: Path) -> Dataflow:
    flow = Dataflow("transient", parallelism=2)
    (flow.from_collection(WORDS).key_by(lambda w: w).process(Count()).uid("count")
         .sink(CommittingFileSink(out)).uid("out"))
    return flow


def committed(directory: Path) -> list[Any]:
    rows = [json.loads(line) for p in list_part_files(directory)
            for line in p.path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return sorted(rows, key=json.dumps)


def test_what_counts_as_a_worker_that_did_not_connect_back() -> None:
    assert is_transient(SparkJobError(NOT_CONNECTED))
    try:  # Spark's error as the cause of ours
        try:
            raise RuntimeError("Timed out while waiting for the Python worker to connect back")
        except RuntimeError as cause:
            raise SparkJobError("the Spark query of sink 'out' failed") from cause
    except SparkJobError as exc:
        assert is_transient(exc)
    assert not is_transient(SparkJobError("the Spark query of sink 'out' failed: "
                                          "UserFunctionError in operator 'parse'"))
    with pytest.raises(ValueError, match="restart_attempts"):
        SparkRunner(None, "chk", restart_attempts=-1)  # type: ignore[arg-type]


@pytest.mark.e2e
def test_queries_stopped_by_a_worker_that_did_not_connect_back_resume_exactly_once(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[SparkJob] = []
    committed_at_failure: list[int] = []
    real_wait = SparkJob.wait

    def wait(job: SparkJob) -> None:
        waits.append(job)
        if len(waits) > 1:
            real_wait(job)
            return
        # the first run fails after its second micro-batch is committed, as a query whose
        # worker for a later micro-batch did not connect back
        query = job.queries["out"]
        try:
            while query.isActive and (query.lastProgress or {}).get("batchId", -1) < 1:
                query.awaitTermination(0.05)
        except Exception as exc:  # a real failure first (as SparkJob.wait says it)
            raise SparkJobError(f"the Spark query of sink 'out' failed: {exc}") from exc
        job.stop()
        commits = tmp_path / "chk" / "transient" / "out" / "commits"
        committed_at_failure.append(sum(1 for p in commits.iterdir() if p.name.isdigit()))
        raise SparkJobError(f"the Spark query of sink 'out' failed: {NOT_CONNECTED}")

    monkeypatch.setattr(SparkJob, "wait", wait)
    # more restarts than the one injected are real ones (a loaded machine)
    SparkRunner(spark, tmp_path / "chk", max_records_per_batch=BATCH, restart_attempts=6,
                restart_delay=0).run(keyed_count(tmp_path / "out"))
    assert len(waits) >= 2
    # the injected failure stopped the run part of the way: the restart had micro-batches
    # left to run (none is injected when a real one came first)
    assert all(n < len(WORDS) // BATCH for n in committed_at_failure)
    expected, seen = [], collections.Counter[str]()
    for w in WORDS:
        seen[w] += 1
        expected.append([w, seen[w]])
    assert committed(tmp_path / "out") == sorted(expected, key=json.dumps)


@pytest.mark.e2e
def test_restarts_end_after_restart_attempts(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[SparkJob] = []

    def wait(job: SparkJob) -> None:
        waits.append(job)
        raise SparkJobError(f"the Spark query of sink 'out' failed: {NOT_CONNECTED}")

    monkeypatch.setattr(SparkJob, "wait", wait)
    with pytest.raises(SparkJobError, match="connect back"):
        SparkRunner(spark, tmp_path / "chk", restart_attempts=2, restart_delay=0).run(
            keyed_count(tmp_path / "out"))
    assert len(waits) == 3
