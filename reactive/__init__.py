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
    IncompatibleUpdateError,
    JobCancelledError,
    JobEndedError,
    JobFailedError,
    MissingExtraError,
    ReactiveError,
    ReconfigurationError,
    RestoreError,
    StateAccessError,
    StateSerializationError,
    UnsupportedKeyError,
    UserFunctionError,
)
from .functions import KeyedProcessFunction, ProcessFunction, RuntimeContext, TimeDomain
from .keygroups import KeyGroupRange, assign_to_key_group, key_group_range_for_operator
from .runtime.job import Job
from .runtime.loop import new_event_loop, run_coroutine
from .runtime.operators import AsyncFailure, RetryPolicy
from .runtime.operators.event_time_joins import LateJoinInput
from .serialization import MsgpackSerializer, PickleSerializer, Serializer
from .sinks import Sink, SinkWriter
from .sources import SimplePollingSource, Source, SourceReader
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
from .two_input_functions import (
    BroadcastProcessFunction,
    CoProcessFunction,
    KeyedBroadcastProcessFunction,
    KeyedCoProcessFunction,
    ProcessJoinFunction,
)
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
    "AsyncFailure",
    "BroadcastProcessFunction",
    "CheckpointConfig",
    "CheckpointError",
    "CheckpointStats",
    "CheckpointStorage",
    "CoProcessFunction",
    "CompletedCheckpoint",
    "ConfigurationError",
    "CorruptCheckpointError",
    "CountWindows",
    "Dataflow",
    "EventTimeSessionWindows",
    "IncompatibleUpdateError",
    "Job",
    "JobCancelledError",
    "JobEndedError",
    "JobFailedError",
    "KeyGroupRange",
    "KeyedBroadcastProcessFunction",
    "KeyedCoProcessFunction",
    "KeyedProcessFunction",
    "KeyedStateBackend",
    "KeyedStateSnapshot",
    "KeyedStream",
    "LateJoinInput",
    "ListState",
    "ListStateDescriptor",
    "ManualClock",
    "MapState",
    "MapStateDescriptor",
    "MissingExtraError",
    "MsgpackSerializer",
    "PickleSerializer",
    "ProcessFunction",
    "ProcessJoinFunction",
    "ProcessWindowFunction",
    "PushSource",
    "ReactiveError",
    "ReconfigurationError",
    "ReducingState",
    "ReducingStateDescriptor",
    "RestartStrategy",
    "RestoreError",
    "RetryPolicy",
    "RuntimeContext",
    "Serializer",
    "SimplePollingSource",
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
    "new_event_loop",
    "run_coroutine",
]
