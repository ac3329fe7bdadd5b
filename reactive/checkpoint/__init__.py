"""Checkpoints: the coordinator, checkpoint storage and metadata, and their statistics."""

from .stats import CheckpointStats
from .storage import CheckpointStorage, CompletedCheckpoint

__all__ = ["CheckpointStats", "CheckpointStorage", "CompletedCheckpoint"]
