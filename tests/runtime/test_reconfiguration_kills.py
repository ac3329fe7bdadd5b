"""SIGKILL at seeded moments of live reconfigurations (``job.rescale``, ``job.update``):
``tests/pipelines/reconfiguring_job.py`` runs in a subprocess that rescales and updates its
keyed count while it runs and kills itself at a seeded point (a record, a pre-commit, a
commit, right before a reconfiguration, while a rescale builds its new graph, right after a
reconfiguration returned); the test resumes it until it exits 0 and compares the committed
files with the batch result: every record once, on the heap and RocksDB backends."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.connectors.files.test_committing_file_sink import (
    committed_records,
    expected_output,
    hidden_files,
)
from tests.pipelines import committing_file_job
from tests.pipelines import reconfiguring_job as pipeline

SCRIPT = Path(pipeline.__file__)
ROOT = SCRIPT.parents[2]
RECORDS = 200_000


def kill_point(seed: int) -> str:
    """One seeded kill point of the reconfiguring job."""
    rnd = random.Random(seed)
    kind = rnd.choice(["record", "precommit", "commit", "committed", "reconfigure", "writer",
                       "switched"])
    at = {"record": rnd.randint(RECORDS // 8, RECORDS), "precommit": rnd.randint(2, 25),
          "commit": rnd.randint(2, 25), "committed": rnd.randint(2, 25),
          "reconfigure": rnd.randint(1, len(pipeline.STEPS)),
          "writer": rnd.randint(3, 12),
          "switched": rnd.randint(1, len(pipeline.STEPS))}[kind]
    return f"{kind}:{at}"


def run_until_done(tmp_path: Path, backend: str, kills: list[str]) -> list[int]:
    """Run the job with each kill point in turn, then without, until it exits 0."""
    out, chk, log = tmp_path / "out", tmp_path / "chk", tmp_path / "kills.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REACTIVE_TEST_KILL_LOG": str(log)}
    codes: list[int] = []
    for kill in [*kills, "none:0"]:
        proc = subprocess.run(
            [sys.executable, str(SCRIPT), str(out), str(chk), str(RECORDS), backend],
            env={**env, "REACTIVE_TEST_KILL": kill}, capture_output=True, text=True,
            timeout=180, check=False)
        codes.append(proc.returncode)
        assert proc.returncode in (0, -signal.SIGKILL), proc.stderr[-3000:]
        if proc.returncode == 0:
            break
    assert codes[-1] == 0, "the job did not finish after the last kill"
    return codes


def _check(tmp_path: Path, backend: str, seeds: list[int]) -> list[str]:
    kills = [kill_point(seed) for seed in seeds]
    codes = run_until_done(tmp_path, backend, kills)
    log = tmp_path / "kills.log"
    happened = log.read_text().split() if log.exists() else []
    assert happened == kills[: len(happened)]
    assert codes.count(-signal.SIGKILL) == len(happened)
    out = tmp_path / "out"
    assert committed_records(out) == expected_output(committing_file_job.words(RECORDS))
    assert hidden_files(out) == []
    return happened


@pytest.mark.e2e
@pytest.mark.parametrize(("backend", "seeds"), [
    ("heap", [27, 23, 13]),     # writer:4 (a rescale builds its graph), switched:4, commit:23
    # the first kill must be one every run reaches: a late writer (a later rescale's graph)
    # is not reached when the input ends before that rescale
    ("rocksdb", [35, 19, 14]),  # reconfigure:2, writer:9, record:186448
])
def test_sigkill_during_reconfigurations_resumes_exactly_once(tmp_path, backend, seeds):
    happened = _check(tmp_path, backend, seeds)
    # the first kill, inside a reconfiguration, certainly happened
    assert happened[:1] == [kill_point(seeds[0])]


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
@pytest.mark.parametrize("seed", range(100, 110))
def test_sigkill_during_reconfigurations_loop(tmp_path, backend, seed):
    _check(tmp_path, backend, [seed, seed + 1000, seed + 2000])
