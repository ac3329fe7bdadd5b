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
