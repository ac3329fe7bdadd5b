"""Stopping a job on SIGINT/SIGTERM the way an operator expects: with a savepoint (Flink's
stop-with-savepoint) when the job checkpoints, so that the next run resumes exactly where this
one stopped; a second signal cancels at once."""

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
        savepoint: the savepoint it stopped with (None: finished, or no checkpointing).
    """

    job: Job
    signal_name: str | None = None
    savepoint: CompletedCheckpoint | None = None


async def run_until_stopped(flow: Any, **options: Any) -> StopOutcome:
    """Run ``flow`` (a :class:`~reactive.Dataflow`, started with ``flow.start(**options)``)
    until it finishes, or until SIGINT or SIGTERM: then stop it with a savepoint in its
    checkpoint storage (so ``resume=True`` continues from it), or cancel it when it does not
    checkpoint. A second signal cancels at once. Signal handlers are installed only on the
    main thread's loop (elsewhere the run is plain).

    Returns:
        the outcome.

    Raises:
        JobFailedError: the job failed for good.
        CheckpointError: the savepoint failed after two tries (the job was cancelled).
    """
    job: Job = await flow.start(**options)
    loop = asyncio.get_running_loop()
    received: list[signal.Signals] = []
    cancelling: set[asyncio.Task[None]] = set()  # referenced until done
    requested = asyncio.Event()
    installed: list[signal.Signals] = []

    def on_signal(sig: signal.Signals) -> None:
        received.append(sig)
        if len(received) == 1:
            requested.set()
        else:
            log.warning("%s again: cancelling job %r without a savepoint", sig.name, job.name)
            task = loop.create_task(job.cancel())
            cancelling.add(task)
            task.add_done_callback(cancelling.discard)

    for sig in SIGNALS:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, on_signal, sig)
            installed.append(sig)
    try:
        finished = asyncio.ensure_future(job.wait())
        stop = asyncio.ensure_future(requested.wait())
        await asyncio.wait({finished, stop}, return_when=asyncio.FIRST_COMPLETED)
        if finished.done():
            stop.cancel()
            finished.result()
            return StopOutcome(job)
        name = received[0].name
        log.warning("%s: stopping job %r with a savepoint", name, job.name)
        savepoint = None
        if options.get("checkpoints") is not None:
            for attempt in range(2):
                try:
                    savepoint = await job.stop(savepoint=True)
                    break
                except CheckpointError:
                    if attempt == 1 or job.status != "running":
                        await job.cancel()
                        raise
        else:
            await job.stop(savepoint=False)
        with contextlib.suppress(asyncio.CancelledError):
            await finished
        return StopOutcome(job, name, savepoint)
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
