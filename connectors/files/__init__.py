"""File sources and sinks: lines of text files (the byte offset is the position), and the
exactly-once committing file sink (JSON lines or Parquet part files).

This package only re-exports; each module has one job:

- :mod:`.line_source`: the line-file source and :class:`InvalidLine` dead letters.
- :mod:`.committing_sink`: the two-phase-commit file sink and its commit verification.
- :mod:`.transaction`: the sink's per-interval part file, as checkpoints store it.
- :mod:`.encoders`: batches of records as JSON lines.
- :mod:`.parquet_buffer`: parquet rows buffered per column, written as row groups.
- :mod:`.hashing`: the size and SHA-256 of part files.
"""

from .committing_sink import CommittingFileSink, PartFileError
from .line_source import InvalidLine, LineFileSource
from .transaction import FileTransaction

__all__ = ["CommittingFileSink", "FileTransaction", "InvalidLine", "LineFileSource",
           "PartFileError"]
