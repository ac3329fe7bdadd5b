"""The Spark runner's one query writing two sinks after a crash between their commits: the
driver's process (Python and its JVM) is SIGKILLed once the dead-letter sink committed a
micro-batch that the results sink and Spark's commit log had not, a second process resumes
the dataflow, and each sink's committed output validates exactly once against a batch
computation. A module of its own (beside ``test_spark_runner_restart.py``, whose driver it
runs): pytest-xdist gives the two crashed runs to different workers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.connectors.spark.test_spark_runner_restart import check_resumed, crash_and_resume

pytestmark = pytest.mark.e2e


def test_driver_killed_between_two_sinks_commits_resumes_exactly_once(
        tmp_path: Path, spark: Any) -> None:
    # the dead-letter sink committed micro-batch 2 (the last of the input's, holding a
    # malformed line), the results sink and Spark's commit log had not: the replayed batch
    # is skipped by the one and written by the other. A run of its own: the kill point is
    # patched into every one-query writer of its driver
    run = crash_and_resume(tmp_path, ["two-sinks"], seed=23, kill_after=None, kill_between=2)
    check_resumed(run, spark, "two-sinks", kill_between=2)
