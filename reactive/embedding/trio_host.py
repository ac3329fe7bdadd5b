"""Running a pipeline from a trio application.

The runtime is written for asyncio (its hot path relies on asyncio's cheap ``*_nowait``
queues and tasks). A trio application runs it through a bridge: the job gets its own asyncio
event loop (uvloop when installed) on a dedicated thread, and every call the application
makes from trio (``await flow.run()``, ``await flow.start()``, pushing into a
:class:`~reactive.PushSource`, querying state, stopping) is scheduled on that loop with
``asyncio.run_coroutine_threadsafe`` and awaited in trio through the trio token
(``run_sync_soon``), so trio never blocks and its cancellation cancels the call in the job's
loop. Results go the other way: the job's loop hands each release of records (and the end)
to the trio thread through the token, so iterating them never needs the job's loop, which
ends with the job. Checkpoints, state backends and restarts run unchanged inside the job's loop;
the two loops share the process (and the GIL: the job's thread yields it every switch
interval, so the application's timers keep running).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import sys
import threading
import time
from collections.abc import AsyncIterator, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from ..runtime.committed_results import DEFAULT_CAPACITY, CommittedResults

if TYPE_CHECKING:
    from ..checkpoint.metadata import CompletedCheckpoint
    from ..runtime.job import Job
    from ..sinks import Sink

__all__ = ["JobLoop", "TrioJob", "running_under_trio", "to_job_loop"]

T = TypeVar("T")


def running_under_trio() -> bool:
    """True when the calling coroutine runs under trio (not asyncio)."""
    if "trio" not in sys.modules:
        return False
    import sniffio

    try:
        return bool(sniffio.current_async_library() == "trio")
    except sniffio.AsyncLibraryNotFoundError:
        return False


async def to_job_loop(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the job's asyncio ``loop`` and await its result from trio.

    Raises:
        whatever ``coro`` raises; trio's cancellation cancels ``coro`` in its loop.
    """
    import trio

    token = trio.lowlevel.current_trio_token()
    done = trio.Event()
    future = asyncio.run_coroutine_threadsafe(coro, loop)

    def wake(_: concurrent.futures.Future[T]) -> None:
        with contextlib.suppress(trio.RunFinishedError):  # the trio run ended meanwhile
            token.run_sync_soon(done.set)

    future.add_done_callback(wake)
    try:
        await done.wait()
    except BaseException:
        future.cancel()
        raise
    return future.result()


class JobLoop:
    """An asyncio event loop (uvloop when installed) on a daemon thread, for one job.

    The job's thread hands the GIL over every ``GIL_HANDOFF`` seconds (``time.sleep(0)``
    between two of its batches). Without it, a busy job keeps the GIL for the interpreter's
    whole switch interval (5 ms) each time the application's thread gives it up for a system
    call, and trio makes several per scheduling round (the convoy effect): a 10 ms trio timer
    then missed most of its ticks (`python -m bench.trio_embedding`).

    Args:
        gil_handoff: seconds between two hand-overs (None: never).
    """

    GIL_HANDOFF = 0.001

    def __init__(self, gil_handoff: float | None = GIL_HANDOFF) -> None:
        from ..runtime.loop import new_event_loop

        self.loop = new_event_loop()
        self.gil_handoff = gil_handoff
        self._thread = threading.Thread(target=self._run, name="reactive-job-loop", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        if self.gil_handoff is not None:
            self.loop.call_soon(self._hand_over_gil)
        self.loop.run_forever()

    def _hand_over_gil(self) -> None:
        time.sleep(0)  # releases the GIL: a thread waiting for it (the application's) runs
        assert self.gil_handoff is not None
        self.loop.call_later(self.gil_handoff, self._hand_over_gil)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self.loop.is_closed()

    async def close(self) -> None:
        """Stop the loop and wait (from trio) for its thread to end."""
        import trio

        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        await trio.to_thread.run_sync(self._thread.join)
        self.loop.close()


class TrioJob:
    """The handle of a job started from trio (``job = await flow.start(...)`` under
    ``trio.run``): the methods of :class:`~reactive.Job`, awaited from trio.

    Args:
        job: the job, on ``host``'s loop.
        host: the loop thread it runs on.
    """

    def __init__(self, job: Job, host: JobLoop) -> None:
        self.job = job
        self.host = host
        self.name = job.name

    @property
    def status(self) -> str:
        """As :attr:`reactive.Job.status`."""
        return self.job.status

    @property
    def metrics(self) -> Any:
        """As :attr:`reactive.Job.metrics` (read it between calls, not for exact figures
        while the job runs: the job's thread updates it)."""
        return self.job.metrics

    async def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return await to_job_loop(self.host.loop, coro)

    async def wait(self) -> None:
        """As :meth:`reactive.Job.wait`; then the job's loop thread ends. Cancelled by trio,
        it cancels the job first (the job does not outlive its trio caller)."""
        import trio

        try:
            await self._call(self.job.wait())
        except BaseException:
            with trio.CancelScope(shield=True):
                await self.shutdown()
            raise
        await self.host.close()

    async def shutdown(self) -> None:
        """Cancel the job if it still runs, then end its loop thread."""
        if not self.host.closed:
            await self._call(self.job.cancel())
            await self.host.close()

    async def cancel(self) -> None:
        """As :meth:`reactive.Job.cancel`."""
        await self._call(self.job.cancel())

    async def checkpoint(self) -> CompletedCheckpoint:
        """As :meth:`reactive.Job.checkpoint`."""
        return await self._call(self.job.checkpoint())

    async def stop(self, savepoint: bool = True) -> CompletedCheckpoint | None:
        """As :meth:`reactive.Job.stop`."""
        return await self._call(self.job.stop(savepoint=savepoint))

    async def query_state(self, uid: str, state: str, key: Any, committed: bool = True) -> Any:
        """As :meth:`reactive.Job.query_state`."""
        return await self._call(self.job.query_state(uid, state, key, committed))

    def results(self, sink: str | Sink, committed: bool = True,
                capacity: int = DEFAULT_CAPACITY) -> AsyncIterator[Any]:
        """As :meth:`reactive.Job.results`, iterated from trio.

        Call it right after ``start`` to see every record (it registers the iterator on the
        job's loop before returning). The records are handed over to trio as the job
        releases them, so iterating needs no call into the job's loop: the records and the
        end are all there after :meth:`wait` ended that loop. The bound holds across the
        two loops: the trio side reports what it read, and the sink waits while
        ``capacity`` handed-over records are unread. Close it with ``aclose()``."""
        import trio

        results = _TrioResults(trio.lowlevel.current_trio_token(), self.host.loop)
        registered: concurrent.futures.Future[None] = concurrent.futures.Future()

        def register() -> None:
            try:
                results.source = self.job.results(sink, committed, capacity)
                results.source.forward_to(results.deliver)
                registered.set_result(None)
            except BaseException as exc:
                registered.set_exception(exc)

        self.host.loop.call_soon_threadsafe(register)
        registered.result()
        return results


class _TrioResults(AsyncIterator[Any]):
    """The trio side of a results iterator: the job's loop thread hands records over
    through the trio token; iterating reads them here and reports what it read back to the
    job's loop (in groups, to keep cross-thread calls few), which frees room for the sink."""

    #: records read before the trio side reports them (sooner when it has read all)
    REPORT_EVERY = 256

    def __init__(self, token: Any, loop: asyncio.AbstractEventLoop) -> None:
        import trio

        self.token = token
        self.loop = loop
        self.source: CommittedResults | None = None  # the job-side iterator
        self._ready: collections.deque[Any] = collections.deque()
        self._ended = False
        self._closed = False
        self._error: BaseException | None = None
        self._arrived = trio.Event()
        self._unreported = 0

    def deliver(self, records: list[Any], ended: bool, error: BaseException | None) -> None:
        """On the job's loop thread: pass ``records`` (and the end) to the trio thread."""
        import trio

        with contextlib.suppress(trio.RunFinishedError):  # the application's run ended
            self.token.run_sync_soon(self._arrive, records, ended, error)

    def _arrive(self, records: list[Any], ended: bool, error: BaseException | None) -> None:
        if self._closed:
            return
        self._ready.extend(records)
        if ended:
            self._ended, self._error = True, error
        self._arrived.set()

    def _on_job_loop(self, fn: Any, *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the job's loop closed: nothing waits
            self.loop.call_soon_threadsafe(fn, *args)

    def _report(self) -> None:
        if self._unreported and self.source is not None:
            self._on_job_loop(self.source.read_elsewhere, self._unreported)
            self._unreported = 0

    async def aclose(self) -> None:
        """Stop iterating: the job keeps nothing more for this iterator."""
        if not self._closed:
            self._closed = True
            self._ready.clear()
            if self.source is not None:
                self._on_job_loop(self.source.close)
            self._arrived.set()

    async def __aenter__(self) -> _TrioResults:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __aiter__(self) -> _TrioResults:
        return self

    async def __anext__(self) -> Any:
        import trio

        while not self._ready:
            self._report()
            if self._ended or self._closed:
                if self._error is not None and not self._closed:
                    raise self._error
                raise StopAsyncIteration
            self._arrived = trio.Event()
            await self._arrived.wait()
        self._unreported += 1
        if self._unreported >= self.REPORT_EVERY:
            self._report()
        return self._ready.popleft()


async def start_under_trio(flow: Any, **options: Any) -> TrioJob:
    """``flow.start(**options)`` on a new job loop thread; the handle for trio."""
    host = JobLoop()
    try:
        job = await to_job_loop(host.loop, flow._start_on_asyncio(**options))
    except BaseException:
        await host.close()
        raise
    return TrioJob(job, host)


async def run_under_trio(flow: Any, **options: Any) -> Job:
    """``flow.run(**options)`` from trio: start it on a job loop thread, wait for it."""
    import trio

    handle = await start_under_trio(flow, **options)
    try:
        await handle.wait()
    except BaseException:
        # trio cancelled us (or the wait failed): cancel the job and end its loop, shielded
        # so the cleanup itself is not cancelled half way
        with trio.CancelScope(shield=True):
            await handle.shutdown()
        raise
    return handle.job
