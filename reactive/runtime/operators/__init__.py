"""Stream operators: the runtime objects that run user functions over record batches.

One module per kind: ``base`` (the base class and shared helpers), ``per_record`` (map,
filter, flat_map, reduce), ``process`` (process functions, keyed and with timers),
``async_wait`` (map_async), ``source`` and ``sink``. Window operators live in
:mod:`reactive.windowing`.
"""

from .async_wait import (
    AsyncFailure,
    AsyncWaitOperator,
    RetryPolicy,
    is_async_failure,
    is_async_result,
)
from .base import StreamOperator, checked_outputs, instance_copy, maybe_await
from .per_record import FilterOperator, FlatMapOperator, MapOperator, ReduceOperator
from .process import KeyedProcessOperator, ProcessOperator, TimedKeyedProcessOperator
from .sink import SinkOperator
from .source import SourceOperator

__all__ = [
    "AsyncFailure",
    "AsyncWaitOperator",
    "FilterOperator",
    "FlatMapOperator",
    "KeyedProcessOperator",
    "MapOperator",
    "ProcessOperator",
    "ReduceOperator",
    "RetryPolicy",
    "SinkOperator",
    "SourceOperator",
    "StreamOperator",
    "TimedKeyedProcessOperator",
    "checked_outputs",
    "instance_copy",
    "is_async_failure",
    "is_async_result",
    "maybe_await",
]
