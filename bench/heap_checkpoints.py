"""Heap checkpoints under load: full vs incremental snapshots, against the previous heap
backend (key-group copy-on-write) as the baseline, in one invocation.

    python -m bench.heap_checkpoints [--keys 1000000 5000000] [--updates 8]
                                     [--changed 0.01] [--round-records 750000]
                                     [--interval 1.0] [--repeats 1] [--verbose]
                                     [--baseline-ref HEAD | --no-baseline]

A keyed count (``from_collection -> key_by -> count``, parallelism 1) first loads ``--keys``
distinct keys, then receives ``--updates`` rounds of updates, each touching ``--changed`` of
the keys, each of them ``--round-records / (changed * keys)`` times (at least once): with
the default, a round is about one checkpoint interval of records at ~750 k records/s, so
about ``--changed`` of the keys change per checkpoint (the table reports the measured
fraction). Checkpoints every ``--interval`` seconds. Per backend variant it prints, over the
checkpoints taken once every key is loaded (min / median / max over them and over
``--repeats`` runs): the records/s while a checkpoint's asynchronous part runs relative to
the records/s between checkpoints (target >= 0.8), the synchronous pause (ms, target < 5),
the asynchronous part's duration (s), the keys changed since the previous checkpoint (% of
the keys), the bytes a checkpoint writes and the ratio of a full snapshot's bytes to them
(target >= 10 at 1 % changed keys), the bytes a checkpoint serialized on the loop (a full
checkpoint copies the rest of its file from the previous one; the baseline serializes its
whole file), and the time to restore the last checkpoint into a fresh backend (the fastest
of ``--restore-repeats`` restores, CPU seconds of the process, so other processes on the
machine weigh less). The baseline is the heap backend of git revision ``--baseline-ref`` (its files
extracted into a temporary package).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import ALL_CHECKPOINTS, package_at_revision, peak_rss_mb, print_table
from reactive import (
    CheckpointConfig,
    CheckpointStorage,
    Dataflow,
    KeyedProcessFunction,
    StateBackend,
    ValueStateDescriptor,
)
from reactive.backends.heap import HeapKeyedStateBackend, HeapStateBackend
from reactive.backends.heap.snapshot import HeapSnapshot
from reactive.connectors.collections import DiscardingSink
from reactive.keygroups import KeyGroupRange

__all__ = ["main"]



class Count(KeyedProcessFunction):
    """Keyed count; notes (wall-clock time, records so far) every 1024 records."""

    marks: list[tuple[float, int]] = []  # class attribute: shared by the job's copies

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))
        self.n = 0

    def process_element(self, value: Any, ctx: Any) -> None:
        self.count.update(self.count.value() + 1)
        self.n += 1
        if not self.n & 1023:
            self.marks.append((time.time(), self.n))


def workload(keys: int, updates: int, changed: float, round_records: int = 750_000,
             seed: int = 42) -> tuple[list[str], int]:
    """The load of every key, then the update rounds; returns (records, load length).

    Records are the key objects of the load (as a source that keeps its keys would hand
    them over): the state's keys lie where the load put them in memory."""
    rng = np.random.default_rng(seed)
    load = [f"k{i}" for i in rng.permutation(keys).tolist()]
    by_index = [""] * keys
    for w in load:
        by_index[int(w[1:])] = w
    out = list(load)
    per_round = max(1, int(keys * changed))
    touches = max(1, round_records // per_round)
    for _ in range(updates):
        hot = rng.choice(keys, size=per_round, replace=False)
        order = np.repeat(hot, touches)[rng.permutation(per_round * touches)]
        out += [by_index[i] for i in order.tolist()]
    return out, len(load)


def baseline_backend(ref: str, into: Path) -> StateBackend:
    """The heap backend of git revision ``ref`` (package ``heap_baseline`` under ``into``)."""
    backend: StateBackend = package_at_revision(
        "backends/heap", ref, "heap_baseline", into).HeapStateBackend()
    return backend


_serialized: dict[int, int] = {}  # checkpoint id -> bytes the heap snapshots serialized
_write = HeapSnapshot.write


async def _counting_write(self: HeapSnapshot) -> dict[str, Any]:
    handle = await _write(self)
    cid = self.ctx.checkpoint_id
    _serialized[cid] = _serialized.get(cid, 0) + self.serialized_bytes
    return handle


HeapSnapshot.write = _counting_write  # type: ignore[method-assign]


def run_once(records: list[str], loaded_at: int, interval: float, backend: StateBackend,
             directory: Path, verbose: bool = False,
             restore_repeats: int = 3) -> dict[str, list[float]]:
    """Run the pipeline once; return per-checkpoint figures of the update phase."""
    import gc

    from reactive.runtime.loop import run_coroutine

    Count.marks = []
    _serialized.clear()
    flow = Dataflow("heap-bench", parallelism=1, max_parallelism=128)
    (flow.from_collection(records).key_by(lambda w: w).process(Count()).uid("count")
         .sink(DiscardingSink()))
    job = run_coroutine(flow.run(checkpoints=CheckpointConfig(history=ALL_CHECKPOINTS,
        interval=interval, directory=directory, retained=2), state_backend=backend))
    marks = Count.marks
    t_loaded = next(t for t, n in marks if n >= loaded_at)
    done = [c for c in job.metrics.completed_checkpoints[:-1] if c.trigger_time > t_loaded]
    # async windows: from the end of the synchronous part to the completion
    windows = [(c.trigger_time + c.alignment + c.sync, c.trigger_time + c.duration)
               for c in done]
    times = np.array([t for t, _ in marks])
    counts = np.array([n for _, n in marks])
    # records processed at each barrier (interpolated between the marks)
    at = [int(np.interp(c.trigger_time + c.alignment, times, counts))
          for c in job.metrics.completed_checkpoints]
    changed = []
    for c, a, b in zip(job.metrics.completed_checkpoints[1:], at, at[1:], strict=False):
        if c in done:
            changed.append(len(set(records[a:b])) / loaded_at)
    if verbose:
        for c, n in zip(job.metrics.completed_checkpoints, at, strict=False):
            print(f"  chk {c.checkpoint_id}: at record {n:,} sync {c.sync * 1e3:.2f} ms "
                  f"async {c.async_:.2f} s duration {c.duration:.2f} s "
                  f"{c.size / 1e6:.2f} MB{'' if c in done else ' (load)'}")

    def rate(inside: bool) -> float:
        n = dt = 0.0
        for (t0, n0), (t1, n1) in itertools.pairwise(marks):
            if t0 < t_loaded:
                continue
            mid = (t0 + t1) / 2
            if any(a <= mid <= b for a, b in windows) == inside:
                n += n1 - n0
                dt += t1 - t0
        return n / dt if dt else float("nan")

    storage = CheckpointStorage(directory, "heap-bench")
    last = storage.completed()[-1]
    handles = [sub.keyed_state.to_json() for sub in
               last.metadata.operators["count"].subtasks.values() if sub.keyed_state]
    restores = []
    for _ in range(restore_repeats):
        gc.collect()
        t = time.process_time()
        kb = HeapKeyedStateBackend(KeyGroupRange(0, 127), 128)
        kb.restore(handles, last.job_dir)
        restores.append(time.process_time() - t)
        del kb
    full = sum(_state_bytes(h) for h in handles)
    return {
        "ratio": [rate(True) / rate(False)],
        "sync_ms": [c.sync * 1e3 for c in done],
        "async_s": [c.async_ for c in done],
        "changed": changed,
        "bytes": [float(c.size) for c in done],
        # the baseline's snapshots are not HeapSnapshots: they serialize their whole file
        "serialized": [float(_serialized.get(c.checkpoint_id, c.size)) for c in done],
        "full_bytes": [float(full)],
        "restore_s": [min(restores)],
        "rate": [len(records) / max(1e-9, marks[-1][0] - marks[0][0])],
    }


def _state_bytes(handle: dict[str, Any]) -> int:
    """What a full snapshot of the handle's state takes: its files (heap-v1, full heap-v2),
    or the full blobs its chains start with (incremental heap-v2)."""
    if handle.get("mode") != "incremental":
        return sum(int(r["size"]) for r in handle["files"])
    return sum(chain[0][2] for chain in handle["key_groups"].values() if chain[0][3] == "f")


def _mmm(values: list[float], scale: float = 1.0) -> str:
    if not values:
        return "-"
    v = [x * scale for x in values]
    big = max(abs(x) for x in v) >= 100

    def fmt(x: float) -> str:
        return f"{x:,.0f}" if big else f"{x:.2f}"

    return f"{fmt(min(v))} / {fmt(statistics.median(v))} / {fmt(max(v))}"


def main(argv: list[str] | None = None) -> str:
    """Parse the command line, run every variant at every key count, print the tables."""
    p = argparse.ArgumentParser(description="heap checkpoints: full vs incremental vs baseline")
    p.add_argument("--keys", type=int, nargs="+", default=[1_000_000, 5_000_000])
    p.add_argument("--updates", type=int, default=8, help="update rounds after the load")
    p.add_argument("--changed", type=float, default=0.01, help="keys touched per round")
    p.add_argument("--round-records", type=int, default=750_000,
                   help="records per update round (about one interval's worth)")
    p.add_argument("--verbose", action="store_true", help="print every checkpoint")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between checkpoints")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--restore-repeats", type=int, default=3,
                   help="restores of the last checkpoint per run (the fastest counts)")
    p.add_argument("--baseline-ref", default="HEAD",
                   help="git revision whose heap backend is the baseline (default HEAD)")
    p.add_argument("--no-baseline", dest="baseline_ref", action="store_const", const=None)
    args = p.parse_args(argv)
    out = []
    with tempfile.TemporaryDirectory(prefix="bench-heap-") as tmp:
        variants: list[tuple[str, Any]] = []
        if args.baseline_ref:
            base = baseline_backend(args.baseline_ref, Path(tmp) / "pkg")
            variants.append((f"heap at {args.baseline_ref} (baseline)", lambda: base))
        variants += [("heap full (per-key copy-on-write)", HeapStateBackend),
                     ("heap incremental", lambda: HeapStateBackend(incremental=True))]
        for keys in args.keys:
            records, loaded_at = workload(keys, args.updates, args.changed,
                                          args.round_records)
            rows: list[list[Any]] = []
            for name, make in variants:
                figures: dict[str, list[float]] = {}
                for r in range(args.repeats):
                    d = Path(tmp) / f"{keys}-{len(rows)}-{r}"
                    if args.verbose:
                        print(f"{name}, {keys:,} keys, run {r + 1}")
                    for k, v in run_once(records, loaded_at, args.interval, make(), d,
                                         args.verbose, args.restore_repeats).items():
                        figures.setdefault(k, []).extend(v)
                full = statistics.median(figures["full_bytes"])
                rows.append([
                    name, _mmm(figures["rate"]), _mmm(figures["ratio"]),
                    _mmm(figures["sync_ms"]), _mmm(figures["async_s"]),
                    _mmm(figures["changed"], 100), _mmm(figures["bytes"]),
                    _mmm([full / b for b in figures["bytes"] if b]),
                    _mmm(figures["serialized"]), _mmm(figures["restore_s"]),
                    len(figures["bytes"]),
                ])
            title = (f"\n{keys:,} keys, then {args.updates} rounds touching "
                     f"{args.changed:.0%} of them ({args.round_records:,} records each); "
                     f"checkpoints every {args.interval:g} s (min / median / max)")
            print(title)
            out.append(title + "\n" + print_table(
                ["variant", "records/s", "rate in async part / between", "sync ms",
                 "async s", "keys changed %", "bytes per checkpoint", "full bytes / bytes",
                 "bytes serialized", "restore CPU s", "checkpoints"], rows))
    print(f"\npeak RSS {peak_rss_mb():,.0f} MiB")
    return "\n".join(out)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    asyncio.set_event_loop_policy(None)
    main()
