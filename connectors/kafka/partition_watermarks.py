"""Per-partition watermarks of a Kafka source reader (Flink's per-split watermarks).

Each partition has its own bounded-out-of-orderness generator; the reader's watermark is the
minimum over its active partitions, so a partition that lags behind (a slow producer, a
backlog) holds event time back instead of having its records arrive late, while a partition
without records for ``idleness`` seconds is left out until it has records again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable

from reactive.time.watermarks import BoundedOutOfOrdernessWatermarks

__all__ = ["PartitionWatermarks"]


class PartitionWatermarks:
    """The watermarks of one reader's partitions.

    Args:
        max_out_of_orderness: seconds a record of a partition may follow a later one of the
            same partition without being late (>= 0).
        idleness: seconds without records after which a partition is idle (None: never).
        clock: processing time in seconds (monotonic) for idleness.

    Raises:
        reactive.errors.ConfigurationError: on a negative ``max_out_of_orderness``.
    """

    def __init__(self, max_out_of_orderness: float, idleness: float | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        BoundedOutOfOrdernessWatermarks(max_out_of_orderness)  # validates the delay
        self.delay = max_out_of_orderness
        self.idleness = idleness
        self.clock = clock
        self._generators: dict[Hashable, BoundedOutOfOrdernessWatermarks] = {}
        self._last_record: dict[Hashable, float] = {}
        self._finished: set[Hashable] = set()

    def add(self, partition: Hashable) -> None:
        """Start tracking ``partition`` (it holds the watermark back until it has records or
        turns idle)."""
        if partition not in self._generators:
            self._generators[partition] = BoundedOutOfOrdernessWatermarks(self.delay)
            self._last_record[partition] = self.clock()

    def on_records(self, partition: Hashable, max_timestamp: float) -> None:
        """``partition`` delivered records whose largest timestamp is ``max_timestamp``
        (seconds)."""
        self._generators[partition].on_max_timestamp(max_timestamp)
        self._last_record[partition] = self.clock()

    def finish(self, partition: Hashable) -> None:
        """``partition`` reached its stopping offset: it no longer holds the watermark back."""
        self._finished.add(partition)

    def _active(self) -> list[Hashable]:
        now = self.clock()
        limit = self.idleness
        return [p for p in self._generators if p not in self._finished
                and (limit is None or now - self._last_record[p] < limit)]

    def current_watermark(self) -> float | None:
        """The minimum watermark over the active partitions (seconds); None when none is
        active (the reader is idle or finished)."""
        active = self._active()
        if not active:
            return None
        return min(self._generators[p].current_watermark() for p in active)

    def is_idle(self) -> bool:
        """True when partitions are tracked and every unfinished one is idle."""
        return bool(self._generators) and not self._active() and len(self._finished) < len(
            self._generators)
