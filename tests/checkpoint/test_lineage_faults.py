"""A whole lineage across processes, seeded: run, stop with a savepoint, restore it at another
parallelism into the same and into a new checkpoint directory, kill -9, resume, run again.
Committed output holds every input record exactly once and the keyed state equals a batch
computation, on both backends, and on the heap backend with forked snapshots (whose children
the kill -9 finds writing). One seed per backend runs by default; ``-m slow`` runs more."""

from __future__ import annotations

import collections
import json
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.pipelines.lineage_job import JOB, words

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "pipelines" / "lineage_job.py"
RECORDS = 20_000


def run(out: Path, chk: Path, parallelism: int, backend: str, *extra: str,
        kill_at: int | None = None, log: Path | None = None) -> int:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if kill_at is not None:
        env["REACTIVE_TEST_KILL"] = f"record:{kill_at}"
        env["REACTIVE_TEST_KILL_LOG"] = str(log)
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), str(chk), str(parallelism), str(RECORDS),
         backend, *extra], env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(f"job failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.returncode


def committed(out: Path) -> collections.Counter[tuple[str, int]]:
    got: collections.Counter[tuple[str, int]] = collections.Counter()
    for part in out.glob("part-*.jsonl"):
        got.update(tuple(json.loads(line)) for line in part.read_text().splitlines())
    return got


def expected_output() -> collections.Counter[tuple[str, int]]:
    seen: collections.Counter[str] = collections.Counter()
    out: collections.Counter[tuple[str, int]] = collections.Counter()
    for w in words(RECORDS):
        seen[w] += 1
        out[(w, seen[w])] += 1
    return out


def final_state(chk: Path) -> dict[Any, int]:
    """The ``count`` state of the newest completed checkpoint, read through a heap backend
    that owns every key group (it reads heap and RocksDB snapshots alike)."""
    from reactive import CheckpointStorage, KeyGroupRange, ValueStateDescriptor
    from reactive.backends.heap import HeapKeyedStateBackend

    newest = CheckpointStorage(chk, JOB).completed()[-1]
    maxp = newest.metadata.max_parallelism
    kb = HeapKeyedStateBackend(KeyGroupRange(0, maxp - 1), maxp)
    handles = [sub.keyed_state.to_json() for sub in
               newest.metadata.operators["count"].subtasks.values() if sub.keyed_state]
    kb.restore(handles, newest.job_dir)
    state = kb.get_state(ValueStateDescriptor("count", default=0))
    out = {}
    for key in list(kb.keys("count")):
        kb.set_current_key(key)
        out[key] = state.value()
    return out


def killed(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def trial(tmp_path: Path, seed: int, backend: str) -> None:
    rnd = random.Random(seed)
    truth = dict(collections.Counter(words(RECORDS)))
    expected = expected_output()
    out, chk, sp = tmp_path / "out", tmp_path / "chk", tmp_path / "sp"
    log = tmp_path / "kills"

    # 1. a run stopped with a savepoint part way
    p = rnd.choice([1, 2, 3])
    stop_at = rnd.randrange(RECORDS // 5, RECORDS * 2 // 5)
    assert run(out, chk, p, backend, "--stop-at", str(stop_at), "--savepoint", str(sp)) == 0
    assert (sp / "_metadata").exists()
    at_savepoint = tmp_path / "out-at-savepoint"
    shutil.copytree(out, at_savepoint)

    # 2. restored at another parallelism into the same directory, killed, resumed
    p2 = rnd.choice([q for q in (1, 2, 3, 4) if q != p])
    assert run(out, chk, p2, backend, "--restore-from", str(sp),
               kill_at=rnd.randrange(500, 8_000), log=log) == -signal.SIGKILL
    assert run(out, chk, rnd.choice([1, 2, 3, 4]), backend, "--resume") == 0
    assert committed(out) == expected
    assert final_state(chk) == truth
    # run again: resuming the finished run adds nothing
    assert run(out, chk, rnd.choice([1, 2, 3]), backend, "--resume") == 0
    assert committed(out) == expected

    # 3. the same savepoint restored into a new directory (the output as it was then)
    new_chk = tmp_path / "chk-new"
    p3 = rnd.choice([q for q in (1, 2, 3, 4) if q != p])
    assert run(at_savepoint, new_chk, p3, backend, "--restore-from", str(sp),
               kill_at=rnd.randrange(500, 8_000), log=log) == -signal.SIGKILL
    assert run(at_savepoint, new_chk, rnd.choice([1, 2, 3, 4]), backend, "--resume") == 0
    assert committed(at_savepoint) == expected
    assert final_state(new_chk) == truth
    assert killed(log) == 2


@pytest.mark.e2e
@pytest.mark.parametrize("backend", ["heap", "heap-fork", "rocksdb"])
def test_lineage_through_savepoint_rescale_kill_and_rerun(tmp_path, backend):
    trial(tmp_path, seed=1, backend=backend)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["heap", "heap-fork", "rocksdb"])
@pytest.mark.parametrize("seed", range(2, 12))
def test_lineage_seeded(tmp_path, backend, seed):
    trial(tmp_path, seed=seed, backend=backend)
