"""A scripted source for tests: a list of records with end-of-stream and failure markers.

``TestingSource(items)`` emits ``items`` in order (bytewax's ``TestingSource``). Two markers
may stand among them:

- :data:`TestingSource.EOF` ends the stream there, even when items follow. The position
  moves past the marker, so the job's final checkpoint records it: a run that resumes from
  that checkpoint (``resume=True``) continues with the items after it, up to the next
  ``EOF`` or the end of the list.
- :data:`TestingSource.ABORT` fails the job there (the reader raises
  :class:`AbortExecution`), the first time a reader of this source object reaches it in the
  process. The restart strategy then restores the latest checkpoint; the restored reader
  reads the same items again and skips the marker, so a test sees one injected failure and
  can check that the results are exactly once.

- :data:`TestingSource.CHECKPOINT` holds the stream there until a checkpoint completes
  after the reader reached the marker (the task keeps serving barriers meanwhile), then
  goes on. A test that injects failures places it before them, so that checkpoints complete
  between the failures on any machine instead of depending on how long checkpoints take
  compared with how fast records flow.
- :data:`TestingSource.HOLD` keeps the stream open there without records until the job is
  cancelled or stopped (a live source with no new input): the task keeps serving barriers,
  so checkpoints and savepoints complete while it holds. A test awaits
  :meth:`TestingSource.wait_held` to act once every record before the marker was read.

The position (the index of the next item) is operator state, so a restore, a resume or a
restore at another parallelism replays exactly from the checkpoint. The source is not
parallel (``max_source_parallelism = 1``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, Final

from ..sources import Source, SourceReader

__all__ = ["ABORT", "CHECKPOINT", "EOF", "HOLD", "AbortExecution", "TestingSource"]


class _Marker:
    """A marker among a :class:`TestingSource`'s items (compared by identity)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"TestingSource.{self.name}"

    def __reduce__(self) -> str:
        # pickle and deepcopy give back the module's singleton
        return self.name


EOF: Final = _Marker("EOF")
"""Ends the stream of a run at this point (see :class:`TestingSource`)."""

ABORT: Final = _Marker("ABORT")
"""Fails the job at this point once per process (see :class:`TestingSource`)."""
CHECKPOINT: Final = _Marker("CHECKPOINT")
"""Waits at this point for a checkpoint to complete (see :class:`TestingSource`)."""
HOLD: Final = _Marker("HOLD")
"""Keeps the stream open at this point until the job is cancelled or stopped."""

# How long a reader at a HOLD or CHECKPOINT marker waits before it returns an empty batch:
# the task then serves barriers and mail. A poll interval (an idle live source's), not a
# synchronisation: without it the task would spin on empty batches, taking the CPU from the
# checkpoint the marker waits for.
_POLL_SECONDS: Final = 0.001


class AbortExecution(RuntimeError):
    """The failure a :data:`TestingSource.ABORT` marker injects.

    The task reports it wrapped in a :class:`~reactive.errors.UserFunctionError` that names
    the source and its position, and the restart strategy restarts the job from its latest
    completed checkpoint.
    """


class TestingSource(Source):
    """A non-parallel source over a list of records and ``EOF``, ``ABORT``, ``CHECKPOINT`` and
    ``HOLD`` markers.

    Args:
        items (Iterable[Any]): the records, with :data:`TestingSource.EOF`,
            :data:`TestingSource.ABORT`, :data:`TestingSource.CHECKPOINT` and
            :data:`TestingSource.HOLD` markers among them (materialized once).
        batch_size (int | None): the most records per batch (None: as many as the task asks
            for). Small batches give checkpoints more places to fall between records.

    Attributes:
        EOF: the end-of-stream marker.
        ABORT: the failure marker.
        CHECKPOINT: the wait-for-a-completed-checkpoint marker.
        HOLD: the stay-open-until-cancelled marker.
        items (list[Any]): the records and markers.
        aborts_raised (int): how many ``ABORT`` markers raised so far (each raises once).

    Raises:
        ValueError: if ``batch_size`` is not a positive number.
    """

    __test__ = False  # not a pytest test class, despite its name

    EOF: Final = EOF
    ABORT: Final = ABORT
    CHECKPOINT: Final = CHECKPOINT
    HOLD: Final = HOLD
    max_source_parallelism = 1

    def __init__(self, items: Iterable[Any], batch_size: int | None = None) -> None:
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 or None, got {batch_size}")
        self.items = list(items)
        self.batch_size = batch_size
        self.aborts_raised = 0
        self._raised: set[int] = set()  # indices of the ABORT markers that raised
        self._held: asyncio.Event | None = None  # made in the loop that first needs it

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_held"] = None  # an event belongs to one process and loop
        return state

    def _held_event(self) -> asyncio.Event:
        if self._held is None:
            self._held = asyncio.Event()
        return self._held

    async def wait_held(self) -> None:
        """Wait until a reader of this source reached a :data:`TestingSource.HOLD` marker
        (it has read every record before it), in this run or an earlier one in the same
        event loop."""
        await self._held_event().wait()

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        """Create the reader of instance ``subtask`` (always 0: the source is not parallel).

        Args:
            subtask (int): the instance's index.
            parallelism (int): the number of instances (1).

        Returns:
            SourceReader: a reader starting at the first item (a restore moves it).
        """
        return _TestingSourceReader(self)


class _TestingSourceReader(SourceReader):
    """Reads a :class:`TestingSource`; its position is the index of the next item."""

    def __init__(self, source: TestingSource) -> None:
        self.source = source
        self.position = 0
        self.completed = 0  # checkpoints completed since the reader started
        self._waiting_from: int | None = None  # ``completed`` when a CHECKPOINT wait began

    async def read_batch(self, max_records: int) -> list[Any] | None:
        source = self.source
        items = source.items
        limit = max_records if source.batch_size is None else min(max_records,
                                                                   source.batch_size)
        batch: list[Any] = []
        while self.position < len(items) and len(batch) < limit:
            item = items[self.position]
            if item is EOF:
                if batch:
                    return batch  # the records before the marker first
                self.position += 1  # a resumed run continues after it
                return None
            if item is ABORT:
                if self.position in source._raised:
                    self.position += 1  # raised once already: skipped after the restore
                    continue
                if batch:
                    return batch
                source._raised.add(self.position)
                source.aborts_raised += 1
                raise AbortExecution(f"TestingSource.ABORT at index {self.position}")
            if item is HOLD:
                if batch:
                    return batch
                source._held_event().set()
                await asyncio.sleep(_POLL_SECONDS)
                return []  # the position stays: a restored reader holds here again
            if item is CHECKPOINT:
                if batch:
                    return batch
                if self._waiting_from is None:
                    self._waiting_from = self.completed
                if self.completed == self._waiting_from:
                    await asyncio.sleep(_POLL_SECONDS)
                    return []  # the task serves barriers and notifications meanwhile
                self._waiting_from = None
                self.position += 1
                continue
            batch.append(item)
            self.position += 1
        if not batch and self.position >= len(items):
            return None
        return batch

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        return [self.position]

    def restore_state(self, entries: list[Any]) -> None:
        self.position = int(entries[0])

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.completed += 1

    def describe_position(self) -> Any:
        return f"index {self.position}"
