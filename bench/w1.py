"""W1: keyed count of Zipf(1.1) keys, without and with checkpoints, against a bare loop.

    python -m bench.w1 [--records 6000000] [--vocabulary 100000] [--parallelism 1]
                       [--repeats 3] [--png bench/results/w1.png | --no-png]

Runs in one process, in this order: a bare Python loop counting the same keys (the
baseline), the pipeline ``from_collection -> key_by -> KeyedProcessFunction count ->
discarding sink`` without checkpoints, the same with checkpoints every second (heap
backend), and that again with the function appending to the ``out`` collector instead of
returning a list per record. A second baseline row times only the calls the pipeline
makes per record (key selector, ``set_current_key``, the function with its state ``value`` /
``update`` and ``out.append``) in a plain loop: what a runtime calling Python per record
cannot beat. Prints records/s, the ratios to the bare loop and to the run without
checkpoints, and per checkpoint (of the last run with checkpoints) the alignment,
synchronous part, asynchronous part (ms) and bytes. Each row runs ``--repeats`` times,
interleaved with the others (min / median / max; ratios of medians). Records per CPU second
(``time.process_time``, every thread of the process) are reported too: on a shared machine
the wall-clock rates of one invocation varied by up to 2x (the bare loop 4.7-10 M/s), and
CPU time is much less sensitive to what the neighbours do. The ratios are also drawn as a
bar chart PNG (``--png``; skipped, with a line saying so, when matplotlib, the ``plot``
extra, is missing).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from typing import Any

from bench.common import ALL_CHECKPOINTS, peak_rss_mb, print_table, zipf_keys
from bench.figures import RESULTS, write_ratio_png
from reactive import CheckpointConfig, Dataflow, KeyedProcessFunction, ValueStateDescriptor
from reactive.connectors.collections import DiscardingSink


class Count(KeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def process_element(self, word: str, ctx: Any) -> Any:
        n = self.count.value() + 1
        self.count.update(n)
        return [(word, n)]


class CollectingCount(Count):
    """The same count emitting through the ``out`` collector (no list per record)."""

    def process_element(self, word: str, ctx: Any, out: list[Any]) -> None:  # type: ignore[override]
        n = self.count.value() + 1
        self.count.update(n)
        out.append((word, n))


MIN_SECONDS = 2.0
"""The baselines repeat their loop over the keys until they ran this long, so their own
timing noise does not dominate the ratios."""


Rates = tuple[float, float]
"""(records per wall-clock second, records per CPU second) of one run."""


def bare_loop(keys: list[str]) -> Rates:
    """Rates of a plain dict count over the keys (repeated for >= MIN_SECONDS)."""
    done, t, c = 0, time.perf_counter(), time.process_time()
    while True:
        counts: dict[str, int] = {}
        get = counts.get
        for k in keys:
            counts[k] = get(k, 0) + 1
        done += len(keys)
        elapsed = time.perf_counter() - t
        if elapsed >= MIN_SECONDS:
            return done / elapsed, done / (time.process_time() - c)


def per_record_calls(keys: list[str], batch_size: int = 1024) -> Rates:
    """Rates of the calls the pipeline makes per record and nothing else: key selector,
    ``set_current_key`` on a heap backend, ``CollectingCount.process_element`` (state
    ``value`` and ``update``, ``out.append``), in a plain loop over batches. The ceiling for
    any runtime that calls a Python function with Python state per record."""
    from reactive.backends.heap import HeapKeyedStateBackend
    from reactive.keygroups import KeyGroupRange

    backend = HeapKeyedStateBackend(KeyGroupRange(0, 127), 128)

    class Ctx:
        get_state = backend.get_state

    fn = CollectingCount()
    fn.open(Ctx())
    process = fn.process_element
    set_key = backend.set_current_key
    key_of = (lambda w: w)  # noqa: E731 - the pipeline's key selector
    done, t, c = 0, time.perf_counter(), time.process_time()
    while True:
        for i in range(0, len(keys), batch_size):
            out: list[Any] = []
            for r in keys[i:i + batch_size]:
                set_key(key_of(r))
                process(r, None, out)
        done += len(keys)
        elapsed = time.perf_counter() - t
        if elapsed >= MIN_SECONDS:
            return done / elapsed, done / (time.process_time() - c)


async def pipeline(keys: list[str], parallelism: int, interval: float | None,
                   directory: str, fn: KeyedProcessFunction | None = None
                   ) -> tuple[Rates, Any]:
    flow = Dataflow("w1", parallelism=parallelism, max_parallelism=128)
    (flow.from_collection(keys).key_by(lambda w: w).process(fn or Count()).uid("count")
         .sink(DiscardingSink()))
    config = CheckpointConfig(history=ALL_CHECKPOINTS, interval=interval,
                              directory=directory) if interval else None
    t, c = time.perf_counter(), time.process_time()
    job = await flow.run(checkpoints=config)
    return (len(keys) / (time.perf_counter() - t), len(keys) / (time.process_time() - c)), job


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description="W1 keyed-count benchmark")
    p.add_argument("--records", type=int, default=6_000_000)
    p.add_argument("--vocabulary", type=int, default=100_000)
    p.add_argument("--parallelism", type=int, default=1)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--png", default=str(RESULTS / "w1.png"),
                   help="bar chart of the ratios (default: %(default)s)")
    p.add_argument("--no-png", dest="png", action="store_const", const=None,
                   help="do not write the bar chart")
    args = p.parse_args(argv)
    keys = zipf_keys(args.records, args.vocabulary)
    from reactive.runtime.loop import run_coroutine

    names = ["bare Python loop", "the per-record calls alone (no runtime)",
             "pipeline, no checkpoints", f"pipeline, checkpoints every {args.interval:g} s",
             f"pipeline, `out` collector, checkpoints every {args.interval:g} s"]
    runs: dict[str, list[Rates]] = {name: [] for name in names}
    job: Any = None
    for _ in range(args.repeats):
        runs[names[0]].append(bare_loop(keys))
        runs[names[1]].append(per_record_calls(keys))
        with tempfile.TemporaryDirectory() as d:
            rates, _ = run_coroutine(pipeline(keys, args.parallelism, None, d))
            runs[names[2]].append(rates)
            rates, job = run_coroutine(pipeline(keys, args.parallelism, args.interval, d))
            runs[names[3]].append(rates)
        with tempfile.TemporaryDirectory() as d:
            rates, _ = run_coroutine(pipeline(keys, args.parallelism, args.interval, d,
                                              CollectingCount()))
            runs[names[4]].append(rates)
    done = job.metrics.completed_checkpoints
    wall = {n: statistics.median(r[0] for r in runs[n]) for n in names}
    cpu = {n: statistics.median(r[1] for r in runs[n]) for n in names}

    def spread(n: str) -> str:
        rates = sorted(r[0] for r in runs[n])
        return " / ".join(f"{v / 1e3:,.0f}k" for v in (rates[0], wall[n], rates[-1]))

    print(f"W1: {args.records:,} Zipf(1.1) keys over {args.vocabulary:,} words, "
          f"parallelism {args.parallelism}, checkpoints every {args.interval} s, "
          f"{args.repeats} repeats (min / median / max)")
    bare, plain = names[0], names[2]
    table = print_table(
        ["run", "records/s", "vs bare loop", "vs no checkpoints", "records per CPU s",
         "CPU: vs bare loop", "CPU: vs no checkpoints"],
        [[n, spread(n), wall[n] / wall[bare],
          "-" if i < 2 else wall[n] / wall[plain], cpu[n], cpu[n] / cpu[bare],
          "-" if i < 2 else cpu[n] / cpu[plain]] for i, n in enumerate(names)],
    )
    print()
    if args.png:
        write_ratio_png(table, args.png, f"W1: {args.records:,} Zipf(1.1) keys, parallelism "
                        f"{args.parallelism}, checkpoints every {args.interval:g} s")
        print()
    rows = [[c.checkpoint_id, c.alignment * 1e3, c.sync * 1e3, c.async_ * 1e3, c.size]
            for c in done]
    if done:
        rows.append(["median", statistics.median(c.alignment for c in done) * 1e3,
                     statistics.median(c.sync for c in done) * 1e3,
                     statistics.median(c.async_ for c in done) * 1e3,
                     int(statistics.median(c.size for c in done))])
    table += "\n\n" + print_table(
        ["checkpoint", "alignment ms", "sync part ms", "async part ms", "bytes"], rows)
    print(f"\npeak RSS {peak_rss_mb():,.0f} MiB")
    return table


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    main()
