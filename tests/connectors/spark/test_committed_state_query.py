"""``job.query_state(...)`` read committed: it answers from the checkpoint a failure cannot
take back, or says it is not ready; never a false None; and it reads snapshot files off the
event loop."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from reactive import (
    CheckpointConfig,
    Dataflow,
    KeyedProcessFunction,
    PushSource,
    ValueStateDescriptor,
)
from reactive.connectors.collections import DiscardingSink
from reactive.errors import StateNotReadyError


class _Count(KeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("c", default=0))

    def process_element(self, value: Any, ctx: Any) -> None:
        self.count.update(self.count.value() + 1)


def _flow(source: PushSource, max_parallelism: int = 128) -> Dataflow:
    flow = Dataflow("committed-query", parallelism=1, max_parallelism=max_parallelism)
    (flow.source(source).uid("src")
         .key_by(lambda v: v[0])
         .process(_Count()).uid("count")
         .sink(DiscardingSink()).uid("out"))
    return flow


async def _send(job: Any, source: PushSource, key: str, n: int) -> None:
    """Send ``n`` records and take checkpoints until one covers them all."""
    for i in range(n):
        last = await source.send((key, i))
    while source.durable <= last:
        await job.checkpoint()


async def test_right_after_a_resume_it_answers_from_the_restored_checkpoint(tmp_path):
    config = CheckpointConfig(interval=None, directory=str(tmp_path))
    source = PushSource()
    job = await _flow(source).start(checkpoints=config)
    await _send(job, source, "k", 10)
    await job.cancel()

    source = PushSource()
    job = await _flow(source).start(checkpoints=config, resume=True)
    # the run is still choosing what to restore: the answer is the restored value
    assert await job.query_state("count", "c", "k") == 10
    assert await job.query_state("count", "c", "never-sent") is None
    source.close()
    await job.wait()


async def test_before_any_checkpoint_it_is_not_ready(tmp_path):
    source = PushSource()
    job = await _flow(source).start(
        checkpoints=CheckpointConfig(interval=None, directory=str(tmp_path)))
    await source.send(("k", 0))
    with pytest.raises(StateNotReadyError, match="no completed checkpoint"):
        await job.query_state("count", "c", "k")
    await _send(job, source, "k", 1)
    assert await job.query_state("count", "c", "k") == 2
    source.close()
    await job.wait()


async def test_an_intermediate_savepoint_is_not_what_it_answers_from(tmp_path):
    """Failover never restores an intermediate savepoint (it committed nothing): the
    committed value stays the checkpoint's."""
    source = PushSource()
    job = await _flow(source).start(
        checkpoints=CheckpointConfig(interval=None, directory=str(tmp_path / "chk")))
    await _send(job, source, "k", 10)
    for i in range(5):
        await source.send(("k", i))
    while await job.query_state("count", "c", "k", committed=False) != 15:
        await asyncio.sleep(0)  # until the count processed them (polls a condition)
    await job.savepoint()  # kept in checkpoint storage: it holds 15
    assert await job.query_state("count", "c", "k") == 10
    await job.savepoint(tmp_path / "sp")  # moved out of it
    assert await job.query_state("count", "c", "k") == 10
    await _send(job, source, "k", 1)
    assert await job.query_state("count", "c", "k") == 16
    source.close()
    await job.wait()


async def test_a_stop_with_savepoint_moved_elsewhere_is_read_where_it_went(tmp_path):
    source = PushSource()
    job = await _flow(source).start(
        checkpoints=CheckpointConfig(interval=None, directory=str(tmp_path / "chk")))
    await _send(job, source, "k", 7)
    await job.stop(savepoint=True, path=tmp_path / "sp")
    assert await job.query_state("count", "c", "k") == 7


async def test_the_snapshot_is_read_while_the_loop_keeps_running(tmp_path, monkeypatch):
    """A loop-step probe: the snapshot reader does not return until the loop ran 20 more
    steps. Read on the loop thread, it would wait in vain (and the probe count no step)."""
    import reactive.runtime.state_query as state_query

    source = PushSource()
    job = await _flow(source).start(
        checkpoints=CheckpointConfig(interval=None, directory=str(tmp_path)))
    await _send(job, source, "k", 3)

    steps = 0
    enough = threading.Event()
    stop = asyncio.Event()

    async def probe() -> None:
        nonlocal steps
        while not stop.is_set():
            steps += 1
            if steps == 20:
                enough.set()
            await asyncio.sleep(0)

    read = state_query.read_key_groups
    saw: list[bool] = []

    def read_after_the_loop_ran(*args: Any, **kwargs: Any) -> Any:
        saw.append(enough.wait(timeout=5.0))  # the timeout only ends a failing run
        return read(*args, **kwargs)

    monkeypatch.setattr(state_query, "read_key_groups", read_after_the_loop_ran)
    prober = asyncio.create_task(probe())
    await asyncio.sleep(0)
    before = steps
    assert await job.query_state("count", "c", "k") == 3
    stop.set()
    await prober
    assert saw == [True] and steps - before >= 20
    source.close()
    await job.wait()
