"""Incremental heap checkpoints in a running job: exact counts after crashes, and checkpoints
that write far fewer bytes than the state when few keys change."""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path
from typing import Any

from reactive import CheckpointConfig, CheckpointStorage, Dataflow, RestartStrategy
from reactive.backends.heap import HeapStateBackend
from reactive.connectors.collections import ListSink
from reactive.sources import Source, SourceReader
from tests.support import FailureInjector, checkpoint_state, failing_count, final_counts


class GatedSource(Source):
    """Emits ``rounds`` one after the other; after each round it waits until a checkpoint
    taken at the end of the round completes (so each round lands in its own checkpoint)."""

    max_source_parallelism = 1

    def __init__(self, rounds: list[list[str]]) -> None:
        self.rounds = rounds

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        return _GatedReader(self.rounds)


class _GatedReader(SourceReader):
    def __init__(self, rounds: list[list[str]]) -> None:
        self.rounds = rounds
        self.round, self.offset = 0, 0
        self.snapshotted_at_end = False

    async def read_batch(self, max_records: int) -> list[Any] | None:
        if self.round >= len(self.rounds):
            return None
        items = self.rounds[self.round]
        if self.offset >= len(items):
            await asyncio.sleep(0.001)  # waits for the end-of-round checkpoint
            return []
        out = items[self.offset:self.offset + max_records]
        self.offset += len(out)
        return out

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        if self.round < len(self.rounds) and self.offset >= len(self.rounds[self.round]):
            self.snapshotted_at_end = True
        return [(self.round, self.offset)]

    def restore_state(self, entries: list[Any]) -> None:
        self.round, self.offset = entries[0]

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        if self.snapshotted_at_end:
            self.snapshotted_at_end = False
            self.round, self.offset = self.round + 1, 0


def rounds(n_keys: int, n_rounds: int, hot: int) -> list[list[str]]:
    """Load ``n_keys`` keys, then ``n_rounds`` rounds touching ``hot`` keys each."""
    load = [f"k{i}" for i in range(n_keys)]
    return [load, *([f"k{(r * 131 + j * 7) % n_keys}" for j in range(hot)] * 3
                    for r in range(n_rounds))]


def flow(name: str, source: Source, fn: Any, sink: ListSink) -> Dataflow:
    df = Dataflow(name, parallelism=2, max_parallelism=32, batch_size=128)
    df.source(source, uid="src").key_by(lambda w: w).process(fn).uid("count").sink(sink)
    return df


async def test_counts_are_exact_after_crashes(tmp_path: Path) -> None:
    data = rounds(4000, 12, 40)
    words = [w for r in data for w in r]
    truth = dict(collections.Counter(words))
    injector = FailureInjector([4300, 4700, 5300])  # in the update rounds
    sink = ListSink()
    job = await flow("inc", GatedSource(data), failing_count(injector), sink).run(
        checkpoints=CheckpointConfig(interval=0.01, directory=tmp_path, retained=2),
        restart=RestartStrategy.fixed(5, 0.0), state_backend=HeapStateBackend(incremental=True))
    assert injector.failures == 3
    assert job.metrics.restored_checkpoints
    assert final_counts(sink.records) == truth
    assert checkpoint_state(tmp_path, "inc", "count", "count") == truth
    # the retained checkpoints reference shared files that exist; the others were deleted
    storage = CheckpointStorage(tmp_path, "inc")
    for chk in storage.completed():
        storage.verify(chk)
    referenced = {ref.path for chk in storage.completed()
                  for sub in chk.metadata.operators["count"].subtasks.values()
                  if sub.keyed_state is not None for ref in sub.keyed_state.shared or ()}
    on_disk = {p.relative_to(storage.job_dir).as_posix()
               for p in storage.shared_dir.rglob("*.heap")}
    assert referenced <= on_disk


async def test_bytes_per_checkpoint_fall_when_few_keys_change(tmp_path: Path) -> None:
    data = rounds(20_000, 6, 30)
    sink = ListSink()
    await flow("bytes", GatedSource(data), failing_count(FailureInjector([])), sink).run(
        checkpoints=CheckpointConfig(interval=0.01, directory=tmp_path, retained=10_000),
        state_backend=HeapStateBackend(incremental=True))
    storage = CheckpointStorage(tmp_path, "bytes")
    per_subtask: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
    for chk in storage.completed():
        for i, sub in chk.metadata.operators["count"].subtasks.items():
            handle = sub.keyed_state
            assert handle is not None
            reused = {r.path for r in handle.shared_reused or ()}
            per_subtask[i].append(
                (sum(r.size for r in handle.files if r.path not in reused),
                 sum(r.size for r in handle.files)))
    for history in per_subtask.values():
        state = history[-1][1]  # every key loaded: what a full snapshot writes
        first = next(i for i, (_, t) in enumerate(history) if t >= 0.9 * state)
        # the checkpoints taken while the keys were loaded (one or several, however fast
        # checkpoints complete) wrote about the whole state between them; the update rounds
        # (30 of 20,000 keys each) write less than a tenth of it each
        assert sum(w for w, _ in history[: first + 1]) * 10 > state
        assert len([w for w, t in history[first + 1:] if t >= 0.9 * state
                    and w * 10 < state]) >= 6
    assert final_counts(sink.records) == dict(collections.Counter(w for r in data for w in r))
