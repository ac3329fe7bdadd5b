"""Per-checkpoint statistics (Flink's checkpoint history in the web UI): the latest ones in a
bounded history, and running totals over all of them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Self, SupportsIndex

__all__ = ["DEFAULT_HISTORY", "CheckpointHistory", "CheckpointStats", "CheckpointTotals"]


@dataclass
class CheckpointStats:
    """What one checkpoint cost.

    Attributes:
        checkpoint_id: the id.
        status: ``"pending"``, ``"completed"`` or ``"aborted"``.
        trigger_time: seconds since the epoch when it was triggered.
        duration: seconds from trigger to completion (or abort).
        alignment: max over tasks of seconds from first to last barrier.
        sync: max over tasks of the synchronous part, seconds (the task's pause).
        async_: max over tasks of the asynchronous part, seconds.
        size: bytes written by this checkpoint (shared files it only references excluded).
        path: the checkpoint directory once completed.
        failure: the reason for an abort, in words.
        failure_reason: the reason's name in
            :class:`~reactive.checkpoint.failure_reason.CheckpointFailureReason`.
        tasks: per-task figures ``{task: {"alignment", "sync", "async", "size"}}``.
        operators: per keyed operator (by uid), summed over its instances:
            ``{"state_bytes": n, "ttl_dropped": n}``: the bytes of every file its keyed state
            needs (files shared with earlier checkpoints included: the state's size on
            disk), and the time-to-live entries the checkpoint left out because they had
            expired by its TTL time (a list's elements and a map's entries one by one; 0
            where a backend does not report it).
    """

    checkpoint_id: int
    kind: str = "checkpoint"
    status: str = "pending"
    trigger_time: float = 0.0
    duration: float = 0.0
    alignment: float = 0.0
    sync: float = 0.0
    async_: float = 0.0
    size: int = 0
    path: str | None = None
    failure: str | None = None
    failure_reason: str | None = None
    tasks: dict[str, dict[str, float]] = field(default_factory=dict)
    operators: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-serializable dict (stored in the metadata)."""
        return asdict(self)


#: checkpoints whose statistics a job keeps (Flink's ``web.checkpoints.history``)
DEFAULT_HISTORY = 10


@dataclass
class CheckpointTotals:
    """Running totals over every checkpoint and savepoint a job triggered (Flink's
    checkpoint counts and summary), kept beyond the bounded history.

    Attributes:
        completed: how many completed.
        aborted: how many were aborted (failed).
        in_progress: how many are pending now.
        failures: aborted ones by ``failure_reason`` name (``"UNKNOWN"`` without one).
        duration: sum over the completed ones of trigger to completion, seconds.
        alignment: sum over the completed ones of the alignment, seconds.
        sync: sum over the completed ones of the synchronous part, seconds.
        async_: sum over the completed ones of the asynchronous part, seconds.
        size: sum over the completed ones of the bytes written.
        max_sync: the longest synchronous part of a completed one, seconds.
        last_completed: the statistics of the latest completed one, if any.
    """

    completed: int = 0
    aborted: int = 0
    in_progress: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    duration: float = 0.0
    alignment: float = 0.0
    sync: float = 0.0
    async_: float = 0.0
    size: int = 0
    max_sync: float = 0.0
    last_completed: CheckpointStats | None = None

    def add(self, stats: CheckpointStats) -> None:
        """Count one checkpoint that ended (completed or aborted)."""
        if stats.status == "completed":
            self.completed += 1
            self.duration += stats.duration
            self.alignment += stats.alignment
            self.sync += stats.sync
            self.async_ += stats.async_
            self.size += stats.size
            self.max_sync = max(self.max_sync, stats.sync)
            if self.last_completed is None or \
                    stats.checkpoint_id > self.last_completed.checkpoint_id:
                self.last_completed = stats
        elif stats.status == "aborted":
            self.aborted += 1
            reason = stats.failure_reason or "UNKNOWN"
            self.failures[reason] = self.failures.get(reason, 0) + 1

    def copy(self) -> CheckpointTotals:
        """An independent copy (the failures dict copied too)."""
        return replace(self, failures=dict(self.failures))


class CheckpointHistory(list[CheckpointStats]):
    """The statistics of the latest ``size`` checkpoints, oldest first, plus running totals
    of all of them (Flink's ``CheckpointStatsTracker``: a bounded history and counts).

    A list the checkpoint coordinator appends to; an entry is updated in place until its
    checkpoint ends. What falls out of the window is folded into the totals once it ended
    (a checkpoint still pending when it falls out is folded when it ends), so the memory is
    O(size) however long the job runs, and every total counts each checkpoint once.

    Args:
        size: entries kept (>= 1).
    """

    def __init__(self, size: int = DEFAULT_HISTORY) -> None:
        super().__init__()
        if size < 1:
            raise ValueError(f"checkpoint history size must be >= 1, got {size}")
        self.size = size
        self._folded = CheckpointTotals()
        # fell out of the window before they ended (at most the checkpoints in flight)
        self._evicted_pending: list[CheckpointStats] = []

    def _trim(self) -> None:
        excess = len(self) - self.size
        if excess <= 0:
            return
        for stats in self[:excess]:
            if stats.status == "pending":
                self._evicted_pending.append(stats)
            else:
                self._folded.add(stats)
        del self[:excess]

    def append(self, stats: CheckpointStats) -> None:
        super().append(stats)
        self._trim()

    def extend(self, items: Iterable[CheckpointStats]) -> None:
        super().extend(items)
        self._trim()

    def insert(self, index: SupportsIndex, stats: CheckpointStats) -> None:
        super().insert(index, stats)
        self._trim()

    def __iadd__(self, items: Iterable[CheckpointStats]) -> Self:  # type: ignore[override, misc]
        self.extend(items)
        return self

    def __setitem__(self, index: Any, value: Any) -> None:
        super().__setitem__(index, value)
        self._trim()

    def __reduce__(self) -> tuple[Any, ...]:
        # the size first (a list subclass is otherwise rebuilt by appending its items
        # before its attributes are set), then the totals, then the entries
        return (type(self), (self.size,), self.__dict__, iter(list(self)))

    def totals(self) -> CheckpointTotals:
        """The running totals now (a copy): every checkpoint that ended counted once, the
        pending ones as ``in_progress``. O(size)."""
        still = []
        for stats in self._evicted_pending:
            if stats.status == "pending":
                still.append(stats)
            else:
                self._folded.add(stats)
        self._evicted_pending = still
        totals = self._folded.copy()
        totals.in_progress = len(still)
        for stats in self:
            if stats.status == "pending":
                totals.in_progress += 1
            else:
                totals.add(stats)
        return totals
