"""Writing Nexmark events to files that other engines read: JSON lines in Flink nexmark's
layout (one object per event: ``event_type`` and the ``person``, ``auction`` or ``bid``
object, times as ``yyyy-MM-dd HH:mm:ss.SSS`` in UTC, the format of Flink's JSON format for
``TIMESTAMP(3)``), or Parquet with the Arrow layout of :mod:`.arrow`.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any, Literal

import numpy as np

from reactive.errors import ConfigurationError
from reactive.extras import require

from .config import NexmarkConfig
from .generator import generate_columns, to_records
from .model import AUCTION_COLUMNS, BID_COLUMNS, PERSON_COLUMNS, Auction, Bid, Person

__all__ = ["event_to_json", "write_events"]

_EPOCH = dt.datetime(1970, 1, 1)
_KINDS: dict[type, tuple[int, str, tuple[str, ...]]] = {
    Person: (0, "person", PERSON_COLUMNS),
    Auction: (1, "auction", AUCTION_COLUMNS),
    Bid: (2, "bid", BID_COLUMNS),
}
_TIMES = {"dateTime", "expires"}


def _sql_time(ms: int) -> str:
    t = _EPOCH + dt.timedelta(milliseconds=ms)
    return t.strftime("%Y-%m-%d %H:%M:%S.") + f"{ms % 1000:03d}"


def event_to_json(event: Person | Auction | Bid) -> dict[str, Any]:
    """One event as the JSON object of Flink nexmark's table (nulls for the other kinds)."""
    kind, name, columns = _KINDS[type(event)]
    values: tuple[Any, ...] = event
    body = {c: _sql_time(v) if c in _TIMES else v for c, v in zip(columns, values, strict=True)}
    return {"event_type": kind, "person": None, "auction": None, "bid": None, name: body}


def write_events(config: NexmarkConfig, path: str | os.PathLike[str],
                 file_format: Literal["jsonl", "parquet"] = "jsonl",
                 batch_size: int = 65_536) -> Path:
    """Write the events ``0 .. config.num_events - 1`` to one file.

    Args:
        config: a bounded stream's parameters.
        path: the file to write (replaced if it exists).
        file_format: ``"jsonl"`` or ``"parquet"`` (needs pyarrow: the parquet extra).
        batch_size: events generated (and written) per step.

    Returns:
        the path written.

    Raises:
        ConfigurationError: for an unbounded stream or an unknown format.
    """
    if config.num_events is None:
        raise ConfigurationError("write_events needs a bounded NexmarkConfig (num_events)")
    path = Path(path)
    if file_format == "parquet":
        pq = require("pyarrow.parquet", "parquet", "Nexmark Parquet files")
        from .arrow import event_schema, record_batches

        with pq.ParquetWriter(path, event_schema()) as writer:
            for batch in record_batches(config, batch_size):
                writer.write_batch(batch)
        return path
    if file_format != "jsonl":
        raise ConfigurationError(f"file_format must be 'jsonl' or 'parquet', got {file_format!r}")
    with open(path, "w", encoding="utf-8") as f:
        for first in range(0, config.num_events, batch_size):
            numbers = np.arange(first, min(first + batch_size, config.num_events))
            f.writelines(json.dumps(event_to_json(e), separators=(",", ":")) + "\n"
                         for e in to_records(generate_columns(config, numbers)))
    return path
