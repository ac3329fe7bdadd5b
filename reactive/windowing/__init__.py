"""Windows: assigners, window functions, window operators and shared aggregation (Cutty).

The fluent entry points are ``KeyedStream.window``, ``KeyedStream.windows`` and
``KeyedStream.count_window`` (see :mod:`.stream`).
"""

from .assigners import (
    CountWindows,
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    TimeWindow,
    TumblingEventTimeWindows,
    WindowAssigner,
)
from .cutty import CuttyAggregator, EventTimeCuttyAggregator
from .flatfat import AggregateStats, FlatFAT
from .functions import AggregateFunction, ProcessWindowFunction, WindowResult

__all__ = [
    "AggregateFunction",
    "AggregateStats",
    "CountWindows",
    "CuttyAggregator",
    "EventTimeCuttyAggregator",
    "EventTimeSessionWindows",
    "FlatFAT",
    "ProcessWindowFunction",
    "SlidingEventTimeWindows",
    "TimeWindow",
    "TumblingEventTimeWindows",
    "WindowAssigner",
    "WindowResult",
]
