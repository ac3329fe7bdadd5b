"""Embedding under trio: the W1 keyed count run from ``trio.run`` (the job on its own asyncio
loop thread, reactive.embedding.trio_host) against the same job on asyncio, the push source's
records/s from trio against asyncio, and how many ticks a trio timer task keeps while a job
runs.

    python -m bench.trio_embedding [--records 500000] [--pushes 100000] [--tick 0.01]

A timer task sleeps until the next point of a fixed grid (``--tick`` seconds); a grid point
is kept when the task ran in its slot (before the next point). Printed: records/s, ratios to
the asyncio run, and the share of kept ticks.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any

import trio

from bench.common import print_table, zipf_keys
from bench.w1 import Count
from reactive import CheckpointConfig, Dataflow, PushSource
from reactive.connectors.collections import DiscardingSink
from reactive.runtime.loop import run_coroutine


def _w1(keys: list[str]) -> Dataflow:
    flow = Dataflow("w1-trio", parallelism=1, max_parallelism=128)
    (flow.from_collection(keys).key_by(lambda w: w).process(Count()).uid("count")
         .sink(DiscardingSink()))
    return flow


def _push_flow(source: PushSource) -> Dataflow:
    flow = Dataflow("push-trio", parallelism=1, max_parallelism=128)
    flow.source(source).key_by(lambda w: w).process(Count()).uid("count").sink(DiscardingSink())
    return flow


async def _push(source: PushSource, keys: list[str]) -> None:
    for k in keys:
        await source.send(k)
    source.close()


def asyncio_w1(keys: list[str], directory: str) -> float:
    async def main() -> float:
        t = time.perf_counter()
        await _w1(keys).run(checkpoints=CheckpointConfig(interval=1.0, directory=directory))
        return len(keys) / (time.perf_counter() - t)
    return run_coroutine(main())


def asyncio_push(keys: list[str], directory: str) -> float:
    async def main() -> float:
        source = PushSource(capacity=10_000)
        job = await _push_flow(source).start(
            checkpoints=CheckpointConfig(interval=0.2, directory=directory))
        t = time.perf_counter()
        await _push(source, keys)
        await job.wait()
        return len(keys) / (time.perf_counter() - t)
    return run_coroutine(main())


def trio_w1(keys: list[str], directory: str, tick: float) -> tuple[float, float]:
    async def main() -> tuple[float, float]:
        kept, slots = 0, 0
        done = trio.Event()

        async def timer() -> None:
            nonlocal kept, slots
            start = trio.current_time()
            n = 1
            while not done.is_set():
                await trio.sleep_until(start + n * tick)
                now = trio.current_time()
                slot = int((now - start) / tick)
                slots = slot
                if slot == n:
                    kept += 1
                n = slot + 1

        t = time.perf_counter()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(timer)
            await _w1(keys).run(checkpoints=CheckpointConfig(interval=1.0, directory=directory))
            done.set()
        return len(keys) / (time.perf_counter() - t), kept / max(1, slots)
    return trio.run(main)


def trio_push(keys: list[str], directory: str) -> float:
    async def main() -> float:
        source = PushSource(capacity=10_000)
        job = await _push_flow(source).start(
            checkpoints=CheckpointConfig(interval=0.2, directory=directory))
        t = time.perf_counter()
        await _push(source, keys)
        await job.wait()
        return len(keys) / (time.perf_counter() - t)
    return trio.run(main)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.trio_embedding",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=500_000, help="W1 records")
    parser.add_argument("--pushes", type=int, default=100_000, help="records pushed")
    parser.add_argument("--tick", type=float, default=0.01, help="timer period (seconds)")
    args = parser.parse_args(argv)
    keys = zipf_keys(args.records, 100_000)
    pushes = keys[: args.pushes]
    rows: list[list[Any]] = []
    with tempfile.TemporaryDirectory() as d:
        base = asyncio_w1(keys, d + "/a")
        rate, ticks = trio_w1(keys, d + "/b", args.tick)
        push_base = asyncio_push(pushes, d + "/c")
        push_trio = trio_push(pushes, d + "/d")
    rows.append(["W1 on asyncio", f"{base:,.0f}", "1.00", ""])
    rows.append(["W1 from trio (job loop thread)", f"{rate:,.0f}", f"{rate / base:.2f}",
                 f"{ticks:.1%} ticks kept"])
    rows.append(["push source, asyncio", f"{push_base:,.0f}", "1.00", ""])
    rows.append(["push source, from trio", f"{push_trio:,.0f}", f"{push_trio / push_base:.2f}",
                 ""])
    print_table(["run", "records/s", "ratio", "trio timer"], rows)


if __name__ == "__main__":
    main()
