"""Checkpoints: the coordinator, checkpoint storage and metadata, and their statistics.

Public here: what a user reads of a completed checkpoint or savepoint (its metadata through
the typed checkpoint contract, its statistics, where it is stored). The rest of the package
is the runtime's implementation.
"""

from .contract import (
    CheckpointMetadata,
    CheckpointMetrics,
    FileRef,
    KeyedStateHandle,
    OperatorState,
    OperatorSubtaskState,
    Reconfiguration,
    StateHandle,
)
from .metadata import CompletedCheckpoint, read_metadata
from .stats import CheckpointStats
from .storage import CheckpointStorage

__all__ = [
    "CheckpointMetadata",
    "CheckpointMetrics",
    "CheckpointStats",
    "CheckpointStorage",
    "CompletedCheckpoint",
    "FileRef",
    "KeyedStateHandle",
    "OperatorState",
    "OperatorSubtaskState",
    "Reconfiguration",
    "StateHandle",
    "read_metadata",
]
