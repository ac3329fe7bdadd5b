"""Time-to-live over an endlessly growing key space whose keys are named in increasing
order (``user-000123``: ids handed out in time order, so each new key sorts after every
stored one): each key is active for a few steps and then never seen again. The incremental
cleanup must reach the expired old keys although every new key is inserted past its cursor,
so the stored entries stay within a small multiple of the live keys on the heap, on
RocksDB's per-record state and on RocksDB's columnar aggregation rows. A manual clock moves
time; nothing sleeps."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from reactive import KeyedProcessFunction, KeyGroupRange, ValueStateDescriptor
from reactive.backends.heap import HeapStateBackend
from reactive.backends.rocksdb import RocksDBStateBackend
from reactive.backends.rocksdb.columnar import COLUMNAR_STATE
from reactive.backends.rocksdb.keys import PREFIX_BYTES, state_id
from reactive.state.ttl import StateTtlConfig
from reactive.testing.operator_harness import OperatorTestHarness
from reactive.time.clock import ManualClock
from tests.columnar.test_columnar import batch_of

TTL = 1.0
STEP = 0.01  # seconds of the manual clock per step
NEW = 2  # keys that start per step
ACTIVE = 2  # steps a key is written in
STEPS = 10_000  # 20,000 keys in all


def active_keys(step: int, new: int = NEW, active: int = ACTIVE) -> list[str]:
    """The keys written at ``step``: the ``new`` keys a step that started in the last
    ``active`` steps, named ``s<step>-<i>`` with zero-padded numbers (their names sort in
    time order)."""
    return [f"s{s:06d}-{i:03d}" for s in range(max(0, step - active + 1), step + 1)
            for i in range(new)]


class Counter(KeyedProcessFunction):
    """Counts each key's records in a value state with ``ttl``."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0,
                                                        ttl=StateTtlConfig(TTL)))

    def process_element(self, record: Any, ctx: Any) -> Iterable[Any]:
        self.count.update(self.count.value() + 1)
        return ()


def rocksdb_entries(db: Any, sid: bytes) -> int:
    """The entries of the state with id ``sid`` in a working RocksDB database."""
    return sum(1 for k in db.keys(from_key=b"") if k[2:PREFIX_BYTES] == sid)


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
@pytest.mark.parametrize("key_groups", [1, 16])
@pytest.mark.parametrize(("new", "active", "steps"), [(NEW, ACTIVE, STEPS), (20, 1, 1_000)])
def test_per_record_state_stays_bounded_when_keys_grow_in_name_order(
        tmp_path: Path, backend: str, key_groups: int, new: int, active: int, steps: int):
    """The stored entries (RocksDB: its database, without the cache) stay under four times
    the live keys after the first pass, at one key group per instance (every key in one
    sorted run) and at 16, with few keys a step written twice and with many written once;
    the live keys are all there with their counts."""
    state_backend = (HeapStateBackend() if backend == "heap" else RocksDBStateBackend(
        path=tmp_path / "db", cache_entries=200, write_batch_entries=100))
    h = OperatorTestHarness.for_keyed_process(Counter(), key_selector=lambda r: r,
                                              max_parallelism=key_groups,
                                              state_backend=state_backend)
    h.open()
    keyed: Any = h.keyed_backend
    sid = state_id("count")
    sizes = []
    live = new * (active + round(TTL / STEP))
    for step in range(steps):
        h.set_processing_time(step * STEP)
        for key in active_keys(step, new, active):  # a record at a time (batches of one)
            h.process_element(key)
        if step % (steps // 20) == steps // 20 - 1:
            n = (len(list(keyed.keys("count"))) if backend == "heap"
                 else rocksdb_entries(keyed._db, sid))
            sizes.append(n)
    assert max(sizes[2:]) < 4 * live, sizes
    fn: Any = h.operator.fn  # type: ignore[attr-defined]
    assert fn.count.expired > steps * new - 4 * live
    h.set_processing_time(steps * STEP)
    keyed.set_current_key(f"s{steps - 1:06d}-001")
    assert fn.count.value() == 1
    keyed.set_current_key(f"s{steps - active:06d}-001")
    assert fn.count.value() == active
    h.close()


def columnar_operator(clock: ManualClock, key_groups: int, where: Path) -> Any:
    """A changelog count per word with ``ttl`` on the RocksDB slot store (the operator of
    the columnar TTL tests, at ``key_groups`` key groups)."""
    import pyarrow as pa

    from reactive.columnar.aggregate_operator import ColumnarAggregateOperator
    from reactive.columnar.aggregates import parse_aggregates

    schema = pa.schema([("word", pa.string()), ("n", pa.int64())])
    specs = parse_aggregates(schema, {"count": ("word", "count")})
    out = pa.schema([schema.field("word"), *(s.output_field() for s in specs)])
    op = ColumnarAggregateOperator("agg", "agg", ["word"], specs, "changelog", out,
                                   StateTtlConfig(TTL, clock=clock))
    op.cache_slots = 64
    keyed = op.keyed_state_backend(RocksDBStateBackend(where, cache_entries=100)) \
        .create_keyed_backend(job_name="j", operator_uid="agg", subtask=0,
                              key_group_range=KeyGroupRange(0, key_groups - 1),
                              max_parallelism=key_groups)
    op.setup(0, 1, key_groups, keyed)
    return op


@pytest.mark.parametrize("key_groups", [1, 16])
def test_columnar_rows_stay_bounded_when_keys_grow_in_name_order(
        tmp_path: Path, key_groups: int):
    """The columnar aggregation's rows in RocksDB stay under four times the live words: 20
    new words a batch (10 ms), each in one batch, 2,020 live (30,000 words written)."""
    clock = ManualClock(0.0)
    op = columnar_operator(clock, key_groups, tmp_path / "db")
    op.open()
    db = op.cache.store._db
    sizes = []
    live = 20 * (1 + round(TTL / STEP))
    for step in range(1_500):
        clock.advance_to(step * STEP)
        op.process_batch([batch_of(active_keys(step, new=20, active=1))])
        if step % 100 == 99:
            sizes.append(rocksdb_entries(db, state_id(COLUMNAR_STATE)))
    assert max(sizes[2:]) < 4 * live, sizes
