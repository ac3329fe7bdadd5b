"""What a job tells the sources an application feeds (``reactive.PushSource``): that it
started, how it ended, and when a checkpoint it was asked for may inject its barrier.

An application-fed source lives longer than its job: the application keeps its handle and
may push after the job failed, or reuse it in the next job. The job therefore tells it when
it starts (accept records again) and ends (refuse them with an error naming the end, and wake
whoever waits), and a checkpoint, savepoint or stop asked for through the job's handle first
waits until such a source has read every record it accepted before the call, so that the
barrier follows them and the checkpoint covers them.

The hooks are looked up by name on the ``Source`` objects of the dataflow
(``_job_started()``, ``_job_ended(how)``, ``async _read_all_accepted()``): the source protocol
has no lifecycle hooks (a file or Kafka source needs none), and the runtime does not import
the embedding sources.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import JobCancelledError, JobFailedError
from ..graph import Transformation

__all__ = ["describe_end", "read_accepted_input", "tell_end", "tell_start"]


def _hooks(transformations: Sequence[Transformation], name: str) -> list[Callable[..., Any]]:
    """The bound method ``name`` of every source of ``transformations`` that has one."""
    hooks = []
    for t in transformations:
        hook = getattr(t.source, name, None)
        if callable(hook):
            hooks.append(hook)
    return hooks


def tell_start(transformations: Sequence[Transformation]) -> None:
    """A job reading these sources starts (call it on the job's loop)."""
    for hook in _hooks(transformations, "_job_started"):
        hook()


def tell_end(transformations: Sequence[Transformation], how: str) -> None:
    """The job reading these sources ended, as ``how`` says (:func:`describe_end`)."""
    for hook in _hooks(transformations, "_job_ended"):
        hook(how)


async def read_accepted_input(transformations: Sequence[Transformation]) -> None:
    """Wait until every application-fed source has read the records it accepted before this
    call, or its job ended: a barrier injected next follows them."""
    for hook in _hooks(transformations, "_read_all_accepted"):
        await hook()


def describe_end(job: str, error: BaseException | None, stopped: bool) -> str:
    """A job's end in words, for the errors raised after it.

    Args:
        job: the job's name.
        error: what its main coroutine ended with (None: it finished; a
            :class:`~reactive.errors.JobCancelledError` or ``CancelledError``: it was
            cancelled).
        stopped: it was cancelled by ``job.stop()``.

    Returns:
        e.g. ``"job 'x' failed after 1 attempt(s): ValueError: poison record"``.
    """
    if error is None:
        return f"job {job!r} finished"
    if isinstance(error, JobCancelledError | asyncio.CancelledError):
        return f"job {job!r} was {'stopped' if stopped else 'cancelled'}"
    if isinstance(error, JobFailedError) and error.__cause__ is not None:
        cause = error.__cause__
        return (f"job {job!r} failed after {error.attempts} attempt(s): "
                f"{type(cause).__name__}: {cause}")
    return f"job {job!r} ended with {type(error).__name__}: {error}"
