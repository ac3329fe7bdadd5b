"""Event time of record batches: a timestamp column read as seconds, and the watermark
generator of a columnar stream (``ColumnarStream.assign_timestamps(column, ...)``).

The generator is the per-record one
(:class:`~reactive.runtime.operators.timestamps.TimestampsAndWatermarksOperator`: bounded
out-of-orderness, idleness, its maximum timestamp in union operator state) with the
per-row work done over arrays: each row's watermark before it is a running maximum
(``numpy.maximum.accumulate``) of the timestamps before it, and the batch is cut (zero-copy
slices) before each row that is behind that watermark when it is newer than the last one
sent, so a window downstream sees the same watermarks between the same rows as through the
per-record API, whatever the batch size.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..runtime.operators.timestamps import TimestampsAndWatermarksOperator
from ..time.clock import ProcessingClock
from ..time.watermarks import ACTIVE
from .schema import pa, position_of

__all__ = ["ColumnarTimestampsOperator", "event_times", "seconds_per_unit"]

_UNITS = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


def seconds_per_unit(value_type: Any) -> int | None:
    """Units per second of an Arrow ``timestamp`` type (None for numbers: seconds)."""
    if pa.types.is_timestamp(value_type):
        return _UNITS[value_type.unit]
    return None


def event_times(batch: Any, column: str) -> np.ndarray:
    """The event time of each row (``float64`` seconds) from ``column``: integer or floating
    seconds, or an Arrow ``timestamp`` (any unit, its epoch value).

    Raises:
        ValueError: for a null timestamp (naming the column and the row's index in the
            batch), or a column of another type.
    """
    array = batch.column(column)
    if array.null_count:
        row = int(np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False))[0])
        raise ValueError(f"timestamp column {column!r} is null at row {row} of the batch")
    t = array.type
    units = seconds_per_unit(t)
    if units is not None:
        values = array.cast(pa.int64()).to_numpy(zero_copy_only=False)
        seconds: np.ndarray = values / units if units != 1 else values.astype(np.float64)
        return seconds
    if not (pa.types.is_integer(t) or pa.types.is_floating(t)):
        raise ValueError(f"timestamp column {column!r} has type {t}: give seconds (a "
                         "number) or an Arrow timestamp")
    return np.asarray(array.to_numpy(zero_copy_only=False), np.float64)


class ColumnarTimestampsOperator(TimestampsAndWatermarksOperator):
    """``assign_timestamps(column, max_out_of_orderness, idleness)`` on a columnar stream.

    Args:
        name, uid: operator identity.
        column: the timestamp column (seconds, or an Arrow timestamp).
        max_out_of_orderness: seconds of disorder tolerated before a row is late.
        idleness: seconds without rows after which the instance is idle, or None.
        clock: processing-time clock for the idleness check.
    """

    def __init__(self, name: str, uid: str, column: str, max_out_of_orderness: float,
                 idleness: float | None, clock: ProcessingClock) -> None:
        super().__init__(name, uid, _no_record_timestamps, max_out_of_orderness, idleness,
                         clock)
        self.column = column

    def process_batch(self, batch: list[Any]) -> list[Any]:
        head: list[Any] = []
        parts: list[tuple[float, list[Any]]] = []
        for b in batch:
            if not b.num_rows:
                continue
            try:
                stamps = event_times(b, self.column)
            except Exception as exc:
                raise self.fail(f"<record batch of {b.num_rows} rows>", exc,
                                position_of(b)) from exc
            self._cut(b, stamps, head if not parts else parts[-1][1], parts)
        if self.idle and (head or parts):
            self.idle = False
            mailbox = self.mailbox
            assert mailbox is not None
            mailbox.post(lambda: mailbox.emit_watermark_status(ACTIVE))
        if head or parts:
            self._seen = True
        if parts:
            self.watermark_split = parts
        if self.generator.current_watermark() > self.emitted:
            self._request_emit()
        return head

    def _cut(self, b: Any, stamps: np.ndarray, current: list[Any],
             parts: list[tuple[float, list[Any]]]) -> None:
        """Append ``b`` to ``current``, cut before each row behind a newer watermark than
        the last one sent (the cuts go to ``parts`` with their watermarks)."""
        gen = self.generator
        delay = gen.delay
        before = np.empty(len(stamps))
        before[0] = gen.max_timestamp
        if len(stamps) > 1:
            np.maximum.accumulate(stamps[:-1], out=before[1:])
            np.maximum(before, gen.max_timestamp, out=before)
        watermarks = before - delay
        gen.max_timestamp = max(gen.max_timestamp, float(stamps.max()))
        if self._finished:
            current.append(b)
            return
        behind = np.flatnonzero((stamps < watermarks) & (watermarks > self.emitted))
        if not len(behind):
            current.append(b)
            return
        # the watermark before each row only grows: one cut per new value
        values, first = np.unique(watermarks[behind], return_index=True)
        cuts = behind[first].tolist()
        if cuts[0] > 0:
            current.append(b.slice(0, cuts[0]))
        for i, (at, wm) in enumerate(zip(cuts, values.tolist(), strict=True)):
            end = cuts[i + 1] if i + 1 < len(cuts) else len(stamps)
            parts.append((wm, [b.slice(at, end - at)]))
        self.emitted = float(values[-1])


def _no_record_timestamps(record: Any) -> float:
    raise TypeError("a columnar stream's event time comes from its timestamp column")
