"""Exactly-once output: W1 into the committing file sink (JSON lines, Parquet) against the same
pipeline into a discarding sink, checkpoints every second, in one invocation.

    python -m bench.exactly_once_sink [--records 2000000] [--vocabulary 100000]
        [--parallelism 1] [--interval 1.0] [--rounds 2]

Workload W1: a keyed count (``from_collection -> key_by -> KeyedProcessFunction count ->
sink``) of Zipf(1.1) keys over a 100,000-word vocabulary (numpy seed 42), heap backend. Each
round runs the three sinks one after the other; the table shows the median records/s over
the rounds and its ratio to the discarding sink (the issue's aim: exactly-once output costs
<= 15% throughput), the checkpoints' median synchronous part (where the sink pre-commits:
flush, fsync, rename) and the commit latency: from the checkpoint's trigger to the moment the
last subtask's part file of that checkpoint is renamed into the directory (visible), median
and max over all checkpoints of all rounds (the final checkpoint included).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import ALL_CHECKPOINTS, peak_rss_mb, print_table, zipf_keys
from bench.w1 import Count
from reactive import CheckpointConfig, Dataflow, Sink
from reactive.connectors.collections import DiscardingSink
from reactive.connectors.files import CommittingFileSink, FileTransaction


class TimedFileSink(CommittingFileSink):
    """The committing file sink, noting when each checkpoint's part file became visible.

    ``visible`` is shared by the per-subtask copies: checkpoint id -> the latest time
    (``time.time()``, seconds) at which a subtask committed its file of that checkpoint.
    """

    def __init__(self, directory: Path, fmt: str) -> None:
        schema = None
        if fmt == "parquet":
            import pyarrow as pa

            schema = pa.schema([("word", pa.string()), ("count", pa.int64())])
        super().__init__(directory, format=fmt, schema=schema)
        self.visible: dict[int, float] = {}

    def commit(self, txn: FileTransaction) -> None:
        super().commit(txn)
        assert txn.checkpoint_id is not None
        now = time.time()
        self.visible[txn.checkpoint_id] = max(now, self.visible.get(txn.checkpoint_id, now))


async def run_w1(keys: list[str], sink: Sink, parallelism: int, interval: float,
                 directory: str) -> tuple[float, Any]:
    """Run W1 into ``sink``; return (records/s, the finished job)."""
    flow = Dataflow("w1-eos", parallelism=parallelism, max_parallelism=128)
    (flow.from_collection(keys).key_by(lambda w: w).process(Count()).uid("count")
         .sink(sink).uid("sink"))
    t = time.perf_counter()
    job = await flow.run(checkpoints=CheckpointConfig(
        history=ALL_CHECKPOINTS, interval=interval, directory=directory))
    return len(keys) / (time.perf_counter() - t), job


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description="exactly-once sink cost on W1")
    p.add_argument("--records", type=int, default=2_000_000)
    p.add_argument("--vocabulary", type=int, default=100_000)
    p.add_argument("--parallelism", type=int, default=1)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    keys = zipf_keys(args.records, args.vocabulary)
    from reactive.runtime.loop import run_coroutine

    variants = ["discarding sink", "committing files, jsonl", "committing files, parquet"]
    rates: dict[str, list[float]] = {v: [] for v in variants}
    syncs: dict[str, list[float]] = {v: [] for v in variants}
    latencies: dict[str, list[float]] = {v: [] for v in variants}
    sizes: dict[str, int] = {v: 0 for v in variants}
    files: dict[str, int] = {v: 0 for v in variants}
    for _ in range(args.rounds):
        for v in variants:
            with tempfile.TemporaryDirectory() as d:
                out = Path(d) / "out"
                sink: Sink = DiscardingSink() if v == variants[0] else \
                    TimedFileSink(out, "jsonl" if "jsonl" in v else "parquet")
                rate, job = run_coroutine(
                    run_w1(keys, sink, args.parallelism, args.interval, str(Path(d) / "chk")))
                rates[v].append(rate)
                done = job.metrics.completed_checkpoints
                syncs[v] += [c.sync for c in done]
                if isinstance(sink, TimedFileSink):
                    latencies[v] += [sink.visible[c.checkpoint_id] - c.trigger_time
                                     for c in done if c.checkpoint_id in sink.visible]
                    parts = list(out.iterdir())
                    sizes[v] = sum(f.stat().st_size for f in parts)
                    files[v] = len(parts)
    base = statistics.median(rates[variants[0]])
    print(f"W1 into exactly-once files: {args.records:,} Zipf(1.1) keys over "
          f"{args.vocabulary:,} words, parallelism {args.parallelism}, checkpoints every "
          f"{args.interval:g} s, median of {args.rounds} round(s)")

    def ms(values: list[float], fn: Any) -> Any:
        return fn(values) * 1e3 if values else "-"

    rows = []
    for v in variants:
        rate = statistics.median(rates[v])
        rows.append([v, rate, rate / base, ms(syncs[v], statistics.median),
                     ms(latencies[v], statistics.median), ms(latencies[v], max),
                     files[v] if v != variants[0] else "-",
                     sizes[v] if v != variants[0] else "-"])
    table = print_table(["sink", "records/s", "vs discarding", "sync part ms (median)",
                         "commit latency ms (median)", "commit latency ms (max)",
                         "part files", "bytes"], rows)
    print(f"\npeak RSS {peak_rss_mb():,.0f} MiB")
    return table


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    main()
