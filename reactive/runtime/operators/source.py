"""The source operator: runs a source reader; its position is operator state."""

from __future__ import annotations

from collections.abc import Awaitable

from ...sources import Source, SourceReader
from ...state.backend import KeyedStateBackend
from .base import StreamOperator

__all__ = ["SourceOperator"]


class SourceOperator(StreamOperator):
    """Runs a :class:`~reactive.sources.SourceReader`; its position is operator state."""

    POSITION = "source-position"

    def __init__(self, name: str, uid: str, source: Source):
        super().__init__(name, uid)
        self.source = source
        self.reader: SourceReader

    def setup(self, subtask: int, parallelism: int, max_parallelism: int,
              keyed_backend: KeyedStateBackend | None) -> None:
        super().setup(subtask, parallelism, max_parallelism, keyed_backend)
        self.reader = self.source.create_reader(subtask, parallelism)

    def open(self) -> None:
        restored = self.operator_state.get_list_state(
            self.POSITION, self.source.state_redistribution)
        if restored.get():
            self.reader.restore_state(restored.get())

    def snapshot_state(self, checkpoint_id: int) -> None:
        entries = self.reader.snapshot_state(checkpoint_id)
        self.operator_state.get_list_state(
            self.POSITION, self.source.state_redistribution).update(entries)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> Awaitable[None] | None:
        return self.reader.notify_checkpoint_complete(checkpoint_id)

    def close(self) -> Awaitable[None] | None:
        return self.reader.close()
