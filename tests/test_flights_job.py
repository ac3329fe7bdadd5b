"""The main job end to end: the flights pipeline on a slice of the real data, killed with
SIGKILL half way, restarted from its checkpoint, validated exactly by Spark."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "flights.py"


def test_flights_job_recovers_from_a_kill_and_validates_exactly(tmp_path):
    limit, malformed_every = 30_000, 1_000
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--limit", str(limit), "--crash-at", "0.5",
         "--malformed-every", str(malformed_every), "--interval", "0.2",
         "--data", str(tmp_path / "flights.csv"), "--output", str(tmp_path / "out"),
         "--checkpoint-dir", str(tmp_path / "chk")],
        capture_output=True, text=True, timeout=600,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "crash: killing the job's process at record 15,000" in out
    assert "restarting from the latest completed checkpoint" in out
    assert re.search(r"OK: exactly-once holds: ([\d,]+) rows match the \1 expected", out)
    assert "crashes: 1" in out
    # every malformed row reached the dead-letter output, exactly once across the crash
    dead = [line for p in (tmp_path / "out" / "_dead_letters").glob("part-*.jsonl")
            for line in p.read_text().splitlines()]
    assert len(dead) == limit // malformed_every
    assert f"dead letters committed: {len(dead)}" in out
    committed = list((tmp_path / "out").glob("part-*.parquet"))
    assert committed
    assert not [p for p in (tmp_path / "out").rglob(".*") if p.is_file()], "in-progress files left"


def test_second_run_refuses_to_double_the_output_and_fresh_runs_again(tmp_path):
    import pyarrow.parquet as pq

    limit = 4_000
    base = [sys.executable, str(EXAMPLE), "--limit", str(limit), "--interval", "0.2",
            "--no-validate", "--data", str(tmp_path / "flights.csv"),
            "--output", str(tmp_path / "out"), "--checkpoint-dir", str(tmp_path / "chk")]

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*base, *extra], capture_output=True, text=True, timeout=600)

    def committed_flights() -> tuple[int, int]:
        table = pq.read_table([str(p) for p in (tmp_path / "out").glob("part-*.parquet")])
        keys = set(zip(*(table.column(c).to_pylist()
                         for c in ("origin", "carrier", "window_start")), strict=True))
        return table.num_rows - len(keys), sum(table.column("flights").to_pylist())

    first = run()
    assert first.returncode == 0, first.stdout + first.stderr
    assert committed_flights() == (0, limit)
    again = run()
    assert again.returncode == 2
    assert "already holds" in again.stderr and "--fresh" in again.stderr
    assert committed_flights() == (0, limit)  # untouched
    crashed = run("--fresh", "--crash-at", "0.5")
    assert crashed.returncode == 0, crashed.stdout + crashed.stderr
    assert "crash: killing the job's process" in crashed.stdout
    assert '"crashes": 1' in crashed.stdout
    assert '"records": 0' not in crashed.stdout  # the restarted run did real work
    assert committed_flights() == (0, limit)  # no duplicated or missing window


def test_a_line_that_is_not_utf8_reaches_the_dead_letters_with_its_offset(tmp_path):
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("flights_data",
                                                  EXAMPLE.parent / "flights_data.py")
    assert spec is not None and spec.loader is not None
    flights_data = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(flights_data)
    data = flights_data.prepare_flights(tmp_path / "flights.csv", limit=2_000)
    lines = data.read_bytes().splitlines(keepends=True)
    bad = lines[500].replace(b",", b"\xff,", 1)  # a byte that no UTF-8 text contains
    offset = sum(map(len, lines[:500]))
    data.write_bytes(b"".join([*lines[:500], bad, *lines[501:]]))
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--interval", "0.2", "--no-validate",
         "--data", str(data), "--output", str(tmp_path / "out"),
         "--checkpoint-dir", str(tmp_path / "chk")],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    dead = [json.loads(line) for p in (tmp_path / "out" / "_dead_letters").glob("part-*.jsonl")
            for line in p.read_text().splitlines()]
    assert [d["offset"] for d in dead] == [offset]
    assert "UTF-8" in dead[0]["reason"] or "utf-8" in dead[0]["reason"]
