"""``job.cancel()`` ends the job: it returns (never hangs) and a cancel never becomes a
restart, whatever the tasks were doing when it came (a push that just woke the source, a
close, a source whose clean-up fails on cancellation)."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from typing import Any

import pytest

from reactive import CheckpointConfig, Dataflow, PushSource, RestartStrategy
from reactive.awaiting import wait_with_timeout
from reactive.connectors.collections import DiscardingSink, ListSink
from reactive.sources import Source, SourceReader


async def _bounded(coro: Any, seconds: float = 10.0) -> bool:
    """Whether ``coro`` finished within ``seconds`` (not ``wait_for``: on a timeout it
    cancels and then waits for the coroutine, which hangs as well)."""
    task = asyncio.ensure_future(coro)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if done:
        task.result()
    return bool(done)


async def _until_reader_waits(source: PushSource) -> None:
    """Until the push reader is parked waiting for a record (a progress marker, no sleep)."""
    while not source._waiters:
        await asyncio.sleep(0)


@pytest.mark.parametrize("interval", [None, 0.02])
@pytest.mark.parametrize("last", ["send", "close"])
async def test_cancel_right_after_a_push_returns(tmp_path, interval, last):
    src = PushSource(capacity=1000)
    sink = ListSink()
    flow = Dataflow("cancel-after-push", parallelism=1)
    flow.source(src).uid("src").map(lambda x: x).uid("m").sink(sink).uid("out")
    checkpoints = (None if interval is None
                   else CheckpointConfig(interval=interval, directory=str(tmp_path)))
    job = await flow.start(checkpoints=checkpoints)
    await src.send(0)
    while not sink.records:
        await asyncio.sleep(0)
    await _until_reader_waits(src)
    # the application's shutdown path: the last push (or close), then cancel, with no await
    # in between that would let the reader take the record first
    if last == "send":
        await src.send(1)
    else:
        src.close()
    assert await _bounded(job.cancel()), "job.cancel() did not return"
    assert job.status == "cancelled"
    assert job.metrics.restarts == 0


# Hand-written, not a TestingSource: the test is about a reader whose clean-up on
# cancellation raises (a SourceReader behaviour TestingSource has no reason to script).
class _FailingCleanup(Source):
    """A source whose reader waits for input and whose clean-up on cancellation fails."""

    max_source_parallelism = 1

    def __init__(self) -> None:
        self.reading = asyncio.Event()

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        return _FailingCleanupReader(self)


class _FailingCleanupReader(SourceReader):
    def __init__(self, source: _FailingCleanup) -> None:
        self.source = source

    async def read_batch(self, max_records: int) -> list[Any] | None:
        self.source.reading.set()
        try:
            await asyncio.Event().wait()  # an upstream that never answers
        except asyncio.CancelledError:
            raise RuntimeError("closing the upstream connection failed") from None
        return []

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        return []

    def restore_state(self, entries: list[Any]) -> None:
        return None


async def test_a_failure_while_cancelling_is_not_restarted(tmp_path):
    source = _FailingCleanup()
    flow = Dataflow("cancel-not-restart", parallelism=1)
    flow.source(source).uid("src").sink(DiscardingSink()).uid("out")
    job = await flow.start(checkpoints=CheckpointConfig(interval=10, directory=str(tmp_path)),
                           restart=RestartStrategy.fixed(3, 0.0))
    await source.reading.wait()
    assert await _bounded(job.cancel()), "the cancel became a restart"
    assert job.status == "cancelled"
    assert job.metrics.restarts == 0


async def test_wait_with_timeout_keeps_a_cancel_that_comes_with_the_result():
    """CPython gh-86296: the inner future completes and the waiter is cancelled in the same
    loop iteration; ``asyncio.wait_for`` on 3.11 returns the result, the helper raises."""
    loop = asyncio.get_running_loop()
    inner = loop.create_future()
    waiting = asyncio.ensure_future(wait_with_timeout(inner, 10.0))
    await asyncio.sleep(0)  # the waiter awaits inner now

    def finish_and_cancel() -> None:
        inner.set_result(None)
        waiting.cancel()

    loop.call_soon(finish_and_cancel)
    with pytest.raises(asyncio.CancelledError):
        await waiting


async def test_wait_with_timeout_reports_expiry_and_completion():
    assert await wait_with_timeout(asyncio.Event().wait(), 0.01) is False
    done = asyncio.Event()
    done.set()
    assert await wait_with_timeout(done.wait(), 10.0) is True

    async def own_timeout() -> None:
        raise TimeoutError("the awaitable's own")

    with pytest.raises(TimeoutError, match="own"):
        await wait_with_timeout(own_timeout(), 10.0)


def test_the_runtime_never_calls_wait_for():
    """``asyncio.wait_for`` loses cancellations on Python 3.11 (see
    reactive.awaiting): the runtime, backends and connectors wait with
    ``wait_with_timeout`` / ``asyncio.timeout`` instead."""
    root = Path(__file__).resolve().parents[2]
    calls = []
    for folder in ("reactive", "backends", "connectors"):
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Attribute) and node.attr == "wait_for" and \
                        isinstance(node.value, ast.Name) and node.value.id == "asyncio":
                    calls.append(f"{path.relative_to(root)}:{node.lineno}")
    assert calls == []
