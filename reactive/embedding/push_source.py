"""A source the application pushes records into, exactly once.

The source keeps every record it accepted in a write-ahead buffer until a completed checkpoint
covers it (Carbone 2018 (PhD thesis), section 4.1: the input of an epoch must be replayable until
the epoch's checkpoint completes). The reader's position (a sequence number) is its operator
state, so when the job fails and restarts in the same process, the restored reader reads the
buffer again from the position of the restored checkpoint: every accepted record is processed
exactly once. When a checkpoint completes, the records before its position are dropped from the
buffer.

What a process crash means: the buffer lives in the process's memory, so records that no
completed checkpoint covered are lost with the process. ``await source.send(record,
durable=True)`` returns only once a completed checkpoint covers the record (after a crash the
restored job has processed it, and a two-phase-commit sink publishes its results); plain
``send`` returns once the record is accepted (in the buffer). A restore in a new process
starts reading that process's pushes from the beginning: the position of the old process's
buffer means nothing there (the buffer's session id tells them apart).

When the job that reads the source ends (finished, stopped, failed for good or cancelled),
nothing will read or checkpoint the buffer any more: every call that would accept a record
or wait for one to become durable raises :class:`~reactive.errors.JobEndedError` saying how
the job ended (``ConfigurationError`` after :meth:`PushSource.close`, as before the end), and
a ``send`` waiting at that moment (a full buffer, ``durable=True``) is woken with it. A new
job started with the same source accepts records again.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections import deque
from typing import Any

from ..awaiting import wait_with_timeout
from ..errors import ConfigurationError, JobEndedError
from ..sources import Source, SourceReader
from .trio_host import running_under_trio, to_job_loop

__all__ = ["PushSource"]


def _in_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


class PushSource(Source):
    """A source fed by the application: ``await source.send(record)``, ``source.close()``.

    Non-parallel (one reader). Use it in one job at a time.

    Args:
        capacity: records accepted but not yet covered by a completed checkpoint, at most;
            ``send`` waits (backpressure) while the buffer is full. With checkpointing off,
            the records already read leave the buffer at once (nothing can replay them).

    Raises:
        ConfigurationError: if ``capacity`` < 1.
    """

    max_source_parallelism = 1

    def __init__(self, capacity: int = 10_000) -> None:
        if capacity < 1:
            raise ConfigurationError(f"PushSource capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.session = uuid.uuid4().hex
        self._buffer: deque[Any] = deque()
        self._first = 0  # sequence number of the buffer's first record
        self._next = 0  # sequence number of the next record accepted
        self._durable = 0  # records below are covered by a completed checkpoint
        self._read_up_to = 0  # the running reader's position: records below were read
        self._closed = False
        # how the job that read it ended (None while one runs or before the first)
        self._ended: str | None = None
        self._checkpointing: bool | None = None  # known once a reader opened
        # the loop of the job that reads it (set when its reader opens), for trio callers
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_ready = threading.Event()
        self._lock = threading.Lock()  # the buffer, for senders on another thread (trio)
        # futures of the coroutines waiting for a change (a send, a read, a release)
        self._waiters: list[asyncio.Future[None]] = []
        # futures of the checkpoints waiting for the reader to catch up (woken per batch
        # read, apart from the senders, who need no wake-up then)
        self._read_waiters: list[asyncio.Future[None]] = []

    # ------------------------------------------------------------------ application side
    async def send(self, record: Any, durable: bool = False) -> int:
        """Accept ``record``; wait while the buffer is full.

        Args:
            record: the record (kept by reference until a checkpoint covers it).
            durable: also wait until a completed checkpoint covers the record.

        Returns:
            the record's sequence number (0, 1, ...), for :meth:`wait_durable`.

        Raises:
            ConfigurationError: after :meth:`close`, or ``durable=True`` in a job without
                checkpointing (no checkpoint will ever cover the record).
            JobEndedError: the job reading the source has ended (also while waiting for room
                or for the checkpoint).
        """
        if running_under_trio():
            return await self._send_from_trio(record, durable)
        while (seq := self._try_accept(record)) is None:
            await self._wait_change()
        self._notify()
        if durable:
            await self.wait_durable(seq)
        return seq

    def _try_accept(self, record: Any) -> int | None:
        """Append ``record`` if the buffer has room; its sequence number, else None.

        Raises:
            ConfigurationError: after :meth:`close`.
            JobEndedError: the job reading the source has ended.
        """
        with self._lock:  # a trio caller appends from its own thread
            if self._closed:
                ended = f" ({self._ended})" if self._ended is not None else ""
                raise ConfigurationError(f"PushSource is closed: no more records{ended}")
            if self._ended is not None:
                raise self._end_error("the record was not accepted")
            if self._next - self._first >= self.capacity:
                return None
            seq = self._next
            self._buffer.append(record)
            self._next += 1
            return seq

    async def _send_from_trio(self, record: Any, durable: bool) -> int:
        """``send`` from a trio application: the job runs on its own asyncio loop thread
        (reactive.embedding.trio_host). A record that fits is appended here, under the lock,
        without a round trip to that loop; a full buffer or a durable send waits there."""
        loop = await self._job_loop()
        seq = self._try_accept(record)
        if seq is None:
            return await to_job_loop(loop, self.send(record, durable))
        if self._waiters:  # the reader waits for a record: wake it in its loop
            loop.call_soon_threadsafe(self._notify)
        if durable and self._durable <= seq:
            if self._ended is not None:  # its loop may have stopped with the job
                raise self._end_error(f"record {seq} will never be covered by a checkpoint")
            await to_job_loop(loop, self.wait_durable(seq))
        return seq

    async def wait_durable(self, seq: int) -> None:
        """Wait until a completed checkpoint covers record ``seq``.

        Raises:
            ConfigurationError: in a job without checkpointing.
            JobEndedError: the job reading the source ended before a checkpoint covered it.
        """
        while self._durable <= seq:
            if self._ended is not None:
                raise self._end_error(f"record {seq} will never be covered by a checkpoint")
            if self._checkpointing is False:
                raise ConfigurationError(
                    "PushSource: the job runs without checkpointing, so no record becomes "
                    "durable; configure checkpoints=CheckpointConfig(...)")
            await self._wait_change()

    async def _job_loop(self) -> asyncio.AbstractEventLoop:
        """The event loop of the job reading this source (waited for from trio)."""
        if self._loop is None:
            import trio

            await trio.to_thread.run_sync(self._loop_ready.wait)
        assert self._loop is not None
        return self._loop

    @property
    def durable(self) -> int:
        """How many records (sequence numbers ``< durable``) a completed checkpoint covers."""
        return self._durable

    def close(self) -> None:
        """End the stream: the job finishes once it has read every accepted record
        (thread-safe: from a trio application it is passed to the job's loop). It never
        raises, like closing the sending end of a trio memory channel: it is the clean-up
        of ``finally`` blocks and shutdown hooks, which run after a job failed too (the
        calls that would lose a record raise :class:`~reactive.errors.JobEndedError`)."""
        loop = self._loop
        if loop is not None and loop.is_running() and not _in_loop(loop):
            loop.call_soon_threadsafe(self.close)
            return
        self._closed = True
        self._notify()

    # ------------------------------------------------------------------ the job's side
    def _job_started(self) -> None:
        """A job that reads this source started (on its loop): accept records again."""
        with self._lock:
            self._ended = None

    def _job_ended(self, how: str) -> None:
        """The job that read this source ended, as ``how`` says (on the job's loop): refuse
        records from now on and wake every waiting ``send`` and ``wait_durable``."""
        with self._lock:
            self._ended = how
        self._notify()
        self._notify_read()

    async def _read_all_accepted(self) -> None:
        """Wait until the job's reader has read every record accepted so far (or the job
        ended), on the job's loop. A checkpoint, savepoint or stop the application asks for
        waits for this before it injects its barrier, so that it covers every record
        ``send`` accepted before the call (the reader may otherwise still be waiting for its
        next poll, and a barrier injected first would leave them out: after a stop, a
        restart with a new PushSource would never see them)."""
        target = self._next
        while self._read_up_to < target and self._ended is None:
            waiter = asyncio.get_running_loop().create_future()
            self._read_waiters.append(waiter)
            try:
                await waiter
            finally:
                with contextlib.suppress(ValueError):
                    self._read_waiters.remove(waiter)

    def _end_error(self, what: str) -> JobEndedError:
        pending = self._next - self._durable
        lost = (f"; {pending} accepted record(s) are not covered by a completed checkpoint"
                if pending and self._checkpointing else "")
        return JobEndedError(
            f"PushSource: {self._ended}; {what} (nothing reads this source any more{lost})")

    # ------------------------------------------------------------------ reader side
    def _notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _notify_read(self) -> None:
        for waiter in self._read_waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _wait_change(self) -> None:
        """Wait for the next change; callers check their condition first (nothing runs
        between that check and registering here, so no change is missed)."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            if not waiter.done() or waiter.cancelled():
                # timed out or cancelled: an idle reader would otherwise leave one
                # future per poll in the list until the next push
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)

    def _read(self, position: int, max_records: int) -> list[Any]:
        with self._lock:
            return self._read_locked(position, max_records)

    def _read_locked(self, position: int, max_records: int) -> list[Any]:
        start = position - self._first
        if start < 0:
            raise RuntimeError(
                f"PushSource: position {position} is no longer buffered (the buffer starts at "
                f"{self._first}); a restore used a checkpoint older than the latest completed "
                "one, whose records were already released")
        end = min(len(self._buffer), start + max_records)
        return [self._buffer[i] for i in range(start, end)]

    def _release(self, below: int) -> None:
        """Drop the records below sequence number ``below`` from the buffer."""
        with self._lock:
            while self._first < below and self._buffer:
                self._buffer.popleft()
                self._first += 1
        self._notify()

    def _covered(self, position: int) -> None:
        if position > self._durable:
            self._durable = position
        self._release(position)

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        return _PushReader(self)


class _PushReader(SourceReader):
    def __init__(self, source: PushSource) -> None:
        self.source = source
        # an attempt that restores nothing starts at the buffer's beginning: with
        # checkpointing nothing was released yet (no checkpoint completed)
        self.position = source._first
        self._snapshots: list[tuple[int, int]] = []  # (checkpoint id, position)

    def open(self, checkpointing: bool) -> None:
        source = self.source
        source._checkpointing = checkpointing
        source._read_up_to = self.position  # where this attempt starts reading
        source._loop = asyncio.get_running_loop()
        source._loop_ready.set()

    async def read_batch(self, max_records: int) -> list[Any] | None:
        source = self.source
        batch = source._read(self.position, max_records)
        if not batch:
            if source._closed and self.position >= source._next:
                return None
            # wait a little for a push; barriers are injected between reads (never
            # wait_for: it can swallow the cancellation of a job.cancel(), see cancellation)
            await wait_with_timeout(source._wait_change(), 0.05)
            return []
        self.position += len(batch)
        source._read_up_to = self.position
        if source._checkpointing is False:
            source._release(self.position)
        if source._read_waiters:
            source._notify_read()
        return batch

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        self._snapshots.append((checkpoint_id, self.position))
        return [[self.source.session, self.position]]

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        covered = None
        while self._snapshots and self._snapshots[0][0] <= checkpoint_id:
            covered = self._snapshots.pop(0)[1]
        if covered is not None:
            self.source._covered(covered)

    def restore_state(self, entries: list[Any]) -> None:
        session, position = entries[0]
        if session == self.source.session:
            self.position = int(position)
        else:
            # a checkpoint of another process's pushes: those records are gone with it;
            # this process's records are read from the beginning
            self.position = self.source._first

    def describe_position(self) -> Any:
        return f"push record {self.position}"
