"""Checkpoint duration under backpressure: aligned vs unaligned checkpoints (Flink's FLIP-76).

A collection source (parallelism 1) feeds ``key_by`` -> a slow keyed count (``--cost`` us of
CPU per record) -> a discarding sink, at parallelism 2, batches of 1024 records, channels of
8 batches, checkpoints every 0.1 s (heap backend). The source is far faster than the count,
so the channels in front of the count stay full: an aligned barrier waits behind up to 8
batches per channel, an unaligned one overtakes them and the snapshot stores them. Each run
processes ``--records`` records; the aligned and the unaligned run alternate ``--repeats``
times in one invocation. Per run: the median and the largest duration of its completed
periodic checkpoints (trigger to completion; the final checkpoint, aligned in both modes and
taken once the input is drained, is left out), the checkpoints completed per second, the
records/s and the in-flight bytes stored per unaligned checkpoint. The table gives min /
median / max over the repeats, and the ratio of the medians.

    python -m bench.unaligned_checkpoints [--records 200000] [--cost 30] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from typing import Any

from reactive import CheckpointConfig, Dataflow, KeyedProcessFunction, ValueStateDescriptor
from reactive.connectors.collections import DiscardingSink

from .common import print_table, zipf_keys

COST = [30e-6]  # seconds of CPU per record in the slow count (set from --cost)


class SlowCount(KeyedProcessFunction):
    """A keyed count that spends ``COST`` seconds of CPU per record (a slow operator)."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def process_element(self, value: Any, ctx: Any) -> list[Any]:
        end = time.perf_counter() + COST[0]
        while time.perf_counter() < end:
            pass
        n = self.count.value() + 1
        self.count.update(n)
        return [(value, n)]


async def one_run(words: list[str], unaligned: bool) -> dict[str, float]:
    """Run the job once; return its checkpoint figures."""
    with tempfile.TemporaryDirectory() as d:
        flow = Dataflow("backpressure", parallelism=2, max_parallelism=64, batch_size=1024,
                        channel_capacity=8)
        (flow.from_collection(words).uid("words")
             .key_by(lambda w: w).process(SlowCount()).uid("count").sink(DiscardingSink()))
        t = time.perf_counter()
        job = await flow.run(checkpoints=CheckpointConfig(
            interval=0.1, directory=d, timeout=120, unaligned=unaligned))
        elapsed = time.perf_counter() - t
        done = job.metrics.completed_checkpoints[:-1]  # without the final checkpoint
        durations = [s.duration for s in done] or [float("nan")]
        return {
            "median": statistics.median(durations),
            "max": max(durations),
            "per_s": len(done) / elapsed,
            "records_s": len(words) / elapsed,
            "size": statistics.median([s.size for s in done]) if done else 0.0,
        }


def spread(values: list[float], digits: str = ".2f") -> str:
    """``min / median / max`` of ``values``."""
    return " / ".join(format(v, digits) for v in
                      (min(values), statistics.median(values), max(values)))


async def main(records: int, repeats: int) -> None:
    words = zipf_keys(records, 2_000)
    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for _ in range(repeats):
        for unaligned in (False, True):
            runs[unaligned].append(await one_run(words, unaligned))
    rows = []
    for unaligned in (False, True):
        r = runs[unaligned]
        rows.append([
            "unaligned" if unaligned else "aligned",
            spread([x["median"] for x in r]),
            spread([x["max"] for x in r]),
            spread([x["per_s"] for x in r], ".1f"),
            spread([x["records_s"] for x in r], ",.0f"),
            spread([x["size"] / 1024 for x in r], ",.0f"),
        ])
    print_table(["checkpoints", "median duration (s)", "longest (s)", "completed per s",
                 "records/s", "checkpoint size (KiB)"], rows)
    aligned = statistics.median(x["median"] for x in runs[False])
    unaligned = statistics.median(x["median"] for x in runs[True])
    print(f"median checkpoint duration, unaligned / aligned: {unaligned / aligned:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--cost", type=float, default=30.0, help="us of CPU per record")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    COST[0] = args.cost / 1e6
    asyncio.run(main(args.records, args.repeats))
