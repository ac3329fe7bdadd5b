"""Punctuation (data-driven) windows through a user trigger, on the real flights table
(examples/punctuation_windows.py): per origin, the runs of flights between cancellations
equal a plain Python loop over the file, also exactly once across crashes."""

from __future__ import annotations

import csv
import random
from pathlib import Path
from typing import Any

import pytest

from reactive import CheckpointConfig, RestartStrategy
from reactive.connectors.collections import ListSink
from tests.support import load_example
from tests.windowing.test_windows import GatedInjector, TxnListSink

example = load_example("punctuation_windows")


@pytest.fixture(scope="module")
def flights(flights_csv: Path) -> Path:
    """The first 30,000 flights of 2013 in event-time order (``prepare_flights(limit=30_000)``,
    shared by the test session)."""
    return flights_csv


def plain_runs(data: Path) -> list[tuple[Any, ...]]:
    """(origin, flights, delayed, mean delay, first, last, closed) per run, from the CSV
    columns directly: a run ends with (and includes) a cancelled flight (no dep_time)."""
    runs = []
    open_runs: dict[str, list[dict[str, str]]] = {}
    with data.open(newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        run = open_runs.setdefault(row["origin"], [])
        run.append(row)
        if row["dep_time"] == "NA":
            runs.append((row["origin"], run, True))
            del open_runs[row["origin"]]
    runs += [(origin, run, False) for origin, run in open_runs.items()]
    out = []
    for origin, run, closed in runs:
        delays = [float(r["dep_delay"]) for r in run if r["dep_delay"] != "NA"]
        times = [example.parse_flight(",".join(r.values())).ts for r in run]
        out.append((origin, len(run), sum(d > 15 for d in delays),
                    sum(delays) / len(delays) if delays else None, min(times), max(times),
                    closed))
    return sorted(out, key=repr)


def as_tuples(runs: list[Any]) -> list[tuple[Any, ...]]:
    return sorted(((r.origin, r.flights, r.delayed, r.mean_delay, r.first, r.last, r.closed)
                   for r in runs), key=repr)


def approx_equal(a: list[tuple[Any, ...]], b: list[tuple[Any, ...]]) -> bool:
    # the mean delay is a float sum in another order: compare it to 1e-9 minutes
    return len(a) == len(b) and all(
        x[:3] == y[:3] and x[4:] == y[4:]
        and (x[3] is None) == (y[3] is None) and (x[3] is None or abs(x[3] - y[3]) < 1e-9)
        for x, y in zip(a, b, strict=True))


async def test_runs_between_cancellations_equal_a_plain_loop(flights: Path):
    data = flights
    sink = ListSink()
    await example.build_flow(data, sink, parallelism=2).run()
    expected = plain_runs(data)
    assert sum(closed for *_, closed in expected) > 100, "the data must have cancellations"
    assert approx_equal(as_tuples(sink.records), expected)


async def test_runs_are_exactly_once_after_crashes(flights: Path, tmp_path: Path):
    data = flights
    injector = GatedInjector(random.Random(4).sample(range(1_000, 20_000), 2), tmp_path / "chk")
    sink = TxnListSink()
    flow = example.build_flow(data, sink, parallelism=2, tick=injector)
    job = await flow.run(checkpoints=CheckpointConfig(interval=0.05, directory=tmp_path / "chk"),
                         restart=RestartStrategy.fixed(5, 0))
    assert injector.failures >= 1 and job.metrics.restored_checkpoints
    assert approx_equal(as_tuples(sink.committed), plain_runs(data))
