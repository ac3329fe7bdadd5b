"""``assign_timestamps``: the operator that generates watermarks for a stream.

Records pass through unchanged: downstream event-time operators re-derive a record's
timestamp with the same function (one call per record, no wrapper object on the hot path).
Per instance it keeps the largest timestamp seen and, at most once per batch, posts a
mailbox action that emits the bounded-out-of-orderness watermark when it advanced (Flink's
``TimestampsAndWatermarksOperator`` with a periodic generator, where the period is a batch).
Watermarks are per record in effect, so batching never changes which records are late:
where a record is behind the watermark of the records before it in its batch, the operator
cuts the batch there and the task emits that watermark before the record
(``StreamOperator.watermark_split``); in-order batches take a fast path with no cut.
With ``idleness`` it declares the instance idle after that many seconds of processing time
without records, so downstream minimums ignore it until records come again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...errors import ConfigurationError
from ...time.clock import Cancellable, ProcessingClock
from ...time.watermarks import ACTIVE, IDLE, BoundedOutOfOrdernessWatermarks
from .base import StreamOperator

__all__ = ["TimestampsAndWatermarksOperator"]

_NEG_INF = float("-inf")
_INF = float("inf")


class TimestampsAndWatermarksOperator(StreamOperator):
    """Emit watermarks for the records passing through.

    Args:
        name, uid: operator identity.
        timestamp_fn: record -> event timestamp (seconds).
        max_out_of_orderness: seconds of disorder tolerated before a record is late.
        idleness: seconds without records after which the instance is idle, or None.
        clock: processing-time clock for the idleness check.

    Raises:
        ConfigurationError: on a negative delay or a non-positive idleness.
    """

    generates_watermarks = True
    STATE = "watermark-generator"

    def __init__(self, name: str, uid: str, timestamp_fn: Callable[[Any], float],
                 max_out_of_orderness: float, idleness: float | None,
                 clock: ProcessingClock) -> None:
        super().__init__(name, uid)
        if idleness is not None and not idleness > 0:
            raise ConfigurationError(f"idleness must be > 0 seconds or None, got {idleness}")
        self.timestamp_fn = timestamp_fn
        self.generator = BoundedOutOfOrdernessWatermarks(max_out_of_orderness)
        self.idleness = idleness
        self.clock = clock
        self.emitted = _NEG_INF
        self.idle = False
        self._posted = False
        self._seen = False
        self._finished = False
        self._idle_check: Cancellable | None = None

    def open(self) -> None:
        # union state: every instance sees every entry; the minimum is a safe restart point
        restored = self.operator_state.get_list_state(self.STATE, "union").get()
        if restored:
            self.generator.on_max_timestamp(min(float(x) for x in restored))
            self._request_emit()
        if self.idleness is not None:
            self._schedule_idle_check()

    def process_batch(self, batch: list[Any]) -> list[Any]:
        ts_fn = self.timestamp_fn
        try:
            stamps = list(map(ts_fn, batch))
        except Exception as exc:
            for r in batch:
                try:
                    ts_fn(r)
                except Exception as inner:
                    raise self.fail(r, inner) from inner
            raise self.fail(batch[0], exc) from exc
        self._seen = True
        if self.idle:
            self.idle = False
            mailbox = self.mailbox
            assert mailbox is not None
            mailbox.post(lambda: mailbox.emit_watermark_status(ACTIVE))
        gen = self.generator
        before = gen.max_timestamp
        delay = gen.delay
        high = max(stamps)
        # Fast paths (C loops): no record can be behind the watermark of the records
        # before it when the batch spans less than the bound, or is in order.
        if not (min(stamps) >= max(before, high) - delay
                or (stamps[0] >= before - delay and stamps == sorted(stamps))):
            return self._split(batch, stamps)
        if high > before:
            gen.max_timestamp = high
            if high - delay > self.emitted:
                self._request_emit()
        return batch

    def _split(self, batch: list[Any], stamps: list[float]) -> list[Any]:
        """Cut ``batch`` before each record that is behind the watermark of the records
        before it, so that watermark reaches downstream first (as with one record per
        batch); return the first part and leave the rest in ``watermark_split`` (None when
        no record is behind)."""
        gen = self.generator
        delay = gen.delay
        high = gen.max_timestamp
        sent = self.emitted
        parts: list[tuple[float, list[Any]]] = []
        part: list[Any] = []
        head = part
        finished = self._finished
        for record, ts in zip(batch, stamps, strict=True):
            if ts < high - delay and high - delay > sent and not finished:
                sent = high - delay
                part = []
                parts.append((sent, part))
            part.append(record)
            if ts > high:
                high = ts
        gen.max_timestamp = high
        if parts:
            # the task emits these watermarks in order right after the head; _emit sends
            # only a watermark beyond them
            self.emitted = sent
            self.watermark_split = parts
        if high - delay > sent:
            self._request_emit()
        return head

    def _request_emit(self) -> None:
        if not self._posted and self.mailbox is not None:
            self._posted = True
            self.mailbox.post(self._emit)

    def _emit(self) -> Any:
        self._posted = False
        wm = self.generator.current_watermark()
        if wm > self.emitted and not self._finished:
            self.emitted = wm
            assert self.mailbox is not None
            return self.mailbox.emit_watermark(wm)
        return None

    def process_watermark(self, timestamp: float) -> list[Any]:
        # Upstream watermarks are replaced by this generator's (the task stops them here),
        # except the final one, which ends event time.
        if timestamp == _INF:
            self._finished = True
            self.emitted = _INF
        return []

    def _schedule_idle_check(self) -> None:
        assert self.idleness is not None
        self._idle_check = self.clock.call_at(
            self.clock.now() + self.idleness,
            lambda: self.mailbox.post(self._check_idle) if self.mailbox else None,
        )

    def _check_idle(self) -> Any:
        if self._finished:
            return None
        seen, self._seen = self._seen, False
        self._schedule_idle_check()
        if not seen and not self.idle:
            self.idle = True
            assert self.mailbox is not None
            return self.mailbox.emit_watermark_status(IDLE)
        return None

    def snapshot_state(self, checkpoint_id: int) -> None:
        m = self.generator.max_timestamp
        self.operator_state.get_list_state(self.STATE, "union").update(
            [] if m == _NEG_INF else [m])

    def close(self) -> None:
        self._finished = True
        if self._idle_check is not None:
            self._idle_check.cancel()
        super().close()
