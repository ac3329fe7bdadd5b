"""The main job end to end: the flights pipeline on a slice of the real data, killed with
SIGKILL half way, restarted from its checkpoint, validated exactly by Spark."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

#: the flights job (in a process of its own, or in this one)
pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "flights.py"


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
    # the run's directory locks (.reactive-lock) are the only hidden files a run leaves
    assert not [p for p in (tmp_path / "out").rglob(".*")
                if p.is_file() and p.name != ".reactive-lock"], "in-progress files left"


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


def _committed(directory):
    """The committed rows of the flights job's results (parquet) or dead letters (jsonl)."""
    import json

    import pyarrow.parquet as pq

    parts = sorted(directory.glob("part-*"))
    if parts and parts[0].suffix == ".jsonl":
        return sorted((d["offset"], d["line"]) for p in parts
                      for d in map(json.loads, p.read_text().splitlines()))
    table = pq.read_table([str(p) for p in parts])
    return sorted(zip(*(table.column(c).to_pylist() for c in table.column_names), strict=True))


async def test_the_csv_reader_and_the_line_reader_commit_the_same_results(tmp_path):
    """The main job's vectorized CSV source, per record and columnar, gives exactly what
    parsing each line in Python gives (results and dead letters, with their offsets), and the
    flights per window equal a batch count over the file, with every kind of malformed row
    in the input."""
    from reactive import CheckpointConfig
    from tests.support import load_example

    flights, flights_data = load_example("flights"), load_example("flights_data")
    data = flights_data.prepare_flights(tmp_path / "flights.csv", limit=6_000,
                                        malformed_every=500)  # wrong field counts
    lines = data.read_bytes().splitlines(keepends=True)
    lines[101] = lines[101].replace(b",", b"\xff,", 1)  # not UTF-8
    lines[2_001] = lines[2_001].replace(b",EWR,", b",,").replace(b",LGA,", b",,") \
        .replace(b",JFK,", b",,")  # an empty origin: 18 fields
    fields = lines[3_001].split(b",")
    fields[12] = b""  # an empty origin, 19 fields
    lines[3_001] = b",".join(fields)
    fields = lines[4_001].split(b",")
    fields[5], fields[3] = b"late", b"517"  # a delay that is no number
    lines[4_001] = b",".join(fields)
    fields = lines[5_001].split(b",")
    fields[17] = b"NA"  # a minute that is no number
    lines[5_001] = b",".join(fields)
    data.write_bytes(b"".join(lines))
    for reader, api in (("csv", "records"), ("lines", "records"), ("csv", "columnar")):
        flow = flights.build_flow(data, tmp_path / api / reader, parallelism=2, reader=reader,
                                  api=api)
        await flow.run(checkpoints=CheckpointConfig(
            interval=0.05, directory=tmp_path / f"chk-{api}-{reader}"))
    lines_out = tmp_path / "records" / "lines"
    for other in (tmp_path / "records" / "csv", tmp_path / "columnar" / "csv"):
        assert _committed(other) == _committed(lines_out)
        assert _committed(other / "_dead_letters") == _committed(lines_out / "_dead_letters")
    dead = _committed(lines_out / "_dead_letters")
    offsets = [sum(map(len, lines[:i])) for i in range(len(lines))]
    expected_dead = {i for i in (101, 2_001, 3_001, 4_001, 5_001)} | {
        i for i in range(1, len(lines)) if i % 500 == 0}
    assert [o for o, _ in dead] == sorted(offsets[i] for i in expected_dead)
    # the batch computation: flights per (origin, carrier, hour) of the good lines
    counts: dict[tuple[str, str, int], int] = {}
    for i, raw in enumerate(lines[1:], start=1):
        if i in expected_dead:
            continue
        f = flights_data.parse_flight(raw.decode().rstrip("\n"))
        key = (f.origin, f.carrier, int(f.ts // 3600 * 3600))
        counts[key] = counts.get(key, 0) + 1
    got = {(r[0], r[1], r[2]): r[4] for r in _committed(tmp_path / "columnar" / "csv")}
    assert got == counts


def test_the_main_command_runs_columnar_with_the_csv_source_and_spark_with_records():
    from tests.support import load_example

    flights = load_example("flights")
    assert flights.parse_args([]).reader == "csv"
    # Spark reads the file with the CSV source too, through the per-record pipeline
    assert flights.parse_args(["--runner", "spark"]).reader == "csv"
    assert flights.parse_args(["--reader", "lines"]).reader == "lines"
    assert flights.parse_args([]).api == "columnar"
    assert flights.parse_args(["--api", "records"]).api == "records"
    assert flights.parse_args(["--reader", "lines"]).api == "records"
    assert flights.parse_args(["--runner", "spark"]).api == "records"
