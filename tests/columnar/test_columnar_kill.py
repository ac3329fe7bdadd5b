"""Exactly once on the columnar path through kill -9: the columnar count job
(``tests/pipelines/columnar_count_job.py``) killed with SIGKILL at seeded rows and resumed
at another parallelism each time, with full and incremental snapshots of its columnar
state, until it finishes; its committed output then holds every row's running count exactly
once (compared with a batch computation of the same input)."""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pipelines import columnar_count_job as pipeline

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(pipeline.__file__)
RECORDS = 60_000


def run_until_done(out: Path, chk: Path, backend: str, seed: int, log: Path) -> list[int]:
    rnd = random.Random(seed)
    kills = sorted(rnd.sample(range(2_000, RECORDS), 3))
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
    assert codes[-1] == 0
    return codes


def check_output(out: Path) -> None:
    rows = [json.loads(line) for part in sorted(out.glob("part-*"))
            for line in part.read_text().splitlines()]
    table = pipeline.words_table(RECORDS)
    assert len(rows) == RECORDS  # every row once: none lost, none replayed into the output
    per_word: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
    for r in rows:
        per_word[r["word"]].append((r["count"], r["total"]))
    expected = table.group_by("word").aggregate([("word", "count"), ("n", "sum")])
    for e in expected.to_pylist():
        updates = sorted(per_word[e["word"]])
        assert [c for c, _ in updates] == list(range(1, e["word_count"] + 1))
        assert updates[-1][1] == e["n_sum"]


def run_trial(tmp_path: Path, backend: str, seed: int) -> None:
    out, chk, log = tmp_path / "out", tmp_path / "chk", tmp_path / "kills.log"
    codes = run_until_done(out, chk, backend, seed, log)
    assert -signal.SIGKILL in codes and log.exists()  # the job really was killed
    check_output(out)


@pytest.mark.parametrize(("backend", "seed"), [("heap", 1), ("heap-incremental", 2),
                                               ("rocksdb", 3)])
def test_sigkill_and_rescale_keep_columnar_output_exactly_once(tmp_path, backend, seed):
    run_trial(tmp_path, backend, seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3, 13))
@pytest.mark.parametrize("backend", ["heap", "heap-incremental", "rocksdb"])
def test_sigkill_and_rescale_seeded_loop(tmp_path, backend, seed):
    run_trial(tmp_path, backend, seed)


# ---------------------------------------------------------------------- windows
WINDOW_RECORDS = 8_000


def run_windows_until_done(out: Path, chk: Path, kind: str, seed: int, log: Path) -> list[int]:
    from tests.pipelines import columnar_window_job as windows

    rnd = random.Random(seed)
    kills = sorted(rnd.sample(range(2_000, WINDOW_RECORDS), 3))
    schedule = [(f"row:{k}", rnd.choice([1, 2, 3])) for k in kills] + [("none:0", 2)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REACTIVE_TEST_KILL_LOG": str(log)}
    codes = []
    for kill, parallelism in schedule:
        proc = subprocess.run(
            [sys.executable, windows.__file__, str(out), str(chk), str(WINDOW_RECORDS),
             str(parallelism), kind],
            env={**env, "REACTIVE_TEST_KILL": kill}, capture_output=True, text=True,
            timeout=180, check=False)
        codes.append(proc.returncode)
        assert proc.returncode in (0, -signal.SIGKILL), proc.stderr[-3000:]
        if proc.returncode == 0:
            break
    assert codes[-1] == 0
    return codes


def test_sigkill_and_rescale_keep_columnar_windows_exactly_once(tmp_path):
    """Columnar session windows (with allowed lateness: late firings too) killed with
    SIGKILL at seeded rows and resumed at another parallelism each time commit exactly what
    the per-record windows compute on the same input."""
    windows_trial(tmp_path, "session", 2)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3, 8))
@pytest.mark.parametrize("kind", ["tumbling", "sliding", "session"])
def test_sigkill_and_rescale_columnar_windows_seeded_loop(tmp_path, kind, seed):
    windows_trial(tmp_path, kind, seed)


def windows_trial(tmp_path: Path, kind: str, seed: int) -> None:
    import asyncio

    import pyarrow.parquet as pq

    from tests.columnar.test_columnar_windows import ordered, per_record_windows
    from tests.pipelines import columnar_window_job as windows

    out, chk, log = tmp_path / "out", tmp_path / "chk", tmp_path / "kills.log"
    codes = run_windows_until_done(out, chk, kind, seed, log)
    assert -signal.SIGKILL in codes and log.exists()  # the job really was killed
    rows = [r for p in sorted(out.glob("part-*")) for r in pq.read_table(p).to_pylist()]
    got = ordered((r["k"], r["window_start"], r["window_end"], r["n"], r["s"], r["lo"],
                   r["hi"], r["m"]) for r in rows)
    expected, _ = asyncio.run(per_record_windows(windows.events(WINDOW_RECORDS),
                                                 windows.ASSIGNERS[kind], windows.LATENESS))
    assert got == expected
