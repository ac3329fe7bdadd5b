"""W1 columnar with the aggregation's state in RocksDB against the heap, in one invocation.

    python -m bench.w1_columnar_rocksdb [--records 2000000] [--vocabulary 100000]
                                        [--repeats 3] [--batch-rows 65536] [--interval 1.0]

Rows, each repeated ``--repeats`` times, interleaved (min / median / max; ratios of
medians against the heap row of the same keys): bench.w1_columnar's pipeline
(``from_arrow -> key_by("word") -> agg(count) -> discarding sink``, each row's running
count emitted, checkpoints every ``--interval`` s) with string keys and with
dictionary-encoded keys, with

- the heap backend (columnar arrays, incremental Arrow IPC snapshots);
- ``RocksDBStateBackend`` (incremental checkpoints), the operator's default cache of
  slots (every key of the vocabulary fits: rows go to RocksDB at each checkpoint);
- ``RocksDBStateBackend`` with a cache of ``--vocabulary / 8`` slots (most batches read
  and write rows in RocksDB).

Beside the rates, each run's process CPU time (every thread's; median), and the heap
row's over it: on a shared machine the CPU a backend adds reads more steadily than its rate.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from typing import Any

import pyarrow as pa

from bench.common import peak_rss_mb, print_table, zipf_keys
from reactive import CheckpointConfig, Dataflow
from reactive.backends.heap import HeapStateBackend
from reactive.backends.rocksdb import RocksDBStateBackend
from reactive.columnar.aggregate_operator import ColumnarAggregateOperator
from reactive.connectors.collections import DiscardingSink

DEFAULT_CACHE = ColumnarAggregateOperator.cache_slots


async def pipeline(table: pa.Table, batch_rows: int, interval: float, directory: str,
                   backend: str, cache_slots: int) -> tuple[float, Any, float]:
    """One run: (records/s, the job, the process's CPU seconds, every thread's)."""
    flow = Dataflow("w1-columnar-rocksdb", max_parallelism=128)
    (flow.from_arrow(table, batch_size=batch_rows).key_by("word")
         .agg(count=("word", "count")).uid("count").sink(DiscardingSink()))
    state: Any = HeapStateBackend(incremental=True) if backend == "heap" else \
        RocksDBStateBackend(f"{directory}/work", incremental=True)
    ColumnarAggregateOperator.cache_slots = cache_slots
    try:
        t, cpu = time.perf_counter(), time.process_time()
        job = await flow.run(checkpoints=CheckpointConfig(interval=interval,
                                                          directory=f"{directory}/chk"),
                             state_backend=state)
        return (table.num_rows / (time.perf_counter() - t), job,
                time.process_time() - cpu)
    finally:
        ColumnarAggregateOperator.cache_slots = DEFAULT_CACHE


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description="W1 columnar: RocksDB state vs heap")
    p.add_argument("--records", type=int, default=2_000_000)
    p.add_argument("--vocabulary", type=int, default=100_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch-rows", type=int, default=65_536)
    p.add_argument("--interval", type=float, default=1.0)
    args = p.parse_args(argv)
    keys = zipf_keys(args.records, args.vocabulary)
    strings = pa.table({"word": pa.array(keys, pa.string())})
    dictionary = pa.table({"word": strings.column("word").combine_chunks().dictionary_encode()})
    from reactive.runtime.loop import run_coroutine

    small = max(1, args.vocabulary // 8)
    spec: list[tuple[str, str, pa.Table, str, int]] = []
    for kind, table in (("str", strings), ("dictionary", dictionary)):
        heap = f"{kind} keys, heap (incremental)"
        spec += [(heap, heap, table, "heap", DEFAULT_CACHE),
                 (f"{kind} keys, RocksDB incremental, {DEFAULT_CACHE:,}-slot cache", heap,
                  table, "rocksdb", DEFAULT_CACHE),
                 (f"{kind} keys, RocksDB incremental, {small:,}-slot cache", heap, table,
                  "rocksdb", small)]
    runs: dict[str, list[float]] = {s[0]: [] for s in spec}
    cpus: dict[str, list[float]] = {s[0]: [] for s in spec}
    jobs: dict[str, Any] = {}
    for _ in range(args.repeats):
        for name, _, table, backend, cache in spec:
            with tempfile.TemporaryDirectory() as d:
                rate, jobs[name], cpu = run_coroutine(pipeline(
                    table, args.batch_rows, args.interval, d, backend, cache))
            runs[name].append(rate)
            cpus[name].append(cpu)
    med = {n: statistics.median(r) for n, r in runs.items()}

    def spread(n: str) -> str:
        r = sorted(runs[n])
        return " / ".join(f"{v / 1e6:,.2f} M" for v in (r[0], med[n], r[-1]))

    def ratios(n: str, base: str) -> str:
        b = med[base]
        r = sorted(v / b for v in runs[n])
        return " / ".join(f"{v:.2f}" for v in (r[0], med[n] / b, r[-1]))

    def sync_ms(n: str) -> str:
        done = jobs[n].metrics.completed_checkpoints
        return f"{max((c.sync for c in done), default=0.0) * 1e3:.1f}"

    print(f"W1 columnar, RocksDB vs heap: {args.records:,} Zipf(1.1) keys over "
          f"{args.vocabulary:,} words, parallelism 1, {args.batch_rows:,}-row record "
          f"batches, checkpoints every {args.interval:g} s, {args.repeats} repeats "
          "(min / median / max)")
    def cpu(n: str, base: str) -> str:
        c = statistics.median(cpus[n])
        return f"{c * 1e3:,.0f} ms ({statistics.median(cpus[base]) / c:.2f})"

    table_text = print_table(
        ["run", "records/s", "vs heap (min / median / max)", "max sync part ms (last)",
         "process CPU (median; heap's / this)"],
        [[n, spread(n), ratios(n, base), sync_ms(n), cpu(n, base)] for n, base, *_ in spec])
    print(f"\npeak RSS {peak_rss_mb():,.0f} MiB")
    return table_text


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    main()
