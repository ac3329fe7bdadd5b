"""The synchronous-snapshot baseline (``CheckpointConfig(mode="synchronous")``, thesis 3.4.2):
the sources are halted from the trigger until the checkpoint completes, every record in
flight reaches the sinks before it completes, every task writes its snapshot before it goes
on, and the results are exactly once like the aligned mode's (the shared exactly-once tests
are parametrized with it; this file checks what only this mode promises).
"""

from __future__ import annotations

import asyncio
import collections
import signal
from typing import Any

import pytest

from reactive import (
    CheckpointConfig,
    CheckpointStorage,
    ConfigurationError,
    Dataflow,
    RestartStrategy,
    Sink,
    Source,
    SourceReader,
)
from reactive.sinks import SinkWriter
from tests.connectors.files.test_file_sink_commits import (
    _run,
    committed_records,
    expected_output,
    hidden_files,
)
from tests.connectors.files.test_file_sink_commits import pipeline as committing_job
from tests.support import Count, checkpoint_state, final_counts, zipf_words


class Log:
    """What a source reader and a sink did, in order (shared by all instances)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int, int]] = []  # (what, checkpoint id or 0, position)
        self.sunk = 0
        self.sunk_at_completion: dict[int, int] = {}


# Hand-written: it logs the order of the reader's reads, snapshots and completion
# notifications, which is what the synchronous-snapshot tests check.
class LoggedSource(Source):
    """A non-parallel source of ``items`` that logs its reads, snapshots and completions;
    with ``every``, it waits for a completed checkpoint each ``every`` records (so several
    complete while the input is read, however fast the machine)."""

    max_source_parallelism = 1

    def __init__(self, items: list[Any], log: Log, every: int = 0) -> None:
        self.items, self.log, self.every = items, log, every

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        return _LoggedReader(self)


class _LoggedReader(SourceReader):
    def __init__(self, src: LoggedSource) -> None:
        self.src, self.pos = src, 0
        self.completed = 0
        self.waiting_from: int | None = None  # completions seen when a pacing wait began

    async def read_batch(self, max_records: int) -> list[Any] | None:
        if self.pos >= len(self.src.items):
            return None
        every = self.src.every
        if every and self.pos and self.pos % every == 0:
            if self.waiting_from is None:
                self.waiting_from = self.completed
            if self.completed == self.waiting_from:
                return []  # not a read: the task serves barriers meanwhile
            self.waiting_from = None
        end = self.pos + max_records
        if every:
            end = min(end, (self.pos // every + 1) * every)
        out = self.src.items[self.pos:end]
        self.pos += len(out)
        self.src.log.events.append(("read", 0, self.pos))
        return out

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        self.src.log.events.append(("snapshot", checkpoint_id, self.pos))
        return [self.pos]

    def restore_state(self, entries: list[Any]) -> None:
        self.pos = entries[0]

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.completed += 1
        log = self.src.log
        log.events.append(("complete", checkpoint_id, self.pos))
        log.sunk_at_completion[checkpoint_id] = log.sunk


class CountingSink(Sink):
    """Counts the records that reached any of its instances."""

    def __init__(self, log: Log) -> None:
        self.log = log

    def create_writer(self, subtask: int, parallelism: int) -> SinkWriter:
        return _CountingWriter(self.log)


class _CountingWriter(SinkWriter):
    def __init__(self, log: Log) -> None:
        self.log = log

    def write(self, batch: list[Any]) -> None:
        self.log.sunk += len(batch)


async def test_sources_stay_halted_and_channels_drain_until_the_checkpoint_completes(tmp_path):
    words = zipf_words(60_000, 500, seed=3)
    log = Log()
    flow = Dataflow("halt", parallelism=2, max_parallelism=64, batch_size=64)
    (flow.source(LoggedSource(words, log, every=10_000), uid="words")
         .map(lambda w: w.upper()).set_parallelism(3)
         .key_by(lambda w: w).process(Count()).uid("count")
         .sink(CountingSink(log)))
    job = await flow.run(checkpoints=CheckpointConfig(interval=0.005, directory=tmp_path,
                                                      mode="synchronous", retained=100))
    completed = job.metrics.completed_checkpoints
    assert len(completed) >= 3, "the run took fewer than 3 checkpoints"
    checked = 0
    for stats in completed:
        cid = stats.checkpoint_id
        trail = [e for e in log.events if e[1] in (0, cid)]
        start = trail.index(next(e for e in trail if e[:2] == ("snapshot", cid)))
        end = trail.index(next(e for e in trail if e[:2] == ("complete", cid)))
        # halted: the source read nothing between its snapshot and the completion
        assert [e for e in trail[start + 1:end] if e[0] == "read"] == [], f"checkpoint {cid}"
        position = trail[start][2]
        # drained: every record read before the barrier reached the sink, and nothing else
        assert log.sunk_at_completion[cid] == position, f"checkpoint {cid}"
        if 0 < position < len(words):
            checked += 1
    assert checked >= 2, "no checkpoint was taken while the input was being read"
    # every task wrote its whole snapshot in the task: nothing is left for an async part
    assert all(t["async"] == 0.0 for s in completed for t in s.tasks.values())
    assert checkpoint_state(tmp_path, "halt", "count", "count") == dict(
        collections.Counter(w.upper() for w in words))


async def test_an_aborted_checkpoint_resumes_the_sources(tmp_path):
    """A checkpoint a task declines is aborted; the sources must read again, or the job
    would stop for good at its first failed checkpoint."""

    words = zipf_words(40_000, 300, seed=4)
    sink_records: list[Any] = []
    snapshots = [0]

    class FailingOnceWriter(_ListWriter):
        def snapshot_state(self, checkpoint_id: int) -> list[Any]:
            snapshots[0] += 1
            if snapshots[0] == 2:
                raise OSError(f"injected: one sink instance fails checkpoint {checkpoint_id}")
            return []

    class ListOnce(Sink):
        def create_writer(self, subtask: int, parallelism: int) -> SinkWriter:
            return FailingOnceWriter(sink_records)

    flow = Dataflow("abort", parallelism=2, batch_size=64)
    flow.from_collection(words).key_by(lambda w: w).process(Count()).uid("count") \
        .sink(ListOnce())
    job = await asyncio.wait_for(flow.run(checkpoints=CheckpointConfig(
        interval=0.005, directory=tmp_path, mode="synchronous", history=1_000)), timeout=120)
    statuses = [s.status for s in job.metrics.checkpoints]
    assert statuses[0] == "aborted" and "completed" in statuses[1:]
    assert final_counts(sink_records) == dict(collections.Counter(words))


class _ListWriter(SinkWriter):
    def __init__(self, records: list[Any]) -> None:
        self.records = records

    def write(self, batch: list[Any]) -> None:
        self.records.extend(batch)


async def test_stop_with_savepoint_and_restore_in_synchronous_mode(tmp_path):
    words = zipf_words(20_000, 400, seed=5)
    log = Log()
    first: list[Any] = []

    class Gate(SinkWriter):
        def write(self, batch: list[Any]) -> None:
            first.extend(batch)
            if len(first) >= 5_000 and not reached.done():
                reached.set_result(None)

    class GateSink(Sink):
        def create_writer(self, subtask: int, parallelism: int) -> SinkWriter:
            return Gate()

    reached: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    flow = Dataflow("stop", parallelism=2, batch_size=64)
    flow.source(LoggedSource(words, log), uid="words").key_by(lambda w: w) \
        .process(Count()).uid("count").sink(GateSink())
    config = CheckpointConfig(interval=0.01, directory=tmp_path / "c", mode="synchronous")
    job = await flow.start(checkpoints=config, restart=RestartStrategy.none())
    await reached
    savepoint = await job.stop(savepoint=True, path=tmp_path / "sp")
    assert savepoint is not None and job.status == "stopped"
    second: list[Any] = []
    again = Dataflow("stop", parallelism=3, batch_size=64)
    again.source(LoggedSource(words, Log()), uid="words").key_by(lambda w: w) \
        .process(Count()).uid("count").sink(_SinkOf(second))
    await again.run(checkpoints=CheckpointConfig(interval=0.01, directory=tmp_path / "c2",
                                                 mode="synchronous"),
                    restore_from=savepoint.path)
    # the stopped run emitted every count up to the savepoint, the restored one the rest
    counts = collections.Counter(words)
    emitted = collections.Counter(k for k, _ in first) + collections.Counter(k for k, _ in second)
    assert final_counts(first + second) == dict(counts)
    assert emitted - counts == collections.Counter()  # no count emitted twice...
    assert counts - emitted == collections.Counter()  # ...and none missing


class _SinkOf(Sink):
    def __init__(self, records: list[Any]) -> None:
        self.records = records

    def create_writer(self, subtask: int, parallelism: int) -> SinkWriter:
        return _ListWriter(self.records)


@pytest.mark.e2e
@pytest.mark.parametrize("kill", ["record:150000", "commit:2"])
def test_killed_process_commits_output_exactly_once_in_synchronous_mode(tmp_path, kill):
    """SIGKILL in the middle of the input or between a checkpoint's completion and its
    commit; the resumed run (synchronous mode too) commits every record once."""
    out, chk = tmp_path / "out", tmp_path / "chk"
    first = _run(out, chk, 2, "heap", REACTIVE_TEST_KILL=kill,
                 REACTIVE_TEST_MODE="synchronous")
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    done = CheckpointStorage(chk, committing_job.JOB).completed()
    assert done and all(c.metadata.mode == "synchronous" for c in done)
    second = _run(out, chk, 3, "heap", REACTIVE_TEST_MODE="synchronous")
    assert second.returncode == 0, second.stderr[-3000:]
    assert committed_records(out) == expected_output(committing_job.words(300_000))
    assert hidden_files(out) == []


def test_synchronous_mode_takes_one_checkpoint_at_a_time():
    with pytest.raises(ConfigurationError, match="max_concurrent must be 1"):
        CheckpointConfig(mode="synchronous", max_concurrent=2)
    with pytest.raises(ConfigurationError, match="'synchronous'"):
        CheckpointConfig(mode="naiad")  # type: ignore[arg-type]
