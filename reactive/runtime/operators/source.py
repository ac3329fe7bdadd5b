"""The source operator: runs a source reader; its position is operator state."""

from __future__ import annotations

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
        restored = self.operator_state.get_list_state(self.POSITION, "split")
        if restored.get():
            self.reader.restore_state(restored.get())

    def snapshot_state(self, checkpoint_id: int) -> None:
        self.operator_state.get_list_state(self.POSITION, "split").update(
            self.reader.snapshot_state()
        )

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.reader.notify_checkpoint_complete(checkpoint_id)

    def close(self) -> None:
        self.reader.close()
