"""``job.stop(savepoint=True)`` from the application: a stop that fails leaves the job
running and moving records; a stop that succeeds covers every record accepted before it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from reactive import CheckpointConfig, Dataflow, PushSource
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
