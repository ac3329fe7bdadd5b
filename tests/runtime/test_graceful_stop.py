"""SIGTERM/SIGINT to ``reactive run``: the job stops with a savepoint, the command prints how
to resume and exits 0; the resumed run finishes with every record counted exactly once."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from reactive import CheckpointStorage
from tests.pipelines import slow_count_job

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "pipelines" / "slow_count_job.py"


def _committed(out: Path) -> collections.Counter[tuple[str, int]]:
    seen: collections.Counter[tuple[str, int]] = collections.Counter()
    for part in out.glob("part-*.jsonl"):
        for line in part.read_text().splitlines():
            word, n = json.loads(line)
            seen[(word, n)] += 1
    return seen


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_with_a_savepoint_and_the_run_resumes_exactly(tmp_path, sig):
    chk, out = tmp_path / "chk", tmp_path / "out"
    env = {**os.environ, "REACTIVE_TEST_OUT": str(out), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "reactive", "run", f"{JOB}:flow", "--checkpoint-dir",
           str(chk), "--interval", "0.1"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        # signal once the job has really started: its first checkpoint completed
        storage = CheckpointStorage(chk, "slow-count")
        for _ in range(600):
            if storage.completed() or proc.poll() is not None:
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.05)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    assert f"stopped by {sig.name} with savepoint" in stdout
    assert "Traceback" not in stderr
    resume = stdout.strip().splitlines()[-1].split()
    assert resume[:2] == ["reactive", "run"] and resume[-1] == "--resume"
    savepoints = [c for c in CheckpointStorage(chk, "slow-count").completed() if c.is_savepoint]
    assert len(savepoints) == 1
    # stopped part way: not everything was committed yet
    counts = {f"k{i}": len(range(i, slow_count_job.RECORDS, 97)) for i in range(97)}
    expected = collections.Counter((w, n) for w, c in counts.items() for n in range(1, c + 1))
    assert sum(_committed(out).values()) < sum(expected.values())
    # the printed command (through python -m reactive) continues and finishes exactly once
    again = subprocess.run([sys.executable, "-m", "reactive", *resume[1:]], env=env, capture_output=True,
                           text=True, timeout=120)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _committed(out) == expected


STUCK_JOB = ROOT / "tests" / "pipelines" / "stuck_savepoint_job.py"


def test_a_second_sigint_abandons_the_savepoint_and_exits_130(tmp_path):
    """Ctrl-C twice: the first takes a stop-with-savepoint (stuck here: the sink's
    pre-commit never returns), the second abandons it: one line says so, exit code 130."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "reactive", "run", f"{STUCK_JOB}:flow", "--checkpoint-dir",
           str(tmp_path / "chk"), "--interval", "3600"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    lines: queue.Queue[str] = queue.Queue()
    seen: list[str] = []
    assert proc.stderr is not None
    reader = threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr],
                              daemon=True)
    reader.start()

    def until(marker: str) -> None:
        while True:
            try:
                line = lines.get(timeout=60)
            except queue.Empty:
                pytest.fail(f"no {marker!r} on standard error; seen: {seen}")
            seen.append(line)
            if marker in line:
                return

    try:
        until("running")  # the job processes records
        proc.send_signal(signal.SIGINT)
        until("snapshot waits")  # the savepoint's barrier reached the stuck sink
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=10)
    while not lines.empty():
        seen.append(lines.get())
    stderr = "".join(seen)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "never retrieved" not in stderr, stderr
    assert "error:" not in stderr, stderr
    said = [line for line in seen if "abandoned" in line]
    assert len(said) == 1, stderr
    assert said[0].startswith("SIGINT again: savepoint abandoned, job 'stuck-savepoint' "
                              "cancelled"), said
