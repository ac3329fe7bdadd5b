"""State backends on W1: heap vs RocksDB full vs RocksDB incremental, against a bare loop.

    python -m bench.state_backends [--records 2000000] [--vocabulary 100000]
                                   [--interval 1.0] [--parallelism 1] [--skip-distinct]

Runs in one process: a bare Python loop counting the keys (the baseline), then the W1
pipeline ``from_collection -> key_by -> KeyedProcessFunction count -> discarding sink`` with
checkpoints every ``--interval`` seconds on the heap backend, RocksDB with full snapshots and
RocksDB with incremental snapshots. Two inputs: Zipf(1.1) keys over ``--vocabulary`` words
(numpy seed 42), and every key distinct (``--records`` keys, state far larger than the
RocksDB write-back cache). Prints records/s, ratios to the bare loop and to the heap backend,
bytes per checkpoint (median of all, and of the last half: once the key set is stable), the
synchronous pause (max and median, ms) and the asynchronous part (median and max, ms).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import ALL_CHECKPOINTS, SilentCount, peak_rss_mb, print_table, zipf_keys
from bench.w1 import bare_loop
from reactive import (
    CheckpointConfig,
    CheckpointStats,
    Dataflow,
    StateBackend,
)
from reactive.backends.heap import HeapStateBackend
from reactive.backends.rocksdb import RocksDBStateBackend
from reactive.connectors.collections import DiscardingSink

__all__ = ["main"]


async def pipeline(keys: list[str], parallelism: int, interval: float, directory: Path,
                   backend: StateBackend) -> tuple[float, list[CheckpointStats]]:
    """Run W1 with ``backend``; return (records/s, completed checkpoints)."""
    flow = Dataflow("w1", parallelism=parallelism, max_parallelism=128)
    (flow.from_collection(keys).key_by(lambda w: w).process(SilentCount()).uid("count")
         .sink(DiscardingSink()))
    t = time.perf_counter()
    job = await flow.run(checkpoints=CheckpointConfig(
        history=ALL_CHECKPOINTS, interval=interval, directory=directory), state_backend=backend)
    return len(keys) / (time.perf_counter() - t), job.metrics.completed_checkpoints


def _ms(values: list[float], fn: Callable[[list[float]], float]) -> float:
    return fn(values) * 1e3 if values else 0.0


def run_workload(title: str, keys: list[str], args: argparse.Namespace) -> str:
    """Run the bare loop and the three backends on ``keys``; print and return the tables."""
    from reactive.runtime.loop import run_coroutine

    bare = bare_loop(keys)
    rows: list[list[Any]] = []
    heap_rate = 0.0
    for name in ("heap", "rocksdb full", "rocksdb incremental"):
        with tempfile.TemporaryDirectory(prefix="bench-state-") as d:
            backend: StateBackend
            if name == "heap":
                backend = HeapStateBackend()
            else:
                backend = RocksDBStateBackend(path=Path(d) / "state",
                                              incremental=name.endswith("incremental"))
            rate, done = run_coroutine(
                pipeline(keys, args.parallelism, args.interval, Path(d) / "chk", backend))
        if name == "heap":
            heap_rate = rate
        # the job's final checkpoint is taken after the input ended: report periodic ones
        periodic = done[:-1] or done
        sync = [c.sync for c in periodic]
        async_ = [c.async_ for c in periodic]
        sizes = [c.size for c in periodic]
        stable = sizes[len(sizes) // 2:]
        rows.append([
            name, rate, rate / bare, rate / heap_rate, len(periodic),
            int(statistics.median(sizes)) if sizes else 0,
            int(statistics.median(stable)) if stable else 0,
            _ms(sync, max), _ms(sync, statistics.median),
            _ms(async_, statistics.median), _ms(async_, max),
        ])
    print(f"\n{title}")
    table = print_table(
        ["backend", "records/s", "vs bare loop", "vs heap", "checkpoints",
         "bytes/checkpoint (median)", "bytes/checkpoint (last half)",
         "sync max ms", "sync median ms", "async median ms", "async max ms"],
        [["bare Python loop", bare, 1.0, "-", "-", "-", "-", "-", "-", "-", "-"], *rows],
    )
    return f"{title}\n{table}"


def main(argv: list[str] | None = None) -> str:
    """Parse the command line, run both workloads, return the printed tables."""
    p = argparse.ArgumentParser(description="W1 on the heap and RocksDB state backends")
    p.add_argument("--records", type=int, default=2_000_000)
    p.add_argument("--vocabulary", type=int, default=100_000)
    p.add_argument("--parallelism", type=int, default=1)
    p.add_argument("--interval", type=float, default=1.0, help="seconds between checkpoints")
    p.add_argument("--skip-distinct", action="store_true",
                   help="only the Zipf input, not the all-distinct-keys one")
    args = p.parse_args(argv)
    out = [run_workload(
        f"W1: {args.records:,} Zipf(1.1) keys over {args.vocabulary:,} words, parallelism "
        f"{args.parallelism}, checkpoints every {args.interval:g} s",
        zipf_keys(args.records, args.vocabulary), args)]
    if not args.skip_distinct:
        rng = np.random.default_rng(42)
        distinct = [f"k{i}" for i in rng.permutation(args.records).tolist()]
        out.append(run_workload(
            f"W1 distinct: {args.records:,} distinct keys, parallelism {args.parallelism}, "
            f"checkpoints every {args.interval:g} s", distinct, args))
    print(f"\npeak RSS {peak_rss_mb():,.0f} MiB")
    return "\n\n".join(out)


if __name__ == "__main__":
    import sys

    # run as a script: make the repository importable like ``python -m bench.state_backends``
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    asyncio.set_event_loop_policy(None)
    main()
