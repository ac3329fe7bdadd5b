"""Windows: assigners, triggers, evictors, window functions, window operators and shared
aggregation (Cutty).

The fluent entry points are ``KeyedStream.window``, ``KeyedStream.windows`` and
``KeyedStream.count_window`` (see :mod:`.stream`); ``.trigger(...)`` and ``.evictor(...)``
on the windowed stream replace the assigner's default trigger and add an evictor.
"""

from .assigners import (
    GLOBAL_WINDOW,
    CountWindows,
    DynamicEventTimeSessionWindows,
    DynamicProcessingTimeSessionWindows,
    EventTimeSessionWindows,
    GlobalWindows,
    ProcessingTimeSessionWindows,
    SlidingEventTimeWindows,
    SlidingProcessingTimeWindows,
    TimeWindow,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    WindowAssigner,
)
from .cutty import CuttyAggregator, EventTimeCuttyAggregator
from .evictors import CountEvictor, DeltaEvictor, Evictor, TimeEvictor, TimestampedValue
from .flatfat import AggregateStats, FlatFAT
from .functions import (
    AggregateFunction,
    ProcessWindowContext,
    ProcessWindowFunction,
    WindowResult,
)
from .triggers import (
    ContinuousEventTimeTrigger,
    CountTrigger,
    EventTimeTrigger,
    NeverTrigger,
    ProcessingTimeTrigger,
    PurgingTrigger,
    Trigger,
    TriggerResult,
)

__all__ = [
    "GLOBAL_WINDOW",
    "AggregateFunction",
    "AggregateStats",
    "ContinuousEventTimeTrigger",
    "CountEvictor",
    "CountTrigger",
    "CountWindows",
    "CuttyAggregator",
    "DeltaEvictor",
    "DynamicEventTimeSessionWindows",
    "DynamicProcessingTimeSessionWindows",
    "EventTimeCuttyAggregator",
    "EventTimeSessionWindows",
    "EventTimeTrigger",
    "Evictor",
    "FlatFAT",
    "GlobalWindows",
    "NeverTrigger",
    "ProcessWindowContext",
    "ProcessWindowFunction",
    "ProcessingTimeSessionWindows",
    "ProcessingTimeTrigger",
    "PurgingTrigger",
    "SlidingEventTimeWindows",
    "SlidingProcessingTimeWindows",
    "TimeEvictor",
    "TimeWindow",
    "TimestampedValue",
    "Trigger",
    "TriggerResult",
    "TumblingEventTimeWindows",
    "TumblingProcessingTimeWindows",
    "WindowAssigner",
    "WindowResult",
]
