"""A triggered checkpoint collecting its acknowledgements (Flink's ``PendingCheckpoint``).

The coordinator creates one per triggered checkpoint. Each task acknowledges once, with the
state handles of its operators' instances (:meth:`PendingCheckpoint.acknowledge`); when the
last one has, the coordinator turns it into the checkpoint's metadata
(:meth:`PendingCheckpoint.finalize`) and, once that is durable, resolves it
(:meth:`PendingCheckpoint.complete`). A checkpoint that times out, is declined or subsumed
is aborted (:meth:`PendingCheckpoint.abort`): whoever waits for it gets the error. What the
coordinator does around these steps (writing the file, notifying the tasks, counting
failures) stays the coordinator's.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..errors import CheckpointError
from .contract import (
    CheckpointMetadata,
    CheckpointMetrics,
    OperatorState,
    OperatorSubtaskState,
    Reconfiguration,
)
from .failure_reason import CheckpointFailureReason
from .metadata import CompletedCheckpoint
from .savepoints import rebase_savepoint_paths
from .stats import CheckpointStats

__all__ = ["OperatorInfo", "PendingCheckpoint", "TaskAcknowledgeResult"]


@dataclass(frozen=True)
class OperatorInfo:
    """What the metadata records of an operator besides its state.

    Attributes:
        uid: its stable id.
        name: its name.
        parallelism: its number of instances.
        keyed: whether it has keyed state.
    """

    uid: str
    name: str
    parallelism: int
    keyed: bool


class TaskAcknowledgeResult(enum.Enum):
    """What became of an acknowledgement (Flink's ``TaskAcknowledgeResult``)."""

    SUCCESS = "success"
    """Counted: the task was awaited."""
    DUPLICATE = "duplicate"
    """The task had acknowledged already."""
    UNKNOWN = "unknown"
    """The task is not one this checkpoint waits for."""
    DISCARDED = "discarded"
    """The checkpoint was aborted or completed meanwhile."""


def _done_future() -> asyncio.Future[CompletedCheckpoint]:
    return asyncio.get_running_loop().create_future()


def _committed_future() -> asyncio.Future[None]:
    return asyncio.get_running_loop().create_future()


@dataclass(eq=False)
class PendingCheckpoint:
    """A triggered checkpoint waiting for acknowledgements.

    Args:
        checkpoint_id: its id.
        kind: ``"checkpoint"`` or ``"savepoint"``.
        deadline: ``time.monotonic()`` after which it expires.
        started: ``time.perf_counter()`` when it was triggered.
        waiting_for: ids of the tasks that have not acknowledged yet.
        stats: its entry in the job's checkpoint history (updated in place).
        commit: notify the tasks when it completes (they commit side effects); False for
            an intermediate savepoint.
        operators: every operator of the job by uid (what the metadata records of them).
        reconfigurations: what its barrier reconfigures (recorded in its metadata).
        rescaled: the parallelism of the operators a rescale changed, by uid (recorded
            in its metadata, ``CheckpointMetadata.rescaled``).

    Attributes:
        done: resolved with the completed checkpoint once its metadata is durable, or
            failed with a :class:`~reactive.errors.CheckpointError` when it is aborted.
        committed: resolved when every task has run ``notify_checkpoint_complete`` (with
            ``commit``), or failed with the abort.
    """

    checkpoint_id: int
    kind: str
    deadline: float
    started: float
    waiting_for: set[str]
    stats: CheckpointStats
    commit: bool = True
    operators: Mapping[str, OperatorInfo] = field(default_factory=dict)
    reconfigurations: tuple[Reconfiguration, ...] = ()
    rescaled: Mapping[str, int] = field(default_factory=dict)
    done: asyncio.Future[CompletedCheckpoint] = field(default_factory=_done_future)
    committed: asyncio.Future[None] = field(default_factory=_committed_future)
    _states: dict[str, dict[int, OperatorSubtaskState]] = field(default_factory=dict)
    _acknowledged: set[str] = field(default_factory=set)
    _discarded: bool = False

    @property
    def is_fully_acknowledged(self) -> bool:
        """Every task has acknowledged."""
        return not self.waiting_for

    @property
    def is_discarded(self) -> bool:
        """It was aborted."""
        return self._discarded

    def acknowledge(self, task_id: str, subtask: int,
                    states: Mapping[str, OperatorSubtaskState],
                    metrics: Mapping[str, float]) -> TaskAcknowledgeResult:
        """Record task ``task_id``'s snapshot.

        Args:
            task_id: the task.
            subtask: its instance index (the key of its operators' subtask states).
            states: the state of each of its operators' instances, by operator uid.
            metrics: the task's figures: ``alignment``, ``sync``, ``async`` (seconds) and
                ``size`` (bytes).

        Returns:
            SUCCESS when counted (see :attr:`is_fully_acknowledged`), else why not.

        Raises:
            KeyError: for a uid that is not among :attr:`operators`.
        """
        if self._discarded:
            return TaskAcknowledgeResult.DISCARDED
        if task_id not in self.waiting_for:
            return (TaskAcknowledgeResult.DUPLICATE if task_id in self._acknowledged
                    else TaskAcknowledgeResult.UNKNOWN)
        unknown = [uid for uid in states if uid not in self.operators]
        if unknown:  # before anything changes
            raise KeyError(f"checkpoint {self.checkpoint_id}: task {task_id} acknowledged "
                           f"state of operators {unknown} the job does not have")
        self.waiting_for.discard(task_id)
        self._acknowledged.add(task_id)
        s = self.stats
        for uid, state in states.items():
            self._states.setdefault(uid, {})[subtask] = state
            keyed = state.keyed_state
            if keyed is not None:
                acc = s.operators.setdefault(uid, {"state_bytes": 0, "ttl_dropped": 0})
                acc["state_bytes"] += sum(ref.size for ref in keyed.files)
                dropped = keyed.extra.get("ttl_dropped", 0)
                acc["ttl_dropped"] += dropped if isinstance(dropped, int) else 0
        s.alignment = max(s.alignment, metrics["alignment"])
        s.sync = max(s.sync, metrics["sync"])
        s.async_ = max(s.async_, metrics["async"])
        s.size += int(metrics["size"])
        s.tasks[task_id] = dict(metrics)
        return TaskAcknowledgeResult.SUCCESS

    def finalize(self, *, job: str, max_parallelism: int, mode: str, run_id: str,
                 checkpoint_dir_name: str) -> CheckpointMetadata:
        """The metadata of the fully acknowledged checkpoint (its statistics marked
        completed): a savepoint's paths made relative to its own directory.

        Args:
            job: the dataflow's name.
            max_parallelism: the job's.
            mode: the checkpointing mode.
            run_id: the run it belongs to.
            checkpoint_dir_name: ``chk-<n>``, the directory it is written to.

        Raises:
            CheckpointError: if it is not fully acknowledged, was discarded, or a
                savepoint's handle references a file outside its directory.
        """
        if self._discarded or self.waiting_for:
            raise CheckpointError(f"checkpoint {self.checkpoint_id} cannot be finalized: "
                                  + ("it was aborted" if self._discarded else
                                     f"{len(self.waiting_for)} task(s) have not acknowledged"))
        self.stats.duration = time.perf_counter() - self.started
        self.stats.status = "completed"
        stats = self.stats
        metadata = CheckpointMetadata(
            job=job, checkpoint_id=self.checkpoint_id, kind=self.kind,
            timestamp=stats.trigger_time, max_parallelism=max_parallelism, mode=mode,
            run_id=run_id, commits=self.commit,
            operators={uid: OperatorState(self.operators[uid].name,
                                          self.operators[uid].parallelism,
                                          self.operators[uid].keyed, dict(subtasks))
                       for uid, subtasks in self._states.items()},
            metrics=CheckpointMetrics(
                stats.checkpoint_id, stats.kind, stats.status, stats.trigger_time,
                stats.duration, stats.alignment, stats.sync, stats.async_, stats.size,
                stats.path, stats.failure, stats.failure_reason),
            reconfigurations=self.reconfigurations,
            rescaled=dict(self.rescaled),
        )
        if self.kind == "savepoint":
            return rebase_savepoint_paths(metadata, checkpoint_dir_name)
        return metadata

    def complete(self, checkpoint: CompletedCheckpoint) -> None:
        """Its metadata is durable: resolve :attr:`done` (and :attr:`committed` when it
        commits nothing)."""
        self.stats.path = str(checkpoint.path)
        if not self.commit and not self.committed.done():
            self.committed.set_result(None)
        if not self.done.done():
            self.done.set_result(checkpoint)

    def abort(self, reason: CheckpointFailureReason, detail: str = "") -> CheckpointError:
        """Discard it: mark its statistics aborted and fail whoever waits for it.

        Args:
            reason: why.
            detail: what happened, in words (default: the reason's message).

        Returns:
            the error its futures were failed with.
        """
        self._discarded = True
        text = detail or reason.message
        self.stats.status = "aborted"
        self.stats.failure = text
        self.stats.failure_reason = reason.name
        self.stats.duration = time.perf_counter() - self.started
        error = CheckpointError(f"checkpoint {self.checkpoint_id} aborted: {text}")
        self.fail_waiters(error)
        return error

    def fail_waiters(self, error: CheckpointError) -> None:
        """Fail :attr:`done` and :attr:`committed` with ``error`` where still unresolved
        (marked retrieved: a periodic checkpoint has nobody waiting)."""
        for fut in (self.done, self.committed):
            if not fut.done():
                fut.set_exception(error)
                fut.exception()
