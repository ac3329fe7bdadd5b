"""Checkpoints of columnar keyed state: full against incremental, at a state of many keys.

    python -m bench.columnar_checkpoints [--keys 1000000] [--updates 4000000]
                                         [--changed 0.01] [--interval 0.5] [--repeats 3]

The input first inserts ``--keys`` distinct int64 keys once each, then ``--updates`` rows
whose keys are drawn from a fixed ``--changed`` share of them (so between two checkpoints
about that share of the state changes); ``from_arrow -> key_by("k") -> agg(count, sum) ->
discarding sink``, parallelism 1, 65,536-row batches. Rows: without checkpoints, with full
checkpoints and with incremental ones every ``--interval`` s (``HeapStateBackend(
incremental=...)``: the columnar state follows the job backend's flag), each repeated and
interleaved (min / median / max of records/s; ratios of each repeat to the median of
the run without checkpoints; process CPU seconds, every thread's, against that run: on a
shared machine the CPU a checkpoint adds reads more steadily than its rate). Then, for the
last repeat of each checkpointed row, the median synchronous part, asynchronous part and
bytes per checkpoint, excluding the first (which holds the inserts).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from typing import Any

import numpy as np
import pyarrow as pa

from bench.common import peak_rss_mb, print_table
from reactive import CheckpointConfig, Dataflow
from reactive.backends.heap import HeapStateBackend
from reactive.connectors.collections import DiscardingSink


def workload(keys: int, updates: int, changed: float, seed: int = 1) -> pa.Table:
    rng = np.random.default_rng(seed)
    inserts = rng.permutation(keys).astype(np.int64)
    hot = rng.choice(keys, size=max(1, int(keys * changed)), replace=False)
    rows = np.concatenate([inserts, hot[rng.integers(0, len(hot), updates)]])
    return pa.table({"k": rows, "v": rng.integers(0, 100, len(rows))})


async def run(table: pa.Table, interval: float | None, incremental: bool, directory: str
              ) -> tuple[float, Any, float]:
    """One run: (records/s, the job, the process's CPU seconds, every thread's)."""
    flow = Dataflow("columnar-checkpoints")
    (flow.from_arrow(table, batch_size=65_536).key_by("k")
         .agg(count=("v", "count"), total=("v", "sum")).uid("agg").sink(DiscardingSink()))
    config = CheckpointConfig(interval=interval, directory=directory) if interval else None
    t, cpu = time.perf_counter(), time.process_time()
    job = await flow.run(checkpoints=config,
                         state_backend=HeapStateBackend(incremental=incremental))
    return (table.num_rows / (time.perf_counter() - t), job,
            time.process_time() - cpu)


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description="columnar checkpoints, full vs incremental")
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--updates", type=int, default=4_000_000)
    p.add_argument("--changed", type=float, default=0.01)
    p.add_argument("--interval", type=float, default=0.5)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    table = workload(args.keys, args.updates, args.changed)
    from reactive.runtime.loop import run_coroutine

    specs = [("no checkpoints", None, False),
             (f"full checkpoints every {args.interval:g} s", args.interval, False),
             (f"incremental checkpoints every {args.interval:g} s", args.interval, True)]
    rates: dict[str, list[float]] = {s[0]: [] for s in specs}
    cpus: dict[str, list[float]] = {s[0]: [] for s in specs}
    jobs: dict[str, Any] = {}
    for _ in range(args.repeats):
        for name, interval, incremental in specs:
            with tempfile.TemporaryDirectory() as d:
                rate, jobs[name], cpu = run_coroutine(run(table, interval, incremental, d))
            rates[name].append(rate)
            cpus[name].append(cpu)
    base = statistics.median(rates[specs[0][0]])
    base_cpu = statistics.median(cpus[specs[0][0]])
    print(f"Columnar checkpoints: {args.keys:,} keys inserted, then {args.updates:,} updates "
          f"of {args.changed:.0%} of them, {args.repeats} repeats (min / median / max)")
    def spread(values: list[float], scale: float) -> str:
        v = sorted(x / scale for x in values)
        return " / ".join(f"{x:.2f}" for x in (v[0], statistics.median(v), v[-1]))

    table_text = print_table(
        ["run", "records/s", "vs no checkpoints (min / median / max)",
         "process CPU s (median)", "CPU vs no checkpoints"],
        [[n, " / ".join(f"{v / 1e6:.2f} M" for v in (min(r), statistics.median(r), max(r))),
          spread(r, base), f"{statistics.median(cpus[n]):.1f}",
          f"{statistics.median(cpus[n]) / base_cpu:.2f}"] for n, r in rates.items()])
    rows = []
    for name, _, _ in specs[1:]:
        done = jobs[name].metrics.completed_checkpoints[1:] or \
            jobs[name].metrics.completed_checkpoints
        rows.append([name, len(done), statistics.median(c.sync for c in done) * 1e3,
                     statistics.median(c.async_ for c in done) * 1e3,
                     int(statistics.median(c.size for c in done))])
    print()
    table_text += "\n\n" + print_table(
        ["checkpoints (last repeat, after the first)", "count", "sync part ms (median)",
         "async part ms (median)", "bytes (median)"], rows)
    print(f"\npeak RSS {peak_rss_mb():,.0f} MiB")
    return table_text


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    main()
