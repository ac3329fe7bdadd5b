"""Incremental heap checkpoints in a running job: exact counts after crashes, and checkpoints
that write far fewer bytes than the state when few keys change."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

from reactive import CheckpointConfig, CheckpointStorage, Dataflow, PushSource, RestartStrategy
from reactive.backends.heap import HeapStateBackend
from reactive.checkpoint import read_metadata
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
    # One checkpoint after the load and one after each round, triggered by the test once
    # the source accepted the round: the load lands in one checkpoint on any machine. (Under
    # periodic checkpoints a slow machine spreads the load over many, and the changelog then
    # materializes key groups whose chains of load deltas outgrew their first blob during the
    # update rounds, as its delta_ratio bound says it must.)
    data = rounds(20_000, 6, 30)
    source = PushSource(capacity=len(data[0]))
    sink = ListSink()
    job = await flow("bytes", source, failing_count(FailureInjector([])), sink).start(
        checkpoints=CheckpointConfig(interval=None, directory=tmp_path, retained=10_000),
        state_backend=HeapStateBackend(incremental=True))
    taken = []
    for r in data:
        for w in r:
            await source.send(w)
        taken.append(await job.checkpoint())
    source.close()
    await job.wait()
    per_subtask: dict[int, list[tuple[int, int]]] = collections.defaultdict(list)
    for chk in taken:
        for i, sub in read_metadata(chk.path).operators["count"].subtasks.items():
            handle = sub.keyed_state
            assert handle is not None
            reused = {r.path for r in handle.shared_reused or ()}
            per_subtask[i].append(
                (sum(r.size for r in handle.files if r.path not in reused),
                 sum(r.size for r in handle.files)))
    assert len(per_subtask) == 2
    for history in per_subtask.values():
        assert len(history) == len(data)
        (load_written, state), *updates = history
        # the load's checkpoint wrote the whole state; each round (30 of 20,000 keys) writes
        # less than a tenth of it while the state it refers to stays whole
        assert load_written == state > 0
        assert all(w * 10 < state <= t for w, t in updates), (state, updates)
    assert final_counts(sink.records) == dict(collections.Counter(w for r in data for w in r))
