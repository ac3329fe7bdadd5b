"""A sink that awaits I/O on every write (a remote write) is handed whole batches, and the
job's checkpoints complete under it; a job whose checkpoints never complete fails saying so.

The task slices an input batch by the chain's measured cost per record
(``reactive.runtime.task.TIME_SLICE``). A write that awaits is not cost: counting it made the
task hand such a sink the fewest records per call (``MIN_SLICE``), so a sink taking 0.1 s per
call moved ~160 records/s per instance and every checkpoint timed out behind its queue.
The task's clock is a fake one (:class:`tests.support.TaskClock`) that the writer advances by
its latency: what the task counts as cost does not depend on how busy the machine is.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterator
from typing import Any

import pytest

from reactive import CheckpointConfig, Dataflow, JobFailedError, RestartStrategy
from reactive.errors import CheckpointProgressError
from reactive.sinks import Sink, SinkWriter
from tests.support import Count, TaskClock, final_counts

BATCH = 256
#: seconds each write awaits (the remote round trip)
LATENCY = 0.01
#: the tasks' clock: the job runs a copy of each writer, so it cannot hold the clock
CLOCK = TaskClock()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[TaskClock]:
    with CLOCK.installed(monkeypatch):
        yield CLOCK


class RemoteWriter(SinkWriter):
    """Awaits a fixed latency per call, as a remote write does; records what it got."""

    def __init__(self, sink: RemoteSink) -> None:
        self.sink = sink

    async def write(self, batch: list[Any]) -> None:
        self.sink.calls.append(len(batch))
        self.sink.records.extend(batch)
        self.sink.writing.set()
        CLOCK.work(LATENCY)  # the round trip, on the tasks' clock
        await asyncio.sleep(LATENCY)


class RemoteSink(Sink):
    def __init__(self) -> None:
        self.calls: list[int] = []
        self.records: list[Any] = []
        self.writing = asyncio.Event()  # set at the first write

    def create_writer(self, subtask: int, parallelism: int) -> SinkWriter:
        return RemoteWriter(self)


async def test_a_sink_awaiting_io_gets_whole_batches_and_checkpoints_complete(
        tmp_path, clock: TaskClock) -> None:
    words = [f"w{i % 97}" for i in range(16 * BATCH)]
    flow = Dataflow("remote-sink", parallelism=1, batch_size=BATCH)
    sink = RemoteSink()
    flow.from_collection(words).key_by(lambda w: w).process(Count()).uid("count").sink(sink)
    job = await flow.start(checkpoints=CheckpointConfig(interval=None, directory=tmp_path,
                                                       timeout=30))
    # a checkpoint triggered once the sink writes its first batch: the source, held back by
    # the full channel, still has batches to emit behind its barrier (a periodic trigger
    # could come after the last one on a loaded machine)
    await sink.writing.wait()
    taken = await job.checkpoint()
    await job.wait()
    assert final_counts(sink.records) == dict(collections.Counter(words))
    # the input batches reach the sink whole: one call per batch of the source (counting
    # the awaited writes as cost, the task made 16 calls of 16 records of each)
    assert sum(sink.calls) == len(words)
    assert sink.calls == [BATCH] * 16, sink.calls
    # the checkpoint completed while the sink was writing, before the final one
    assert [c.checkpoint_id for c in job.metrics.completed_checkpoints][:1] == [
        taken.checkpoint_id]
    assert len(job.metrics.completed_checkpoints) == 2


class StuckWriter(SinkWriter):
    """A remote write that never returns (the service hangs): the job is backpressured and
    no barrier reaches the sink."""

    async def write(self, batch: list[Any]) -> None:
        await asyncio.Event().wait()


class StuckSink(Sink):
    def create_writer(self, subtask: int, parallelism: int) -> SinkWriter:
        return StuckWriter()


async def test_a_job_whose_checkpoints_never_complete_fails_saying_so(tmp_path) -> None:
    """After more than the tolerable number of consecutive failed checkpoints and none
    completed in the attempt, a restart would restore the same state and repeat it: the job
    fails at once naming why, instead of restarting from the beginning again and again."""
    flow = Dataflow("stuck", parallelism=1, batch_size=64)
    (flow.from_collection([f"w{i % 7}" for i in range(10_000)])
         .key_by(lambda w: w).process(Count()).uid("count").sink(StuckSink()))
    config = CheckpointConfig(interval=0.02, directory=tmp_path, timeout=0.1,
                              tolerable_failed_checkpoints=1)
    job = await flow.start(checkpoints=config, restart=RestartStrategy.fixed(2, 0.0))
    with pytest.raises(JobFailedError) as info:
        await job.wait()
    cause = info.value.__cause__
    assert isinstance(cause, CheckpointProgressError), repr(cause)
    assert "no checkpoint completed in this job attempt" in str(cause)
    assert "2 consecutive checkpoints failed" in str(cause)
    assert "2 timed out" in str(cause)
    assert "backpressure" in str(cause)
    assert job.metrics.restarts == 0
    assert job.metrics.completed_checkpoints == []
