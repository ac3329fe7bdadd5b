"""W1: keyed count of Zipf(1.1) keys, without and with checkpoints, against a bare loop.

    python -m bench.w1 [--records 6000000] [--vocabulary 100000] [--parallelism 1]
                       [--png bench/results/w1.png | --no-png]

Runs in one process, in this order: a bare Python loop counting the same keys (the
baseline), the pipeline ``from_collection -> key_by -> KeyedProcessFunction count ->
discarding sink`` without checkpoints, the same with checkpoints every second (heap
backend), and that again with the function appending to the ``out`` collector instead of
returning a list per record. A second baseline row times only the calls the pipeline
makes per record (key selector, ``set_current_key``, the function with its state ``value`` /
``update`` and ``out.append``) in a plain loop: what a runtime calling Python per record
cannot beat. Prints records/s, the ratios to the bare loop and to the run without
checkpoints, and per checkpoint the alignment, synchronous part, asynchronous part (ms)
and bytes. The ratios are also drawn as a bar chart PNG (``--png``; skipped, with a line
saying so, when matplotlib, the ``plot`` extra, is missing).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from typing import Any

from bench.common import peak_rss_mb, print_table, zipf_keys
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


def bare_loop(keys: list[str]) -> float:
    """Records/s of a plain dict count over the keys (repeated for >= MIN_SECONDS)."""
    done, t = 0, time.perf_counter()
    while True:
        counts: dict[str, int] = {}
        get = counts.get
        for k in keys:
            counts[k] = get(k, 0) + 1
        done += len(keys)
        elapsed = time.perf_counter() - t
        if elapsed >= MIN_SECONDS:
            return done / elapsed


def per_record_calls(keys: list[str], batch_size: int = 1024) -> float:
    """Records/s of the calls the pipeline makes per record and nothing else: key selector,
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
    done, t = 0, time.perf_counter()
    while True:
        for i in range(0, len(keys), batch_size):
            out: list[Any] = []
            for r in keys[i:i + batch_size]:
                set_key(key_of(r))
                process(r, None, out)
        done += len(keys)
        elapsed = time.perf_counter() - t
        if elapsed >= MIN_SECONDS:
            return done / elapsed


async def pipeline(keys: list[str], parallelism: int, interval: float | None,
                   directory: str, fn: KeyedProcessFunction | None = None
                   ) -> tuple[float, Any]:
    flow = Dataflow("w1", parallelism=parallelism, max_parallelism=128)
    (flow.from_collection(keys).key_by(lambda w: w).process(fn or Count()).uid("count")
         .sink(DiscardingSink()))
    config = CheckpointConfig(interval=interval, directory=directory) if interval else None
    t = time.perf_counter()
    job = await flow.run(checkpoints=config)
    return len(keys) / (time.perf_counter() - t), job


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description="W1 keyed-count benchmark")
    p.add_argument("--records", type=int, default=6_000_000)
    p.add_argument("--vocabulary", type=int, default=100_000)
    p.add_argument("--parallelism", type=int, default=1)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--png", default=str(RESULTS / "w1.png"),
                   help="bar chart of the ratios (default: %(default)s)")
    p.add_argument("--no-png", dest="png", action="store_const", const=None,
                   help="do not write the bar chart")
    args = p.parse_args(argv)
    keys = zipf_keys(args.records, args.vocabulary)
    from reactive.runtime.loop import run_coroutine

    bare = bare_loop(keys)
    calls = per_record_calls(keys)
    with tempfile.TemporaryDirectory() as d:
        plain, _ = run_coroutine(pipeline(keys, args.parallelism, None, d))
        chk_rate, job = run_coroutine(pipeline(keys, args.parallelism, args.interval, d))
    with tempfile.TemporaryDirectory() as d:
        out_rate, _ = run_coroutine(pipeline(keys, args.parallelism, args.interval, d,
                                             CollectingCount()))
    done = job.metrics.completed_checkpoints
    print(f"W1: {args.records:,} Zipf(1.1) keys over {args.vocabulary:,} words, "
          f"parallelism {args.parallelism}, checkpoints every {args.interval} s")
    table = print_table(
        ["run", "records/s", "vs bare loop", "vs no checkpoints"],
        [["bare Python loop", bare, 1.0, "-"],
         ["the per-record calls alone (no runtime)", calls, calls / bare, "-"],
         ["pipeline, no checkpoints", plain, plain / bare, 1.0],
         [f"pipeline, checkpoints every {args.interval:g} s", chk_rate, chk_rate / bare,
          chk_rate / plain],
         [f"pipeline, `out` collector, checkpoints every {args.interval:g} s", out_rate,
          out_rate / bare, out_rate / plain]],
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
