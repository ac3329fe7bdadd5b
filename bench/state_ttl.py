"""State time-to-live: what it costs on W1, and whether it keeps an ever-growing key space flat.

    python -m bench.state_ttl [--w1-records 2000000] [--repeats 3] [--w1-backend heap]
                              [--minutes 10] [--backends heap,rocksdb] [--skip-w1]
                              [--skip-growth] [--png bench/results/state_ttl.png]

1. **W1 with and without TTL** (interleaved, ``--repeats`` times, min / median / max): the
   keyed running count of Zipf(1.1) keys over 100,000 words, on ``--w1-backend`` (heap, or
   incremental RocksDB), checkpoints every second; the TTL run gives the count state
   ``ttl=3600`` (nothing expires: the figure is the cost of the decorator, the stored
   expiry and the incremental cleanup's passes).
2. **An ever-growing key space**, each key active for a few seconds (a record of a new key
   every ~0.1 ms, each key seen again for about 3 s of processing time, then never), with
   ``ttl=5`` and without, on each backend, checkpoints every second, for ``--minutes``
   each: every 10 s the number of keys in the state, the last checkpoint's bytes and the
   process's RSS. With TTL they stay flat; without, they grow with the key space.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import print_table, zipf_keys
from bench.figures import RESULTS
from reactive import (
    CheckpointConfig,
    Dataflow,
    KeyedProcessFunction,
    ValueStateDescriptor,
)
from reactive.connectors.collections import DiscardingSink
from reactive.sources import Source, SourceReader


class Count(KeyedProcessFunction):
    """W1's count; with ``ttl`` its state expires."""

    def __init__(self, ttl: float | None = None) -> None:
        self.ttl = ttl

    def open(self, ctx: Any) -> None:
        self.ctx = ctx
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0, ttl=self.ttl))
        Count.instances.append(self)

    def process_element(self, word: str, ctx: Any, out: list[Any]) -> None:
        n = self.count.value() + 1
        self.count.update(n)
        out.append((word, n))

    instances: list[Count] = []


async def w1(keys: list[str], ttl: float | None, backend: str = "heap"
             ) -> tuple[float, float]:
    """(records per second of wall time, records per second of the process's CPU time) on
    ``backend`` (``"heap"`` or ``"rocksdb"``, incremental checkpoints)."""
    flow = Dataflow("w1-ttl", parallelism=1)
    (flow.from_collection(keys).key_by(lambda w: w).process(Count(ttl)).uid("count")
         .sink(DiscardingSink()))
    with tempfile.TemporaryDirectory() as d:
        state_backend: Any = None
        if backend == "rocksdb":
            from reactive.backends.rocksdb import RocksDBStateBackend

            state_backend = RocksDBStateBackend(path=Path(d) / "db", incremental=True)
        t0, c0 = time.perf_counter(), time.process_time()
        await flow.run(checkpoints=CheckpointConfig(interval=1.0, directory=Path(d) / "chk"),
                       state_backend=state_backend)
        return (len(keys) / (time.perf_counter() - t0),
                len(keys) / (time.process_time() - c0))


class GrowingKeys(Source):
    """An endless key space until ``until`` (perf_counter seconds): the records name 1,000
    live keys, a window that slides by one new key every 3 ms of processing time, so each key
    is active for about 3 s and then never seen again. ``padded`` names key ``n`` with a
    zero-padded number (``key-000000012345``), so each new key sorts after every older one
    (ids handed out in time order); otherwise as ``key-12345``."""

    def __init__(self, until: float, padded: bool = False) -> None:
        self.until = until
        self.padded = padded

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        return _GrowingReader(self.until, self.padded)


class _GrowingReader(SourceReader):
    def __init__(self, until: float, padded: bool) -> None:
        self.until = until
        self.padded = padded
        self.i = 0
        self.t0 = time.perf_counter()

    async def read_batch(self, max_records: int) -> list[Any] | None:
        now = time.perf_counter()
        if now >= self.until:
            return None
        base = int((now - self.t0) / 0.003)
        i = self.i
        self.i += max_records
        if self.padded:
            return [f"key-{base + (i + j) % 1000:012d}" for j in range(max_records)]
        return [f"key-{base + (i + j) % 1000}" for j in range(max_records)]

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        return [self.i]

    def restore_state(self, entries: list[Any]) -> None:
        self.i = int(entries[0]) if entries else 0


def growth(backend: str, ttl: float | None, minutes: float, directory: Path,
           padded: bool = False) -> list[tuple[float, int, int, float]]:
    """(seconds, keys in state, last checkpoint bytes, RSS MB) every 10 s."""
    from reactive.runtime.loop import run_coroutine

    Count.instances = []
    until = time.perf_counter() + minutes * 60
    samples: list[tuple[float, int, int, float]] = []

    async def go() -> None:
        flow = Dataflow(f"growth-{backend}-{ttl}", parallelism=1)
        (flow.source(GrowingKeys(until, padded)).uid("keys").key_by(lambda w: w)
             .process(Count(ttl)).uid("count").sink(DiscardingSink()))
        state_backend: Any = None
        if backend == "rocksdb":
            from reactive.backends.rocksdb import RocksDBStateBackend

            state_backend = RocksDBStateBackend(path=directory / "db", incremental=True)
        job = await flow.start(checkpoints=CheckpointConfig(interval=1.0, directory=directory),
                               state_backend=state_backend)
        t0 = time.perf_counter()
        while time.perf_counter() < until - 1.0:
            await asyncio.sleep(min(10.0, max(0.0, until - 1.0 - time.perf_counter())))
            keys = sum(len(list(c.ctx._keyed.keys("count")))  # the instance's backend
                       for c in Count.instances if c.ctx._keyed is not None)
            size = _checkpoint_bytes(directory, flow.name)
            samples.append((time.perf_counter() - t0, keys, size, _rss_mb()))
        await job.wait()

    run_coroutine(go())
    return samples


def _checkpoint_bytes(directory: Path, job: str) -> int:
    """Bytes of every file the newest completed checkpoint needs (shared ones included):
    the state's size on disk."""
    from reactive import CheckpointStorage

    done = CheckpointStorage(directory, job).completed()
    if not done:
        return 0
    total = 0
    for _, _, sub in done[-1].metadata.subtask_states():
        for part in (sub.keyed_state, sub.operator_state):
            if part is not None:
                total += sum(f.size for f in part.files)
    return total


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _growth_in_child(backend: str, ttl: float | None, minutes: float, names: str
                     ) -> list[tuple[float, int, int, float]]:
    """:func:`growth` in a fresh process, so its RSS is its own."""
    import json
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "bench.state_ttl", "--child", backend,
         "--child-ttl", str(ttl or 0), "--minutes", str(minutes),
         "--names", names],
        check=True, capture_output=True, text=True).stdout
    points = json.loads(out.strip().splitlines()[-1])
    for point in points:
        print(backend, "ttl" if ttl else "no ttl", point, flush=True)
    return [tuple(p) for p in points]  # type: ignore[misc]


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--w1-records", type=int, default=2_000_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--w1-backend", choices=("heap", "rocksdb"), default="heap")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--backends", default="heap,rocksdb")
    p.add_argument("--names", choices=("plain", "padded"), default="plain",
                   help="the growth run's key names: key-12345, or key-000000012345 "
                        "(zero-padded: each new key sorts after every older one)")
    p.add_argument("--skip-w1", action="store_true")
    p.add_argument("--skip-growth", action="store_true")
    p.add_argument("--png", default=str(RESULTS / "state_ttl.png"))
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--child-ttl", type=float, default=0.0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        import json

        with tempfile.TemporaryDirectory() as d:
            points = growth(args.child, args.child_ttl or None, args.minutes, Path(d),
                            args.names == "padded")
        print(json.dumps(points))
        return ""
    text = ""
    if not args.skip_w1:
        from reactive.runtime.loop import run_coroutine

        keys = zipf_keys(args.w1_records, 100_000)
        rates: dict[str, list[float]] = {"no ttl": [], "ttl": []}
        cpu: dict[str, list[float]] = {"no ttl": [], "ttl": []}
        for _ in range(args.repeats):
            for name, ttl in (("no ttl", None), ("ttl", 3600.0)):
                gc.collect()
                wall, on_cpu = run_coroutine(w1(keys, ttl, args.w1_backend))
                rates[name].append(wall)
                cpu[name].append(on_cpu)
        rows = []
        for label, figures in (("wall", rates), ("CPU", cpu)):
            base = statistics.median(figures["no ttl"])
            rows += [[f"{name} ({label} time)",
                      *(f"{v:,.0f}" for v in (min(r), statistics.median(r), max(r))),
                      f"{statistics.median(r) / base:.2f}"] for name, r in figures.items()]
        text += print_table(
            [f"W1 ({args.w1_backend}, checkpoints every 1 s)", "min records/s", "median", "max",
             "vs no ttl"], rows) + "\n"
    if not args.skip_growth:
        series: dict[str, list[tuple[float, int, int, float]]] = {}
        for backend in args.backends.split(","):
            for ttl in (5.0, None):
                label = f"{backend}, {'ttl 5 s' if ttl else 'no ttl'}"
                series[label] = _growth_in_child(backend, ttl, args.minutes, args.names)
        rows = []
        for label, points in series.items():
            first, last = points[0], points[-1]
            rows.append([label, f"{first[1]:,} -> {last[1]:,}",
                         f"{first[2]:,} -> {last[2]:,}", f"{first[3]:.0f} -> {last[3]:.0f}"])
        text += print_table(["run", "keys in state (10 s -> end)",
                             "state on disk, bytes (10 s -> end)", "RSS MB (10 s -> end)"],
                            rows)
        _plot(series, Path(args.png), args.minutes)
    return text


def _plot(series: dict[str, list[tuple[float, int, int, float]]], path: Path,
          minutes: float) -> None:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        print("matplotlib missing (pip install 'reactive[plot]'): no PNG")
        return
    fig = Figure(figsize=(12, 3.6))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3)
    for label, points in series.items():
        xs = [p[0] for p in points]
        for ax, i in zip(axes, (1, 2, 3), strict=True):
            ax.plot(xs, [p[i] for p in points], label=label)
    for ax, title in zip(axes, ("keys in state", "checkpoint's files (bytes)", "RSS (MB)"),
                         strict=True):
        ax.set_title(title)
        ax.set_xlabel("seconds")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"An ever-growing key space, {minutes:g} minutes per run, with and without TTL")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    print(f"plot written to {path}")


if __name__ == "__main__":
    main()
