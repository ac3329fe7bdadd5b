"""RocksDB checkpoints: synchronous pause and asynchronous part with updates flowing, bytes per
incremental checkpoint, and a restarted job's records/s against a fresh one's; the working
tree's backend against a baseline revision's (default HEAD) in the same invocation.

    python -m bench.rocksdb_checkpoints [--keys 1000000 5000000] [--updates 2000000]
        [--interval 1.0] [--repeats 3] [--restart-records 2000000] [--vocabulary 100000]
        [--w1-records 2000000] [--baseline HEAD | --no-baseline] [--skip-pauses]
        [--skip-restart] [--skip-w1] [--shared-key-objects]

Pauses: W1 keyed count (``from_collection -> key_by -> count -> discarding sink``, parallelism
1, incremental checkpoints every ``--interval`` s) over every key of ``range(K)`` once (in a
seeded random order), then ``--updates`` updates of uniformly random keys, for each K of
``--keys``. Prints records/s, the synchronous pause (max, median ms), the asynchronous part
(median, max ms) and bytes per periodic checkpoint (median, mean, max) next to the full
state's size. Restart: W1 on ``--restart-records`` Zipf(1.1) keys over ``--vocabulary`` words
(numpy seed 42; one string object per record unless ``--shared-key-objects``) run fresh, then
a new job restored from its last checkpoint (the source under
another uid, so it reads the same input again), then a second fresh run (A-B-A: successive
jobs in one process drift), ``--repeats`` times; prints min/median/max of both records/s
and of the ratio restored / mean of the two fresh runs around it, in wall time and in
process CPU time (fresh CPU seconds / restored CPU seconds: less sensitive to other
processes on a shared machine); then where the restored run's time goes: the time from the
job's start to its first record (the restore) for fresh and restored runs, and the restored
run's records/s over the second half of the input relative to the fresh runs' (once the
restored state is warm).
W1: ``--w1-records`` Zipf(1.1) keys with
checkpoints every ``--interval`` s on the heap backend and on each RocksDB backend, in turn,
``--repeats`` times; prints min/median/max of records/s, of the ratio to the heap run of the
same repeat, and the synchronous and asynchronous parts (ms; the asynchronous part includes
refilling the cache, writing the frozen generation, the memtable flush, the local checkpoint
and the upload). The baseline backend is the baseline revision's ``backends/rocksdb``
(``git show``) loaded as a separate package.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import (
    ALL_CHECKPOINTS,
    SilentCount,
    package_at_revision,
    peak_rss_mb,
    print_table,
    zipf_keys,
)
from reactive import (
    CheckpointConfig,
    CheckpointStats,
    Dataflow,
    StateBackend,
)
from reactive.checkpoint.metadata import read_metadata
from reactive.connectors.collections import DiscardingSink

__all__ = ["main"]

REPO = Path(__file__).resolve().parents[1]


def backends(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Name -> RocksDB backend module: the baseline's (unless --no-baseline), then ours."""
    from reactive.backends import rocksdb

    out: dict[str, Any] = {}
    if args.baseline:
        out[f"baseline ({args.baseline})"] = package_at_revision(
            "backends/rocksdb", args.baseline, "rocksdb_baseline", tmp / "baseline")
    out["working tree"] = rocksdb
    return out


#: process CPU seconds of the last :func:`run_w1` (every thread: the loop, the snapshot
#: workers, RocksDB's background threads): less sensitive than wall time to other
#: processes on a shared machine
LAST_CPU: list[float] = [0.0]
#: (start, end) of the last :func:`run_w1`, ``time.perf_counter()`` seconds
LAST_SPAN: list[float] = [0.0, 0.0]


class MarkedCount(SilentCount):
    """:class:`SilentCount` noting when it counted its first record and the record at
    ``half`` (``time.perf_counter()`` seconds, in :attr:`marks`; parallelism 1)."""

    marks: dict[str, float] = {}  # class attribute: shared by the job's copy of the function

    def __init__(self, half: int) -> None:
        super().__init__()
        self.half = half

    def open(self, ctx: Any) -> None:
        super().open(ctx)
        self.n = 0

    def process_element(self, value: Any, ctx: Any) -> None:
        super().process_element(value, ctx)
        self.n += 1
        if self.n == 1:
            self.marks["first"] = time.perf_counter()
        elif self.n == self.half:
            self.marks["half"] = time.perf_counter()


async def run_w1(keys: list[Any], directory: Path, backend: StateBackend, source_uid: str,
                 interval: float, restore_from: Path | None = None,
                 fn: SilentCount | None = None) -> tuple[float, list[CheckpointStats]]:
    """Run W1 once (with ``fn``, default :class:`SilentCount`); return (records/s,
    completed checkpoints); its process CPU seconds go to :data:`LAST_CPU`, its start
    and end (``time.perf_counter()``) to :data:`LAST_SPAN`."""
    flow = Dataflow("w1", parallelism=1, max_parallelism=128)
    (flow.from_collection(keys).uid(source_uid).key_by(lambda w: w)
         .process(fn or SilentCount()).uid("count").sink(DiscardingSink()))
    t, cpu = time.perf_counter(), time.process_time()
    job = await flow.run(checkpoints=CheckpointConfig(history=ALL_CHECKPOINTS, interval=interval,
                                                      directory=directory / "chk"),
                         state_backend=backend, restore_from=restore_from,
                         allow_non_restored_state=restore_from is not None)
    LAST_CPU[0] = time.process_time() - cpu
    LAST_SPAN[:] = [t, time.perf_counter()]
    return len(keys) / (LAST_SPAN[1] - t), job.metrics.completed_checkpoints


def state_size(chk: CheckpointStats) -> int:
    """Bytes of every file the checkpoint's keyed state references (a full copy's size)."""
    assert chk.path is not None
    meta = read_metadata(Path(chk.path))
    return sum(ref.size for sub in meta.operators["count"].subtasks.values()
               if sub.keyed_state is not None for ref in sub.keyed_state.files)


def pauses(args: argparse.Namespace, mods: dict[str, Any], tmp: Path) -> str:
    from reactive.runtime.loop import run_coroutine

    rows: list[list[Any]] = []
    for k in args.keys:
        rng = np.random.default_rng(7)
        keys = rng.permutation(k).tolist() + rng.integers(0, k, args.updates).tolist()
        for name, mod in mods.items():
            d = Path(tempfile.mkdtemp(dir=tmp))
            backend = mod.RocksDBStateBackend(path=d / "state", incremental=True)
            rate, done = run_coroutine(run_w1(keys, d, backend, "src", args.interval))
            periodic = done[:-1] or done  # the last one is taken after the input ended
            sync = [c.sync * 1e3 for c in periodic]
            async_ = [c.async_ * 1e3 for c in periodic]
            sizes = [c.size / 1e6 for c in periodic]
            rows.append([f"{k:,}", name, rate, len(periodic), max(sync),
                         statistics.median(sync), statistics.median(async_), max(async_),
                         statistics.median(sizes), statistics.mean(sizes), max(sizes),
                         state_size(done[-1]) / 1e6])
    print(f"\nCheckpoint pauses: W1 over K keys then {args.updates:,} uniform updates, "
          f"incremental checkpoints every {args.interval:g} s")
    return print_table(
        ["keys", "backend", "records/s", "checkpoints", "sync max ms", "sync median ms",
         "async median ms", "async max ms", "MB/checkpoint median", "MB/checkpoint mean",
         "MB/checkpoint max", "state MB"], rows)


def restart(args: argparse.Namespace, mods: dict[str, Any], tmp: Path) -> str:
    from reactive.runtime.loop import run_coroutine

    keys = zipf_keys(args.restart_records, args.vocabulary)
    if not args.shared_key_objects:
        # one string object per record, as a job that parses its input has: zipf_keys
        # repeats the same ``--vocabulary`` objects, so a fresh job's cache holds the very
        # objects of the records (every dict lookup an identity hit) while a restored job's
        # holds keys decoded from RocksDB (equal, not identical: a string comparison each)
        keys = [w[:1] + w[1:] for w in keys]
    rows: list[list[Any]] = []
    parts: list[list[Any]] = []
    half = len(keys) // 2
    marks = MarkedCount.marks

    def phases() -> tuple[float, float]:
        """(ms from the job's start to its first record, records/s of the second half)."""
        start, end = LAST_SPAN
        return (marks["first"] - start) * 1e3, (len(keys) - half) / (end - marks["half"])

    for name, mod in mods.items():
        fresh, restored, ratio, cpu_ratio = [], [], [], []
        first_fresh, first_restored, second_half = [], [], []
        for i in range(args.repeats):
            d = Path(tempfile.mkdtemp(dir=tmp))
            r1, done = run_coroutine(run_w1(
                keys, d, mod.RocksDBStateBackend(path=d / "state"), f"a{i}", args.interval,
                fn=MarkedCount(half)))
            cpu1, (f1, h1) = LAST_CPU[0], phases()
            assert done[-1].path is not None
            r2, _ = run_coroutine(run_w1(
                keys, d, mod.RocksDBStateBackend(path=d / "state2"), f"b{i}", args.interval,
                restore_from=Path(done[-1].path), fn=MarkedCount(half)))
            cpu2, (f2, h2) = LAST_CPU[0], phases()
            # a second fresh run after the restored one (A-B-A): successive jobs in one
            # process drift (measured 980 k -> 720 k records/s over five fresh runs), which
            # would count against the restored run if it always came second
            r3, _ = run_coroutine(run_w1(
                keys, d / "again", mod.RocksDBStateBackend(path=d / "state3"), f"c{i}",
                args.interval, fn=MarkedCount(half)))
            f3, h3 = phases()
            fresh.extend([r1, r3])
            restored.append(r2)
            ratio.append(r2 / ((r1 + r3) / 2))
            cpu_ratio.append((cpu1 + LAST_CPU[0]) / 2 / cpu2)
            first_fresh.extend([f1, f3])
            first_restored.append(f2)
            second_half.append(h2 / ((h1 + h3) / 2))
        rows.append([name, min(fresh), statistics.median(fresh), max(fresh), min(restored),
                     statistics.median(restored), max(restored), min(ratio),
                     statistics.median(ratio), max(ratio), _spread(cpu_ratio, "{:.2f}")])
        parts.append([name, _spread(first_fresh, "{:.0f}"), _spread(first_restored, "{:.0f}"),
                      _spread(second_half, "{:.2f}")])
    print(f"\nRestart: W1 on {args.restart_records:,} Zipf(1.1) keys over {args.vocabulary:,} "
          f"words, fresh vs restored from the fresh run's last checkpoint vs fresh again, "
          f"{args.repeats} repeats")
    table = print_table(
        ["backend", "fresh min", "fresh median", "fresh max", "restored min",
         "restored median", "restored max", "ratio min", "ratio median", "ratio max",
         "CPU-time ratio min / median / max"], rows)
    print("\nWhere the restored run's time goes: from the job's start to its first record "
          "(ms; the restore), and its records/s over the second half of the input against "
          "the fresh runs' (min / median / max)")
    return table + "\n\n" + print_table(
        ["backend", "first record, fresh ms", "first record, restored ms",
         "second half, restored / fresh"], parts)


def _spread(xs: list[float], fmt: str = "{:,.0f}") -> str:
    return " / ".join(fmt.format(x) for x in (min(xs), statistics.median(xs), max(xs)))


def w1_ratio(args: argparse.Namespace, mods: dict[str, Any], tmp: Path) -> str:
    """W1 with checkpoints: each RocksDB backend against the heap backend, per repeat."""
    from reactive.backends.heap import HeapStateBackend
    from reactive.runtime.loop import run_coroutine

    keys = zipf_keys(args.w1_records, args.vocabulary)
    rates: dict[str, list[float]] = {}
    ratios: dict[str, list[float]] = {}
    sync: dict[str, list[float]] = {}
    async_: dict[str, list[float]] = {}
    for i in range(args.repeats):
        d = Path(tempfile.mkdtemp(dir=tmp))
        heap, _ = run_coroutine(run_w1(keys, d / "heap", HeapStateBackend(), f"h{i}",
                                       args.interval))
        rates.setdefault("heap", []).append(heap)
        for name, mod in mods.items():
            rate, done = run_coroutine(run_w1(
                keys, d / name.split()[0], mod.RocksDBStateBackend(path=d / f"state-{i}"),
                f"r{i}", args.interval))
            rates.setdefault(name, []).append(rate)
            ratios.setdefault(name, []).append(rate / heap)
            periodic = done[:-1] or done
            sync.setdefault(name, []).extend(c.sync * 1e3 for c in periodic)
            async_.setdefault(name, []).extend(c.async_ * 1e3 for c in periodic)
    rows: list[list[Any]] = [["heap", _spread(rates["heap"]), "1.00", "-", "-"]]
    for name in mods:
        rows.append([name, _spread(rates[name]), _spread(ratios[name], "{:.2f}"),
                     _spread(sync[name], "{:.2f}"), _spread(async_[name], "{:.0f}")])
    print(f"\nW1: {args.w1_records:,} Zipf(1.1) keys over {args.vocabulary:,} words, "
          f"checkpoints every {args.interval:g} s, {args.repeats} repeats (min / median / max)")
    return print_table(["backend", "records/s", "vs heap (same repeat)", "sync ms",
                        "async ms"], rows)


def main(argv: list[str] | None = None) -> str:
    """Parse the command line, run the sections, return the printed tables."""
    p = argparse.ArgumentParser(description="RocksDB checkpoint pauses and restart speed")
    p.add_argument("--keys", type=int, nargs="+", default=[1_000_000, 5_000_000])
    p.add_argument("--updates", type=int, default=2_000_000)
    p.add_argument("--interval", type=float, default=1.0, help="seconds between checkpoints")
    p.add_argument("--repeats", type=int, default=3, help="fresh/restored pairs per backend")
    p.add_argument("--restart-records", type=int, default=2_000_000)
    p.add_argument("--vocabulary", type=int, default=100_000)
    p.add_argument("--w1-records", type=int, default=2_000_000)
    p.add_argument("--baseline", default="HEAD", help="git revision of the baseline backend")
    p.add_argument("--no-baseline", dest="baseline", action="store_const", const=None)
    p.add_argument("--skip-pauses", action="store_true")
    p.add_argument("--skip-restart", action="store_true")
    p.add_argument("--skip-w1", action="store_true")
    p.add_argument("--shared-key-objects", action="store_true",
                   help="restart: keep zipf_keys' shared word objects as the records")
    args = p.parse_args(argv)
    out = []
    with tempfile.TemporaryDirectory(prefix="bench-rocksdb-") as t:
        tmp = Path(t)
        mods = backends(args, tmp)
        if not args.skip_pauses:
            out.append(pauses(args, mods, tmp))
        if not args.skip_restart:
            out.append(restart(args, mods, tmp))
        if not args.skip_w1:
            out.append(w1_ratio(args, mods, tmp))
    print(f"\npeak RSS {peak_rss_mb():,.0f} MiB")
    return "\n\n".join(out)


if __name__ == "__main__":
    # run as a script: make the repository importable like ``python -m bench.rocksdb_checkpoints``
    sys.path.insert(0, str(REPO))
    asyncio.set_event_loop_policy(None)
    main()
