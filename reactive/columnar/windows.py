"""Event-time windows of columnar streams: which window assigners apply, each row's windows
computed over arrays, and the schema of the window results.

The assigners are the per-record ones (:mod:`reactive.windowing.assigners`): tumbling and
sliding event-time windows (``PeriodicWindows``) and sessions with a fixed gap
(``EventTimeSessionWindows``). A row's windows are those ``assign_windows`` gives its
timestamp, computed with the same floating-point operations in the same order over the
whole timestamp array, so both APIs put a row in identical windows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ConfigurationError
from ..windowing.assigners import (
    EventTimeSessionWindows,
    PeriodicWindows,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    WindowAssigner,
)
from .aggregates import Spec
from .schema import pa
from .watermarks import seconds_per_unit

__all__ = ["LATE_KEY", "WINDOW_END", "WINDOW_START", "assign_periodic", "check_assigner",
           "is_late_batch", "window_schema", "window_values"]

WINDOW_START = "window_start"
WINDOW_END = "window_end"
LATE_KEY = b"reactive.late"
"""Schema-metadata key marking a batch of late rows on its way to the late output."""


def check_assigner(assigner: WindowAssigner, specs: list[Spec] | None = None) -> None:
    """Refuse assigners the columnar windows do not run.

    Raises:
        ConfigurationError: for processing-time, count, global or dynamic-gap windows, and
            for first/last in session windows (merging sessions would need each value's
            arrival order).
    """
    if isinstance(assigner, EventTimeSessionWindows):
        for s in specs or []:
            if getattr(s, "function", None) in ("first", "last"):
                raise ConfigurationError(
                    f"agg: {s.output}=: {s.function} is not supported in session windows "
                    "(use it with tumbling or sliding windows)")
        return
    if isinstance(assigner, (TumblingEventTimeWindows, SlidingEventTimeWindows)):
        return
    raise ConfigurationError(
        f"columnar windows take TumblingEventTimeWindows, SlidingEventTimeWindows or "
        f"EventTimeSessionWindows.with_gap, got {assigner!r} (use to_records() and the "
        "per-record windows for other assigners)")


def assign_periodic(assigner: PeriodicWindows, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every (row, window start) pair of periodic windows, rows ascending and each row's
    windows in the order ``assign_windows`` lists them (latest start first).

    Args:
        assigner: tumbling or sliding event-time windows.
        ts: per row, its event time (seconds).

    Returns:
        ``(rows, starts)``: ``int64`` row indices and ``float64`` window starts.
    """
    size, slide, offset = assigner.size, assigner.slide, assigner.offset
    if isinstance(assigner, TumblingEventTimeWindows):
        return np.arange(len(ts), dtype=np.int64), ts - np.remainder(ts - offset, size)
    last = ts - np.remainder(ts - offset, slide)
    if slide >= size:
        # one window at most: [last, last + size) holds ts when ts - last < size
        rows = np.arange(len(ts), dtype=np.int64)
        keep = last > ts - size
        return rows[keep], last[keep]
    columns, valid = [], []
    start = last
    lowest = ts - size
    while True:
        ok = start > lowest
        if not ok.any():
            break
        columns.append(start)
        valid.append(ok)
        start = start - slide
    starts = np.stack(columns, axis=1).reshape(-1)
    mask = np.stack(valid, axis=1).reshape(-1)
    rows = np.repeat(np.arange(len(ts), dtype=np.int64), len(columns))
    return rows[mask], starts[mask]


def _integral(*values: float) -> bool:
    return all(float(v).is_integer() for v in values)


def window_type(timestamp_type: Any, assigner: WindowAssigner) -> Any:
    """The Arrow type of ``window_start``/``window_end``: the timestamp column's type for
    an Arrow timestamp; ``int64`` for integer seconds with integral window sizes (as the
    per-record windows' ``int`` bounds); else ``float64``."""
    if seconds_per_unit(timestamp_type) is not None:
        return timestamp_type
    if pa.types.is_integer(timestamp_type):
        if isinstance(assigner, PeriodicWindows) and \
                _integral(assigner.size, assigner.slide, assigner.offset):
            return pa.int64()
        if isinstance(assigner, EventTimeSessionWindows) and _integral(assigner.gap):
            return pa.int64()
    return pa.float64()


def window_values(seconds: np.ndarray, value_type: Any) -> Any:
    """Window bounds (``float64`` seconds) as an Arrow array of ``value_type``."""
    units = seconds_per_unit(value_type)
    if units is not None:
        return pa.array(np.round(seconds * units).astype(np.int64)).cast(value_type)
    if pa.types.is_integer(value_type):
        return pa.array(seconds.astype(np.int64))
    return pa.array(seconds, pa.float64())


def window_schema(schema: Any, key_columns: list[str], timestamp: str,
                  assigner: WindowAssigner, specs: list[Any]) -> Any:
    """The schema of window results: the key columns, ``window_start``, ``window_end``,
    then one column per aggregate."""
    bound = window_type(schema.field(timestamp).type, assigner)
    return pa.schema([schema.field(c) for c in key_columns]
                     + [pa.field(WINDOW_START, bound, nullable=False),
                        pa.field(WINDOW_END, bound, nullable=False)]
                     + [s.output_field() for s in specs])


def is_late_batch(batch: Any) -> bool:
    """Whether a batch carries late rows (for the late output) rather than results."""
    meta = batch.schema.metadata
    return bool(meta) and LATE_KEY in meta
