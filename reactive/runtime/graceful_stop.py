"""Stopping a job on SIGINT/SIGTERM the way an operator expects: with a savepoint (Flink's
stop-with-savepoint) when the job checkpoints, so that the next run resumes exactly where this
one stopped. A second signal abandons the savepoint and cancels the job at once (the run then
resumes from the latest completed checkpoint); later signals change nothing."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..checkpoint.metadata import CompletedCheckpoint
from ..errors import CheckpointError

if TYPE_CHECKING:
    from .job import Job

__all__ = ["StopOutcome", "run_until_stopped"]

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass
class StopOutcome:
    """How a run ended.

    Attributes:
        job: the job handle.
        signal_name: ``"SIGINT"``/``"SIGTERM"`` when a signal stopped it, else None.
        savepoint: the savepoint it stopped with (None: finished, no checkpointing, or
            abandoned).
        abandoned_by: the second signal, which abandoned the stop (the savepoint, if it was
            still being taken) and cancelled the job; None otherwise.
    """

    job: Job
    signal_name: str | None = None
    savepoint: CompletedCheckpoint | None = None
    abandoned_by: signal.Signals | None = None


async def run_until_stopped(flow: Any, **options: Any) -> StopOutcome:
    """Run ``flow`` (a :class:`~reactive.Dataflow`, started with ``flow.start(**options)``)
    until it finishes, or until SIGINT or SIGTERM: then stop it with a savepoint in its
    checkpoint storage (so ``resume=True`` continues from it), or cancel it when it does not
    checkpoint. A second signal abandons the stop: the savepoint still being taken is
    aborted, the job is cancelled and the outcome says so (``abandoned_by``). Signal
    handlers are installed only on the main thread's loop (elsewhere the run is plain).

    Returns:
        the outcome.

    Raises:
        JobFailedError: the job failed for good.
        CheckpointError: the savepoint failed after two tries (the job was cancelled).
    """
    job: Job = await flow.start(**options)
    loop = asyncio.get_running_loop()
    received: list[signal.Signals] = []
    requested = asyncio.Event()
    abandon = asyncio.Event()
    installed: list[signal.Signals] = []

    def on_signal(sig: signal.Signals) -> None:
        received.append(sig)
        if len(received) == 1:
            requested.set()
        elif len(received) == 2:
            abandon.set()

    for sig in SIGNALS:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, on_signal, sig)
            installed.append(sig)
    # every task started here is awaited or cancelled before returning, so none is left
    # to report "Task exception was never retrieved"
    finished = asyncio.ensure_future(job.wait())
    stop = asyncio.ensure_future(requested.wait())
    abandoned = asyncio.ensure_future(abandon.wait())
    stopping: asyncio.Future[CompletedCheckpoint | None] | None = None
    try:
        await asyncio.wait({finished, stop}, return_when=asyncio.FIRST_COMPLETED)
        if finished.done():
            finished.result()
            return StopOutcome(job)
        name = received[0].name
        log.warning("%s: stopping job %r with a savepoint", name, job.name)
        stopping = asyncio.ensure_future(_stop(job, options.get("checkpoints") is not None))
        await asyncio.wait({stopping, abandoned}, return_when=asyncio.FIRST_COMPLETED)
        if not stopping.done():
            # the second signal: whatever the stop waits for (a savepoint stuck behind
            # backpressure or a slow sink), the operator wants out now
            log.info("%s again: abandoning the savepoint, cancelling job %r",
                     received[1].name, job.name)
            stopping.cancel()
            await asyncio.wait({stopping})  # job.stop resumes its sources as it unwinds
            await job.cancel()
            await asyncio.wait({finished})
            return StopOutcome(job, name, None, received[1])
        savepoint = stopping.result()
        await asyncio.wait({finished})
        return StopOutcome(job, name, savepoint)
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
        for task in (finished, stop, abandoned, stopping):
            if task is None:
                continue
            task.cancel()
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: what matters was raised or returned above


async def _stop(job: Job, savepoint: bool) -> CompletedCheckpoint | None:
    """Stop ``job`` with a savepoint (tried twice) or, without checkpointing, cancel it.

    Raises:
        CheckpointError: the savepoint failed twice (the job is then cancelled).
    """
    if not savepoint:
        await job.stop(savepoint=False)
        return None
    for attempt in range(2):
        try:
            return await job.stop(savepoint=True)
        except CheckpointError:
            if attempt == 1 or job.status != "running":
                await job.cancel()
                raise
    raise AssertionError("unreachable")
