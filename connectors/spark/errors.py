"""Errors of the PySpark bridge (all are :class:`reactive.errors.ReactiveError` s).

Reading a checkpoint raises the runtime's own :class:`~reactive.errors.RestoreError` (and
:class:`~reactive.errors.CorruptCheckpointError`), so a tool and a restoring job report the
same thing in the same words.
"""

from __future__ import annotations

from reactive.errors import ReactiveError

__all__ = ["JavaNotFoundError", "ResultLogError", "SavepointWriteError", "SparkBridgeError",
           "SparkJobError", "TranslationError"]


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


class TranslationError(SparkBridgeError):
    """A dataflow cannot run on Spark: raised by the Spark runner before anything runs, naming
    the operator (its name, uid and kind) and why it has no Spark equivalent.

    Attributes:
        operator: the operator's display name.
        uid: its stable id.
        kind: its kind (``"map_async"``, ``"iterate"`` ...).
    """

    def __init__(self, operator: str, uid: str, kind: str, reason: str) -> None:
        super().__init__(f"operator {operator!r} (uid {uid!r}, {kind}) cannot run on Spark: "
                         f"{reason}")
        self.operator = operator
        self.uid = uid
        self.kind = kind


class SparkJobError(SparkBridgeError):
    """A streaming query of a dataflow running on Spark failed; the message names the query
    (the sink it writes) and carries Spark's error (which names the failing user function,
    operator and record when a user function raised)."""
