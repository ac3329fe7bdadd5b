"""W1 columnar: the keyed running count of bench.w1 on the columnar API, against the same
bare dict loop, in one invocation.

    python -m bench.w1_columnar [--records 2000000] [--vocabulary 100000] [--repeats 3]
                                [--batch-rows 65536] [--interval 1.0]

Rows, each repeated ``--repeats`` times, interleaved (min / median / max; ratios of
medians):

- the bare Python loop of bench.w1 (a dict count over a list of str);
- ``from_arrow(table) -> key_by("word") -> agg(count=("word", "count")) -> discarding
  sink``, each row's running count emitted as an output column, checkpoints every
  ``--interval`` s (the columnar state's Arrow IPC snapshots), with the keys as an Arrow
  string array, then dictionary-encoded (one dictionary for the whole table, as a Parquet
  column chunk has);
- the same with string keys without checkpoints, and with ``--batch-rows`` halved and
  doubled (the size of the record batch, which is one element of a channel batch).

The Arrow table is built before the timing starts (the bare loop's input list too).
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
from bench.w1 import Rates, bare_loop
from reactive import CheckpointConfig, Dataflow
from reactive.connectors.collections import DiscardingSink


async def pipeline(table: pa.Table, batch_rows: int, interval: float | None, directory: str
                   ) -> tuple[Rates, Any]:
    flow = Dataflow("w1-columnar", max_parallelism=128)
    (flow.from_arrow(table, batch_size=batch_rows).key_by("word")
         .agg(count=("word", "count")).uid("count").sink(DiscardingSink()))
    config = CheckpointConfig(interval=interval, directory=directory) if interval else None
    t, c = time.perf_counter(), time.process_time()
    job = await flow.run(checkpoints=config)
    n = table.num_rows
    return (n / (time.perf_counter() - t), n / (time.process_time() - c)), job


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description="W1 on the columnar API")
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

    b, iv = args.batch_rows, args.interval
    runs_spec: list[tuple[str, pa.Table, int, float | None]] = [
        (f"columnar, str keys, checkpoints every {iv:g} s", strings, b, iv),
        (f"columnar, dictionary keys, checkpoints every {iv:g} s", dictionary, b, iv),
        ("columnar, str keys, no checkpoints", strings, b, None),
        (f"columnar, str keys, {b // 2:,}-row batches, checkpoints", strings, b // 2, iv),
        (f"columnar, str keys, {b * 2:,}-row batches, checkpoints", strings, b * 2, iv),
    ]
    bare = "bare Python loop (dict count over a list of str)"
    names = [bare] + [r[0] for r in runs_spec]
    runs: dict[str, list[Rates]] = {n: [] for n in names}
    job: Any = None
    for _ in range(args.repeats):
        runs[bare].append(bare_loop(keys))
        for name, table, rows, interval in runs_spec:
            with tempfile.TemporaryDirectory() as d:
                rates, last = run_coroutine(pipeline(table, rows, interval, d))
            runs[name].append(rates)
            if name == names[1]:
                job = last
    wall = {n: statistics.median(r[0] for r in runs[n]) for n in names}
    cpu = {n: statistics.median(r[1] for r in runs[n]) for n in names}

    def spread(n: str) -> str:
        rates = sorted(r[0] for r in runs[n])
        return " / ".join(f"{v / 1e6:,.2f} M" for v in (rates[0], wall[n], rates[-1]))

    def ratios(n: str) -> str:
        base = statistics.median(r[0] for r in runs[bare])
        rs = sorted(r[0] / base for r in runs[n])
        return " / ".join(f"{v:.2f}" for v in (rs[0], wall[n] / base, rs[-1]))

    print(f"W1 columnar: {args.records:,} Zipf(1.1) keys over {args.vocabulary:,} words, "
          f"parallelism 1, {b:,}-row record batches, {args.repeats} repeats "
          "(min / median / max)")
    table = print_table(
        ["run", "records/s", "vs bare loop (min / median / max)", "records per CPU s",
         "CPU: vs bare loop"],
        [[n, spread(n), ratios(n), cpu[n], cpu[n] / cpu[bare]] for n in names])
    done = job.metrics.completed_checkpoints if job is not None else []
    rows = [[c.checkpoint_id, c.alignment * 1e3, c.sync * 1e3, c.async_ * 1e3, c.size]
            for c in done]
    if rows:
        print()
        table += "\n\n" + print_table(
            ["checkpoint (str keys, last repeat)", "alignment ms", "sync part ms",
             "async part ms", "bytes"], rows)
    print(f"\npeak RSS {peak_rss_mb():,.0f} MiB")
    return table


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    main()
