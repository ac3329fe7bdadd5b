"""Columnar event-time windows with their panes in RocksDB against the heap, in one
invocation.

    python -m bench.columnar_windows_rocksdb [--records 1000000] [--keys 20000]
                                             [--repeats 3] [--batch-rows 65536]
                                             [--interval 1.0]

The pipeline: ``from_arrow -> assign_timestamps("ts", 5) -> key_by("user") ->
window(TumblingEventTimeWindows.of(60), timestamp="ts") -> agg(count, sum) -> discarding
sink``, checkpoints every ``--interval`` s, over ``--records`` rows of ``--keys`` Zipf(1.1)
users (``bench.common.zipf_keys``, numpy seed 42), 100 rows per second of event time (so
each window holds 6,000 rows over the keys active in its minute). Rows, each repeated
``--repeats`` times, interleaved (min / median / max rows/s; ratios of medians against the
heap):

- the heap backend (panes in arrays, full Arrow IPC snapshots of the open windows);
- ``RocksDBStateBackend`` (incremental checkpoints), the operator's default cache of keys
  (every key fits: rows go to RocksDB at each checkpoint);
- ``RocksDBStateBackend`` with a cache of ``--keys / 8`` keys (batches read and write the
  panes of most keys in RocksDB; evicted keys come back by their timers).
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

from bench.common import peak_rss_mb, print_table, zipf_keys
from reactive import CheckpointConfig, Dataflow, TumblingEventTimeWindows
from reactive.backends.heap import HeapStateBackend
from reactive.backends.rocksdb import RocksDBStateBackend
from reactive.columnar.window_operator import ColumnarWindowOperator
from reactive.connectors.collections import DiscardingSink

DEFAULT_CACHE = ColumnarWindowOperator.cache_keys


async def pipeline(table: pa.Table, batch_rows: int, interval: float, directory: str,
                   backend: str, cache_keys: int) -> float:
    """Rows/s of one run."""
    flow = Dataflow("windows-rocksdb", max_parallelism=128)
    (flow.from_arrow(table, batch_size=batch_rows).assign_timestamps("ts", 5.0)
         .key_by("user").window(TumblingEventTimeWindows.of(60), timestamp="ts")
         .agg(n=("v", "count"), total=("v", "sum")).uid("windows").sink(DiscardingSink()))
    state: Any = HeapStateBackend() if backend == "heap" else \
        RocksDBStateBackend(f"{directory}/work", incremental=True)
    ColumnarWindowOperator.cache_keys = cache_keys
    try:
        t = time.perf_counter()
        await flow.run(checkpoints=CheckpointConfig(interval=interval,
                                                    directory=f"{directory}/chk"),
                       state_backend=state)
        return table.num_rows / (time.perf_counter() - t)
    finally:
        ColumnarWindowOperator.cache_keys = DEFAULT_CACHE


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description="columnar windows: RocksDB panes vs heap")
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--keys", type=int, default=20_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch-rows", type=int, default=65536)
    p.add_argument("--interval", type=float, default=1.0)
    args = p.parse_args(argv)
    n = args.records
    table = pa.table({"user": zipf_keys(n, args.keys), "ts": np.arange(n) / 100.0,
                      "v": np.arange(n) % 97})
    runs = [("heap", "heap", DEFAULT_CACHE), ("RocksDB, default cache", "rocksdb", DEFAULT_CACHE),
            (f"RocksDB, cache of {args.keys // 8:,} keys", "rocksdb", args.keys // 8)]
    rates: dict[str, list[float]] = {name: [] for name, _, _ in runs}
    for _ in range(args.repeats):
        for name, backend, cache in runs:
            with tempfile.TemporaryDirectory() as d:
                rate = asyncio.run(pipeline(table, args.batch_rows, args.interval, d, backend,
                                            cache))
            rates[name].append(rate)
            print(f"  {name}: {rate:,.0f} rows/s", flush=True)
    print(f"\ncolumnar tumbling windows (60 s) over {n:,} rows, {args.keys:,} Zipf(1.1) keys, "
          f"checkpoints every {args.interval:g} s, {args.repeats} repeats")
    base = statistics.median(rates["heap"])
    rows = [[name, min(r), statistics.median(r), max(r), statistics.median(r) / base]
            for name, r in rates.items()]
    table_text = print_table(["run", "min rows/s", "median rows/s", "max rows/s",
                              "median vs heap"], rows)
    print(f"\npeak RSS {peak_rss_mb():,.0f} MiB")
    return table_text


if __name__ == "__main__":
    main()
