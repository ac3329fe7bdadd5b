"""Event time: timestamps and watermarks, processing-time clocks, and timers."""

from .clock import ManualClock, ProcessingClock, SystemClock
from .timers import TimerService
from .watermarks import BoundedOutOfOrdernessWatermarks, WatermarkStatus

__all__ = [
    "BoundedOutOfOrdernessWatermarks",
    "ManualClock",
    "ProcessingClock",
    "SystemClock",
    "TimerService",
    "WatermarkStatus",
]
