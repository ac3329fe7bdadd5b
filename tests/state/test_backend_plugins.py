"""A third-party state backend in a job and under the contract suite: the suite runs every
hook on the thread the runtime runs it on, checks the files a snapshot handle lists, and a
restore that fails fails the job once, naming the operator and the phase."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from reactive import CheckpointConfig, Dataflow, JobFailedError, RestartStrategy, RestoreError
from reactive.connectors.collections import ListSink
from reactive.testing import TestingSource
from tests.faulty_backends import FlakyRestoreStateBackend, ThreadBoundStateBackend
from tests.support import Count

REPO = Path(__file__).resolve().parents[2]

SUITE = '''
from reactive.backends.heap import HeapStateBackend
from reactive.testing.backend_contract import StateBackendContract
from tests.faulty_backends import TamperedHandleStateBackend, ThreadBoundStateBackend


class TestControl(StateBackendContract):
    def create_state_backend(self, tmp_path):
        return HeapStateBackend()


class TestThreadBound(StateBackendContract):
    def create_state_backend(self, tmp_path):
        return ThreadBoundStateBackend()
'''


def run_contract_suite(tmp_path: Path, source: str,
                       select: str | None = None) -> dict[str, dict[str, str]]:
    """Run the contract suite in ``source`` as a third party would (its own pytest run, strict
    asyncio mode; ``select``: a ``-k`` expression); return
    ``{class: {test: "passed" | failure message}}``."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_my_backend.py").write_text(textwrap.dedent(source))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "asyncio_mode=strict",
         "-q", "--junitxml", str(tmp_path / "report.xml"), "test_my_backend.py",
         *(["-k", select] if select else [])],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    out: dict[str, dict[str, str]] = {}
    for case in ET.parse(tmp_path / "report.xml").iter("testcase"):
        cls = case.get("classname", "").rsplit(".", 1)[-1]
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        out.setdefault(cls, {})[case.get("name", "")] = \
            "passed" if failure is None else (failure.get("message") or "") + (failure.text or "")
    return out


@pytest.mark.e2e
def test_the_suite_fails_a_backend_that_works_on_the_loops_thread_only(tmp_path):
    results = run_contract_suite(tmp_path, SUITE)
    assert set(results["TestControl"].values()) == {"passed"}, results["TestControl"]
    bound = results["TestThreadBound"]
    assert len(bound) == len(results["TestControl"])
    # every test that restores fails, with sqlite3's own error: restore runs in a worker thread
    failed = {name: msg for name, msg in bound.items() if msg != "passed"}
    assert "test_snapshot_restore_round_trip" in failed
    assert "test_restore_key_group_subset" in failed
    assert all("ProgrammingError" in msg for msg in failed.values()), failed
    # ... and only those: the hooks that run on the loop work there
    assert bound["test_value_state"] == "passed"
    assert bound["test_snapshot_does_not_see_later_updates"] != "passed"


async def test_a_restore_error_fails_the_job_once_naming_the_operator(tmp_path):
    words = [f"w{i % 7}" for i in range(300)]
    items = [*words[:100], TestingSource.CHECKPOINT, *words[100:200], TestingSource.ABORT,
             *words[200:]]
    flow = Dataflow("restore-error", parallelism=2)
    (flow.source(TestingSource(items, batch_size=20), uid="src")
     .key_by(lambda w: w).process(Count()).uid("count").sink(ListSink()))
    with pytest.raises(JobFailedError) as info:
        await flow.run(checkpoints=CheckpointConfig(interval=0.02, directory=tmp_path / "chk"),
                       state_backend=ThreadBoundStateBackend(),
                       restart=RestartStrategy.fixed(3, 0.0))
    # the ABORT restarted the job once; its restore failed and was not retried
    assert info.value.attempts == 2
    cause = info.value.__cause__
    assert isinstance(cause, RestoreError)
    assert (cause.operator, cause.phase) == ("count", "keyed state")
    assert cause.subtask in (0, 1) and cause.checkpoint_id is not None
    assert isinstance(cause.__cause__, Exception)
    assert type(cause.__cause__).__name__ == "ProgrammingError"
    assert "uid 'count'" in str(info.value) and "keyed state" in str(info.value)


async def test_an_os_error_in_restore_is_retried_and_says_where(tmp_path, caplog):
    words = [f"w{i % 7}" for i in range(300)]
    items = [*words[:100], TestingSource.CHECKPOINT, *words[100:200], TestingSource.ABORT,
             *words[200:]]
    flow = Dataflow("flaky-restore", parallelism=2)
    sink = ListSink()
    (flow.source(TestingSource(items, batch_size=20), uid="src")
     .key_by(lambda w: w).process(Count()).uid("count").sink(sink))
    backend = FlakyRestoreStateBackend(failures=1)
    job = await flow.run(checkpoints=CheckpointConfig(interval=0.02, directory=tmp_path / "chk"),
                         state_backend=backend, restart=RestartStrategy.fixed(3, 0.0))
    # the ABORT, then the failed restore: two restarts, and every word counted to its end
    assert job.metrics.restarts == 2
    # three attempts of two instances, each disposed (the failed restore's too)
    assert backend.created == backend.disposed == 6
    final = {w: max(n for x, n in sink.records if x == w) for w in set(words)}
    assert final == {w: words.count(w) for w in set(words)}
    failure = next(r.getMessage() for r in caplog.records if "OSError" in r.getMessage())
    assert "uid 'count'" in failure and "keyed state" in failure
    assert "Input/output error (injected)" in failure


TAMPERED = '''
from reactive.testing.backend_contract import StateBackendContract
from tests.faulty_backends import TamperedHandleStateBackend


class TestWrongSha256(StateBackendContract):
    def create_state_backend(self, tmp_path):
        return TamperedHandleStateBackend("wrong_sha256")


class TestWrongSize(StateBackendContract):
    def create_state_backend(self, tmp_path):
        return TamperedHandleStateBackend("wrong_size")


class TestAbsolutePath(StateBackendContract):
    def create_state_backend(self, tmp_path):
        return TamperedHandleStateBackend("absolute_path")


class TestDotDotPath(StateBackendContract):
    def create_state_backend(self, tmp_path):
        return TamperedHandleStateBackend("dotdot_path")
'''


@pytest.mark.e2e
def test_the_suite_fails_a_backend_whose_handles_misstate_their_files(tmp_path):
    results = run_contract_suite(
        tmp_path, TAMPERED, "round_trip or savepoint or value_state or while_the_asynchronous")
    what = {"TestWrongSha256": "sha256", "TestWrongSize": "bytes",
            "TestAbsolutePath": "is absolute", "TestDotDotPath": "contains '..'"}
    for cls, words in what.items():
        failed = {name: msg for name, msg in results[cls].items() if msg != "passed"}
        # every test that takes a snapshot fails, saying what is wrong with the file
        assert "test_snapshot_restore_round_trip" in failed, (cls, results[cls])
        assert "test_savepoint_is_self_contained" in failed, (cls, results[cls])
        assert "test_state_changes_while_the_asynchronous_part_runs" in failed
        assert all(words in msg for msg in failed.values()), (cls, failed)
        assert results[cls]["test_value_state"] == "passed"
