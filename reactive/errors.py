"""Error types of the runtime.

Every error the runtime raises on purpose derives from :class:`ReactiveError`, so an
application can catch the whole family. Messages say what went wrong and what to do.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CheckpointError",
    "CheckpointProgressError",
    "ConfigurationError",
    "CorruptCheckpointError",
    "IncompatibleUpdateError",
    "JobCancelledError",
    "JobEndedError",
    "JobFailedError",
    "MissingExtraError",
    "ReactiveError",
    "ReconfigurationError",
    "RecordRejectedError",
    "RestoreError",
    "StateAccessError",
    "StateNotReadyError",
    "StateQueryError",
    "StateSerializationError",
    "UnsupportedKeyError",
    "UserFunctionError",
]


def _preview(record: Any, limit: int = 200) -> str:
    text = repr(record)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ReactiveError(Exception):
    """Base class of all errors raised by the runtime."""


class ConfigurationError(ReactiveError, ValueError):
    """A dataflow or run option is invalid; raised before the job starts."""


class UserFunctionError(ReactiveError):
    """A user function raised while processing a record.

    Attributes:
        operator: the operator's name.
        uid: the operator's stable id.
        subtask: index of the parallel instance that failed.
        parallelism: the operator's parallelism.
        record: the input record being processed when the function raised.
        position: where the record came from when known (e.g. a source offset), else None.
    """

    def __init__(
        self,
        operator: str,
        uid: str,
        subtask: int,
        parallelism: int,
        record: Any,
        cause: BaseException,
        position: Any = None,
    ) -> None:
        self.operator = operator
        self.uid = uid
        self.subtask = subtask
        self.parallelism = parallelism
        self.record = record
        self.position = position
        where = f" at {position}" if position is not None else ""
        super().__init__(
            f"operator {operator!r} (uid {uid!r}, subtask {subtask}/{parallelism}) failed on "
            f"record {_preview(record)}{where}: {type(cause).__name__}: {cause}"
        )


class RecordRejectedError(ReactiveError):
    """A sink (or the system behind it) refused one record; raised by a sink writer so that
    the job's error names that record, not the first one of its batch.

    Attributes:
        record: the refused record.
    """

    def __init__(self, message: str, record: Any) -> None:
        super().__init__(message)
        self.record = record


class StateAccessError(ReactiveError):
    """Keyed state was used without a current key, or with an unknown state name."""


class CheckpointError(ReactiveError):
    """A checkpoint could not be taken (declined, timed out or failed while writing)."""


class CheckpointProgressError(CheckpointError):
    """No checkpoint completed in a job attempt before more than
    ``tolerable_failed_checkpoints`` consecutive checkpoints failed.

    A restart would restore the same checkpoint (or start from the beginning) and repeat
    the attempt, so the job fails at once instead of restarting; the message says why the
    checkpoints failed (timeouts under backpressure, declines, write errors).
    """


class StateSerializationError(CheckpointError):
    """A state value (or operator-state entry) cannot be serialized into a snapshot.

    Deterministic: the same state fails every later checkpoint, so the job fails at once
    (no restart) instead of running on towards a final checkpoint that cannot succeed.

    Attributes:
        operator: the operator's uid.
        state_name: the state's name.
        key: the key whose value failed (None for operator state).
    """

    def __init__(self, operator: str, state_name: str, key: object, cause: BaseException
                 ) -> None:
        self.operator = operator
        self.state_name = state_name
        self.key = key
        where = f", key {_preview(key)}" if key is not None else ""
        super().__init__(
            f"operator {operator!r}: state {state_name!r}{where} cannot be serialized: "
            f"{type(cause).__name__}: {cause}. Keep state values to picklable data, or give "
            "the state descriptor a serializer that handles them"
        )


class StateQueryError(ReactiveError):
    """A state query names an operator or state the job does not have, the operator is not
    keyed, or the state cannot be read now."""


class StateNotReadyError(StateQueryError):
    """A committed state query has no completed checkpoint to answer from yet: the run has
    completed none (and restored none), or is still choosing what to restore. Ask again
    after the next checkpoint completes; this is never a "no value" answer (that is None).
    """


class RestoreError(ReactiveError):
    """A checkpoint could not be restored (missing, incomplete or incompatible).

    Deterministic: restoring the same checkpoint again fails the same way, so a job whose
    restore fails ends at once with this error (no restart). When the failure is one
    operator instance's, the error says which and in which phase of its restore.

    Args:
        message: what went wrong and what to do.
        operator: the uid of the operator whose state failed to restore.
        subtask: the index of the operator instance.
        phase: the step of the restore that failed: ``"state assignment"`` (reading and
            redistributing the checkpoint's state for the instance), ``"keyed state"``
            (the state backend's ``restore``) or ``"operator state"``.
        checkpoint_id: the checkpoint being restored.

    Attributes:
        operator (str | None): as given (None when the error is not about one operator).
        subtask (int | None): as given.
        phase (str | None): as given.
        checkpoint_id (int | None): as given.
    """

    def __init__(self, message: str = "", *, operator: str | None = None,
                 subtask: int | None = None, phase: str | None = None,
                 checkpoint_id: int | None = None) -> None:
        super().__init__(message)
        self.operator = operator
        self.subtask = subtask
        self.phase = phase
        self.checkpoint_id = checkpoint_id


class CorruptCheckpointError(RestoreError):
    """A checkpoint file's checksum or size does not match its metadata."""


class JobFailedError(ReactiveError):
    """The job failed and its restart strategy gave up; ``__cause__`` is the last failure.

    Args:
        job: the job's name.
        attempts: how many times the job was started (1 + restarts).
        cause: the last failure.
        resumable: whether a completed checkpoint exists that ``resume=True`` would
            continue from (one of this run, or the one it restored); the message suggests
            resuming only then.

    Attributes:
        job: as given.
        attempts: as given.
        resumable: as given.
    """

    def __init__(self, job: str, attempts: int, cause: BaseException, *,
                 resumable: bool = False) -> None:
        self.job = job
        self.attempts = attempts
        self.resumable = resumable
        advice = ("Completed checkpoints stay on disk; run again with resume=True to "
                  "continue from the latest one." if resumable else
                  "No checkpoint completed in this run, so resume=True has nothing of it to "
                  "continue from.")
        super().__init__(
            f"job {job!r} failed after {attempts} attempt(s): {type(cause).__name__}: {cause}. "
            f"{advice}"
        )


class JobCancelledError(ReactiveError):
    """The job was cancelled through its handle before it finished."""


class JobEndedError(ReactiveError):
    """The job that reads an application-fed source has ended (finished, stopped, failed or
    cancelled): a record pushed now would never be read, and one not yet covered by a
    completed checkpoint never will be. The message says how the job ended."""


class UnsupportedKeyError(ConfigurationError, TypeError):
    """A key returned by a ``key_by`` selector has no canonical byte encoding.

    Raised at the first record that carries such a key (not before the job starts, unlike
    other configuration errors): the key is not hashable, or its type (or the type of an
    element of a tuple or frozenset key) is not one :mod:`reactive.key_encoding` encodes,
    and ``key_by`` was given no ``key_serializer``. Deterministic: a restart meets it again.

    Attributes:
        key: the key.
        key_type: the type without an encoding (the key's, or that of one of its elements).
        operator: the uid of the keyed operator, or None when not known where it was raised.
        detail: the message without the operator.
    """

    def __init__(self, detail: str, key: object, key_type: type, operator: str | None = None
                 ) -> None:
        self.detail = detail
        self.key = key
        self.key_type = key_type
        self.operator = operator
        where = f"operator {operator!r}: " if operator is not None else ""
        super().__init__(where + detail)

    def for_operator(self, operator: str | None) -> UnsupportedKeyError:
        """Return this error naming ``operator`` (a new error; self when ``operator`` is None
        or already named)."""
        if operator is None or self.operator is not None:
            return self
        return UnsupportedKeyError(self.detail, self.key, self.key_type, operator)


class MissingExtraError(ReactiveError, ImportError):
    """A feature needs an optional dependency that is not installed.

    Attributes:
        extra: the extra of the ``reactive`` distribution that installs it.
        feature: what needed it.
    """

    def __init__(self, feature: str, module: str, extra: str) -> None:
        self.extra = extra
        self.feature = feature
        super().__init__(
            f"{feature} needs {module}, which is not installed: pip install 'reactive[{extra}]'"
            " (or, in a checkout, pip install -e '.[" + extra + "]')"
        )


class ReconfigurationError(ReactiveError):
    """A reconfiguration of a running job (``job.update``) did not take effect: the
    checkpoint carrying it failed, or the job ended first. The job runs (or returns to,
    by a restart from the last completed checkpoint) the configuration before it."""


class IncompatibleUpdateError(ReconfigurationError):
    """``job.update`` refused a new function before sending anything: the operator cannot
    be updated, or the new function's state differs from the running one's in kind or
    serializer (the message names the state). The job keeps running the old version."""
