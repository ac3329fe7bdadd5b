"""The cost of a time-to-live on columnar W1: ``key_by("word").agg(count=..., ttl=...)``
against the same aggregation without one, in one invocation.

    python -m bench.w1_columnar_ttl [--records 2000000] [--vocabulary 100000] [--repeats 3]
                                    [--batch-rows 65536] [--interval 1.0]
                                    [--backend heap|rocksdb]

Rows, interleaved, each repeated ``--repeats`` times (min / median / max of the wall
time's and of the process's CPU time's rates; ratios against the median of the run without
ttl): W1 on the columnar API (bench.w1_columnar's string-key
pipeline, checkpoints every ``--interval`` s) without a ttl; with ``ttl=3600`` (nothing
expires: the price of stamping and checking); with ``ttl=0.05`` (a key not seen for 0.05 s,
the cold keys of the Zipf distribution, expires: the reset of expired slots and the
snapshots' filter do work). ``--backend rocksdb`` runs the three on the RocksDB slot store
(incremental checkpoints; with a ttl, the sweep of expired rows does work too).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time

import pyarrow as pa

from bench.common import print_table, zipf_keys
from reactive import CheckpointConfig, Dataflow
from reactive.connectors.collections import DiscardingSink


async def pipeline(table: pa.Table, batch_rows: int, interval: float, directory: str,
                   ttl: float | None, backend: str = "heap") -> tuple[float, float]:
    flow = Dataflow("w1-columnar-ttl", max_parallelism=128)
    (flow.from_arrow(table, batch_size=batch_rows).key_by("word")
         .agg(count=("word", "count"), ttl=ttl).uid("count").sink(DiscardingSink()))
    t, c = time.perf_counter(), time.process_time()
    state_backend = None
    if backend == "rocksdb":
        from reactive.backends.rocksdb import RocksDBStateBackend

        state_backend = RocksDBStateBackend(path=f"{directory}/db", incremental=True)
    await flow.run(checkpoints=CheckpointConfig(interval=interval, directory=directory),
                   state_backend=state_backend)
    n = table.num_rows
    return n / (time.perf_counter() - t), n / (time.process_time() - c)


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description="the cost of a ttl on columnar W1")
    p.add_argument("--records", type=int, default=2_000_000)
    p.add_argument("--vocabulary", type=int, default=100_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch-rows", type=int, default=65_536)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--backend", choices=("heap", "rocksdb"), default="heap")
    args = p.parse_args(argv)
    table = pa.table({"word": pa.array(zipf_keys(args.records, args.vocabulary), pa.string())})
    from reactive.runtime.loop import run_coroutine

    runs_spec: list[tuple[str, float | None]] = [
        ("no ttl", None), ("ttl 3600 s (nothing expires)", 3600.0),
        ("ttl 0.05 s (cold keys expire)", 0.05)]
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in runs_spec}
    for _ in range(args.repeats):
        for name, ttl in runs_spec:
            with tempfile.TemporaryDirectory() as d:
                runs[name].append(run_coroutine(
                    pipeline(table, args.batch_rows, args.interval, d, ttl, args.backend)))

    def row(name: str) -> list[str]:
        out = [name]
        for i in (0, 1):  # wall time, then the process's CPU time
            base = statistics.median(r[i] for r in runs["no ttl"])
            rates = sorted(r[i] for r in runs[name])
            spread = (rates[0], statistics.median(rates), rates[-1])
            out += [" / ".join(f"{v / 1e6:,.2f} M" for v in spread),
                    " / ".join(f"{v / base:.2f}" for v in spread)]
        return out

    print(f"columnar W1 with a ttl ({args.backend}): {args.records:,} Zipf(1.1) keys over "
          f"{args.vocabulary:,} words, parallelism 1, {args.batch_rows:,}-row record "
          f"batches, checkpoints every {args.interval:g} s, {args.repeats} repeats "
          "(min / median / max)")
    return print_table(["run", "records/s", "vs no ttl's median", "records per CPU s",
                        "CPU: vs no ttl's median"],
                       [row(name) for name, _ in runs_spec])


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    main()
