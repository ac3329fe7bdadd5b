"""Checkpoints: the coordinator, checkpoint storage and metadata, and their statistics."""

from .metadata import CompletedCheckpoint
from .stats import CheckpointStats
from .storage import CheckpointStorage

__all__ = ["CheckpointStats", "CheckpointStorage", "CompletedCheckpoint"]
