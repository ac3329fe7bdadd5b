"""Halting the sources for the synchronous-snapshot baseline (``CheckpointConfig(mode="synchronous")``).

The baseline the ABS paper measures itself against (Carbone et al., "Lightweight
Asynchronous Snapshots for Distributed Dataflows", 2015, section 7; Carbone 2018 (PhD
thesis), section 3.4.2, "global synchronous snapshots" as in Naiad): to take checkpoint n the coordinator

1. halts the sources right after they snapshot their positions and inject barrier n
   (:func:`halt_sources`: a mailbox action that holds each source task until checkpoint n is
   completed or aborted);
2. lets every channel drain: with no new input, the records in flight are processed, and
   barrier n, the last item every source sent, marks on each channel the end of what was
   in flight (no record follows it until the sources resume, so alignment never holds a
   record back);
3. has every task snapshot synchronously when barrier n has reached all its inputs: the
   synchronous part and the writing of its files run in the task, which processes nothing
   else until its snapshot is written (``SubtaskCheckpointCoordinator.synchronous``);
4. writes the metadata when every task has acknowledged, and only then resumes the sources.

So the whole dataflow stands still from the trigger until the checkpoint is written: the
cost the asynchronous barrier snapshots avoid, which is what this mode is for (comparisons,
``bench/papers.py``). It is exactly once like the aligned mode.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from .checkpointable_task import CheckpointableTask, Resumable

__all__ = ["halt_sources"]


def halt_sources(sources: Sequence[CheckpointableTask], until: asyncio.Future[Any]) -> None:
    """Hold every source task, after the mailbox actions already posted, until ``until``
    is done (the pending checkpoint completed, was aborted, or the attempt ended).

    A held source runs the mailbox actions posted to it meanwhile (checkpoint completion or
    abort notifications, state queries) but reads no input
    (:meth:`~reactive.runtime.task_mailbox.TaskMailbox.suspend_default_action`). Post it
    right behind the barrier-injection actions, so the sources halt right after injecting
    the barrier.

    Args:
        sources: the job's source tasks.
        until: resolved (with a result or an exception) when the sources may read again.
    """
    suspensions: list[Resumable] = [task.mailbox.suspend_default_action() for task in sources]

    def resume(_: asyncio.Future[Any]) -> None:
        for suspension in suspensions:
            suspension.resume()

    until.add_done_callback(resume)
