"""The cost of leaving expired TTL entries out of heap snapshots, in one invocation.

    python -m bench.heap_ttl_snapshots [--keys 1000000] [--expired 0.0 0.5] [--repeats 5]

A heap keyed backend (128 key groups) holds ``--keys`` keys of a TTL value state (and, as a
second table, a TTL list state of one element per key); ``--expired`` of them expired at the
checkpoint's TTL time. Each row times the asynchronous part of a savepoint (every key group
serialized in full, on an idle loop: no pacing) with the filter (``filter``) and with it
turned off (``baseline``: every entry written, as before the filter), interleaved, and
prints min / median / max seconds over ``--repeats`` runs, the ratio of the medians, and
the file's bytes. The time source is a manual clock, so the expired share is exact.
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
from reactive.backends.heap import HeapKeyedStateBackend
from reactive.backends.heap.ttl_filter import TtlFilter
from reactive.keygroups import KeyGroupRange
from reactive.state.backend import SnapshotContext
from reactive.state.descriptors import ListStateDescriptor, ValueStateDescriptor
from reactive.state.ttl import StateTtlConfig
from reactive.state.ttl_clock import TtlClock

__all__ = ["main"]


def build(keys: int, expired: float) -> HeapKeyedStateBackend:
    """A backend with ``keys`` keys in a TTL value and a TTL list state; the first
    ``expired`` share written at time 0 (expiring at 10), the rest at 20 (expiring at 30);
    the clock reads 15."""
    now = [0.0]
    clock = TtlClock(lambda: now[0])
    kb = HeapKeyedStateBackend(KeyGroupRange(0, 127), 128)
    config = StateTtlConfig(10.0)
    value = kb.get_ttl_state(ValueStateDescriptor("v", ttl=10.0), config, clock)
    lst = kb.get_ttl_state(ListStateDescriptor("l", ttl=10.0), config, clock)
    assert value is not None and lst is not None
    cut = int(keys * expired)
    for i in range(keys):
        now[0] = 0.0 if i < cut else 20.0
        kb.set_current_key(i)
        value.update(i)
        lst.add(i)
    now[0] = 15.0
    return kb


async def _savepoint(kb: HeapKeyedStateBackend, job: Path, cid: int) -> tuple[float, int]:
    ctx = SnapshotContext(cid, job, job / f"chk-{cid}", job / "shared", "op", 0,
                          savepoint=True)
    snap = kb.snapshot(ctx)
    t0 = time.perf_counter()
    handle = await snap.write()
    seconds = time.perf_counter() - t0
    return seconds, sum(f["size"] for f in handle["files"])


def main(argv: list[str] | None = None) -> str:
    """Run the benchmark and print (and return) its table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--expired", type=float, nargs="+", default=[0.0, 0.5])
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    rows: list[list[Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for share in args.expired:
            kb = build(args.keys, share)
            filtering = kb._ttl_filter
            runs: dict[str, list[float]] = {"baseline": [], "filter": []}
            size: dict[str, int] = {}
            cid = 0
            for _ in range(args.repeats):
                for name in ("baseline", "filter"):
                    kb._ttl_filter = (
                        filtering if name == "filter" else (lambda: TtlFilter({})))
                    cid += 1
                    seconds, size[name] = asyncio.run(
                        _savepoint(kb, Path(tmp) / f"{share}", cid))
                    runs[name].append(seconds)
            med = {n: statistics.median(r) for n, r in runs.items()}
            for name, r in runs.items():
                rows.append([f"{args.keys:,}", f"{share:.0%}", name,
                             f"{min(r):.3f} / {med[name]:.3f} / {max(r):.3f}",
                             f"{med[name] / med['baseline']:.2f}", f"{size[name]:,}"])
    return print_table(["keys", "expired", "variant", "write s (min/med/max)",
                        "ratio to baseline", "file bytes"], rows)


if __name__ == "__main__":
    main()
