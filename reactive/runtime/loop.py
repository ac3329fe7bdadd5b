"""Running a coroutine on a fresh event loop, with uvloop where it is installed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar

from .gc_tuning import throughput_gc

__all__ = ["new_event_loop", "run_coroutine"]

T = TypeVar("T")


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop's when installed, else asyncio's default."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def run_coroutine(coro: Coroutine[Any, Any, T], *, tune_gc: bool = True) -> T:
    """``asyncio.run(coro)`` on uvloop when available, else the default loop.

    Args:
        coro: the coroutine (a job's run, typically).
        tune_gc: run it under :func:`~reactive.runtime.gc_tuning.throughput_gc` (the
            process belongs to the job while it runs).
    """
    with throughput_gc() if tune_gc else contextlib.nullcontext():
        try:
            import uvloop
        except ImportError:
            return asyncio.run(coro)
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(coro)
