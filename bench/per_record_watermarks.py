"""Cost of per-record watermarks in ``assign_timestamps`` (a batch cut before each record
behind the watermark of the records before it, so the batch size never changes which
records are late).

1. Operator: ``TimestampsAndWatermarksOperator.process_batch`` on batches of 1024 records,
   against one watermark per batch (``max(map(ts_fn, batch))``, the baseline) in the same
   run: in order (fast path), disorder within the bound (fast
   path), and 5% of the records behind the watermark (batches are cut before them).
2. Pipeline: ``assign_timestamps -> key_by -> tumbling window -> sink`` with 5% late
   records, at batch_size 1024 (per-record watermarks by cutting batches) against
   batch_size 1 (one watermark per record the plain way), records/s and their ratio.

Run: ``python bench/per_record_watermarks.py [--records 1000000] [--pipeline-records 200000]``
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from typing import Any

from reactive import AggregateFunction, Dataflow, ManualClock, TumblingEventTimeWindows
from reactive.connectors.collections import DiscardingSink
from reactive.runtime.operators.timestamps import TimestampsAndWatermarksOperator

BOUND = 5.0
BATCH = 1024


class Count(AggregateFunction):
    def create_accumulator(self) -> Any:
        return 0

    def add(self, value: Any, acc: Any) -> Any:
        return acc + 1

    def get_result(self, acc: Any) -> Any:
        return acc

    def merge(self, a: Any, b: Any) -> Any:
        return a + b


def stamps(n: int, kind: str, seed: int = 1) -> list[tuple[int, float]]:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        ts = i * 0.01
        if kind != "in order":
            ts -= rnd.uniform(0, BOUND * 0.9)
        if kind == "5% behind" and rnd.random() < 0.05:
            ts -= 3 * BOUND
        out.append((i % 64, ts))
    return out


def ts_of(r: tuple[int, float]) -> float:
    return r[1]


class _Mailbox:
    """Mailbox stand-in: posted watermark emissions are dropped (the operator only)."""

    def post(self, action: Any) -> None:
        pass


def operator_rate(records: list[Any]) -> tuple[float, float, int]:
    """(operator records/s, baseline records/s, batches cut)."""
    op = TimestampsAndWatermarksOperator("ts", "ts", ts_of, BOUND, None, ManualClock())
    op.mailbox = _Mailbox()  # type: ignore[assignment]
    batches = [records[i:i + BATCH] for i in range(0, len(records), BATCH)]
    cut = 0
    t0 = time.perf_counter()
    for b in batches:
        op.process_batch(b)
        if op.watermark_split is not None:
            cut += 1
            op.watermark_split = None
    t_op = time.perf_counter() - t0
    high = float("-inf")
    t0 = time.perf_counter()
    for b in batches:  # the per-batch maximum of the previous operator
        high = max(high, max(map(ts_of, b)))
    t_base = time.perf_counter() - t0
    return len(records) / t_op, len(records) / t_base, cut


async def pipeline_rate(records: list[Any], batch_size: int) -> float:
    flow = Dataflow("per-record-wm-bench", parallelism=1, batch_size=batch_size)
    (flow.from_collection(records).assign_timestamps(ts_of, BOUND)
         .key_by(lambda r: r[0]).window(TumblingEventTimeWindows.of(10.0))
         .side_output_late_data(DiscardingSink())
         .aggregate(Count()).sink(DiscardingSink()))
    t0 = time.perf_counter()
    await flow.run()
    return len(records) / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--pipeline-records", type=int, default=200_000)
    args = parser.parse_args()
    print(f"operator, {args.records:,} records, batches of {BATCH}")
    print("| input | operator rec/s | baseline max() rec/s | ratio | batches cut |")
    print("|---|---|---|---|---|")
    for kind in ("in order", "within bound", "5% behind"):
        op, base, cut = operator_rate(stamps(args.records, kind))
        print(f"| {kind} | {op / 1e6:.2f} M | {base / 1e6:.2f} M | {base / op:.2f}x slower "
              f"| {cut:,} of {-(-args.records // BATCH):,} |")
    records = stamps(args.pipeline_records, "5% behind")
    many = asyncio.run(pipeline_rate(records, BATCH))
    one = asyncio.run(pipeline_rate(records, 1))
    print(f"\npipeline, {args.pipeline_records:,} records, 5% behind the watermark")
    print(f"batch_size {BATCH}: {many / 1e3:.0f} K rec/s; batch_size 1: {one / 1e3:.0f} K rec/s;"
          f" {many / one:.1f}x faster for the same late records")


if __name__ == "__main__":
    main()
