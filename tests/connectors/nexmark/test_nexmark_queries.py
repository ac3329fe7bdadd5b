"""The Nexmark queries from a user's side: every query's output equals a pandas computation
over the same generated events, and the stateful ones (q3, q4, q5, q7, q8) stay exact
through an injected failure and a stop-with-savepoint restored at another parallelism, on
the heap and RocksDB backends."""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.nexmark import queries as Q
from bench.nexmark import reference as R
from reactive import CheckpointConfig, Dataflow, RestartStrategy, Stream
from reactive.connectors.collections import ListSink
from reactive.connectors.files import CommittingFileSink
from reactive.connectors.nexmark import NexmarkConfig, NexmarkSource
from reactive.connectors.nexmark.generator import generate_columns, to_records
from reactive.connectors.nexmark.source import NexmarkReader
from reactive.sources import SourceReader
from tests.connectors.files.test_committing_file_sink import committed_records

# 30,000 events at 100 events/s: 300 s of event time (30 q7/q8 windows, 150 q5 windows),
# 600 people, 1,800 auctions lasting about 17 s each
CONFIG = NexmarkConfig(num_events=12_000, first_event_rate=100, seed=11)


@pytest.fixture(scope="module")
def tables() -> R.Tables:
    assert CONFIG.num_events is not None
    return R.Tables(to_records(generate_columns(CONFIG, np.arange(CONFIG.num_events))))


def build(query: str, source: NexmarkSource, parallelism: int, sink: Any, closed: Any = None,
          inject: Any = None) -> Dataflow:
    flow = Dataflow(f"nexmark-{query}", parallelism=parallelism, max_parallelism=16,
                    batch_size=128)
    events: Stream = flow.source(source, uid="events")
    if inject is not None:
        events = events.filter(inject, name="failure-injector")
    if query == "q4":
        out = Q.q4(events, closed=lambda s: s.sink(closed) if closed is not None else None)
    else:
        out = Q.QUERIES[query](events)
    out.sink(sink)
    return flow


def assert_q4(rows: collections.Counter[tuple[Any, ...]], tables: R.Tables) -> None:
    """Per category, each running count 1..n emitted once, the last with the batch average."""
    per_category: dict[Any, list[tuple[int, float]]] = collections.defaultdict(list)
    for (category, average, count), n in rows.items():
        per_category[category].extend([(count, average)] * n)
    totals = R.q4_totals(tables)
    assert set(per_category) == set(totals)
    for category, (count, total) in totals.items():
        emitted = sorted(per_category[category])
        assert [c for c, _ in emitted] == list(range(1, count + 1))
        assert emitted[-1][1] == total / count


@pytest.mark.parametrize("query", list(Q.QUERIES))
async def test_query_equals_the_batch_reference(query: str, tables: R.Tables) -> None:
    sink, closed = ListSink(), ListSink()
    await build(query, NexmarkSource(CONFIG, splits=4), 2, sink, closed).run()
    got = collections.Counter(tuple(r) for r in sink.records)
    if query == "q4":
        assert collections.Counter(closed.records) == R.q4_closed(tables)
        assert_q4(got, tables)
    else:
        expected = R.expected(query, tables)
        assert sum(expected.values()) > 0
        assert got == expected


# ---------------------------------------------------------------------- failures, rescaling
class Gate:
    """Lets the sources read the events numbered below ``limit`` only; ``parked`` is set
    once every reader of the running attempt waits at the limit."""

    def __init__(self, limit: int, readers: int) -> None:
        self.limit = limit
        self.readers = readers
        self.waiting: set[int] = set()
        self.parked = asyncio.Event()
        self.changed = asyncio.Event()

    def allow(self, limit: int | None, readers: int | None = None) -> None:
        self.limit = limit if limit is not None else 1 << 62
        self.readers = readers or self.readers
        self.waiting.clear()
        self.parked.clear()
        self.changed.set()
        self.changed = asyncio.Event()

    async def wait_at_limit(self, subtask: int) -> None:
        self.waiting.add(subtask)
        if len(self.waiting) >= self.readers:
            self.parked.set()
        changed = self.changed
        try:
            async with asyncio.timeout(0.05):
                await changed.wait()
        except TimeoutError:
            pass


# A Nexmark reader held back by the gate: the test is about the Nexmark connector's own
# parallel splits and positions, which a TestingSource would replace.
class GatedSource(NexmarkSource):
    """The Nexmark source held back by a :class:`Gate` (the test's pacing)."""

    def __init__(self, config: NexmarkConfig, gate: Gate) -> None:
        super().__init__(config, splits=6, chunk=256)
        self.gate = gate

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        splits = [[k, self.splits, k] for k in range(subtask, self.splits, parallelism)]
        return _GatedReader(self, splits, self.gate, subtask)


class _GatedReader(NexmarkReader):
    """Reads up to the gate's limit (the reader's end of input is moved there), then
    waits for the gate to open further."""

    def __init__(self, source: NexmarkSource, entries: list[list[int]], gate: Gate,
                 subtask: int) -> None:
        self.gate = gate
        self.subtask = subtask
        super().__init__(source, entries)

    def _end(self) -> int | None:
        end = self.config.num_events
        return self.gate.limit if end is None else min(end, self.gate.limit)

    async def read_batch(self, max_records: int) -> list[Any] | None:
        batch = await super().read_batch(max_records)
        if batch is None and self.gate.limit < (self.config.num_events or 0):
            await self.gate.wait_at_limit(self.subtask)
            return []
        return batch


def make_backend(name: str, work: Path) -> Any:
    if name == "heap":
        return None
    from reactive.backends.rocksdb import RocksDBStateBackend

    return RocksDBStateBackend(path=work)


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
@pytest.mark.parametrize("query", Q.STATEFUL)
async def test_stateful_query_is_exact_through_a_failure_and_a_rescale(
        query: str, backend: str, tmp_path: Path, tables: R.Tables) -> None:
    n = CONFIG.num_events
    assert n is not None
    out, closed_out = tmp_path / "out", tmp_path / "closed"
    # periodic checkpoints as well: positions taken in the middle of the source's chunks
    checkpoints = CheckpointConfig(interval=0.02, directory=tmp_path / "chk")
    failures: list[int] = []
    fail_after: list[int] = []
    seen = [0]

    def inject(e: Any) -> bool:
        seen[0] += 1
        if fail_after and seen[0] >= fail_after[0]:
            fail_after.pop()
            failures.append(seen[0])
            raise RuntimeError("injected failure")
        return True

    # run 1 at parallelism 2: a checkpoint at a sixth of the events, a failure a twelfth
    # later (restored from it), then a savepoint at half of them
    gate = Gate(n // 6, readers=2)
    first = build(query, GatedSource(CONFIG, gate), 2, CommittingFileSink(out),
                  CommittingFileSink(closed_out), inject)
    job = await first.start(checkpoints=checkpoints, restart=RestartStrategy.fixed(2, 0.0),
                            state_backend=make_backend(backend, tmp_path / "rocks1"))
    await gate.parked.wait()
    await job.checkpoint()
    fail_after.append(seen[0] + n // 12)
    gate.allow(n // 2)
    await gate.parked.wait()
    savepoint = await job.stop(savepoint=True, path=tmp_path / "savepoint")
    await job.wait()
    assert failures and job.metrics.restarts == 1
    assert job.metrics.restored_checkpoints  # the failure restored a checkpoint's state
    assert savepoint is not None

    # run 2 at parallelism 3 restores the savepoint and reads to the end
    gate.allow(None, readers=3)
    second = build(query, GatedSource(CONFIG, gate), 3, CommittingFileSink(out),
                   CommittingFileSink(closed_out), inject)
    await second.run(checkpoints=checkpoints, restore_from=savepoint.path,
                     state_backend=make_backend(backend, tmp_path / "rocks2"))

    rows = committed_records(out)
    if query == "q4":
        assert committed_records(closed_out) == R.q4_closed(tables)
        assert_q4(rows, tables)
    else:
        assert rows == R.expected(query, tables)
