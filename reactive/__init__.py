"""reactive: stateful stream processing in one asyncio process, made fault tolerant with
Asynchronous Barrier Snapshotting (the algorithm of Apache Flink's checkpoints).

The public API is re-exported here; everything else is internal.
"""

from .checkpoint.metadata import CompletedCheckpoint
from .checkpoint.stats import CheckpointStats
from .checkpoint.storage import CheckpointStorage
from .config import CheckpointConfig, RestartStrategy, StartOptions
from .dataflow import Dataflow, KeyedStream, Stream
from .embedding import PushSource, StateQueryError
from .errors import (
    CheckpointError,
    ConfigurationError,
    CorruptCheckpointError,
    JobCancelledError,
    JobEndedError,
    JobFailedError,
    MissingExtraError,
    ReactiveError,
    RestoreError,
    StateAccessError,
    StateSerializationError,
    UnsupportedKeyError,
    UserFunctionError,
)
from .functions import KeyedProcessFunction, ProcessFunction, RuntimeContext, TimeDomain
from .keygroups import KeyGroupRange, assign_to_key_group, key_group_range_for_operator
from .runtime.job import Job
from .serialization import MsgpackSerializer, PickleSerializer, Serializer
from .sinks import Sink, SinkWriter
from .sources import Source, SourceReader
from .state import (
    AggregatingState,
    AggregatingStateDescriptor,
    KeyedStateBackend,
    KeyedStateSnapshot,
    ListState,
    ListStateDescriptor,
    MapState,
    MapStateDescriptor,
    ReducingState,
    ReducingStateDescriptor,
    SnapshotContext,
    StateBackend,
    StateTtlConfig,
    ValueState,
    ValueStateDescriptor,
)
from .time import ManualClock, TimerService
from .two_phase_commit import TwoPhaseCommitSink
from .windowing import (
    AggregateFunction,
    CountWindows,
    EventTimeSessionWindows,
    ProcessWindowFunction,
    SlidingEventTimeWindows,
    TimeWindow,
    TumblingEventTimeWindows,
    WindowResult,
)

__all__ = [
    "AggregateFunction",
    "AggregatingState",
    "AggregatingStateDescriptor",
    "CheckpointConfig",
    "CheckpointError",
    "CheckpointStats",
    "CheckpointStorage",
    "CompletedCheckpoint",
    "ConfigurationError",
    "CorruptCheckpointError",
    "CountWindows",
    "Dataflow",
    "EventTimeSessionWindows",
    "Job",
    "JobCancelledError",
    "JobEndedError",
    "JobFailedError",
    "KeyGroupRange",
    "KeyedProcessFunction",
    "KeyedStateBackend",
    "KeyedStateSnapshot",
    "KeyedStream",
    "ListState",
    "ListStateDescriptor",
    "ManualClock",
    "MapState",
    "MapStateDescriptor",
    "MissingExtraError",
    "MsgpackSerializer",
    "PickleSerializer",
    "ProcessFunction",
    "ProcessWindowFunction",
    "PushSource",
    "ReactiveError",
    "ReducingState",
    "ReducingStateDescriptor",
    "RestartStrategy",
    "RestoreError",
    "RuntimeContext",
    "Serializer",
    "Sink",
    "SinkWriter",
    "SlidingEventTimeWindows",
    "SnapshotContext",
    "Source",
    "SourceReader",
    "StartOptions",
    "StateAccessError",
    "StateBackend",
    "StateQueryError",
    "StateSerializationError",
    "StateTtlConfig",
    "Stream",
    "TimeDomain",
    "TimeWindow",
    "TimerService",
    "TumblingEventTimeWindows",
    "TwoPhaseCommitSink",
    "UnsupportedKeyError",
    "UserFunctionError",
    "ValueState",
    "ValueStateDescriptor",
    "WindowResult",
    "assign_to_key_group",
    "key_group_range_for_operator",
]
