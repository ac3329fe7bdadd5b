"""A sink's records as an async iterator for the application, released when the checkpoint
that covers them completes (read committed) or at once (read uncommitted).

Read committed is the epoch commit of Carbone 2018 (PhD thesis), section 4.1.3, applied to an
in-memory queue: the records a sink instance receives between two barriers are held as that
checkpoint's transaction, released in checkpoint order when it completes. So the application
never acts on output that a failure takes back, whatever the sink itself guarantees. Read
uncommitted yields every record at once: after a failure it may see records again.

The iterator is bounded: a sink instance accepts no batch while ``capacity`` released records
wait to be read (backpressure: the sink task waits, its input channels fill, the sources
slow down), so an application that reads slowly slows the job instead of growing its memory.
Records are released a checkpoint at a time, so up to ``capacity`` plus the records of one
checkpoint interval of every instance wait at once. An application that stops reading closes
the iterator (``aclose()``, or ``async with``): the job no longer keeps records for it (an
iterator neither read nor closed stalls the job, as a full channel does).

When an attempt fails, its instances hand their held transactions back to the iterator, which
outlives attempts as the job does: the restore releases those of the checkpoints the restored
one covers (they completed, so the restored job does not produce their records again; the
notification just never reached the sink instance) and drops the others (the restored job
produces their records again). This is the recovery of a two-phase-commit writer (Carbone
2018 (PhD thesis), section 4.1.3.1: commit the restored checkpoint's pending transactions) for an
in-memory sink; each transaction is released once, by the instance's notification or by the
restore.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from ..awaiting import maybe_await
from ..errors import ConfigurationError
from ..sinks import SinkWriter

__all__ = ["DEFAULT_CAPACITY", "CommittedResults"]

#: records an iterator keeps released and unread before its sink waits (see the module)
DEFAULT_CAPACITY = 10_000

_END = object()

#: ``deliver(records, ended, error)``: see :meth:`CommittedResults.forward_to`
Deliver = Callable[[list[Any], bool, "BaseException | None"], None]


class CommittedResults(AsyncIterator[Any]):
    """The records of one sink (all its instances), as an async iterator.

    Made by :meth:`reactive.Job.results`. Iteration ends when the job finishes (after the
    last records) and raises the job's error when it fails for good, or when the
    application closes it (``await it.aclose()``, or ``async with job.results(...) as it``).

    Args:
        committed: read committed (True) or uncommitted (False).
        capacity: records released and not yet read before the sink's instances wait for
            the application to read (backpressure; see the module).

    Raises:
        ConfigurationError: ``capacity`` is below 1.
    """

    def __init__(self, committed: bool = True, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ConfigurationError(f"results capacity must be at least 1, got {capacity}")
        self.committed = committed
        self.capacity = capacity
        self._closed = False
        self._on_close: Callable[[], None] | None = None
        self._room = asyncio.Event()
        self._room.set()
        self._ready: deque[Any] = deque()
        self._event = asyncio.Event()
        self._error: BaseException | None = None
        self._deliver: Deliver | None = None
        # transactions (checkpoint id, records) taken back from instances of failed attempts
        self._held: list[tuple[int, list[Any]]] = []
        # records handed to ``deliver`` that the other loop has not reported read yet
        self._forwarded = 0

    def forward_to(self, deliver: Deliver) -> None:
        """Hand released records to ``deliver`` instead of keeping them for ``__anext__``
        (an iterator of another event loop: :mod:`reactive.embedding.trio_host`). What was
        released before goes first. Call it on the job's loop.

        ``deliver(records, ended, error)`` runs on the job's loop for each release, and once
        with ``ended=True`` (and the job's error, if it failed) when the job ended.
        """
        self._deliver = deliver
        ready = [r for r in self._ready if r is not _END]
        ended = len(ready) < len(self._ready)
        self._ready.clear()
        self._forwarded += len(ready)
        if ready or ended:
            deliver(ready, ended, self._error)

    def read_elsewhere(self, n: int) -> None:
        """The other loop's iterator read ``n`` of the records forwarded to it (call it on
        the job's loop): they no longer count against the capacity."""
        self._forwarded -= n
        if self._forwarded < self.capacity:
            self._room.set()

    def wrap(self, writer: SinkWriter) -> SinkWriter:
        """The sink instance's writer, with its records also going to this iterator."""
        return _TappedWriter(writer, self)

    @property
    def buffered(self) -> int:
        """Records released and not yet read."""
        return len(self._ready) - (1 if self._ended() else 0)

    @property
    def closed(self) -> bool:
        """Whether the application closed the iterator."""
        return self._closed

    def _ended(self) -> bool:
        return bool(self._ready) and self._ready[-1] is _END

    async def wait_for_room(self) -> None:
        """Wait while ``capacity`` released records wait to be read (a sink instance calls
        it before accepting a batch), here or forwarded to another loop's iterator."""
        while not self._closed and (
                self._forwarded if self._deliver is not None else len(self._ready)
        ) >= self.capacity:
            self._room.clear()
            await self._room.wait()

    async def aclose(self) -> None:
        """Stop iterating: drop what is buffered; the job keeps nothing more for this
        iterator and never waits for it. Idempotent."""
        self.close()

    def close(self) -> None:
        """As :meth:`aclose`, callable from a plain function on the job's loop."""
        if self._closed:
            return
        self._closed = True
        self._ready.clear()
        self._held = []
        self._room.set()
        self._event.set()  # a reader waiting in __anext__ stops
        if self._on_close is not None:
            self._on_close()

    async def __aenter__(self) -> CommittedResults:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _release(self, records: list[Any]) -> None:
        if records and not self._closed:
            if self._deliver is not None:
                self._forwarded += len(records)
                self._deliver(list(records), False, None)
                return
            self._ready.extend(records)
            self._event.set()

    def hold(self, transactions: list[tuple[int, list[Any]]]) -> None:
        """An instance closes with pre-committed transactions ``[(checkpoint id, records)]``
        whose completion it was not told: keep them until :meth:`recover` decides."""
        if not self._closed:
            self._held.extend(transactions)

    def recover(self, checkpoint_id: int | None) -> None:
        """The job goes on from checkpoint ``checkpoint_id`` (None: from the start of the
        input): release the held transactions it covers, in checkpoint order, and drop the
        rest (the restored job produces their records again).

        Called when a restart restores a checkpoint, and at the end of the job with its
        latest completed checkpoint (its output is committed).
        """
        held, self._held = sorted(self._held, key=lambda t: t[0]), []
        if checkpoint_id is None:
            return
        for cid, records in held:
            if cid <= checkpoint_id:
                self._release(records)

    def end(self, error: BaseException | None = None) -> None:
        """The job ended (with ``error`` when it failed): iteration stops after the records
        released so far."""
        self._error = error
        if self._deliver is not None:
            self._deliver([], True, error)
            return
        self._ready.append(_END)
        self._event.set()

    def __aiter__(self) -> CommittedResults:
        return self

    async def __anext__(self) -> Any:
        while not self._ready:
            if self._closed:
                raise StopAsyncIteration
            self._event.clear()
            await self._event.wait()
        item = self._ready[0]
        if item is _END:
            if self._error is not None:
                raise self._error
            raise StopAsyncIteration
        self._ready.popleft()
        if len(self._ready) < self.capacity:
            self._room.set()
        return item


class _TappedWriter(SinkWriter):
    """Delegates to the sink's writer; copies its records to a :class:`CommittedResults`,
    held per checkpoint until it completes (read committed)."""

    def __init__(self, writer: SinkWriter, results: CommittedResults) -> None:
        self.writer = writer
        self.results = results
        self.current: list[Any] = []
        self.pending: list[tuple[int, list[Any]]] = []
        self.state_redistribution = writer.state_redistribution

    def start_fresh(self) -> Awaitable[None] | None:
        return self.writer.start_fresh()

    async def write(self, batch: list[Any]) -> None:
        # backpressure: the application reads slower than the sink writes
        await self.results.wait_for_room()
        await maybe_await(self.writer.write(batch))
        if self.results.closed:
            return
        if self.results.committed:
            self.current.extend(batch)
        else:
            self.results._release(list(batch))

    async def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        entries = await maybe_await(self.writer.snapshot_state(checkpoint_id))
        if self.current:
            self.pending.append((checkpoint_id, self.current))
            self.current = []
        return list(entries or [])

    def restore_state(self, entries: list[Any]) -> Awaitable[None] | None:
        return self.writer.restore_state(entries)

    async def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        await maybe_await(self.writer.notify_checkpoint_complete(checkpoint_id))
        while self.pending and self.pending[0][0] <= checkpoint_id:
            self.results._release(self.pending.pop(0)[1])

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> Awaitable[None] | None:
        # the records stay pending: the next completed checkpoint covers them
        return self.writer.notify_checkpoint_aborted(checkpoint_id)

    async def finish(self) -> None:
        """End of input: the final checkpoint committed the intervals before it; what came
        after it is released now (as the two-phase-commit writers commit it at finish)."""
        await maybe_await(self.writer.finish())
        for _, records in self.pending:
            self.results._release(records)
        self.pending = []
        self.results._release(self.current)
        self.current = []

    def close(self) -> Awaitable[None] | None:
        # after a failure: the open interval is taken back (the restored job emits it
        # again); the pre-committed ones go to the iterator, whose recover() releases those
        # of checkpoints that completed (see the module's docstring)
        if self.pending:
            self.results.hold(self.pending)
        self.current, self.pending = [], []
        return self.writer.close()
