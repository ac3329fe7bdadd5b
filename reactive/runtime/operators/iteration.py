"""The operators at the two ends of an iteration's loop: the head, which keeps the back-edge
log of a checkpoint, and the tail, which passes the loop's feedback to the head (ABS paper,
section 3.3, Algorithm 2; Carbone 2018 (PhD thesis), section 3.4.4.4, Algorithm 7).

Both pass records through unchanged; the protocol is run by the head's task
(``reactive.runtime.iteration_head``).
"""

from __future__ import annotations

from typing import Any

from .base import StreamOperator

__all__ = ["BACK_EDGE_LOG", "IterationHeadOperator", "IterationTailOperator"]

BACK_EDGE_LOG = "back-edge-log"
"""The name of the head's operator state that holds a checkpoint's back-edge log."""


class IterationHeadOperator(StreamOperator):
    """The loop head: forwards the input and the feedback into the loop, and logs the
    feedback records that arrive while a checkpoint's barrier travels around the loop.

    The log of checkpoint n holds every feedback record the head received after it
    forwarded barrier n into the loop and before barrier n came back through the tail:
    the records that were inside the loop when its operators took their snapshots. It is
    the head's whole snapshot (operator state, redistributed round robin on rescaling);
    a restored head sends it into the loop before any new input.
    """

    def __init__(self, name: str, uid: str) -> None:
        super().__init__(name, uid)
        self._logs: dict[int, list[Any]] = {}
        self._closed_logs: dict[int, list[Any]] = {}

    def take_restored_log(self) -> list[Any]:
        """The records of the restored checkpoint's log (once; empty on a fresh start)."""
        state = self.operator_state.get_list_state(BACK_EDGE_LOG)
        records = state.get()
        state.clear()
        return records

    def open_log(self, checkpoint_id: int) -> None:
        """Barrier ``checkpoint_id`` was forwarded into the loop: start its log."""
        self._logs[checkpoint_id] = []

    def log_feedback(self, batch: list[Any]) -> None:
        """A feedback batch arrived: append it to every open log."""
        for log in self._logs.values():
            log.extend(batch)

    def close_log(self, checkpoint_id: int) -> None:
        """Barrier ``checkpoint_id`` came back: its log is complete. Logs of older
        checkpoints whose barrier will never return (a task dropped it) are discarded."""
        for cid in [c for c in self._logs if c < checkpoint_id]:
            del self._logs[cid]
        self._closed_logs[checkpoint_id] = self._logs.pop(checkpoint_id, [])

    @property
    def open_logs(self) -> int:
        """Checkpoints whose barrier is still travelling around the loop."""
        return len(self._logs)

    def snapshot_state(self, checkpoint_id: int) -> None:
        self.operator_state.get_list_state(BACK_EDGE_LOG).update(
            self._closed_logs.pop(checkpoint_id, []))

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self._logs.pop(checkpoint_id, None)
        self._closed_logs.pop(checkpoint_id, None)


class IterationTailOperator(StreamOperator):
    """The loop tail: the end of the step's feedback stream. Its task writes into the
    feedback channel of the head instance with the same index (the colocated head, as in
    Flink's ``StreamIterationTail``); the channel is unbounded, so the tail never blocks
    (a bounded channel in a cycle can deadlock, Carbone 2018 (PhD thesis), section 6.4.3.2)."""
