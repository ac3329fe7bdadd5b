"""``job.stop(savepoint=True)`` from the application: a stop that fails leaves the job
running and moving records; a stop that succeeds covers every record accepted before it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from reactive import (
    CheckpointConfig,
    Dataflow,
    KeyedProcessFunction,
    PushSource,
    ValueStateDescriptor,
)
from reactive.connectors.collections import ListSink


async def _bounded(coro: Any, seconds: float = 10.0) -> Any:
    """``coro``'s result, failing the test if it takes longer than ``seconds``."""
    task = asyncio.ensure_future(coro)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if not done:
        task.cancel()
        pytest.fail(f"no answer within {seconds} s")
    return task.result()


async def test_a_stop_whose_move_fails_leaves_the_job_running(tmp_path):
    (tmp_path / "a-file").write_text("not a directory")
    src = PushSource()
    sink = ListSink()
    flow = Dataflow("stop-move-fails", parallelism=1)
    flow.source(src).uid("src").map(lambda x: x).uid("m").sink(sink).uid("out")
    job = await flow.start(checkpoints=CheckpointConfig(interval=0.05,
                                                        directory=str(tmp_path / "chk")))
    for i in range(5):
        await src.send(i, durable=True)
    with pytest.raises(OSError):
        await job.stop(savepoint=True, path=tmp_path / "a-file" / "sp")
    assert job.status == "running"
    # the sources read again: new records become durable (a checkpoint covers them, so
    # they were read) and reach the sink
    for i in range(5, 10):
        await _bounded(src.send(i, durable=True))
    assert sorted(sink.records) == list(range(10))
    # and the job can still be stopped properly
    savepoint = await job.stop(savepoint=True, path=tmp_path / "sp")
    assert job.status == "stopped" and savepoint is not None
    assert (tmp_path / "sp" / "_metadata").exists()


class _Count(KeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        self.n = ctx.get_state(ValueStateDescriptor("n", default=0))

    def process_element(self, value: Any, ctx: Any) -> Any:
        self.n.update(self.n.value() + 1)
        yield value


def _counting(source: PushSource) -> Dataflow:
    flow = Dataflow("stop-push", parallelism=2, max_parallelism=64)
    (flow.source(source).uid("src").key_by(lambda e: e["user"]).process(_Count()).uid("count")
         .sink(ListSink()).uid("out"))
    return flow


SENT = 500


async def _stop_after_sends(directory: str) -> tuple[int, int | None, int]:
    """Push SENT records right before stop(savepoint=True), then resume from the savepoint
    with a new PushSource (as after a process restart) and push one more."""
    source = PushSource()
    job = await _counting(source).start(
        checkpoints=CheckpointConfig(interval=3600, directory=directory))
    await source.send({"user": "warm-up"})
    await job.checkpoint()  # the job runs and its reader waits for records
    for _ in range(SENT):
        await source.send({"user": "u0"})
    await job.stop(savepoint=True)
    durable_at_stop = source.durable
    again = PushSource()
    job2 = await _counting(again).start(
        checkpoints=CheckpointConfig(interval=3600, directory=directory), resume=True)
    await again.send({"user": "u0"})
    await job2.checkpoint()  # covers the new record: it was read before the barrier
    count = await job2.query_state("count", "n", "u0")
    again.close()
    await job2.wait()
    return durable_at_stop, count, SENT + 1


async def test_stop_covers_every_record_accepted_before_it(tmp_path):
    durable, count, expected = await _stop_after_sends(str(tmp_path))
    assert durable == SENT + 1  # the warm-up record too
    assert count == expected


def test_stop_covers_every_record_accepted_before_it_under_trio(tmp_path):
    trio = pytest.importorskip("trio")
    durable, count, expected = trio.run(_stop_after_sends, str(tmp_path))
    assert durable == SENT + 1
    assert count == expected
