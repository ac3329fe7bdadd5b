"""What the directory fsyncs before a checkpoint's metadata cost.

    python -m bench.directory_fsync [--records 200000] [--keys 20000] [--repeats 3]

A keyed count (heap incremental, and RocksDB incremental when rocksdict is installed) with a
``CommittingFileSink`` and checkpoints every 0.1 s, run alternately with
``CheckpointStorage`` fsyncing every directory the checkpoint depends on (the runtime) and
with that step replaced by nothing (the baseline), in one invocation. Prints per backend the
median checkpoint duration (trigger to completed, ms) and the job's records per second (min
/ median / max over ``--repeats``), and the ratio to the baseline. The directory syncs run in
the worker thread that writes the metadata: they lengthen checkpoints, not the tasks' work.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import print_table
from reactive import CheckpointConfig, Dataflow, KeyedProcessFunction, ValueStateDescriptor
from reactive.checkpoint.storage import CheckpointStorage
from reactive.connectors.files import CommittingFileSink
from reactive.testing import TestingSource


class _Count(KeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        self.n = ctx.get_state(ValueStateDescriptor("n", default=0))

    def process_element(self, value: Any, ctx: Any) -> Any:
        n = self.n.value() + 1
        self.n.update(n)
        yield (value, n)


def _backend(name: str, work: Path) -> Any:
    if name == "rocksdb":
        from reactive.backends.rocksdb import RocksDBStateBackend
        return RocksDBStateBackend(work / "rocks", incremental=True)
    from reactive.backends.heap import HeapStateBackend
    return HeapStateBackend(incremental=True)


async def _run(backend: str, records: int, keys: int) -> tuple[float, float, int]:
    work = Path(tempfile.mkdtemp(prefix="bench-dirsync-"))
    flow = Dataflow("dirsync", parallelism=1, max_parallelism=16)
    (flow.source(TestingSource(range(records), batch_size=1000)).uid("src")
         .key_by(lambda x: x % keys).process(_Count()).uid("count")
         .sink(CommittingFileSink(work / "out")).uid("out"))
    t0 = time.perf_counter()
    job = await flow.run(checkpoints=CheckpointConfig(interval=0.1, directory=work / "chk"),
                         state_backend=_backend(backend, work))
    elapsed = time.perf_counter() - t0
    done = [s.duration for s in job.metrics.checkpoints if s.status == "completed"]
    return statistics.median(done) * 1e3, records / elapsed, len(done)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    backends = ["heap"]
    try:
        import rocksdict  # noqa: F401
        backends.append("rocksdb")
    except ImportError:
        pass
    real = CheckpointStorage._sync_dirs
    rows = []
    for backend in backends:
        got: dict[str, list[tuple[float, float, int]]] = {"without": [], "with": []}
        for _ in range(args.repeats):
            for mode in ("without", "with"):
                CheckpointStorage._sync_dirs = (  # type: ignore[method-assign]
                    real if mode == "with" else lambda self, chk, body: None)
                got[mode].append(asyncio.run(_run(backend, args.records, args.keys)))
        CheckpointStorage._sync_dirs = real  # type: ignore[method-assign]
        base_ms = statistics.median(r[0] for r in got["without"])
        base_rate = statistics.median(r[1] for r in got["without"])
        for mode in ("without", "with"):
            ms = sorted(r[0] for r in got[mode])
            rate = sorted(r[1] for r in got[mode])
            rows.append([backend, f"{mode} directory fsyncs", ms[0], statistics.median(ms),
                         ms[-1], statistics.median(ms) / base_ms, statistics.median(rate),
                         statistics.median(rate) / base_rate,
                         statistics.median(r[2] for r in got[mode])])
    print_table(["backend", "run", "checkpoint ms min", "median", "max", "vs without",
                 "records/s (median)", "vs without", "checkpoints"], rows)


if __name__ == "__main__":
    main()
