"""The sink protocol: a :class:`Sink` creates one :class:`SinkWriter` per instance.

A plain writer is at-least-once: after a recovery it sees the records since the last
checkpoint again. Exactly-once sinks use the two-phase-commit hooks: ``snapshot_state``
(pre-commit, in the checkpoint's synchronous part) and ``notify_checkpoint_complete``
(commit); :class:`~reactive.two_phase_commit.TwoPhaseCommitSink` implements them over
transactions. Each hook may be a coroutine function (``async def``); the runtime awaits
what it returns, and the annotations say so (``X | Awaitable[X]``), so a synchronous and an
asynchronous writer both override them exactly.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any, Generic, Literal

from typing_extensions import TypeVar

__all__ = ["Sink", "SinkWriter"]

# the record type; Any by default (PEP 696), so a plain ``Sink`` subclass takes anything
T = TypeVar("T", default=Any)


class SinkWriter(ABC, Generic[T]):
    """Writes one instance's records (of type ``T``).

    Attributes:
        state_redistribution: how the entries of :meth:`snapshot_state` are redistributed
            when a restore changes the parallelism: ``"split"`` (round robin) or ``"union"``
            (every instance gets all of them; two-phase-commit writers, which must see
            every pending transaction).
    """

    state_redistribution: Literal["split", "union"] = "split"

    @abstractmethod
    def write(self, batch: list[T]) -> Awaitable[None] | None:
        """Write a batch of records (may be a coroutine)."""

    def snapshot_state(self, checkpoint_id: int) -> list[Any] | Awaitable[list[Any]]:
        """Checkpoint ``checkpoint_id`` passes: flush or pre-commit, return entries to keep
        (picklable)."""
        return []

    def restore_state(self, entries: list[Any]) -> Awaitable[None] | None:
        """Recovery: entries of the restored checkpoint (e.g. transactions to commit);
        called before the first record, instead of :meth:`start_fresh`."""
        return None

    def start_fresh(self) -> Awaitable[None] | None:
        """Nothing was restored for this sink: called before the first record, instead of
        :meth:`restore_state` (e.g. abort transactions a crashed earlier run left open)."""
        return None

    def notify_checkpoint_complete(self, checkpoint_id: int) -> Awaitable[None] | None:
        """Checkpoint ``checkpoint_id`` completed (commit what it pre-committed)."""
        return None

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> Awaitable[None] | None:
        """Checkpoint ``checkpoint_id`` was aborted."""
        return None

    def finish(self) -> Awaitable[None] | None:
        """End of input: nothing more will be written."""
        return None

    def close(self) -> Awaitable[None] | None:
        """Release resources (also after a failure); may be a coroutine (the task awaits
        it)."""
        return None


class Sink(ABC, Generic[T]):
    """A sink factory (``stream.sink(s)``) of records of type ``T``.

    Attributes:
        exactly_once: True when the sink publishes each record once across failures
            (two-phase commit); the runtime then refuses a restore that would make it
            publish committed output a second time (``reactive.checkpoint.lineage``).
        deduplicates_by_checkpoint_id: True when the sink drops a checkpoint interval it
            already committed (e.g. it keys its output by checkpoint id), so replaying
            committed intervals does not duplicate its output.
    """

    exactly_once: bool = False
    deduplicates_by_checkpoint_id: bool = False

    @abstractmethod
    def create_writer(self, subtask: int, parallelism: int) -> SinkWriter[T]:
        """Create the writer of instance ``subtask`` of ``parallelism``."""

    def exclusive_directories(self) -> Sequence[Path]:
        """Directories this sink owns while a run uses it: the runtime locks each one for
        the run's lifetime (``reactive.runtime.directory_lock``), so a second process
        writing there fails at start. The default is none."""
        return ()
