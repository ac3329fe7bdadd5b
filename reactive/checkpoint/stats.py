"""Per-checkpoint statistics (Flink's checkpoint history in the web UI)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["CheckpointStats"]


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

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-serializable dict (stored in the metadata)."""
        return asdict(self)
