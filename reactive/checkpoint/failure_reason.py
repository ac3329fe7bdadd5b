"""Why a checkpoint did not complete (Flink's ``CheckpointFailureReason``).

Each reason says whether it counts towards ``tolerable_failed_checkpoints`` (Flink's
``CheckpointFailureManager``): a checkpoint that a newer one replaced did not fail, nor did
one dropped because its job attempt ended.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["CheckpointFailureReason"]


class CheckpointFailureReason(Enum):
    """The reason an aborted checkpoint carries (``CheckpointStats.failure_reason``).

    Attributes:
        message: a short description, the start of the abort message.
        counts_as_failure: whether it counts towards the tolerable consecutive failures.
    """

    CHECKPOINT_EXPIRED = ("timed out", True)
    CHECKPOINT_DECLINED = ("declined by a task", True)
    CHECKPOINT_DECLINED_SUBSUMED = ("a newer checkpoint's barrier overtook it at a task", False)
    CHECKPOINT_SUBSUMED = ("a newer checkpoint completed first", False)
    FINALIZE_CHECKPOINT_FAILURE = ("completing it failed", True)
    IO_EXCEPTION = ("writing its metadata failed", True)
    CHECKPOINT_COORDINATOR_SHUTDOWN = ("the job attempt ended", False)

    def __init__(self, message: str, counts_as_failure: bool) -> None:
        self.message = message
        self.counts_as_failure = counts_as_failure
