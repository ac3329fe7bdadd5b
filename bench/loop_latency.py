"""Event-loop latency of an application task that shares its loop with a running job.

    python -m bench.loop_latency [--records 4000000] [--vocabulary 100000] [--interval 1.0]
                                 [--restore-keys 1000000] [--repeats 3] [--skip-restore]
                                 [--baseline REV]

An application task on the job's event loop wakes every 1 ms (``asyncio.sleep(0.001)``) and
records how late each wake-up is (seconds past the 1 ms it asked for). Runs, in one process
and in this order, each ``--repeats`` times:

- *idle loop*: the same task alone on the loop for as long as the heap run took (the
  baseline);
- *W1 heap*: the W1 keyed count (``from_collection -> key_by -> KeyedProcessFunction count
  -> discarding sink``, Zipf(1.1) keys, as ``bench.w1``) with checkpoints every
  ``--interval`` seconds on the heap backend;
- *W1 RocksDB incremental*: the same on RocksDB with incremental checkpoints;
- *W1 RocksDB incremental, baseline REV* (with ``--baseline``): the same on the RocksDB
  backend of git revision REV (``git show``, loaded as a separate package), run right after
  the working tree's in each repeat;
- *restore*: a job resumes a checkpoint of ``--restore-keys`` distinct keys on the heap
  backend (written by a first run, not measured); the task records its wake-ups from the
  start of the resuming job until its tasks run (the restore), and the longest stall.

Prints, per run, p50/p99/max wake-up delay in ms as min/median/max over the repeats, the
ratio of each p99 (median) to the idle loop's p99 in the same invocation, and the job's
records/s (min/median/max). Every job is built before the probe starts (``from_collection``
copies its input: set-up, not the job's work). The target is a
p99 below 10 ms while a job runs. Figures on a shared machine are indicative only.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.common import package_at_revision, print_table, zipf_keys
from reactive import CheckpointConfig, Dataflow, KeyedProcessFunction, ValueStateDescriptor
from reactive.connectors.collections import DiscardingSink

__all__ = ["main"]

TICK = 0.001  # seconds the application task sleeps per wake-up


class Count(KeyedProcessFunction):
    """Keyed count (emits nothing: the benchmark measures the loop, not output)."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def process_element(self, value: Any, ctx: Any) -> None:
        self.count.update(self.count.value() + 1)


class WakeUpProbe:
    """The application task: wakes every ``TICK`` seconds and records its lateness."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self._stop = False

    async def run(self) -> None:
        """Sleep ``TICK`` repeatedly until :meth:`stop`; each delay is in seconds."""
        clock = time.perf_counter
        while not self._stop:
            t = clock()
            await asyncio.sleep(TICK)
            self.delays.append(max(0.0, clock() - t - TICK))

    def stop(self) -> None:
        """End :meth:`run` after its current wake-up."""
        self._stop = True


def _flow(keys: list[str], name: str = "w1") -> Dataflow:
    flow = Dataflow(name, parallelism=1, max_parallelism=128)
    (flow.from_collection(keys).uid("src").key_by(lambda w: w).process(Count()).uid("count")
         .sink(DiscardingSink()))
    return flow


async def _probe_during(work: Callable[[], Awaitable[Any]]) -> tuple[list[float], float]:
    """Run ``work`` with the probe on the same loop; (delays, seconds ``work`` took)."""
    probe = WakeUpProbe()
    task = asyncio.create_task(probe.run())
    await asyncio.sleep(0)
    t = time.perf_counter()
    await work()
    took = time.perf_counter() - t
    probe.stop()
    await task
    return probe.delays, took


async def idle(seconds: float) -> list[float]:
    """The baseline: the probe alone on the loop for ``seconds``."""
    delays, _ = await _probe_during(lambda: asyncio.sleep(seconds))
    return delays


async def w1(keys: list[str], interval: float, directory: Path, backend: Any
             ) -> tuple[list[float], float]:
    """The probe while W1 runs with checkpoints every ``interval`` s on ``backend``."""
    config = CheckpointConfig(interval=interval, directory=directory)
    # built before the probe starts: from_collection copies the input list (~0.2 s for
    # 1 M records), which is the benchmark's set-up, not the job's work
    flow = _flow(keys)
    return await _probe_during(
        lambda: flow.run(checkpoints=config, state_backend=backend))


async def restore(directory: Path) -> tuple[list[float], float]:
    """The probe from the start of a resuming job until its tasks run (the restore); the
    job then finishes (its final checkpoint) outside the measured window."""
    jobs: list[Any] = []

    async def until_running() -> None:
        job = await _flow([], "restore").start(
            checkpoints=CheckpointConfig(interval=None, directory=directory), resume=True)
        jobs.append(job)
        while job.status in ("created", "restarting"):
            await asyncio.sleep(TICK)

    measured = await _probe_during(until_running)
    await jobs[0].wait()
    return measured


def _ms(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3


def _spread(xs: list[float]) -> str:
    return f"{min(xs):.2f} / {statistics.median(xs):.2f} / {max(xs):.2f}"


def _rates(name: str, runs: list[tuple[list[float], float]], records: int) -> str:
    """Records/s of the W1 runs (min / median / max, thousands); "-" for the others."""
    if not name.startswith("W1"):
        return "-"
    rates = [records / took / 1e3 for _, took in runs]
    return f"{min(rates):.0f}k / {statistics.median(rates):.0f}k / {max(rates):.0f}k"


def main(argv: list[str] | None = None) -> str:
    """Parse the command line, run every scenario, print and return the table."""
    p = argparse.ArgumentParser(description="event-loop latency next to a running job")
    p.add_argument("--records", type=int, default=4_000_000)
    p.add_argument("--vocabulary", type=int, default=100_000)
    p.add_argument("--interval", type=float, default=1.0, help="seconds between checkpoints")
    p.add_argument("--restore-keys", type=int, default=1_000_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip-restore", action="store_true")
    p.add_argument("--baseline", default=None,
                   help="also run W1 on the RocksDB backend of this git revision")
    args = p.parse_args(argv)
    from reactive.backends.heap import HeapStateBackend
    from reactive.backends.rocksdb import RocksDBStateBackend
    from reactive.runtime.loop import run_coroutine

    keys = zipf_keys(args.records, args.vocabulary)
    results: dict[str, list[tuple[list[float], float]]] = {}
    base_name = f"W1 RocksDB incremental, baseline {args.baseline}"
    base_dir = tempfile.TemporaryDirectory(prefix="bench-loop-baseline-")
    baseline = None if args.baseline is None else package_at_revision(
        "backends/rocksdb", args.baseline, "rocksdb_loop_baseline", Path(base_dir.name))
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="bench-loop-") as d:
            heap = run_coroutine(w1(keys, args.interval, Path(d) / "heap", HeapStateBackend()))
            results.setdefault("W1 heap", []).append(heap)
            results.setdefault("idle loop", []).append(
                (run_coroutine(idle(heap[1])), heap[1]))
            rocks = run_coroutine(w1(keys, args.interval, Path(d) / "rocks",
                                     RocksDBStateBackend(path=Path(d) / "db",
                                                         incremental=True)))
            results.setdefault("W1 RocksDB incremental", []).append(rocks)
            if baseline is not None:
                results.setdefault(base_name, []).append(run_coroutine(w1(
                    keys, args.interval, Path(d) / "base",
                    baseline.RocksDBStateBackend(path=Path(d) / "base-db", incremental=True))))
    base_dir.cleanup()
    if not args.skip_restore:
        distinct = [f"k{i}" for i in range(args.restore_keys)]
        with tempfile.TemporaryDirectory(prefix="bench-loop-restore-") as d:
            run_coroutine(_flow(distinct, "restore").run(
                checkpoints=CheckpointConfig(interval=None, directory=Path(d))))
            for _ in range(args.repeats):
                results.setdefault(f"restore {args.restore_keys:,} heap keys", []).append(
                    run_coroutine(restore(Path(d))))
    base = statistics.median(_ms(d, 0.99) for d, _ in results["idle loop"])
    order = ["idle loop", "W1 heap", "W1 RocksDB incremental",
             *([base_name] if baseline is not None else []),
             *(k for k in results if k.startswith("restore"))]
    rows = []
    for name in order:
        runs = results[name]
        p99 = [_ms(d, 0.99) for d, _ in runs]
        rows.append([name, _spread([_ms(d, 0.5) for d, _ in runs]), _spread(p99),
                     _spread([max(d, default=0.0) * 1e3 for d, _ in runs]),
                     statistics.median(p99) / base if base else float("nan"),
                     _spread([t for _, t in runs]),
                     _rates(name, runs, len(keys)),
                     int(statistics.median(len(d) for d, _ in runs))])
    print(f"Wake-up delay of a task sleeping {TICK * 1e3:g} ms on the job's loop; W1: "
          f"{args.records:,} Zipf(1.1) keys over {args.vocabulary:,} words, checkpoints every "
          f"{args.interval:g} s; {args.repeats} repeats (min / median / max)")
    return print_table(["run", "p50 ms", "p99 ms", "max ms", "p99 vs idle", "run s",
                        "W1 records/s", "wake-ups"], rows)


if __name__ == "__main__":
    if str(Path(__file__).resolve().parent.parent) not in sys.path:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main()
