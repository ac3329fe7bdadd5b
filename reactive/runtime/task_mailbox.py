"""A task's mailbox: actions other parts of the job run in the task, between two batches
(Flink's ``TaskMailbox`` and the suspension of ``MailboxProcessor``'s default action).

A task has one loop. Its *default action* is reading input (a source reader's next batch,
or the next item of the input gate); *mail* (a barrier to inject, a checkpoint's completion
or abort to handle, a processing-time timer, a state lookup) is posted by the coordinator,
operators and the job, and runs in the task before its next read, in the order posted. So
nothing a mail action touches is touched concurrently by the task.

A task may have to run its mail and read no input until something happens:

- a source parked by a stop-with-savepoint right after it injected the savepoint's barrier,
  until the job ends or the stop fails (Flink's synchronous savepoint);
- the sources halted behind barrier n until checkpoint n completes, in the synchronous-
  snapshot baseline (:mod:`reactive.checkpoint.synchronous_snapshots`);
- a finished source, which keeps handling barriers and notifications until the job tells it
  to end its output (Flink FLIP-147's final checkpoint).

All three are :meth:`TaskMailbox.run_until`; the first two are posted as mail by
:meth:`TaskMailbox.suspend_default_action` and end with :meth:`Suspension.resume`.

The input gate reads this mailbox's queue first and wakes on a post, so a task waiting for
input wakes for mail too (:class:`~.channel.InputGate`).
"""

from __future__ import annotations

import asyncio
import inspect
from collections import deque
from collections.abc import Awaitable, Callable

__all__ = ["MailboxAction", "Suspension", "TaskMailbox"]

#: a mailbox action: called in the task; what it returns is awaited when awaitable
MailboxAction = Callable[[], Awaitable[None] | None]


def _nothing() -> None:
    return None


class TaskMailbox:
    """The mail of one task: a FIFO of actions run in the task between two batches.

    Attributes:
        queue: the actions posted and not yet taken, oldest first (the input gate reads it
            directly: a truth test per read is all the hot path pays).
    """

    __slots__ = ("_on_post", "_waiter", "queue")

    def __init__(self) -> None:
        self.queue: deque[MailboxAction] = deque()
        self._waiter: asyncio.Future[None] | None = None
        # the input gate's wake-up: a task waiting for input wakes for mail
        self._on_post: Callable[[], None] = _nothing

    def __len__(self) -> int:
        return len(self.queue)

    def bind(self, on_post: Callable[[], None]) -> None:
        """Call ``on_post`` after every post (the input gate wakes its reader with it)."""
        self._on_post = on_post

    def post(self, action: MailboxAction) -> None:
        """Queue ``action``; it runs in the task after the actions posted before it."""
        self.queue.append(action)
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)
        self._on_post()

    async def run_pending(self) -> None:
        """Run every queued action, the ones they post included, until the queue is empty."""
        queue = self.queue
        while queue:
            result = queue.popleft()()
            if result is not None and inspect.isawaitable(result):
                await result

    async def run_until(self, done: Callable[[], bool]) -> None:
        """Run mail as it comes and read no input until ``done()`` is true.

        ``done`` is asked before each action and whenever the mailbox is woken: whoever
        makes it true must post an action or call :meth:`Suspension.resume` (which wakes
        the mailbox). Actions still queued when it returns run at the task's next read.
        """
        queue = self.queue
        while not done():
            if queue:
                result = queue.popleft()()
                if result is not None and inspect.isawaitable(result):
                    await result
                continue
            waiter = asyncio.get_running_loop().create_future()
            self._waiter = waiter
            try:
                await waiter
            finally:
                if self._waiter is waiter:
                    self._waiter = None

    def suspend_default_action(self) -> Suspension:
        """Post an action that stops the task reading input until the returned suspension
        is resumed; meanwhile the task runs its mail.

        It takes effect behind the actions posted before it (post it right behind a
        barrier's injection to stop the source right after the barrier). Resuming before
        it ran makes it a no-op.
        """
        suspension = Suspension(self)
        self.post(suspension._hold)
        return suspension


class Suspension:
    """A suspension of a task's default action (Flink's ``MailboxController.Suspension``),
    made by :meth:`TaskMailbox.suspend_default_action`."""

    __slots__ = ("_mailbox", "resumed")

    def __init__(self, mailbox: TaskMailbox) -> None:
        self._mailbox = mailbox
        self.resumed = False

    def _hold(self) -> Awaitable[None]:
        return self._mailbox.run_until(self._is_resumed)

    def _is_resumed(self) -> bool:
        return self.resumed

    def resume(self) -> None:
        """Let the task read input again (idempotent)."""
        if not self.resumed:
            self.resumed = True
            self._mailbox._wake()
