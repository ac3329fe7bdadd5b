"""Reading the metadata log of Spark's file sink: which files of a directory a streaming
query committed, and in which micro-batch.

Spark's ``FileStreamSink`` writes ``_spark_metadata/<batch>`` (and every
``spark.sql.streaming.fileSink.log.compactInterval`` batches a ``<batch>.compact`` that
repeats the entries of the earlier ones) when a micro-batch commits: a ``v1`` line, then one
JSON entry per file (``path``, ``action`` ``add`` or ``delete``). Files of a batch that
failed before its log entry was written are in the directory but not in the log: they are
not output. Source: Spark's ``FileStreamSinkLog`` / ``CompactibleFileStreamLog``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import unquote, urlparse

from .errors import ResultLogError

__all__ = ["METADATA_DIR", "SparkSinkFile", "is_spark_sink_directory", "spark_sink_files"]

METADATA_DIR = "_spark_metadata"
_LOG_FILE = re.compile(r"^(\d+)(\.compact)?$")
_PARTITION = re.compile(r"^part-(\d+)-")
_FORMATS = {".txt": "jsonl", ".json": "jsonl", ".parquet": "parquet"}


def is_spark_sink_directory(directory: Path) -> bool:
    """True when ``directory`` holds a Spark file sink's metadata log."""
    return (directory / METADATA_DIR).is_dir()


class SparkSinkFile:
    """One committed file: the batch that committed it, the partition that wrote it, its
    path and format (``jsonl`` for text and JSON files, ``parquet``)."""

    __slots__ = ("batch_id", "format", "partition", "path")

    def __init__(self, batch_id: int, partition: int, path: Path, format: str) -> None:
        self.batch_id = batch_id
        self.partition = partition
        self.path = path
        self.format = format


def _local_path(text: str) -> Path:
    parsed = urlparse(text)
    return Path(unquote(parsed.path) if parsed.scheme in ("file", "") else text)


def spark_sink_files(directory: Path) -> list[SparkSinkFile]:
    """The files Spark's file sink committed in ``directory``, by batch then partition.

    A file's batch is the first log file that lists it (exact while the per-batch log files
    are kept; after Spark compacted and deleted them, the compaction's batch).

    Raises:
        ResultLogError: naming the log file, when one is not a Spark sink log.
    """
    log_dir = directory / METADATA_DIR
    logs: list[tuple[int, Path]] = []
    for p in log_dir.iterdir():
        m = _LOG_FILE.match(p.name)
        if m:
            logs.append((int(m.group(1)), p))
    first_seen: dict[str, int] = {}
    deleted: set[str] = set()
    for batch, p in sorted(logs, key=lambda x: (x[0], x[1].name)):
        lines = p.read_text(encoding="utf-8").splitlines()
        if not lines or not lines[0].startswith("v"):
            raise ResultLogError(f"{p} is not a Spark file sink log (no version line)")
        for line in lines[1:]:
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                path, action = entry["path"], entry.get("action", "add")
            except (ValueError, KeyError, TypeError) as exc:
                raise ResultLogError(f"{p}: malformed entry {line[:80]!r}: {exc}") from exc
            if action == "delete":
                deleted.add(path)
            else:
                first_seen.setdefault(path, batch)
    out = []
    for path, batch in first_seen.items():
        if path in deleted:
            continue
        local = _local_path(path)
        fmt = next((f for ext, f in _FORMATS.items() if local.name.endswith(ext)), None)
        if fmt is None:
            continue
        m = _PARTITION.match(local.name)
        out.append(SparkSinkFile(batch, int(m.group(1)) if m else 0, local, fmt))
    return sorted(out, key=lambda f: (f.batch_id, f.partition, f.path.name))
