"""An operator's handle on its task: post mailbox actions, emit records and watermarks.

Operators are synchronous; what happens outside a batch (a processing-time timer, a periodic
watermark, an idleness check) is posted into the task's mailbox and runs between two
batches, in the task (Flink's ``MailboxExecutor``). Records and watermarks emitted this way
enter the chain after the operator, as if the operator had returned them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from .watermarks import WatermarkStatus

__all__ = ["MailboxOwner", "OperatorMailbox"]

MailboxAction = Callable[[], Awaitable[None] | None]


class MailboxOwner(Protocol):
    """The task as its operators' mailbox sees it: the narrow interface the time layer uses,
    so timers and watermark generators never depend on the task's implementation."""

    def post(self, action: MailboxAction) -> None:
        """Run ``action`` in the task between two batches."""
        ...

    def push_from(self, start: int, batch: list[Any]) -> Awaitable[None]:
        """Send ``batch`` through the chain from operator ``start``."""
        ...

    def emit_watermark_from(self, start: int, timestamp: float) -> Awaitable[None]:
        """Send a watermark through the chain from operator ``start`` and downstream."""
        ...

    def emit_watermark_status(self, status: WatermarkStatus) -> Awaitable[None]:
        """Send an idle/active status downstream."""
        ...


class OperatorMailbox:
    """The mailbox of the task running chained operator ``index``.

    Args:
        task: the task (anything with the :class:`MailboxOwner` methods).
        index: the operator's position in the task's chain.
    """

    __slots__ = ("index", "task")

    def __init__(self, task: MailboxOwner, index: int) -> None:
        self.task = task
        self.index = index

    def post(self, action: MailboxAction) -> None:
        """Run ``action`` in the task between two batches (sync or returning an awaitable)."""
        self.task.post(action)

    def post_emitting(self, action: Callable[[], list[Any]]) -> None:
        """Run ``action`` in the task and send the records it returns downstream."""
        task, start = self.task, self.index + 1

        def run() -> Awaitable[None] | None:
            out = action()
            return task.push_from(start, out) if out else None

        task.post(run)

    def emit_watermark(self, timestamp: float) -> Awaitable[None]:
        """Send watermark ``timestamp`` (seconds) through the rest of the chain and downstream.

        Call it from a mailbox action (it must run in the task)."""
        return self.task.emit_watermark_from(self.index + 1, timestamp)

    def emit_watermark_status(self, status: WatermarkStatus) -> Awaitable[None]:
        """Send an idle/active status downstream (from a mailbox action)."""
        return self.task.emit_watermark_status(status)
