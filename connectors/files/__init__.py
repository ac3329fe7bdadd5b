"""File sources and sinks: lines of text files and rows of CSV files (the byte offset is the
position), and the exactly-once committing file sink (JSON lines or Parquet part files).

This package only re-exports; each module has one job:

- :mod:`.line_source`: the line-file source and :class:`InvalidLine` dead letters.
- :mod:`.csv_source`: the CSV file source (pyarrow, vectorized blocks).
- :mod:`.csv_records`: blocks of CSV rows to records, and :class:`InvalidRow` dead letters.
- :mod:`.csv_rows`: row boundaries of CSV bytes (blocks cut at row ends, rows and offsets).
- :mod:`.committing_sink`: the two-phase-commit file sink and its commit verification.
- :mod:`.transaction`: the sink's per-interval part file, as checkpoints store it.
- :mod:`.encoders`: batches of records as JSON lines.
- :mod:`.parquet_buffer`: parquet rows buffered per column, written as row groups.
- :mod:`.hashing`: the size and SHA-256 of part files.
"""

from .committing_sink import CommittingFileSink, PartFileError
from .csv_records import InvalidRow
from .csv_source import CsvFileSource
from .line_source import InvalidLine, LineFileSource
from .transaction import FileTransaction

__all__ = ["CommittingFileSink", "CsvFileSource", "FileTransaction", "InvalidLine",
           "InvalidRow", "LineFileSource", "PartFileError"]
