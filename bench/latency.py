"""Source-to-sink latency for the benchmarks: a source that stamps its records, a sink that
measures them.

:class:`StampedSource` emits ``(key, value, stamp)`` records: ``stamp`` is
``time.perf_counter()`` when the reader produced the record's batch, so the latency a
:class:`LatencySink` records (its ``perf_counter()`` on arrival minus the stamp, seconds)
covers every queue, operator and checkpoint pause between them. With a ``rate``, the source
follows a schedule instead (record k of an instance is due at ``t0 + k / rate``) and stamps
each record with the time it was due, so a record a halted or slow source reads late counts
its wait too (no coordinated omission). The sink also keeps the arrival time of its first and
last record, for records/s over what it received.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from reactive.sinks import Sink, SinkWriter
from reactive.sources import Source, SourceReader

__all__ = ["LatencySink", "StampedSource", "latency_summary", "uniform_key"]

_GOLDEN = 2654435761  # Knuth's multiplicative hash: spreads consecutive ids over the keys


def uniform_key(keys: int) -> Callable[[int], int]:
    """Record index -> one of ``keys`` keys, uniformly (a fixed multiplicative hash)."""
    def key(i: int) -> int:
        return (i * _GOLDEN) % 4294967296 % keys
    return key


class StampedSource(Source):
    """A parallel source of ``records`` records ``(key, value, stamp)``.

    Instance ``i`` of ``p`` emits the records ``i, i + p, ...``; its position (how many it
    emitted) is its operator state.

    Args:
        records: how many records in all.
        key: record index -> key.
        value: record index -> value (default: 1).
        delay: seconds the reader of instance ``slow_subtask`` sleeps per batch (a slow
            producer; 0: none).
        slow_subtask: which instance is slow when ``delay`` > 0.
        rate: records/s per instance from record ``rate_from`` on (None: as fast as read).
        rate_from: the first record index that follows the schedule.
    """

    def __init__(self, records: int, key: Callable[[int], Any],
                 value: Callable[[int], Any] | None = None, delay: float = 0.0,
                 slow_subtask: int = 0, rate: float | None = None, rate_from: int = 0) -> None:
        self.records = records
        self.key = key
        self.value = value
        self.delay = delay
        self.slow_subtask = slow_subtask
        self.rate = rate
        self.rate_from = rate_from

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        delay = self.delay if subtask == self.slow_subtask else 0.0
        return _StampedReader(self, subtask, parallelism, delay)


class _StampedReader(SourceReader):
    def __init__(self, src: StampedSource, subtask: int, parallelism: int,
                 delay: float) -> None:
        self.src, self.subtask, self.parallelism, self.delay = src, subtask, parallelism, delay
        self.emitted = 0
        self.t0: float | None = None  # when the scheduled part started
        self.scheduled = 0  # records emitted on the schedule

    async def read_batch(self, max_records: int) -> list[Any] | None:
        src, p = self.src, self.parallelism
        first = self.subtask + self.emitted * p
        if first >= src.records:
            return None
        if self.delay:
            await asyncio.sleep(self.delay)
        key, value = src.key, src.value
        if src.rate is not None and first >= src.rate_from:
            return await self._scheduled(first, max_records)
        last = min(src.records, first + max_records * p)
        if src.rate is not None:
            last = min(last, max(src.rate_from, first + p))
        indices = range(first, last, p)
        stamp = time.perf_counter()
        if value is None:
            out = [(key(i), 1, stamp) for i in indices]
        else:
            out = [(key(i), value(i), stamp) for i in indices]
        self.emitted += len(out)
        return out

    async def _scheduled(self, first: int, max_records: int) -> list[Any]:
        src, p = self.src, self.parallelism
        rate = src.rate
        assert rate is not None
        now = time.perf_counter()
        if self.t0 is None:
            self.t0 = now
        due = int((now - self.t0) * rate) + 1 - self.scheduled
        if due <= 0:
            # until the next record is due; the task runs its mailbox (barriers) meanwhile
            await asyncio.sleep(self.t0 + self.scheduled / rate - now)
            return []
        n = min(due, max_records)
        indices = range(first, min(src.records, first + n * p), p)
        key, value, t0, k0 = src.key, src.value, self.t0, self.scheduled
        out = [(key(i), 1 if value is None else value(i), t0 + (k0 + j) / rate)
               for j, i in enumerate(indices)]
        self.emitted += len(out)
        self.scheduled += len(out)
        return out

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        return [(self.subtask, self.emitted, self.scheduled)]

    def restore_state(self, entries: list[Any]) -> None:
        for subtask, emitted, scheduled in entries:
            if subtask == self.subtask:
                self.emitted, self.scheduled = emitted, scheduled


class LatencySink(Sink):
    """Records the latency (seconds) of every record ``(..., stamp)`` that reaches it.

    Attributes:
        latencies: one float per record, in arrival order (all instances).
        first, last: ``perf_counter()`` at the first and the last arrival.
        count: records received.
        accept: only records for which ``accept(record)`` is true are measured (all by
            default); the others are counted in ``ignored``.
    """

    def __init__(self, accept: Callable[[Any], bool] | None = None) -> None:
        self.latencies = array("d")
        self.first = 0.0
        self.last = 0.0
        self.count = 0
        self.ignored = 0
        self.accept = accept

    def create_writer(self, subtask: int, parallelism: int) -> SinkWriter:
        return _LatencyWriter(self)

    def rate(self) -> float:
        """Records/s between the first and the last measured arrival."""
        span = self.last - self.first
        return self.count / span if span > 0 else float("nan")


class _LatencyWriter(SinkWriter):
    def __init__(self, sink: LatencySink) -> None:
        self.sink = sink

    def write(self, batch: list[Any]) -> None:
        sink = self.sink
        now = time.perf_counter()
        accept = sink.accept
        if accept is not None:
            kept = [r for r in batch if accept(r)]
            sink.ignored += len(batch) - len(kept)
            batch = kept
            if not batch:
                return
        if not sink.count:
            sink.first = now
        sink.last = now
        sink.count += len(batch)
        sink.latencies.extend(now - r[-1] for r in batch)


def latency_summary(latencies: Sequence[float]) -> tuple[float, float]:
    """(p50, p99) of ``latencies`` in milliseconds (nan when empty)."""
    if not len(latencies):
        return float("nan"), float("nan")
    arr = np.frombuffer(latencies, dtype=np.float64) if isinstance(latencies, array) \
        else np.asarray(latencies, dtype=np.float64)
    p50, p99 = np.percentile(arr, [50, 99])
    return float(p50) * 1e3, float(p99) * 1e3
