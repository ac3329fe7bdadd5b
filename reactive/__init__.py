"""reactive: stateful stream processing in one asyncio process, made fault tolerant with
Asynchronous Barrier Snapshotting (the algorithm of Apache Flink's checkpoints).

The public API is re-exported here; everything else is internal.
"""

from .checkpoint.stats import CheckpointStats
from .checkpoint.storage import CheckpointStorage, CompletedCheckpoint
from .config import CheckpointConfig, RestartStrategy
from .dataflow import Dataflow, KeyedStream, Stream
from .errors import (
    CheckpointError,
    ConfigurationError,
    CorruptCheckpointError,
    JobCancelledError,
    JobFailedError,
    ReactiveError,
    RestoreError,
    StateAccessError,
    UserFunctionError,
)
from .functions import KeyedProcessFunction, ProcessFunction, RuntimeContext
from .keygroups import KeyGroupRange, assign_to_key_group, key_group_range_for_operator
from .runtime.job import Job
from .serialization import MsgpackSerializer, PickleSerializer, Serializer
from .sinks import Sink, SinkWriter
from .sources import Source, SourceReader
from .state import (
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
    ValueState,
    ValueStateDescriptor,
)

__all__ = [
    "CheckpointConfig",
    "CheckpointError",
    "CheckpointStats",
    "CheckpointStorage",
    "CompletedCheckpoint",
    "ConfigurationError",
    "CorruptCheckpointError",
    "Dataflow",
    "Job",
    "JobCancelledError",
    "JobFailedError",
    "KeyGroupRange",
    "KeyedProcessFunction",
    "KeyedStateBackend",
    "KeyedStateSnapshot",
    "KeyedStream",
    "ListState",
    "ListStateDescriptor",
    "MapState",
    "MapStateDescriptor",
    "MsgpackSerializer",
    "PickleSerializer",
    "ProcessFunction",
    "ReactiveError",
    "ReducingState",
    "ReducingStateDescriptor",
    "RestartStrategy",
    "RestoreError",
    "RuntimeContext",
    "Serializer",
    "Sink",
    "SinkWriter",
    "SnapshotContext",
    "Source",
    "SourceReader",
    "StateAccessError",
    "StateBackend",
    "Stream",
    "UserFunctionError",
    "ValueState",
    "ValueStateDescriptor",
    "assign_to_key_group",
    "key_group_range_for_operator",
]
