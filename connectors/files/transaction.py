"""The transaction of the committing file sink: one subtask's part file for one checkpoint
interval, and what of it a checkpoint stores."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["FileTransaction"]


@dataclass(eq=False)
class FileTransaction:
    """The part file of one subtask for one checkpoint interval.

    Only the names, the record count and the pre-committed size and digest are pickled into
    checkpoints; the open file and buffered rows are not.

    Attributes:
        subtask: the subtask that wrote it (the part file's name carries it).
        name: its current name in the sink's directory: the hidden in-progress name, then,
            once pre-committed, the hidden pending name.
        final: the committed name ``part-<subtask>-<checkpoint>.<ext>`` (set by pre-commit).
        checkpoint_id: the checkpoint that pre-committed it.
        records: how many records it holds.
        size: the file's size in bytes as pre-commit wrote it (None before pre-commit, and
            in transactions of checkpoints taken before sizes were recorded).
        sha256: the file's SHA-256 (hex) as pre-commit wrote it (None like ``size``).
    """

    subtask: int
    name: str
    final: str | None = None
    checkpoint_id: int | None = None
    records: int = 0
    size: int | None = None
    sha256: str | None = None
    file: Any = field(default=None, repr=False)  # a _HashingFile while in progress
    writer: Any = field(default=None, repr=False)  # pyarrow.parquet.ParquetWriter
    columns: list[list[Any]] = field(default_factory=list, repr=False)  # parquet rows to write
    # parquet: Arrow record batches to write as they are (a columnar stream's output)
    record_batches: list[Any] = field(default_factory=list, repr=False)
    buffered: int = 0
    failure: BaseException | None = field(default=None, repr=False)  # why pre-commit failed

    def __getstate__(self) -> dict[str, Any]:
        return {"subtask": self.subtask, "name": self.name, "final": self.final,
                "checkpoint_id": self.checkpoint_id, "records": self.records,
                "size": self.size, "sha256": self.sha256}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]


# checkpoints store it (pickled): keep the name they hold, as before reactive.connectors.files became
# a package, so checkpoints of either layout restore with the other
FileTransaction.__module__ = "reactive.connectors.files"
