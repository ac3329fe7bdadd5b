"""A task as the checkpoint coordinator sees it (Flink's ``CheckpointableTask``).

The coordinator drives the tasks through their mailboxes: it posts a barrier injection into
each source task, the completion or abort of a checkpoint into every task, and, in the
synchronous-snapshot baseline, holds the source tasks' input reading. That is all it needs
of a task, so it names this protocol instead of the runtime's task
(:class:`reactive.runtime.task.StreamTask` implements it): the checkpoint package stays below
the runtime, and a test drives the coordinator with a stand-in task.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from .barrier import CheckpointBarrier

__all__ = ["CheckpointableTask", "MailboxAction", "Resumable", "SuspendableMailbox"]

#: a mailbox action: called in the task; what it returns is awaited when awaitable
MailboxAction = Callable[[], Awaitable[None] | None]


class Resumable(Protocol):
    """A held default action (Flink's ``MailboxDefaultAction.Suspension``)."""

    def resume(self) -> None:
        """Let the task read input again (idempotent)."""
        ...


class SuspendableMailbox(Protocol):
    """A task's mailbox as the coordinator sees it."""

    def suspend_default_action(self) -> Resumable:
        """Post an action that stops the task reading input until the returned handle is
        resumed; meanwhile the task runs its mail."""
        ...


class CheckpointableTask(Protocol):
    """What the checkpoint coordinator uses of a task.

    The ``trigger_checkpoint`` and ``notify_*`` methods are mailbox actions: the coordinator
    posts them (:meth:`post`), so they run in the task between two batches, never while it
    processes one.
    """

    @property
    def task_id(self) -> str:
        """The task's display name (``"<chain> (<subtask + 1>/<parallelism>)"``)."""
        ...

    @property
    def subtask(self) -> int:
        """The task's instance index, from 0."""
        ...

    @property
    def source(self) -> object | None:
        """The task's source operator; None for a task that reads channels (the coordinator
        injects barriers into the tasks that have one)."""
        ...

    @property
    def is_iteration_head(self) -> bool:
        """Whether the task is an iteration's head (unaligned checkpoints refuse those)."""
        ...

    @property
    def mailbox(self) -> SuspendableMailbox:
        """The task's mailbox."""
        ...

    def post(self, action: MailboxAction) -> None:
        """Run ``action`` in the task between two batches, after those posted before it."""
        ...

    def trigger_checkpoint(self, barrier: CheckpointBarrier) -> Awaitable[None]:
        """Mailbox action of a source task: snapshot and inject ``barrier``."""
        ...

    def notify_checkpoint_complete(self, checkpoint_id: int) -> Awaitable[None]:
        """Mailbox action: checkpoint ``checkpoint_id`` completed (commit side effects)."""
        ...

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> Awaitable[None]:
        """Mailbox action: checkpoint ``checkpoint_id`` was aborted."""
        ...
