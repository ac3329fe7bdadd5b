"""The sink operator: hands batches to a sink writer; its snapshot entries (pre-committed
transactions) are operator state."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from ...errors import ConfigurationError, RecordRejectedError
from ...sinks import Sink, SinkWriter
from ...state.backend import KeyedStateBackend
from ...state.operator_state import OperatorListState, RedistributionMode
from .base import StreamOperator, maybe_await

__all__ = ["SinkOperator"]


class SinkOperator(StreamOperator):
    """Hands batches to a :class:`~reactive.sinks.SinkWriter`; its ``snapshot_state`` entries
    are operator state (e.g. pre-committed transactions).

    The entries are redistributed as the writer's ``state_redistribution`` says (``"union"``
    for two-phase-commit writers: every instance must see every pending transaction, see
    ``reactive.two_phase_commit``). Before the first record the writer gets
    ``restore_state(entries)``, or ``start_fresh()`` when there is nothing to restore.
    """

    STATE = "sink-state"

    def __init__(self, name: str, uid: str, sink: Sink):
        super().__init__(name, uid)
        self.sink = sink
        self.writer: SinkWriter

    def setup(self, subtask: int, parallelism: int, max_parallelism: int,
              keyed_backend: KeyedStateBackend | None) -> None:
        super().setup(subtask, parallelism, max_parallelism, keyed_backend)
        self.writer = self.sink.create_writer(subtask, parallelism)

    def _state(self) -> OperatorListState:
        mode: RedistributionMode = self.writer.state_redistribution
        return self.operator_state.get_list_state(self.STATE, mode)

    async def restore(self) -> None:
        """Give the writer the entries of the restored checkpoint (commit pending ones), or
        tell it that it starts fresh."""
        entries = self._state().get()
        if entries:
            await maybe_await(self.writer.restore_state(entries))
            return
        await maybe_await(self.writer.start_fresh())

    async def write(self, batch: list[Any]) -> None:
        """Write a batch, reporting a failure with the record the writer refused
        (:class:`~reactive.errors.RecordRejectedError`), else the batch's first record.

        Raises:
            ConfigurationError: as the writer raised it (a misconfigured sink is not the
                record's fault).
            UserFunctionError: wrapping any other error of the writer.
        """
        try:
            await maybe_await(self.writer.write(batch))
        except ConfigurationError:
            raise
        except RecordRejectedError as exc:
            raise self.fail(exc.record, exc) from exc
        except Exception as exc:
            raise self.fail(batch[0] if batch else None, exc) from exc

    async def snapshot_state(self, checkpoint_id: int) -> None:
        entries = await maybe_await(self.writer.snapshot_state(checkpoint_id))
        self._state().update(entries or [])

    def notify_checkpoint_complete(self, checkpoint_id: int) -> Awaitable[None] | None:
        return self.writer.notify_checkpoint_complete(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> Awaitable[None] | None:
        return self.writer.notify_checkpoint_aborted(checkpoint_id)

    def close(self) -> Awaitable[None] | None:
        return self.writer.close()
