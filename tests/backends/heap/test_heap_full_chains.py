"""Full (self-contained) heap checkpoints carry chains of deltas in their own file: the file
stays near the state's size while the bytes serialized per checkpoint follow the changed
keys; the chain bound counts the delta about to be written; large key groups are pickled in
chunks, not in one call that holds the loop."""

from __future__ import annotations

import pickle
import random
from io import BytesIO
from pathlib import Path
from typing import Any

import pytest

from reactive.backends.heap import HeapKeyedStateBackend, read_heap_snapshot
from reactive.backends.heap import snapshot as heap_snapshot
from reactive.backends.heap.changelog import (
    FULL_LIMITS,
    INCREMENTAL_LIMITS,
    ChangeLog,
    GroupChain,
    jitter,
    limits,
)
from reactive.keygroups import KeyGroupRange
from reactive.state.backend import SnapshotContext
from reactive.state.descriptors import ValueStateDescriptor

MAX_PARALLELISM = 16
FULL_RANGE = KeyGroupRange(0, MAX_PARALLELISM - 1)


def context(job_dir: Path, cid: int) -> SnapshotContext:
    return SnapshotContext(cid, job_dir, job_dir / f"chk-{cid}", job_dir / "shared", "op", 0)


def file_size(handle: dict[str, Any]) -> int:
    return sum(int(r["size"]) for r in handle["files"])


async def test_full_checkpoint_files_stay_near_the_state_size(tmp_path: Path) -> None:
    """20 checkpoints changing 4 % of the keys each: every full checkpoint's file stays within
    1.3x of a freshly written file of the same state (the chains it carries are bounded),
    restores alone, and the checkpoints serialize far less than the state on average."""
    job_dir = tmp_path / "job"
    kb = HeapKeyedStateBackend(FULL_RANGE, MAX_PARALLELISM, operator_uid="op")
    state = kb.get_state(ValueStateDescriptor("v", default=0))
    keys = [f"key-{i}" for i in range(16_000)]
    for k in keys:
        kb.set_current_key(k)
        state.update(1)  # type: ignore[attr-defined]
    model = dict.fromkeys(keys, 1)
    rnd = random.Random(7)
    handle = await kb.snapshot(context(job_dir, 1)).write()
    kb.notify_checkpoint_complete(1)
    sizes: list[int] = []
    snaps = []
    for cid in range(2, 22):
        for k in rnd.sample(keys, len(keys) // 25):
            kb.set_current_key(k)
            state.update(cid)  # type: ignore[attr-defined]  # < 256: entries keep their size
            model[k] = cid
        snap = kb.snapshot(context(job_dir, cid))
        handle = await snap.write()
        kb.notify_checkpoint_complete(cid)
        (job_dir / f"chk-{cid - 1}").rename(job_dir / f"gone-{cid - 1}")  # self-contained
        sizes.append(file_size(handle))
        snaps.append(snap)
    assert read_heap_snapshot(handle, job_dir)["v"] == model
    fresh_kb = HeapKeyedStateBackend(FULL_RANGE, MAX_PARALLELISM, operator_uid="op")
    fresh_kb.restore([handle], job_dir)
    fresh = file_size(await fresh_kb.snapshot(context(job_dir, 99)).write())
    assert max(sizes) <= 1.3 * fresh
    serialized = [s.serialized_bytes for s in snaps]
    assert sum(serialized) / len(serialized) < 0.5 * fresh
    assert all(s < file_size(handle) for s in serialized)  # never the whole file


def test_limits_depend_on_the_mode() -> None:
    assert limits(True) == INCREMENTAL_LIMITS
    assert limits(False) == FULL_LIMITS
    assert FULL_LIMITS[1] < INCREMENTAL_LIMITS[1]
    assert limits(False, 3, 0.7) == (3, 0.7)


def planned_full(changed: int, *, ratio: float = 0.4, deltas: int = 0) -> bool:
    """Whether a key group of 100 entries with a 1,000-byte full blob (and ``deltas`` deltas
    of 10 bytes) is materialized when ``changed`` of its keys changed."""
    log = ChangeLog(1, 0, max_deltas=8, delta_ratio=ratio)
    chain = GroupChain.full(({"path": "x"}, 0, 1000, "f"))
    for _ in range(deltas):
        chain = chain.with_delta(({"path": "x"}, 0, 10, "d"))
    log.close(1, {}, [0], [100])
    log.written(1, [chain])
    log.complete(1)
    plan = log.close(2, {}, [changed], [100])
    assert plan.full is not None
    return 0 in plan.full


def test_the_bound_counts_the_delta_about_to_be_written() -> None:
    # threshold: ratio * jitter(0) * 1000 bytes = 200; a changed key costs about
    # DELTA_COST * 10 bytes, and DIRTY_FULL (20 keys of 100) is not reached
    assert jitter(0) == 0.5
    assert not planned_full(10)  # ~150 bytes of delta: fits
    assert planned_full(15)  # ~225 bytes: the chain would outgrow its bound
    assert not planned_full(15, ratio=1.0)  # incremental's bound is looser
    assert planned_full(10, deltas=6)  # 60 bytes of deltas already + ~150


async def test_large_key_groups_are_pickled_in_chunks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A key group whose one-call pickle would outlast the live budget is copied and pickled
    in chunks ("pk" frames), not in one call; its bytes restore the same."""
    monkeypatch.setattr(heap_snapshot, "_LIVE_SECONDS", 5000 * 1e-9)
    monkeypatch.setattr(heap_snapshot, "_PER_ENTRY", 1e-7)
    kb = HeapKeyedStateBackend(KeyGroupRange(0, 0), 1, operator_uid="op")
    state = kb.get_state(ValueStateDescriptor("v"))
    for k in range(20_000):  # one key group: 20,000 entries * 1e-7 s > 5 us
        kb.set_current_key(k)
        state.update(k)  # type: ignore[attr-defined]
    job_dir = tmp_path / "job"
    handle = await kb.snapshot(context(job_dir, 1)).write()
    [[_, offset, length, kind]] = handle["key_groups"]["0"]
    assert kind == "f"
    f = BytesIO((job_dir / handle["files"][0]["path"]).read_bytes()[offset:offset + length])
    pickle.load(f)  # header
    ops = []
    while f.tell() < length:
        ops.append(pickle.load(f)[0])
    # (a "k" frame may follow: the key current at the barrier, captured)
    assert ops.count("pk") > 1 and "p" not in ops
    assert read_heap_snapshot(handle, job_dir)["v"] == {k: k for k in range(20_000)}
