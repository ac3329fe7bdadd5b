"""Incremental heap checkpoints in a running job: exact counts after crashes, and checkpoints
that write far fewer bytes than the state when few keys change."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

from reactive import CheckpointConfig, CheckpointStorage, Dataflow, RestartStrategy
from reactive.backends.heap import HeapStateBackend
from reactive.connectors.collections import ListSink
from reactive.sources import Source
from reactive.testing import TestingSource
from tests.support import FailureInjector, checkpoint_state, failing_count, final_counts


def gated(rounds: list[list[str]]) -> TestingSource:
    """The rounds one after the other, with a completed checkpoint between each two: the
    reader waits at a CHECKPOINT marker after each round until one completes (two after the
    first round, so that one holds every record of it: a checkpoint triggered after the
    first marker's release, which came after the whole round was read)."""
    items: list[Any] = [*rounds[0], TestingSource.CHECKPOINT, TestingSource.CHECKPOINT]
    for r in rounds[1:]:
        items += [*r, TestingSource.CHECKPOINT]
    return TestingSource(items)


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
    job = await flow("inc", gated(data), failing_count(injector), sink).run(
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
    await flow("bytes", gated(data), failing_count(FailureInjector([])), sink).run(
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
