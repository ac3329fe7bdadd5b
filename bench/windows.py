"""Shared window aggregation (Cutty) against a naive per-window aggregator.

Periodic count windows (ranges 20,000-80,000 records, slides 1,000-20,000) over one
stream, with 1, 10 and 100 concurrent queries (Carbone 2018 (PhD thesis), section 5.7). For each
query count it reports the shared aggregator's records/s and combine calls per record over
``--records`` records, and the naive aggregator's over ``--naive-records`` records (it folds
every record into every open window: ~sum(r/s) adds per record, too slow for the full run in
Python), plus the naive steady-state combines per record, sum(r/s), computed exactly. Then one
pipeline run: ``key_by(...).windows([...]).aggregate(...)`` through the runtime.

Run: ``python bench/windows.py [--records 2000000] [--naive-records 20000]``
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from typing import Any

from bench.naive_windows import NaiveAggregator
from reactive import AggregateFunction, Dataflow
from reactive.connectors.collections import ListSink
from reactive.windowing import CountWindows
from reactive.windowing.cutty import CuttyAggregator


class Sum(AggregateFunction):
    def create_accumulator(self) -> Any:
        return 0

    def add(self, value: Any, acc: Any) -> Any:
        return acc + value

    def get_result(self, acc: Any) -> Any:
        return acc

    def merge(self, a: Any, b: Any) -> Any:
        return a + b


def make_queries(n: int, seed: int) -> list[CountWindows]:
    rnd = random.Random(seed)
    return [CountWindows.of(rnd.randrange(20_000, 80_001, 1_000),
                            rnd.randrange(1_000, 20_001, 1_000)) for _ in range(n)]


def run(aggregator: Any, values: list[int], batch: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    windows = 0
    for i in range(0, len(values), batch):
        windows += len(aggregator.add_all(values[i:i + batch]))
    return time.perf_counter() - t0, windows


def bare_loop(values: list[int]) -> float:
    t0 = time.perf_counter()
    acc = 0
    for v in values:
        acc = acc + v
    return time.perf_counter() - t0


async def pipeline(records: int, queries: list[CountWindows]) -> float:
    sink = ListSink()
    flow = Dataflow("bench-windows", parallelism=1, batch_size=1024)
    (flow.from_collection(range(records)).key_by(lambda r: r & 3)
         .windows(list(queries)).aggregate(Sum()).sink(sink))
    t0 = time.perf_counter()
    await flow.run()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--naive-records", type=int, default=20_000)
    parser.add_argument("--pipeline-records", type=int, default=400_000)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    rnd = random.Random(args.seed)
    values = [rnd.randrange(100) for _ in range(args.records)]
    bare = args.records / bare_loop(values)
    print(f"records={args.records:,} naive-records={args.naive_records:,} "
          f"bare loop {bare / 1e6:.2f} M rec/s")
    print(f"{'queries':>7} {'cutty rec/s':>12} {'vs bare':>8} {'cutty comb/rec':>15} "
          f"{'naive rec/s':>12} {'naive comb/rec':>15} {'steady sum(r/s)':>16} "
          f"{'naive/cutty comb':>17} {'cutty windows':>14}")
    base_rate = None
    for n in (1, 10, 100):
        queries = make_queries(n, args.seed + n)
        cutty = CuttyAggregator(queries, Sum())
        secs, windows = run(cutty, values, args.batch)
        rate = args.records / secs
        base_rate = base_rate or rate
        naive = NaiveAggregator(queries, Sum())
        nsecs, _ = run(naive, values[: args.naive_records], args.batch)
        c_per = cutty.stats.combines / args.records
        n_per = naive.stats.combines / args.naive_records
        steady = sum(q.size / q.slide for q in queries)
        print(f"{n:>7} {rate:>12,.0f} {rate / bare:>8.3f} {c_per:>15.3f} "
              f"{args.naive_records / nsecs:>12,.0f} {n_per:>15.2f} {steady:>16.1f} "
              f"{steady / c_per:>17.1f} {windows:>14,}")
        if n == 100:
            print(f"throughput 1 -> 100 queries: {base_rate / rate:.2f}x slower "
                  f"(aim <= 6x); combines naive/shared at 100 queries (steady state): "
                  f"{steady / c_per:.0f}x (aim >= 10x)")
    queries = make_queries(10, args.seed + 10)
    secs = asyncio.run(pipeline(args.pipeline_records, queries))
    print(f"pipeline: {args.pipeline_records:,} records, 4 keys, 10 shared count-window "
          f"queries: {args.pipeline_records / secs:,.0f} rec/s")


if __name__ == "__main__":
    main()
