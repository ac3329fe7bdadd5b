"""A source the application pushes records into, exactly once.

The source keeps every record it accepted in a write-ahead buffer until a completed checkpoint
covers it (thesis 4.1: the input of an epoch must be replayable until the epoch's checkpoint
completes). The reader's position (a sequence number) is its operator state, so when the job
fails and restarts in the same process, the restored reader reads the buffer again from the
position of the restored checkpoint: every accepted record is processed exactly once. When a
checkpoint completes, the records before its position are dropped from the buffer.

What a process crash means: the buffer lives in the process's memory, so records that no
completed checkpoint covered are lost with the process. ``await source.send(record,
durable=True)`` returns only once a completed checkpoint covers the record (after a crash the
restored job has processed it, and a two-phase-commit sink publishes its results); plain
``send`` returns once the record is accepted (in the buffer). A restore in a new process
starts reading that process's pushes from the beginning: the position of the old process's
buffer means nothing there (the buffer's session id tells them apart).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import deque
from typing import Any

from ..errors import ConfigurationError
from ..sources import Source, SourceReader

__all__ = ["PushSource"]


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
        self._closed = False
        self._checkpointing: bool | None = None  # known once a reader opened
        # futures of the coroutines waiting for a change (a send, a read, a release)
        self._waiters: list[asyncio.Future[None]] = []

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
        """
        if self._closed:
            raise ConfigurationError("PushSource is closed: no more records")
        while self._next - self._first >= self.capacity:
            await self._wait_change()
            if self._closed:
                raise ConfigurationError("PushSource is closed: no more records")
        seq = self._next
        self._buffer.append(record)
        self._next += 1
        self._notify()
        if durable:
            await self.wait_durable(seq)
        return seq

    async def wait_durable(self, seq: int) -> None:
        """Wait until a completed checkpoint covers record ``seq``.

        Raises:
            ConfigurationError: in a job without checkpointing.
        """
        while self._durable <= seq:
            if self._checkpointing is False:
                raise ConfigurationError(
                    "PushSource: the job runs without checkpointing, so no record becomes "
                    "durable; configure checkpoints=CheckpointConfig(...)")
            await self._wait_change()

    @property
    def durable(self) -> int:
        """How many records (sequence numbers ``< durable``) a completed checkpoint covers."""
        return self._durable

    def close(self) -> None:
        """End the stream: the job finishes once it has read every accepted record."""
        self._closed = True
        self._notify()

    # ------------------------------------------------------------------ reader side
    def _notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _wait_change(self) -> None:
        """Wait for the next change; callers check their condition first (nothing runs
        between that check and registering here, so no change is missed)."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        await waiter

    def _read(self, position: int, max_records: int) -> list[Any]:
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
        self.source._checkpointing = checkpointing

    async def read_batch(self, max_records: int) -> list[Any] | None:
        source = self.source
        batch = source._read(self.position, max_records)
        if not batch:
            if source._closed and self.position >= source._next:
                return None
            # wait a little for a push; barriers are injected between reads
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(source._wait_change(), 0.05)
            return []
        self.position += len(batch)
        if source._checkpointing is False:
            source._release(self.position)
        return batch

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:  # type: ignore[override]
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
