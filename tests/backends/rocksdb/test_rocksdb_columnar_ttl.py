"""Time-to-live of the columnar aggregation (``agg(..., ttl=...)``) on RocksDB: the same
answers as on the heap, batch for batch, through expiry, checkpoints and restores (a manual
clock moves time); expired rows leave the store and the checkpoints' files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from reactive import KeyGroupRange, key_group_range_for_operator
from reactive.backends.rocksdb import RocksDBStateBackend
from reactive.backends.rocksdb.columnar import COLUMNAR_STATE
from reactive.backends.rocksdb.reader import iter_rocksdb_entries
from reactive.key_encoding import decode_key
from reactive.keygroups import assign_to_key_group
from reactive.state.ttl_config import StateTtlConfig
from reactive.time.clock import ManualClock
from tests.columnar.test_columnar import batch_of, finals, snapshot

TTL = 10.0


def agg_operator(kgr: KeyGroupRange, clock: ManualClock, backend: str, where: Path,
                 parallelism: int = 1, subtask: int = 0) -> Any:
    """A changelog count and sum per word with ``ttl``, on the heap's columnar arrays or
    the RocksDB slot store (a small cache of slots: written back and read again often)."""
    from reactive.columnar.aggregate_operator import ColumnarAggregateOperator
    from reactive.columnar.aggregates import parse_aggregates
    from reactive.columnar.state import ColumnarKeyedStateBackend

    schema = pa.schema([("word", pa.string()), ("n", pa.int64())])
    specs = parse_aggregates(schema, {"count": ("word", "count"), "total": ("n", "sum")})
    out = pa.schema([schema.field("word"), *(s.output_field() for s in specs)])
    op = ColumnarAggregateOperator("agg", "agg", ["word"], specs, "changelog", out,
                                   StateTtlConfig(TTL, clock=clock))
    if backend == "heap":
        keyed: Any = ColumnarKeyedStateBackend(kgr, 16, True)
    else:
        op.cache_slots = 64
        keyed = op.keyed_state_backend(RocksDBStateBackend(where, cache_entries=100)) \
            .create_keyed_backend(job_name="j", operator_uid="agg", subtask=subtask,
                                  key_group_range=kgr, max_parallelism=16)
    op.setup(subtask, parallelism, 16, keyed)
    return op


def changelog(op: Any, words: list[str]) -> list[tuple[str, int, int]]:
    return [(r["word"], r["count"], r["total"]) for b in op.process_batch([batch_of(words)])
            for r in b.to_pylist()]


def final(op: Any) -> dict[str, tuple[int, int]]:
    """The final output (count, total) per live word, as ``emit="final"`` gives it."""
    op.emit = "final"
    try:
        return finals(op)
    finally:
        op.emit = "changelog"


def stored_words(handle: dict[str, Any], job_dir: Path, scratch: Path) -> set[str]:
    return {decode_key(k) for _, name, k, _ in iter_rocksdb_entries(handle, job_dir, scratch)
            if name == COLUMNAR_STATE}


async def test_rocksdb_answers_as_the_heap_through_expiry_checkpoints_and_restores(
        tmp_path: Path):
    words = [f"w{i}" for i in range(300)]
    runs: dict[str, list[Any]] = {}
    handles: dict[str, dict[str, Any]] = {}
    for backend in ("heap", "rocksdb"):
        clock = ManualClock(0.0)
        op = agg_operator(KeyGroupRange(0, 15), clock, backend, tmp_path / backend / "db")
        op.open()
        job_dir = tmp_path / backend / "chk"
        out: list[Any] = [changelog(op, words)]  # every word at 0
        await snapshot(op, job_dir, 1)
        clock.advance_to(6.0)
        out.append(changelog(op, words[:100] + words[:10]))  # w0..w99 live until 16
        clock.advance_to(12.0)  # w100..w299 expired at 10
        out.append(changelog(op, words[250:]))  # counted from zero again
        handles[backend] = await snapshot(op, job_dir, 2)
        clock.advance_to(15.9)
        out.append(final(op))
        clock.advance_to(16.0)
        out.append(final(op))  # w0..w99 expired too: only w250.. (written at 12) remain
        # restored at parallelism 2 at 15 (before w0..w99 expire) and at 23
        for at in (15.0, 23.0):
            later = ManualClock(at)  # another process's clock, set before 16 (a restart)
            merged: dict[str, Any] = {}
            for i in range(2):
                kgr = key_group_range_for_operator(i, 2, 16)
                r = agg_operator(kgr, later, backend,
                                 tmp_path / backend / f"r{at}-{i}", parallelism=2, subtask=i)
                r.keyed_backend.restore([handles[backend]], job_dir)
                r.open()
                merged.update(final(r))
                owned = [w for w in ("w0", "w150", "w299")
                         if kgr.start <= assign_to_key_group(w, 16) <= kgr.end]
                merged[f"again {i}"] = changelog(r, owned) if owned else []
            out.append(merged)
        runs[backend] = out
    assert runs["rocksdb"] == runs["heap"]
    heap = runs["heap"]
    assert heap[2][:3] == [("w250", 1, 0), ("w251", 1, 1), ("w252", 1, 2)]
    assert set(heap[3]) == set(words[:100]) | set(words[250:]) and set(heap[4]) == \
        set(words[250:])
    # restored at 15: w0 goes on counting, w150 (expired at 10) starts again
    assert ("w0", 4, 100) in heap[5]["again 0"] + heap[5]["again 1"]
    assert ("w150", 1, 1) in heap[5]["again 0"] + heap[5]["again 1"]


async def test_expired_rows_leave_the_store_as_batches_go_by(tmp_path: Path):
    """An ever-growing key space: each word written once; the rows of expired words are
    deleted from RocksDB by the sweep the batches drive, so the store holds about the live
    words, and the next checkpoint's files none of the expired ones."""
    import random

    rnd = random.Random(7)
    clock = ManualClock(0.0)
    op = agg_operator(KeyGroupRange(0, 15), clock, "rocksdb", tmp_path / "db")
    op.open()
    written = [[f"{rnd.getrandbits(48):012x}" for _ in range(100)] for _ in range(40)]
    for step, words in enumerate(written):  # 100 new words a second, for 40 s
        clock.advance_to(float(step))
        changelog(op, words)
    handle = await snapshot(op, tmp_path / "chk", 1)
    stored = stored_words(handle, tmp_path / "chk", tmp_path / "s")
    live = {w for words in written[30:] for w in words}  # written at 30 or later
    assert live <= stored
    assert len(stored) < 2 * len(live), len(stored)  # not the 4,000 words written
    assert op.cache.swept + op.cache.dropped >= 4_000 - 2 * len(live)
