"""Awaiting in the runtime: hooks that may be sync or async (:func:`maybe_await`), and
waiting with a timeout without ever losing a cancellation (:func:`wait_with_timeout`).

The plug-in protocols (sources, sinks, two-phase-commit sinks) and the operators declare
hooks that may be plain functions or coroutine functions (``X | Awaitable[X]``); whoever
calls one awaits what it returns when that is awaitable.

On Python 3.11 (the oldest version we support) ``asyncio.wait_for`` returns the inner
awaitable's result instead of raising ``CancelledError`` when the waiting task is cancelled
in the same loop iteration as the inner awaitable completes (CPython gh-86296; 3.12 rewrote
``wait_for`` on top of ``asyncio.timeout``). The cancellation is lost: a task group that
cancelled its children then waits forever for the child that swallowed it, and
``job.cancel()`` never returns. Wrapping ``wait_for`` in ``suppress(TimeoutError)`` does not
help, the lost cancellation never becomes an exception at all.

The runtime therefore never calls ``wait_for``. It waits with ``asyncio.timeout``, which
keeps a pending cancellation: ``Task.cancel()`` on a task whose awaited future is already
done marks the task, and the next step throws ``CancelledError`` into it at that ``await``;
the timeout turns only its own expiry into ``TimeoutError`` (it compares the task's
``cancelling()`` count with the one it entered with, so a concurrent ``cancel()`` still
propagates).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable
from typing import Any

__all__ = ["maybe_await", "wait_with_timeout"]


async def maybe_await(value: Awaitable[Any] | Any) -> Any:
    """Await ``value`` when it is awaitable (hooks may be sync or async).

    Args:
        value: what a hook returned.

    Returns:
        the awaited result, or ``value`` itself when it is not awaitable.
    """
    if inspect.isawaitable(value):
        return await value
    return value


async def wait_with_timeout(awaitable: Awaitable[object], timeout: float) -> bool:
    """Wait for ``awaitable`` at most ``timeout`` seconds; a cancellation of the caller is
    always raised, never turned into a result or a timeout.

    Args:
        awaitable: what to wait for (a coroutine is cancelled when the time is up).
        timeout: seconds, >= 0.

    Returns:
        True when ``awaitable`` completed in time, False when the time ran out.

    Raises:
        asyncio.CancelledError: when the caller is cancelled meanwhile (even in the loop
            iteration in which ``awaitable`` completes).
        Exception: whatever ``awaitable`` raised (a ``TimeoutError`` of its own included).
    """
    scope = asyncio.timeout(timeout)
    try:
        async with scope:
            await awaitable
    except TimeoutError:
        if scope.expired():
            return False
        raise  # the awaitable's own TimeoutError
    return True
