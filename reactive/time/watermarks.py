"""Watermark generation and watermark status (Flink's ``WatermarkGenerator``/``WatermarkStatus``).

Convention (the same as Flink's after its ``- 1 ms`` shift): a watermark ``W`` promises that
no record with a timestamp ``< W`` follows. An event-time timer for ``t`` fires when
``W >= t``; a window ``[start, end)`` fires when ``W >= end`` and is late for good when
``W >= end + allowed_lateness``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigurationError

__all__ = ["ACTIVE", "IDLE", "BoundedOutOfOrdernessWatermarks", "WatermarkStatus"]


@dataclass(frozen=True, slots=True)
class WatermarkStatus:
    """Control event: the channel's producer became idle (``idle=True``) or active again.

    An idle channel is ignored when a task takes the minimum watermark over its inputs, so a
    source instance without data does not stall event time (Flink's ``WatermarkStatus``).
    Records that an idle producer sends when it wakes up may be late.
    """

    idle: bool


IDLE = WatermarkStatus(True)
ACTIVE = WatermarkStatus(False)


class BoundedOutOfOrdernessWatermarks:
    """Watermark ``max_timestamp - max_out_of_orderness`` (Flink's
    ``BoundedOutOfOrdernessWatermarks``).

    Args:
        max_out_of_orderness: seconds a record may arrive after a record with a larger
            timestamp without being late (>= 0).

    Raises:
        ConfigurationError: if ``max_out_of_orderness`` is negative.
    """

    __slots__ = ("delay", "max_timestamp")

    def __init__(self, max_out_of_orderness: float) -> None:
        if not max_out_of_orderness >= 0:
            raise ConfigurationError(
                f"max_out_of_orderness must be >= 0 seconds, got {max_out_of_orderness}")
        self.delay = float(max_out_of_orderness)
        self.max_timestamp = float("-inf")

    def on_max_timestamp(self, timestamp: float) -> None:
        """Record the largest timestamp of a batch (seconds)."""
        if timestamp > self.max_timestamp:
            self.max_timestamp = timestamp

    def current_watermark(self) -> float:
        """The watermark the records seen so far allow (seconds; -inf before any record)."""
        return self.max_timestamp - self.delay
