"""Which rocksdict calls release the GIL while RocksDB works: a call that holds it stalls the
event loop (and the application sharing it) for as long as RocksDB works.

    python -m bench.rocksdict_gil [--entries 300000] [--value-bytes 100] [--repeats 3]

Each call runs in a worker thread while the main thread counts in a tight Python loop and
records the longest gap between two of its iterations (the GIL switch interval is set to
0.5 ms, as while a job runs). A call that releases the GIL leaves gaps of about one switch
interval; one that holds it stops the main thread for the whole call, as it would stop the
event loop. Calls, each on a fresh database of ``--entries`` random 16-byte keys with
``--value-bytes`` values:

- ``write`` of one ``WriteBatch`` of ``--entries`` puts (memtable inserts);
- ``flush`` of a memtable holding them (the database's write buffer is 256 MiB, so nothing
  was flushed before);
- ``create_checkpoint`` right after a ``flush`` (hard links of the SST files, copies of the
  small files, as the backend's local phase does);
- ``create_checkpoint`` with the memtable unflushed (RocksDB flushes it inside the call);
- ``compact_range`` over the whole key space.

Prints, per call, its duration and the main thread's longest gap (ms, min / median / max
over ``--repeats``), and the share of the call the main thread was stopped (longest gap /
duration, median): ~0 means the GIL is released.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from rocksdict import Checkpoint, Options, Rdict, WriteBatch

from bench.common import print_table

__all__ = ["main"]

SWITCH_INTERVAL = 0.0005  # seconds, as the runtime sets while a job runs


def _open(path: Path) -> Rdict:
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.set_write_buffer_size(256 << 20)
    return Rdict(str(path), opts)


def _batch(entries: int, value_bytes: int) -> WriteBatch:
    wb = WriteBatch(raw_mode=True)
    for _ in range(entries):
        wb.put(os.urandom(16), os.urandom(value_bytes))
    return wb


def _stopped_during(call: Callable[[], None]) -> tuple[float, float]:
    """(seconds ``call`` took in a worker thread, longest gap in seconds of a loop counting
    on the calling thread meanwhile)."""
    took: list[float] = []

    def work() -> None:
        t = time.perf_counter()
        call()
        took.append(time.perf_counter() - t)

    worker = threading.Thread(target=work)
    longest = 0.0
    # counting from before the start: a call that holds the GIL from its first instruction
    # stops this thread before it could look at the clock again
    last = time.perf_counter()
    worker.start()
    while worker.is_alive():
        now = time.perf_counter()
        longest = max(longest, now - last)
        last = now
    worker.join()
    return took[0], longest


def measure(kind: str, directory: Path, entries: int, value_bytes: int) -> tuple[float, float]:
    """Set up a fresh database for ``kind`` in ``directory`` and time the call."""
    db = _open(directory / "db")
    try:
        wb = _batch(entries, value_bytes)
        if kind == "write":
            return _stopped_during(lambda: db.write(wb))
        db.write(wb)
        if kind == "flush":
            return _stopped_during(db.flush)
        if kind == "create_checkpoint after flush":
            db.flush()
            return _stopped_during(
                lambda: Checkpoint(db).create_checkpoint(str(directory / "chk")))
        if kind == "create_checkpoint, memtable unflushed":
            return _stopped_during(
                lambda: Checkpoint(db).create_checkpoint(str(directory / "chk")))
        if kind == "compact_range":
            db.flush()
            return _stopped_during(lambda: db.compact_range(None, None))
        raise ValueError(kind)
    finally:
        db.close()


KINDS = ["write", "flush", "create_checkpoint after flush",
         "create_checkpoint, memtable unflushed", "compact_range"]


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description="rocksdict calls and the GIL")
    p.add_argument("--entries", type=int, default=300_000)
    p.add_argument("--value-bytes", type=int, default=100)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    old = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL)
    rows = []
    try:
        for kind in KINDS:
            runs = []
            for _ in range(args.repeats):
                with tempfile.TemporaryDirectory() as d:
                    runs.append(measure(kind, Path(d), args.entries, args.value_bytes))
            took = sorted(r[0] * 1e3 for r in runs)
            gap = sorted(r[1] * 1e3 for r in runs)
            stopped = statistics.median(r[1] / r[0] for r in runs)
            rows.append([kind, " / ".join(f"{x:.1f}" for x in (took[0], statistics.median(
                took), took[-1])), " / ".join(f"{x:.1f}" for x in (gap[0], statistics.median(
                    gap), gap[-1])), stopped, "holds it" if stopped > 0.5 else "releases it"])
    finally:
        sys.setswitchinterval(old)
    print(f"rocksdict calls in a worker thread: {args.entries:,} entries of 16-byte keys and "
          f"{args.value_bytes}-byte values, GIL switch interval {SWITCH_INTERVAL * 1e3:g} ms, "
          f"{args.repeats} repeats (min / median / max)")
    return print_table(["call", "call ms", "main thread's longest gap ms",
                        "share of the call stopped", "the GIL"], rows)


if __name__ == "__main__":
    main()
