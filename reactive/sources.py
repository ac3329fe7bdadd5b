"""The source protocol: a :class:`Source` creates one :class:`SourceReader` per instance.

A reader returns batches of records and keeps its position as operator state (a list of
entries, redistributed round robin, "split", when the parallelism changes, or given to every
instance, "union", for a source whose instances pick their own splits). Barriers are
injected between two ``read_batch`` calls, so a reader waiting for data must return an empty
batch within about ``max_wait`` seconds to keep checkpoints on time.

A reader may generate watermarks itself (Flink's per-split watermarks: a source that knows
its splits, e.g. Kafka partitions, holds event time back for the slowest of them and ignores
idle ones): the task asks :meth:`SourceReader.current_watermark` and
:meth:`SourceReader.is_idle` after every batch.
"""

from __future__ import annotations

import asyncio
import inspect
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from typing import Any, Generic, Literal

from typing_extensions import TypeVar

__all__ = ["PollResult", "SimplePollingSource", "Source", "SourceReader"]

# the record type; Any by default (PEP 696), so a plain ``Source`` subclass emits anything
T = TypeVar("T", default=Any)


class SourceReader(ABC, Generic[T]):
    """Reads one instance's share of a source: records of type ``T``."""

    def open(self, checkpointing: bool) -> None:
        """Called once per attempt before the first read (after ``restore_state``).

        Args:
            checkpointing: whether the job takes checkpoints (a reader that buffers records
                for replay can release them at once without).
        """

    @abstractmethod
    async def read_batch(self, max_records: int) -> list[T] | None:
        """Return up to ``max_records`` records, ``[]`` when none is ready yet, ``None`` at the
        end of input (then never called again)."""

    @abstractmethod
    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        """Return the position as a list of picklable entries (one per split), in the
        synchronous part of checkpoint ``checkpoint_id`` (Flink's
        ``SourceReader.snapshotState(checkpointId)``: the id lets a reader commit this
        position to an external system when that checkpoint completes)."""

    @abstractmethod
    def restore_state(self, entries: list[Any]) -> None:
        """Resume from ``entries`` (taken by ``snapshot_state``, possibly of other instances)."""

    def notify_checkpoint_complete(self, checkpoint_id: int) -> Awaitable[None] | None:
        """Checkpoint ``checkpoint_id`` completed (e.g. commit offsets to an external
        system); may be a coroutine (the task awaits it)."""
        return None

    def describe_position(self) -> Any:
        """A short description of the current position, used in error messages."""
        return None

    def current_watermark(self) -> float | None:
        """The reader's watermark (seconds; the promise that no record with a smaller
        timestamp follows), asked after every batch; None (the default): the reader does not
        generate watermarks (a downstream ``assign_timestamps`` does)."""
        return None

    def is_idle(self) -> bool:
        """True while every split of the reader is idle (no data for a while), so downstream
        watermarks do not wait for this instance (Flink's ``WatermarkStatus.IDLE``)."""
        return False

    def close(self) -> Awaitable[None] | None:
        """Release resources (may be a coroutine: the task awaits it)."""
        return None


class Source(ABC, Generic[T]):
    """A source factory (``flow.source(src)``) of records of type ``T``.

    Attributes:
        max_source_parallelism: the largest parallelism it supports (None: unbounded).
        state_redistribution: how the readers' position entries are redistributed on a
            restore: ``"split"`` (round robin over the new instances) or ``"union"`` (every
            instance gets all of them and keeps its own, for readers that decide their
            splits by themselves).
        timestamp_fn: record -> event time (seconds) when the readers generate watermarks
            (:meth:`SourceReader.current_watermark`); event-time operators downstream use it
            unless given their own. None: the source does not assign event time.
    """

    max_source_parallelism: int | None = None
    state_redistribution: Literal["split", "union"] = "split"
    timestamp_fn: Callable[[T], float] | None = None

    @abstractmethod
    def create_reader(self, subtask: int, parallelism: int) -> SourceReader[T]:
        """Create the reader of instance ``subtask`` of ``parallelism``; its initial share
        is decided here and replaced by ``restore_state`` when restoring."""


P = TypeVar("P", default=Any)

PollResult = tuple[list[T], P] | None
"""What a :class:`SimplePollingSource`'s ``poll`` returns: ``(records, next_position)``, or
None at the end of input."""


class SimplePollingSource(Source[T], Generic[T, P]):
    """A non-parallel source over a function polled for the records after a position; the
    position is checkpointed and restored for you (the idea of bytewax's
    ``SimplePollingSource``, with Flink's exactly-once positions).

    ``poll(position)`` returns ``(records, next_position)``: the records after
    ``position`` (``[]`` when none is ready yet: the source waits ``interval`` seconds before
    polling again) and the position after them; or None at the end of input. It may be a
    coroutine function. For exactly-once results a poll must be deterministic in its
    position (a file offset, a cursor, a page token, a sequence number): after a failure
    the source polls again from the checkpointed position and skips the records of that
    poll it had already emitted.

    Args:
        poll: ``position -> (records, next_position) | None``, or a coroutine function.
        start: the position of the first poll (picklable).
        interval: seconds to wait after a poll without records (>= 0; keep it well below
            the checkpoint interval: barriers wait for the poll).

    Raises:
        ConfigurationError: for a negative interval.

    Example::

        source = SimplePollingSource(lambda n: (list(range(n, min(n + 100, 1000))),
                                                n + 100) if n < 1000 else None, start=0)
    """

    max_source_parallelism = 1

    def __init__(self, poll: Callable[[P], PollResult[T, P] | Awaitable[PollResult[T, P]]],
                 start: P, interval: float = 0.1) -> None:
        from .errors import ConfigurationError

        if interval < 0:
            raise ConfigurationError(f"SimplePollingSource interval must be >= 0, got {interval}")
        self.poll = poll
        self.start = start
        self.interval = interval

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader[T]:
        return _PollingReader(self)


class _PollingReader(SourceReader[T], Generic[T, P]):
    """Reads a :class:`SimplePollingSource`.

    Invariant: ``pending`` is what the poll at ``position`` returned beyond the
    ``emitted`` records already handed out; the checkpointed position is ``(position,
    emitted)``, so a restore polls ``position`` again and drops its first ``emitted``.
    """

    def __init__(self, source: SimplePollingSource[T, P]) -> None:
        self.source = source
        self.position: P = source.start  # where the current poll started
        self.next_position: P = source.start  # the position after the current poll
        self.emitted = 0  # records of the current poll handed out
        self.skip = 0  # records of the next poll handed out before a restore
        self.pending: list[T] = []
        self.ended = False

    async def read_batch(self, max_records: int) -> list[T] | None:
        if not self.pending:
            if self.ended:
                return None
            # the current poll is emitted in full: the next one starts after it
            self.position, self.emitted = self.next_position, 0
            result = self.source.poll(self.position)
            if inspect.isawaitable(result):
                result = await result
            if result is None:
                self.ended = True
                return None
            records, self.next_position = result
            self.emitted, self.skip = self.skip, 0
            self.pending = list(records)[self.emitted:]
            if not self.pending:
                if not records:
                    await asyncio.sleep(self.source.interval)
                return []
        batch, self.pending = self.pending[:max_records], self.pending[max_records:]
        self.emitted += len(batch)
        return batch

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        if not self.pending:  # (after a restore, before its poll: the skip still due)
            return [(self.next_position, self.skip)]
        return [(self.position, self.emitted)]

    def restore_state(self, entries: list[Any]) -> None:
        position, skip = entries[0]
        self.position = self.next_position = position
        self.emitted, self.skip, self.pending, self.ended = 0, int(skip), [], False

    def describe_position(self) -> Any:
        return f"position {self.position!r}, record {self.emitted} of its poll"
