"""The heap's columnar snapshots read each array as of its barrier: copy-on-write into an
array a written snapshot released leaves every snapshot its own values, and a snapshot's
keys taken chunk by chunk equal the keys of the concatenated index."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from reactive import KeyGroupRange
from reactive.columnar.aggregates import parse_aggregates
from reactive.columnar.key_index import KeyIndex
from reactive.columnar.state import (
    ColumnarKeyedStateBackend,
    _take_from_chunks,
    iter_columnar_key_groups,
)
from reactive.state.backend import SnapshotContext


def _stored(handles: list[dict], job: Path) -> dict[int, int]:
    # incremental handles: the chain's files hold the slots changed since the last
    # completed checkpoint; the latest handle's chain reads as the whole state
    out: dict[int, int] = {}
    for kg in iter_columnar_key_groups(handles[-1], job):
        out.update(kg.states["total"])
    return out


async def _snapshots_hold_their_barrier(tmp_path: Path, incremental: bool) -> None:
    maxp = 16
    backend = ColumnarKeyedStateBackend(KeyGroupRange(0, maxp - 1), maxp, incremental)
    schema = pa.schema([("k", pa.int64()), ("v", pa.int64())])
    specs = parse_aggregates(schema, {"total": ("v", "sum")})
    index = KeyIndex(["k"], maxp, "agg")
    arrays = {n: np.zeros(1024, s.dtype(p)) for s in specs for p in s.state_columns()
              for n in [f"{s.output}.{p}"]}
    backend.bind(index, arrays, specs)
    job = tmp_path / "job"
    state: dict[int, int] = {}

    def add(keys: list[int], n: int) -> None:
        batch = pa.record_batch([pa.array(keys, pa.int64()), pa.array([n] * len(keys))],
                                schema=schema)
        looked = index.lookup(batch)
        backend.thaw()
        backend.touch(looked.slots, index.size)
        arrays["total.n"][looked.slots] += 1  # values summed (none null)
        arrays["total.acc"][looked.slots] += n
        for k in keys:
            state[k] = state.get(k, 0) + n

    add(list(range(50)), 1)
    handles = []
    # some snapshots follow the previous one's write with no batch between (the arrays
    # that one read are the operator's still), some see a batch after their barrier
    for cid in range(1, 9):
        if cid % 4 == 1:
            add(list(range(cid * 7, cid * 7 + 30)), cid)
        snap = backend.snapshot(SnapshotContext(cid, job, job / f"chk-{cid}",
                                                job / "shared", "agg", 0))
        at_barrier = dict(state)
        if cid % 2:
            add(list(range(0, 80, 3)), 100)  # after the barrier, before the write
        handles.append(await snap.write())
        backend.notify_checkpoint_complete(cid)
        assert _stored(handles, job) == at_barrier


async def test_full_snapshots_hold_their_barrier_when_copies_reuse_arrays(tmp_path):
    await _snapshots_hold_their_barrier(tmp_path, incremental=False)


async def test_incremental_snapshots_hold_their_barrier_when_copies_reuse_arrays(tmp_path):
    await _snapshots_hold_their_barrier(tmp_path, incremental=True)


@given(st.lists(st.integers(0, 20), min_size=1, max_size=8), st.data())
def test_keys_taken_chunk_by_chunk_equal_a_take_of_the_concatenation(lengths, data):
    chunks = []
    start = 0
    for n in lengths:
        chunks.append(pa.array([f"k{i}" for i in range(start, start + n)], pa.string()))
        start += n
    at = np.array(data.draw(st.lists(st.integers(0, max(start - 1, 0)),
                                     max_size=30 if start else 0)), np.int64)
    want = pa.concat_arrays(chunks).take(pa.array(at, pa.int64()))
    assert _take_from_chunks(chunks, at).to_pylist() == want.to_pylist()
