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

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from typing import Any, Generic, Literal

from typing_extensions import TypeVar

__all__ = ["Source", "SourceReader"]

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
    def snapshot_state(self) -> list[Any]:
        """Return the position as a list of picklable entries (one per split).

        A reader that needs the checkpoint's id (e.g. to commit the position to an external
        system when that checkpoint completes) declares it: ``snapshot_state(self,
        checkpoint_id: int)`` is called with it (Flink's ``snapshotState(checkpointId)``)."""

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
