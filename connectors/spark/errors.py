"""Errors of the PySpark bridge (all are :class:`reactive.errors.ReactiveError` s).

Reading a checkpoint raises the runtime's own :class:`~reactive.errors.RestoreError` (and
:class:`~reactive.errors.CorruptCheckpointError`), so a tool and a restoring job report the
same thing in the same words.
"""

from __future__ import annotations

from reactive.errors import ReactiveError

__all__ = ["JavaNotFoundError", "ResultLogError", "SavepointWriteError", "SparkBridgeError"]


class SparkBridgeError(ReactiveError):
    """Base class of the PySpark bridge's own errors."""


class JavaNotFoundError(SparkBridgeError):
    """No Java runtime to start Spark's JVM; the message says how to install one."""


class ResultLogError(SparkBridgeError):
    """A result-log directory or one of its part files cannot be read as asked (missing
    directory, unreadable file, schema mismatch); the message names the file."""


class SavepointWriteError(SparkBridgeError):
    """A savepoint cannot be written from the given state (duplicate or null keys, an
    existing target directory, conflicting operator definitions)."""
