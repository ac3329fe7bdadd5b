"""Event-loop stalls of committed state lookups (``job.query_state``) on RocksDB.

    python -m bench.state_query [--keys 200000] [--lookups 40] [--repeats 3]

A keyed count over ``--keys`` distinct keys (max parallelism 128, RocksDB backend) takes one
checkpoint and stays running; then an application task on the job's loop wakes every 1 ms
and records how late each wake-up is while, in one process and in this order, each
``--repeats`` times:

- *idle*: no lookup, for as long as the next run took (the baseline);
- *inline*: ``--lookups`` keys of distinct key groups read from the checkpoint on the event
  loop (the key group read that a committed lookup does, called on the loop thread);
- *query_state*: the same keys through ``job.query_state`` (its cache emptied first), which
  reads a key group in a worker thread.

Prints the longest and p99 wake-up delay in ms (min/median/max over the repeats), the ratio
of each median longest delay to the idle one's, and the median time per lookup. Figures on a
shared machine are indicative only.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.common import SilentCount, print_table
from reactive import CheckpointConfig, Dataflow, PushSource
from reactive.connectors.collections import DiscardingSink
from reactive.keygroups import assign_to_key_group, operator_index_for_key_group
from reactive.runtime.loop import run_coroutine
from reactive.runtime.state_query import CommittedStateCache, _read_key_group

MAX_PARALLELISM = 128


async def _probe(work: Callable[[], Awaitable[float]]) -> tuple[list[float], float]:
    """Wake-up delays (s) of a 1 ms ticker while ``work`` runs, and ``work``'s result."""
    delays: list[float] = []
    stop = False

    async def ticker() -> None:
        while not stop:
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            delays.append(time.perf_counter() - t - 0.001)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)
    per_lookup = await work()
    stop = True
    await task
    return delays, per_lookup


async def main(keys: int, lookups: int, repeats: int) -> None:
    from reactive.backends.rocksdb import RocksDBStateBackend

    work_dir = Path(tempfile.mkdtemp(prefix="bench-state-query-"))
    source = PushSource(capacity=max(keys, 1))
    flow = Dataflow("state-query", parallelism=1, max_parallelism=MAX_PARALLELISM)
    (flow.source(source).uid("src").key_by(lambda k: k).process(SilentCount()).uid("count")
         .sink(DiscardingSink()))
    job = await flow.start(checkpoints=CheckpointConfig(interval=None,
                                                        directory=work_dir / "chk"),
                           state_backend=RocksDBStateBackend(str(work_dir / "db")))
    last = 0
    for k in range(keys):
        last = await source.send(k)
    while source.durable <= last:
        await job.checkpoint()
    checkpoint = job._latest_committed()
    assert checkpoint is not None
    operator = checkpoint.metadata.operators["count"]
    # keys of distinct key groups: each lookup reads a key group not read before
    chosen: dict[int, int] = {}
    for k in range(keys):
        chosen.setdefault(assign_to_key_group(k, MAX_PARALLELISM), k)
        if len(chosen) == lookups:
            break
    state_name = "count"  # SilentCount's value state

    async def inline() -> float:
        t = time.perf_counter()
        for kg in chosen:
            owner = operator_index_for_key_group(kg, operator.parallelism, MAX_PARALLELISM)
            handle = operator.subtasks[owner].keyed_state
            assert handle is not None
            _read_key_group(handle.to_json(), checkpoint.job_dir, kg)
            await asyncio.sleep(0)
        return (time.perf_counter() - t) / len(chosen)

    async def queried() -> float:
        job._committed_state = CommittedStateCache()
        t = time.perf_counter()
        for k in chosen.values():
            await job.query_state("count", state_name, k)
        return (time.perf_counter() - t) / len(chosen)

    runs: dict[str, list[tuple[float, float, float]]] = {"idle": [], "inline": [],
                                                        "query_state": []}
    for _ in range(repeats):
        for name, work in (("inline", inline), ("query_state", queried)):
            delays, per = await _probe(work)
            runs[name].append((max(delays), _p99(delays), per))
            span = per * len(chosen)

            async def idle(span: float = span) -> float:
                await asyncio.sleep(span)
                return 0.0

            delays, _ = await _probe(idle)
            runs["idle"].append((max(delays), _p99(delays), 0.0))
    source.close()
    await job.wait()

    idle_max = statistics.median(r[0] for r in runs["idle"])
    rows = []
    for name, rs in runs.items():
        longest = [r[0] * 1000 for r in rs]
        p99 = [r[1] * 1000 for r in rs]
        rows.append([name, _mmm(longest), _mmm(p99),
                     f"{statistics.median(r[0] for r in rs) / idle_max:.1f}",
                     f"{statistics.median(r[2] for r in rs) * 1000:.1f}" if name != "idle"
                     else "-"])
    print(f"committed lookups on RocksDB: {keys:,} keys, {len(chosen)} key groups read, "
          f"{repeats} repeats")
    print_table(["run", "longest delay ms (min/med/max)", "p99 ms (min/med/max)",
                 "longest vs idle", "ms per lookup"], rows)


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else 0.0


def _mmm(values: list[float]) -> str:
    return f"{min(values):.1f} / {statistics.median(values):.1f} / {max(values):.1f}"


def _args(argv: list[str] | None = None) -> Any:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--lookups", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    return parser.parse_args(argv)


if __name__ == "__main__":
    a = _args()
    run_coroutine(main(a.keys, a.lookups, a.repeats))
