"""The source protocol: a :class:`Source` creates one :class:`SourceReader` per instance.

A reader returns batches of records and keeps its position as operator state (a list of
entries, redistributed round robin, "split", when the parallelism changes). Barriers are
injected between two ``read_batch`` calls, so a reader waiting for data must return an empty
batch within about ``max_wait`` seconds to keep checkpoints on time.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

__all__ = ["Source", "SourceReader"]


class SourceReader(ABC):
    """Reads one instance's share of a source."""

    @abstractmethod
    async def read_batch(self, max_records: int) -> list[Any] | None:
        """Return up to ``max_records`` records, ``[]`` when none is ready yet, ``None`` at the
        end of input (then never called again)."""

    @abstractmethod
    def snapshot_state(self) -> list[Any]:
        """Return the position as a list of picklable entries (one per split)."""

    @abstractmethod
    def restore_state(self, entries: list[Any]) -> None:
        """Resume from ``entries`` (taken by ``snapshot_state``, possibly of other instances)."""

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:  # noqa: B027
        """Checkpoint ``checkpoint_id`` completed (e.g. commit offsets to an external system)."""

    def describe_position(self) -> Any:
        """A short description of the current position, used in error messages."""
        return None

    def close(self) -> None:  # noqa: B027
        """Release resources."""


class Source(ABC):
    """A source factory (``flow.source(src)``).

    Attributes:
        max_source_parallelism: the largest parallelism it supports (None: unbounded).
    """

    max_source_parallelism: int | None = None

    @abstractmethod
    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        """Create the reader of instance ``subtask`` of ``parallelism``; its initial share
        is decided here and replaced by ``restore_state`` when restoring."""
