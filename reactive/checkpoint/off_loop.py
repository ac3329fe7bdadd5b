"""Blocking checkpoint file work off the event loop: each call in a worker thread, waited for
even when the caller is cancelled.

The runtime shares its event loop with the application that embeds it, so writing and
fsyncing metadata, hashing files before a restore, deleting subsumed checkpoints or reading
snapshots back must not run on the loop thread: each step runs in the loop's default
executor (``asyncio.to_thread``), one bounded step per call (one file, one directory, a
chunk of files), and the loop keeps scheduling other tasks meanwhile. Python code in the
worker holds the GIL, but the interpreter hands it back every ``sys.getswitchinterval()``
(5 ms), and the file system calls and ``hashlib`` on large buffers release it.

A thread cannot be cancelled. :func:`in_thread` therefore waits for a step that already
started before it lets a cancellation through: an attempt's task group (which cancels its
children on a failure) only ends once no file of that attempt is still being written or
deleted, so the next attempt (or a restore) never races with a step of the previous one.
Flink runs the same kind of work in its ``ioExecutor`` for the same reason (a
``CheckpointCoordinator`` never does file I/O on its main thread).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import ParamSpec, TypeVar

__all__ = ["chunks", "in_thread", "through_cancellation", "wait_all"]

_P = ParamSpec("_P")
_T = TypeVar("_T")
_S = TypeVar("_S")


async def in_thread(fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """Run ``fn(*args, **kwargs)`` in a worker thread and return its result.

    If the calling task is cancelled meanwhile, the call still runs to its end (a thread
    cannot be stopped) and only then is ``CancelledError`` raised, so the caller never
    returns (or its task group never exits) while ``fn`` still touches files.

    Raises:
        Exception: whatever ``fn`` raised (same type and message: errors read as if ``fn``
            had run inline).
        asyncio.CancelledError: when the caller was cancelled (after ``fn`` returned).
    """
    return await through_cancellation(asyncio.ensure_future(asyncio.to_thread(fn, *args,
                                                                              **kwargs)))


async def through_cancellation(future: asyncio.Future[_T]) -> _T:
    """The result of ``future``, work that cannot be stopped (a thread's job, wrapped with
    ``asyncio.wrap_future``): if the caller is cancelled meanwhile, ``future`` is still waited
    for, and the cancellation raised after it.

    Raises:
        Exception: what ``future`` raised.
        asyncio.CancelledError: when the caller was cancelled (after ``future`` ended).
    """
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        while not future.done():
            # every further cancel() (a task group and the job handle may both cancel) is
            # re-delivered by the raise below; swallowing it here only defers it
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(future)
        if not future.cancelled():
            future.exception()  # retrieved: the caller's cancellation is what reaches it
        raise


async def wait_all(tasks: set[asyncio.Task[None]]) -> None:
    """Wait until ``tasks`` (and any task added to the set meanwhile) are done, without
    cancelling them; a cancellation of the caller is raised only after that (as
    :func:`in_thread` does, for the same reason). Their own errors are not raised here.

    Raises:
        asyncio.CancelledError: when the caller was cancelled meanwhile.
    """
    cancelled = False
    while tasks:
        try:
            await asyncio.wait(set(tasks))
        except asyncio.CancelledError:
            cancelled = True
        tasks.difference_update([t for t in tasks if t.done()])
    if cancelled:
        raise asyncio.CancelledError


def chunks(items: Sequence[_S], size: int) -> Iterator[Sequence[_S]]:
    """``items`` in consecutive slices of at most ``size`` (the bounded steps of a pass).

    Raises:
        ValueError: if ``size`` < 1.
    """
    if size < 1:
        raise ValueError(f"chunk size must be >= 1, got {size}")
    for start in range(0, len(items), size):
        yield items[start:start + size]
