"""``job.update(uid, new_function)`` on a running job: the new version takes over at the
snapshot instant of the checkpoint whose barrier carries it (Carbone 2018 (PhD thesis),
section 4.5.5), with the operator's state, exactly once, and survives restarts."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from reactive import (
    CheckpointConfig,
    Dataflow,
    IncompatibleUpdateError,
    KeyedProcessFunction,
    ListStateDescriptor,
    MsgpackSerializer,
    PushSource,
    ReconfigurationError,
    RestartStrategy,
    ValueStateDescriptor,
)
from reactive.backends.heap import HeapStateBackend
from reactive.backends.rocksdb import RocksDBStateBackend
from reactive.checkpoint import Reconfiguration, read_metadata
from reactive.connectors.collections import ListSink
from reactive.runtime.operators.source import SourceOperator
from reactive.sinks import Sink, SinkWriter
from reactive.state.backend import StateBackend
from tests.support import Count, operator_state_entry

WORDS = ["a", "b", "c"]


class TaggedCount(KeyedProcessFunction):
    """The second version of :class:`Count`: the same state, its output tagged."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def process_element(self, value: Any, ctx: Any) -> Iterable[Any]:
        n = self.count.value() + 1
        self.count.update(n)
        yield (ctx.current_key, n, "v2")


class FailingTaggedCount(TaggedCount):
    """:class:`TaggedCount` failing once at its ``fail_at``-th record (shared by every
    instance and attempt)."""

    seen = [0]
    fail_at = 5

    def process_element(self, value: Any, ctx: Any) -> Iterable[Any]:
        self.seen[0] += 1
        if self.seen[0] == self.fail_at:
            raise RuntimeError("injected failure after the update")
        return super().process_element(value, ctx)


class ListCount(KeyedProcessFunction):
    """Uses ``count`` as list state: incompatible with :class:`Count`'s value state."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ListStateDescriptor("count"))

    def process_element(self, value: Any, ctx: Any) -> Iterable[Any]:
        yield value


class MsgpackCount(TaggedCount):
    """Reads ``count`` with another serializer than :class:`Count` wrote it with."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0,
                                                        serializer=MsgpackSerializer()))


def _flow(name: str, source: PushSource, parallelism: int = 2) -> Dataflow:
    flow = Dataflow(name, parallelism=parallelism)
    (flow.source(source).uid("src").key_by(lambda w: w).process(Count()).uid("count")
     .sink(ListSink()).uid("out"))
    return flow


def _expected(rounds_v1: int, rounds_v2: int) -> list[tuple[Any, ...]]:
    """The committed output, sorted: each word counted by v1, then on by v2."""
    return sorted([(w, n) for w in WORDS for n in range(1, rounds_v1 + 1)]
                  + [(w, n, "v2") for w in WORDS
                     for n in range(rounds_v1 + 1, rounds_v1 + rounds_v2 + 1)])


async def _send_rounds(source: PushSource, rounds: int) -> None:
    for _ in range(rounds):
        for w in WORDS:
            await source.send(w)


async def test_output_switches_at_the_position_the_checkpoint_recorded(tmp_path):
    source = PushSource()
    flow = Dataflow("update-map", parallelism=1)
    flow.source(source).uid("src").map(lambda x: x).uid("m").sink(ListSink()).uid("out")
    job = await flow.start(checkpoints=CheckpointConfig(interval=None, directory=str(tmp_path)))
    results = job.results("out")
    for i in range(50):
        await source.send(i)

    def double(x: int) -> int:
        return 2 * x

    completed = await job.update("m", double)
    for i in range(50, 100):
        await source.send(i)
    source.close()
    out = [r async for r in results]
    await job.wait()
    # the source's position in the checkpoint that carried the update
    (_, split), = operator_state_entry(completed, "src", SourceOperator.POSITION, None)
    assert split == 50
    assert out == list(range(split)) + [2 * i for i in range(split, 100)]
    # the update is in the checkpoint's metadata, on disk, through the typed contract
    recorded = read_metadata(completed.path).reconfigurations
    assert recorded == (Reconfiguration(
        "update", "m", f"{double.__module__}.{double.__qualname__}"),)
    assert recorded[0].to_json()["version"] == 1


def _backend(name: str, tmp_path: Path) -> StateBackend:
    return HeapStateBackend() if name == "heap" else RocksDBStateBackend(path=tmp_path / "db")


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
async def test_keyed_state_carries_over_to_the_new_version(tmp_path, backend):
    source = PushSource()
    job = await _flow("update-count", source).start(
        checkpoints=CheckpointConfig(interval=0.05, directory=str(tmp_path / "chk")),
        state_backend=_backend(backend, tmp_path))
    results = job.results("out")
    await _send_rounds(source, 10)
    await job.update("count", TaggedCount())
    await _send_rounds(source, 10)
    source.close()
    out = [r async for r in results]
    await job.wait()
    assert sorted(out) == _expected(10, 10)
    # per key, every v1 record comes before every v2 record
    for w in WORDS:
        tags = [len(r) for r in out if r[0] == w]
        assert tags == sorted(tags)


@pytest.mark.parametrize("new, reason", [
    (ListCount(), "state 'count' is value state in the running version and list state"),
    (MsgpackCount(), "state 'count' is written with pickle (default) in the running version"),
    (lambda x: x, "has no process_element"),
])
async def test_an_incompatible_update_is_refused_and_the_job_runs_on(tmp_path, new, reason):
    source = PushSource()
    job = await _flow("update-refused", source).start(
        checkpoints=CheckpointConfig(interval=None, directory=str(tmp_path)))
    results = job.results("out")
    await _send_rounds(source, 5)
    with pytest.raises(IncompatibleUpdateError, match=re.escape(reason)):
        await job.update("count", new)
    assert job.status == "running"
    assert job.metrics.checkpoints == []  # nothing was sent
    await _send_rounds(source, 5)
    source.close()
    out = [r async for r in results]
    await job.wait()
    assert sorted(out) == sorted((w, n) for w in WORDS for n in range(1, 11))


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
async def test_a_failure_after_the_update_restores_the_new_version(tmp_path, backend):
    FailingTaggedCount.seen[0] = 0
    source = PushSource()
    job = await _flow("update-then-fail", source).start(
        checkpoints=CheckpointConfig(interval=0.05, directory=str(tmp_path / "chk")),
        state_backend=_backend(backend, tmp_path),
        restart=RestartStrategy.fixed(2, delay=0.0))
    results = job.results("out")
    await _send_rounds(source, 10)
    completed = await job.update("count", FailingTaggedCount())
    await _send_rounds(source, 10)
    source.close()
    out = [r async for r in results]
    await job.wait()
    assert job.metrics.restarts == 1
    assert job.restored_from is not None
    assert job.restored_from.checkpoint_id >= completed.checkpoint_id
    assert sorted(out) == _expected(10, 10)


class _FailingSnapshotSink(Sink[Any]):
    """A list sink whose snapshot fails while ``armed`` (shared by its instances)."""

    def __init__(self) -> None:
        self.armed = [False]

    def create_writer(self, subtask: int, parallelism: int) -> SinkWriter[Any]:
        return _FailingSnapshotWriter(self.armed)


class _FailingSnapshotWriter(SinkWriter[Any]):
    def __init__(self, armed: list[bool]) -> None:
        self.armed = armed

    def write(self, batch: list[Any]) -> None:
        pass

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        if self.armed[0]:
            self.armed[0] = False
            raise OSError("injected snapshot failure")
        return []


async def test_a_failed_update_checkpoint_leaves_the_old_version(tmp_path):
    source = PushSource()
    sink = _FailingSnapshotSink()
    flow = Dataflow("update-fails", parallelism=2)
    (flow.source(source).uid("src").key_by(lambda w: w).process(Count()).uid("count")
     .sink(sink).uid("out"))
    job = await flow.start(checkpoints=CheckpointConfig(interval=None, directory=str(tmp_path)),
                           restart=RestartStrategy.fixed(1, delay=0.0))
    results = job.results("out")
    await _send_rounds(source, 5)
    before = await job.checkpoint()
    await _send_rounds(source, 5)
    sink.armed[0] = True
    with pytest.raises(ReconfigurationError, match="injected snapshot failure"):
        await job.update("count", TaggedCount())
    await _send_rounds(source, 5)
    source.close()
    out = [r async for r in results]
    await job.wait()
    # the attempt restarted from the checkpoint before the update, with the old version
    assert job.metrics.restarts == 1
    assert job.restored_from is not None
    assert job.restored_from.checkpoint_id == before.checkpoint_id
    assert sorted(out) == sorted((w, n) for w in WORDS for n in range(1, 16))


def test_metadata_without_reconfigurations_reads_as_none_and_writes_back_unchanged():
    from reactive.checkpoint import CheckpointMetadata

    old = {"format": 2, "job": "j", "checkpoint_id": 3, "kind": "checkpoint",
           "max_parallelism": 128, "operators": {}}
    metadata = CheckpointMetadata.from_json(old)
    assert metadata.reconfigurations == ()
    assert metadata.to_json() == old
    entry = {"version": 1, "kind": "update", "operator": "m", "function": "mod.f"}
    new = CheckpointMetadata.from_json({**old, "reconfigurations": [entry]})
    assert new.reconfigurations == (Reconfiguration("update", "m", "mod.f"),)
    assert new.to_json() == {**old, "reconfigurations": [entry]}


async def test_no_checkpoint_is_triggered_while_the_update_checkpoint_is_pending(tmp_path):
    """With several checkpoints allowed at once, a later one completing first would
    subsume the update's checkpoint: the update's takes every slot until it ends."""
    source = PushSource()
    job = await _flow("update-concurrent", source).start(
        checkpoints=CheckpointConfig(interval=0.01, max_concurrent=4,
                                     directory=str(tmp_path)))
    results = job.results("out")
    await _send_rounds(source, 10)
    completed = await job.update("count", TaggedCount())
    await _send_rounds(source, 10)
    source.close()
    out = [r async for r in results]
    await job.wait()
    assert sorted(out) == _expected(10, 10)
    update = next(s for s in job.metrics.checkpoints
                  if s.checkpoint_id == completed.checkpoint_id)
    # every checkpoint triggered after it was triggered once it had completed
    later = [s for s in job.metrics.checkpoints if s.checkpoint_id > completed.checkpoint_id]
    assert later
    assert all(s.trigger_time >= update.trigger_time + update.duration for s in later)
