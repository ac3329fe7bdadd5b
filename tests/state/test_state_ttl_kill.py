"""State time-to-live exactly once through kill -9: the session count job
(``tests/pipelines/ttl_session_job.py``, a count with ``ttl=3`` s of record time) killed with
SIGKILL at seeded records and resumed at another parallelism each time, on the heap
backend (full and incremental checkpoints) and RocksDB, until it finishes; its committed
output then holds every event once with the count a run without failures gives: no expired
count resurrected by a restore, none expired early."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pipelines import ttl_session_job as pipeline

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(pipeline.__file__)
RECORDS = 20_000


def run_trial(tmp_path: Path, backend: str, seed: int) -> None:
    out, chk, log = tmp_path / "out", tmp_path / "chk", tmp_path / "kills.log"
    rnd = random.Random(seed)
    kills = sorted(rnd.sample(range(1_000, RECORDS // 2), 3))
    schedule = [(f"row:{k}", rnd.choice([1, 2, 3])) for k in kills] + [("none:0", 2)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REACTIVE_TEST_KILL_LOG": str(log)}
    codes = []
    for kill, parallelism in schedule:
        proc = subprocess.run(
            [sys.executable, str(SCRIPT), str(out), str(chk), str(RECORDS), str(parallelism),
             backend],
            env={**env, "REACTIVE_TEST_KILL": kill}, capture_output=True, text=True,
            timeout=180, check=False)
        codes.append(proc.returncode)
        assert proc.returncode in (0, -signal.SIGKILL), proc.stderr[-3000:]
        if proc.returncode == 0:
            break
    assert codes[-1] == 0 and -signal.SIGKILL in codes and log.exists()  # really killed
    rows = [json.loads(line) for part in sorted(out.glob("part-*"))
            for line in part.read_text().splitlines()]
    expected = pipeline.expected(pipeline.events(RECORDS))
    # each event once (event times are distinct), with the count of a run without failures
    assert sorted(rows, key=lambda r: (r["t"], r["key"])) == expected
    # the input has counts that expired and counts that did not
    assert any(r["n"] == 1 for r in expected[1_000:]) and max(r["n"] for r in expected) > 3


@pytest.mark.parametrize(("backend", "seed"), [("heap-incremental", 2), ("rocksdb", 3)])
def test_sigkill_and_rescale_keep_ttl_counts_exactly_once(tmp_path, backend, seed):
    run_trial(tmp_path, backend, seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4, 10))
@pytest.mark.parametrize("backend", ["heap", "heap-incremental", "rocksdb"])
def test_sigkill_and_rescale_seeded_loop(tmp_path, backend, seed):
    run_trial(tmp_path, backend, seed)
