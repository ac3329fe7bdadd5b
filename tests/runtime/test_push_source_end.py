"""A PushSource after its job ended (failed, cancelled, stopped, finished): every call that
would accept a record or wait for one raises JobEndedError saying how the job ended (after
close(), the ConfigurationError of a closed source names the end too), and a call waiting at
that moment is woken with it; close() never raises; a new job reading the source accepts
again."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from reactive import CheckpointConfig, Dataflow, JobEndedError, PushSource, RestartStrategy
from reactive.connectors.collections import DiscardingSink
from reactive.errors import ConfigurationError


async def _answer(coro: Any, seconds: float = 10.0) -> Any:
    """``coro``'s result (or error), failing the test if it never answers."""
    task = asyncio.ensure_future(coro)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if not done:
        task.cancel()
        pytest.fail(f"no answer within {seconds} s")
    return task.result()


def _poison(x: int) -> int:
    if x == 13:
        raise ValueError("poison record")
    return x


def _flow(name: str, src: PushSource, fn: Any = lambda x: x) -> Dataflow:
    flow = Dataflow(name, parallelism=1)
    flow.source(src).uid("src").map(fn).uid("m").sink(DiscardingSink()).uid("out")
    return flow


async def test_after_a_failure_every_call_names_it(tmp_path):
    src = PushSource(capacity=5)
    job = await _flow("push-failed", src, _poison).start(
        checkpoints=CheckpointConfig(interval=0.05, directory=str(tmp_path)),
        restart=RestartStrategy.none())
    seq = await src.send(13)
    with pytest.raises(Exception, match="poison"):
        await job.wait()
    for call in (src.send(1), src.send(2, durable=True), src.wait_durable(seq)):
        with pytest.raises(JobEndedError, match=r"job 'push-failed' failed .*poison record"):
            await _answer(call)
    src.close()  # the clean-up of a finally block: it does not raise
    with pytest.raises(ConfigurationError, match=r"closed: no more records .job 'push-failed'"):
        await _answer(src.send(3))


@pytest.mark.parametrize("end", ["cancel", "stop"])
async def test_waiting_sends_are_woken_when_the_job_ends(tmp_path, end):
    src = PushSource(capacity=3)
    # no checkpoint completes in the test: accepted records stay in the buffer
    job = await _flow("push-waiting", src).start(
        checkpoints=CheckpointConfig(interval=3600, directory=str(tmp_path)))
    durable = asyncio.ensure_future(src.send(0, durable=True))
    for i in range(1, 3):
        await src.send(i)
    blocked = asyncio.ensure_future(src.send(3))  # the buffer is full: it waits for room
    await asyncio.sleep(0)
    assert not durable.done() and not blocked.done()
    if end == "cancel":
        await job.cancel()
        how = "was cancelled"
    else:
        await job.stop(savepoint=False)
        how = "was stopped"
    for waiting in (durable, blocked):
        with pytest.raises(JobEndedError, match=f"job 'push-waiting' {how}"):
            await _answer(waiting)
    with pytest.raises(JobEndedError, match=how):
        await _answer(src.send(4))


async def test_after_the_job_finished(tmp_path):
    src = PushSource()
    job = await _flow("push-finished", src).start()
    await src.send(1)
    src.close()
    await job.wait()
    with pytest.raises(ConfigurationError, match=r"closed: .* .job 'push-finished' finished"):
        await _answer(src.send(2))
    src.close()  # closing a closed source does nothing


async def test_a_new_job_reading_the_source_accepts_again(tmp_path):
    src = PushSource()
    job = await _flow("push-again", src).start(
        checkpoints=CheckpointConfig(interval=0.05, directory=str(tmp_path)))
    await job.cancel()
    with pytest.raises(JobEndedError):
        await _answer(src.send(0))
    job = await _flow("push-again", src).start(
        checkpoints=CheckpointConfig(interval=0.05, directory=str(tmp_path)), resume=True)
    seq = await _answer(src.send(1, durable=True))
    assert src.durable > seq
    src.close()
    await _answer(job.wait())


def test_under_trio_a_waiting_send_is_woken_when_the_job_ends(tmp_path):
    trio = pytest.importorskip("trio")
    src = PushSource(capacity=2)

    async def main() -> list[str]:
        job = await _flow("push-trio", src).start(
            checkpoints=CheckpointConfig(interval=3600, directory=str(tmp_path)))
        await src.send(0)
        await src.send(1)
        errors: list[str] = []

        async def blocked() -> None:  # the buffer is full: it waits in the job's loop
            try:
                await src.send(2)
            except JobEndedError as exc:
                errors.append(str(exc))

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(blocked)
                await trio.sleep(0.05)  # not a synchronisation: the send waits either way
                await job.cancel()
            with pytest.raises(JobEndedError, match="was cancelled"):
                await src.send(3)
            with pytest.raises(JobEndedError, match="was cancelled"):
                await src.send(4, durable=True)
        await job.shutdown()
        return errors

    errors = trio.run(main)
    assert len(errors) == 1 and "job 'push-trio' was cancelled" in errors[0]
