"""Rescaling benchmark: restore time of a keyed state taken at parallelism 4, restored at
p=2 and p=8 (rescaling, Carbone 2018 (PhD thesis), section 4.2), against a restore at the same
parallelism p=4 measured in the same run, for the heap and RocksDB backends.

The state (``--keys`` keys, one ``ValueState`` int each, ``max_parallelism`` 128) is written
by 4 keyed backend instances and snapshotted as a savepoint (full, self-contained files);
then, for each target parallelism, every new instance is created and restored from the
handles whose key-group range intersects its own (what ``StateAssignmentOperation`` hands it), and
the time until all instances have restored is reported, with its ratio to the same-
parallelism restore. Instances restore one after the other, as the tasks of one job do in
one process.

    python -m bench.rescaling [--keys 1000000] [--backends heap rocksdb]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from reactive import ValueStateDescriptor, key_group_range_for_operator
from reactive.backends.heap import HeapStateBackend
from reactive.backends.rocksdb import RocksDBStateBackend
from reactive.keygroups import KeyGroupAssigner
from reactive.state.backend import SnapshotContext, StateBackend

from .common import print_table

MAXP = 128
SOURCE_P = 4


def _backend(name: str, work: Path) -> StateBackend:
    return HeapStateBackend() if name == "heap" else RocksDBStateBackend(path=work / "rocks")


def _write_state(backend: StateBackend, keys: int, job_dir: Path) -> list[dict[str, Any]]:
    """Fill ``SOURCE_P`` instances with ``keys`` keys and return their savepoint handles."""
    assign = KeyGroupAssigner(MAXP)
    instances = [backend.create_keyed_backend(
        job_name="bench", operator_uid="count", subtask=i,
        key_group_range=key_group_range_for_operator(i, SOURCE_P, MAXP),
        max_parallelism=MAXP) for i in range(SOURCE_P)]
    states = [b.get_state(ValueStateDescriptor("count", default=0)) for b in instances]
    for k in range(keys):
        i = assign(k) * SOURCE_P // MAXP
        instances[i].set_current_key(k)
        states[i].update(k)  # type: ignore[attr-defined]
    handles = []
    for i, b in enumerate(instances):
        ctx = SnapshotContext(1, job_dir, job_dir / "chk-1", job_dir / "shared", "count", i,
                              savepoint=True)
        handles.append(asyncio.run(b.snapshot(ctx).write()))
        b.dispose()
    return handles


def _restore(backend: StateBackend, handles: list[dict[str, Any]], p: int,
             job_dir: Path) -> tuple[float, int]:
    """Restore every instance of parallelism ``p``; returns (seconds, keys restored)."""
    t0 = time.perf_counter()
    restored = []
    for i in range(p):
        kgr = key_group_range_for_operator(i, p, MAXP)
        b = backend.create_keyed_backend(job_name="bench", operator_uid="count", subtask=i,
                                         key_group_range=kgr, max_parallelism=MAXP)
        mine = [h for h, j in zip(handles, range(SOURCE_P), strict=True)
                if _intersects(key_group_range_for_operator(j, SOURCE_P, MAXP), kgr)]
        b.restore(mine, job_dir)
        restored.append(b)
    seconds = time.perf_counter() - t0
    n = sum(sum(1 for _ in b.keys("count")) for b in restored)
    for b in restored:
        b.dispose()
    return seconds, n


def _intersects(a: Any, b: Any) -> bool:
    return bool(a.start <= b.end and b.start <= a.end)


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print a Markdown table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=1_000_000, help="number of keys (default 1M)")
    ap.add_argument("--backends", nargs="+", default=["heap", "rocksdb"],
                    choices=["heap", "rocksdb"])
    args = ap.parse_args(argv)
    rows = []
    for name in args.backends:
        work = Path(tempfile.mkdtemp(prefix="bench-rescaling-"))
        try:
            backend = _backend(name, work)
            job_dir = work / "job"
            t0 = time.perf_counter()
            handles = _write_state(backend, args.keys, job_dir)
            size = sum(int(r["size"]) for h in handles for r in h["files"])
            print(f"{name}: wrote {args.keys:,} keys at p={SOURCE_P} in "
                  f"{time.perf_counter() - t0:.1f} s ({size / 2**20:.1f} MiB)", flush=True)
            base, n = _restore(backend, handles, SOURCE_P, job_dir)
            assert n == args.keys, (n, args.keys)
            rows.append((name, f"{SOURCE_P} -> {SOURCE_P}", base, 1.0))
            for p in (2, 8):
                seconds, n = _restore(backend, handles, p, job_dir)
                assert n == args.keys, (n, args.keys)
                rows.append((name, f"{SOURCE_P} -> {p}", seconds, seconds / base))
        finally:
            shutil.rmtree(work, ignore_errors=True)
    print_table(["backend", "parallelism", "restore s", "x same-p restore"], rows)


if __name__ == "__main__":
    main()
