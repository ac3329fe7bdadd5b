"""The task around the harness's one operator, as the operator and the checkpoint code see
it: a mailbox whose actions the harness runs, recorded output, and the acknowledgements of
its snapshots."""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Awaitable, Generator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..checkpoint.contract import OperatorSubtaskState
from ..checkpoint.failure_reason import CheckpointFailureReason
from ..time.mailbox import MailboxAction
from ..time.watermarks import WatermarkStatus

__all__ = ["DONE", "Acknowledgements", "HarnessOutput", "HarnessTask", "Identity",
           "synchronous"]


class HarnessOutput(Protocol):
    """Where the harness's task records what its operator emits."""

    output: list[Any]
    watermarks: list[float]
    watermark_statuses: list[WatermarkStatus]


class _Done:
    """An awaitable that is already done: what the harness's task methods return (they
    record synchronously)."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        yield from ()


DONE = _Done()


class HarnessTask:
    """The task as the operator's mailbox sees it (:class:`~reactive.time.mailbox.MailboxOwner`):
    actions are queued for the harness, emitted records and watermarks are recorded."""

    def __init__(self, harness: HarnessOutput) -> None:
        self.harness = harness
        self.mail: deque[MailboxAction] = deque()

    def post(self, action: MailboxAction) -> None:
        self.mail.append(action)

    def push_from(self, start: int, batch: list[Any]) -> Awaitable[None]:
        self.harness.output.extend(batch)
        return DONE

    def emit_watermark_from(self, start: int, timestamp: float) -> Awaitable[None]:
        self.harness.watermarks.append(timestamp)
        return DONE

    def emit_watermark_status(self, status: WatermarkStatus) -> Awaitable[None]:
        self.harness.watermark_statuses.append(status)
        return DONE


@dataclass(frozen=True)
class Identity:
    task_id: str
    subtask: int


class Acknowledgements:
    """The checkpoint coordinator as the harness's snapshot sees it."""

    def __init__(self) -> None:
        self.states: Mapping[str, OperatorSubtaskState] | None = None
        self.declined: BaseException | None = None

    async def acknowledge(self, checkpoint_id: int, task: Any,
                          states: Mapping[str, OperatorSubtaskState],
                          stats: Mapping[str, float]) -> None:
        self.states = states

    def decline(self, checkpoint_id: int, task: Any, reason: BaseException,
                failure_reason: CheckpointFailureReason | None = None) -> None:
        self.declined = reason


def synchronous(result: Any, what: str) -> None:
    """Accept what a synchronous hook returned; refuse real asynchronous work."""
    if result is None or result is DONE:
        return
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()
        raise TypeError(f"{what} returned an awaitable: the harness runs synchronous operators "
                        "(map_async, sources and sinks need a task)")
