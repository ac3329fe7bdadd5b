"""Windows: assigners, triggers, evictors, window functions and the built-in aggregations.

The fluent entry points are ``KeyedStream.window``, ``KeyedStream.windows`` and
``KeyedStream.count_window`` (see :mod:`.stream`); ``.trigger(...)`` and ``.evictor(...)``
on the windowed stream replace the assigner's default trigger and add an evictor. The
window operators and the shared aggregation of ``windows([...])`` (Cutty slicing over a
FlatFAT, :mod:`.cutty` and :mod:`.flatfat`) are the implementation, not exported here.
"""

from .aggregates import (
    Aggregates,
    BuiltinAggregate,
    count,
    first,
    last,
    max_of,
    mean,
    min_of,
    sum_of,
)
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
from .evictors import CountEvictor, DeltaEvictor, Evictor, TimeEvictor, TimestampedValue
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
    TriggerContext,
    TriggerResult,
)

__all__ = [
    "GLOBAL_WINDOW",
    "AggregateFunction",
    "Aggregates",
    "BuiltinAggregate",
    "ContinuousEventTimeTrigger",
    "CountEvictor",
    "CountTrigger",
    "CountWindows",
    "DeltaEvictor",
    "DynamicEventTimeSessionWindows",
    "DynamicProcessingTimeSessionWindows",
    "EventTimeSessionWindows",
    "EventTimeTrigger",
    "Evictor",
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
    "TriggerContext",
    "TriggerResult",
    "TumblingEventTimeWindows",
    "TumblingProcessingTimeWindows",
    "WindowAssigner",
    "WindowResult",
    "count",
    "first",
    "last",
    "max_of",
    "mean",
    "min_of",
    "sum_of",
]
