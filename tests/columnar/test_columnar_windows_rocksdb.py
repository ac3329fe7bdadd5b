"""Columnar event-time windows with their panes in RocksDB (``RocksDBStateBackend``): a row
of panes per key behind a cache of a few keys, evicted keys brought back by their heap
timers. Results and late rows equal the heap run's, whatever the batch size; through a
failure and a restore at another parallelism the committed output is exact; the checkpoint
holds the panes as RocksDB rows (readable by the key-group reader)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reactive import CheckpointConfig, CheckpointStorage, Dataflow, RestartStrategy
from reactive.backends.rocksdb import RocksDBStateBackend
from reactive.columnar.pane_store import PaneCache
from reactive.columnar.window_operator import ColumnarWindowOperator
from reactive.connectors.collections import ListSink
from reactive.errors import JobFailedError
from reactive.state.key_group_stream import read_key_groups
from reactive.testing import AbortExecution
from tests.columnar.test_columnar_windows import (
    ASSIGNERS,
    DELAY,
    _chain,
    _result_row,
    events,
    ordered,
    per_record_windows,
    window_job,
)


@pytest.fixture
def counted(monkeypatch):
    """A cache of 3 keys for the 30 keys of the input, counting evictions and the keys
    read back by their timers."""
    monkeypatch.setattr(ColumnarWindowOperator, "cache_keys", 3)
    seen = {"evictions": 0, "timer_reads": 0}
    evict, fire = PaneCache.evict, PaneCache.fire_timers

    def counting_evict(self: PaneCache) -> None:
        seen["evictions"] += 1
        evict(self)

    def counting_fire(self: PaneCache, watermark: float) -> None:
        before = self.index.size
        fire(self, watermark)
        seen["timer_reads"] += self.index.size - before

    monkeypatch.setattr(PaneCache, "evict", counting_evict)
    monkeypatch.setattr(PaneCache, "fire_timers", counting_fire)
    return seen


def stored_rows(completed: Any, uid: str) -> dict[Any, Any]:
    """The window operator's rows (key -> panes) in a completed checkpoint."""
    handles = [s.keyed_state.to_json() for s in
               completed.metadata.operators[uid].subtasks.values() if s.keyed_state]
    assert handles and all(h["backend"] == "rocksdb" for h in handles)
    rows: dict[Any, Any] = {}
    for h in handles:
        for kg in read_key_groups(h, completed.job_dir):
            rows.update(kg.states.get("_columnar", {}))
    return rows


async def windows(table: pa.Table, assigner: Any, batch_size: int, parallelism: int,
                  directory: Path | None) -> tuple[list[Any], list[Any]]:
    """Results and late rows of the windows, on RocksDB under ``directory`` (None: heap)."""
    flow = Dataflow("windows-rocksdb", parallelism=parallelism, max_parallelism=16)
    windowed = (flow.from_arrow(table, batch_size=batch_size)
                    .assign_timestamps("ts", DELAY).set_parallelism(1)
                    .key_by("k").window(assigner, timestamp="ts").allowed_lateness(20))
    results, late = ListSink(), ListSink()
    windowed.agg(n=("v", "count"), s=("v", "sum"), lo=("v", "min"), hi=("v", "max"),
                 m=("v", "mean")).uid("windows").to_records().sink(results)
    windowed.late_data().to_records().sink(late)
    if directory is None:
        await flow.run()
    else:
        await flow.run(checkpoints=CheckpointConfig(interval=0.01, directory=directory / "c"),
                       state_backend=RocksDBStateBackend(directory / "work"))
    return (ordered(_result_row(r) for r in results.records),
            ordered((r["k"], r["ts"], r["v"]) for r in late.records))


@pytest.mark.parametrize("kind", ["tumbling", "sliding-gaps", "session"])
async def test_panes_in_rocksdb_give_the_heap_results(tmp_path, counted, kind):
    table = events(400, seed=7, keys=30)
    heap = await windows(table, ASSIGNERS[kind], 97, 2, None)
    assert heap[0] and (heap[1] or kind != "tumbling")  # windows fired, rows were late
    assert await windows(table, ASSIGNERS[kind], 97, 2, tmp_path / "a") == heap
    # the cache really was too small: keys went to RocksDB and came back by timer
    assert counted["evictions"] > 10 and counted["timer_reads"] > 10
    # at the end every window is gone, and so is every key's row (deleted, not emptied)
    final = CheckpointStorage(tmp_path / "a" / "c", "windows-rocksdb").completed()[-1]
    assert stored_rows(final, "windows") == {}
    assert await windows(table, ASSIGNERS[kind], 200, 3, tmp_path / "b") == heap


@pytest.mark.parametrize("kind", ["sliding", "session"])
async def test_panes_in_rocksdb_exactly_once_through_a_failure_and_a_rescale(
        tmp_path, counted, kind):
    table = events(1500, seed=11, keys=30)
    assigner = ASSIGNERS[kind]
    out, chk = tmp_path / "out", tmp_path / "chk"
    config = CheckpointConfig(interval=0.01, directory=chk)
    backend = RocksDBStateBackend(tmp_path / "work")
    first = window_job(table, assigner, 2, out, chk, fail_at=1000)
    with pytest.raises(JobFailedError) as info:
        await first.run(checkpoints=config, restart=RestartStrategy.none(),
                        state_backend=backend)
    assert any(isinstance(e, AbortExecution) for e in _chain(info.value))
    before = [r for part in out.glob("part-*") for r in pq.read_table(part).to_pylist()]

    # the checkpoint holds the open panes as RocksDB rows, one per key
    rows = stored_rows(CheckpointStorage(chk, "columnar-window-eo").completed()[-1], "windows")
    assert rows and all(k.startswith("k") for k in rows)
    # (starts, ends, *aggregate arrays): one entry per open pane in each
    assert all(r and len({len(column) for column in r}) == 1 for r in rows.values())

    await window_job(table, assigner, 3, out, chk, fail_at=None).run(
        checkpoints=config, resume=True, state_backend=backend)
    committed = [r for part in sorted(out.glob("part-*"))
                 for r in pq.read_table(part).to_pylist()]
    expected, _ = await per_record_windows(table, assigner, 20)
    assert len(before) < len(expected)  # the first run failed part way
    assert ordered(_result_row(r) for r in committed) == expected
