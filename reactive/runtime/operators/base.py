"""The operator base class and what every operator shares: the lifecycle and snapshot
hooks, the timer service of keyed operators (created by the operator's
``timer_service_factory``, Flink's ``InternalTimeServiceManager``), awaiting hooks that may
be coroutines, per-instance copies of user functions, and the check of what a user function
returns.

Each operator turns an input batch (``list``) into an output batch in a tight loop; a
chain of operators in one task passes batches from one to the next without a queue. A user
function that raises is reported as :class:`~reactive.errors.UserFunctionError` naming the
operator, subtask and record (the loop variable of the failing iteration).
"""

from __future__ import annotations

import copy
import types
import warnings
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from ...awaiting import maybe_await
from ...errors import UserFunctionError
from ...functions import RuntimeContext
from ...state.backend import KeyedStateBackend, StateBackend
from ...state.operator_state import OperatorStateStore
from ...time.clock import ProcessingClock
from ...time.timers import Fire, InternalTimers, InternalTimerService

if TYPE_CHECKING:
    from ...time.mailbox import OperatorMailbox

__all__ = ["StreamOperator", "TimerServiceFactory", "checked_outputs", "embedded_timer_service",
           "instance_copy", "maybe_await", "restore_watermark", "snapshot_watermark"]

WATERMARK_STATE = "operator-watermark"


def restore_watermark(op: StreamOperator) -> float:
    """The restored event time of an operator: the minimum of its union entries (-inf)."""
    entries = op.operator_state.get_list_state(WATERMARK_STATE, "union").get()
    return min((float(x) for x in entries), default=float("-inf"))


def snapshot_watermark(op: StreamOperator, watermark: float) -> None:
    """Keep ``watermark`` (seconds) in the operator's union state.

    The final watermark of a bounded input (+inf, end of input, not event time) is not
    kept: the entry stays at the last event time an earlier checkpoint recorded, so a run
    that resumes the job's final checkpoint with more input (a source that continues after
    its end, a file that grew) goes on from real event time instead of finding every record
    late.
    """
    if watermark == float("inf"):
        return
    op.operator_state.get_list_state(WATERMARK_STATE, "union").update(
        [watermark] if watermark > float("-inf") else [])


TimerServiceFactory = Callable[["StreamOperator", ProcessingClock, Fire, Fire], InternalTimers]
"""``factory(operator, clock, on_event_time, on_processing_time) -> timer service``: how a
keyed operator gets its timers (Flink's ``InternalTimeServiceManager``), called in the
operator's ``open`` after its state was restored."""


def embedded_timer_service(op: StreamOperator, clock: ProcessingClock, on_event_time: Fire,
                           on_processing_time: Fire) -> InternalTimerService:
    """The runtime's timer service for ``op``: timers in its keyed state, processing-time
    timers posted to its task's mailbox, event time and timers restored.

    Raises:
        AssertionError: for an operator without a keyed backend.
    """
    assert op.keyed_backend is not None, f"operator {op.name!r} has timers but is not keyed"
    timers = InternalTimerService(op.keyed_backend, clock, op.mailbox, on_event_time,
                                  on_processing_time)
    timers.watermark = restore_watermark(op)
    timers.restore()
    return timers


GENERATOR = types.GeneratorType
"""The type of the objects generator functions return (checked once per call)."""


def instance_copy(fn: Any) -> Any:
    """A private copy of a user function object for one operator instance.

    Like Flink, which deserializes a fresh copy per parallel instance, each instance gets its
    own object, so attributes set in ``open()`` (state handles) are not shared between
    instances. Plain functions and lambdas are returned as they are (``deepcopy`` keeps them).
    Objects that cannot be copied are shared, with a warning.
    """
    try:
        return copy.deepcopy(fn)
    except Exception as exc:
        warnings.warn(f"cannot copy function {fn!r} per operator instance ({exc}); instances "
                      "share it, so they must not keep per-instance attributes", stacklevel=2)
        return fn


# iterable, but taken apart into characters (or ints) they are never what a function meant
TEXT_TYPES = (str, bytes, bytearray, memoryview)
# the same as a set of exact types, for a per-record check: ``type(x) in`` costs about a
# tenth of ``isinstance(x, TEXT_TYPES)`` for a value of another type (a tuple, a generator)
EXACT_TEXT_TYPES = frozenset(TEXT_TYPES)


def refuse_text(res: Any, method: str,
                must: str = "must return an iterable of records (or None)") -> None:
    """Refuse a string or bytes returned as a function's outputs (the check that ``flat_map``
    and the process functions share).

    Iterating a returned ``"hello"`` would emit five one-character records: a function that
    returns text almost always meant one record.

    Args:
        res: what the function returned.
        method: the function's name for the message (``"process_element"``, ...).
        must: what the function must return instead, for the message.

    Raises:
        TypeError: when ``res`` is a ``str``, ``bytes``, ``bytearray`` or ``memoryview``
            (the operator wraps it in a :class:`~reactive.errors.UserFunctionError` naming
            itself and the record).
    """
    if isinstance(res, TEXT_TYPES):
        text = repr(res)
        text = text if len(text) <= 80 else text[:77] + "..."
        unit = "character" if isinstance(res, str) else "byte"
        raise TypeError(
            f"{method} {must}, but it returned a {type(res).__name__}: {text}; a "
            f"{type(res).__name__} is not taken apart into one record per {unit}: return "
            "[value] for one record"
        )


_MUST_YIELD = "must yield its outputs (or return None or a list)"


def checked_outputs(res: Any, method: str) -> Iterable[Any]:
    """The outputs a user function returned (the slow path: a generator is taken as it is).

    A process function yields its outputs; returning None (no output), a list of outputs
    or another iterator is accepted too. Any other value is refused rather than iterated:
    a returned tuple ``(word, n)`` would become two records, a string one record per
    character, a dict its keys. (An empty tuple, the common ``return ()``, means no output
    either way and is accepted.)

    Args:
        res: what the function returned.
        method: the function's name for the message (``"process_element"``, ...).

    Returns:
        ``res``, or an empty tuple for None.

    Raises:
        TypeError: for any other value, naming its type (the operator wraps it in a
            :class:`~reactive.errors.UserFunctionError` naming itself and the record).
    """
    if type(res) is list or isinstance(res, Iterator):
        return res
    if res is None or (type(res) is tuple and not res):
        return ()
    refuse_text(res, method, _MUST_YIELD)
    text = repr(res)
    text = text if len(text) <= 80 else text[:77] + "..."
    raise TypeError(
        f"{method} {_MUST_YIELD}, but it returned a "
        f"{type(res).__name__}: {text}; a returned {type(res).__name__} is not taken apart "
        f"into records (it may be one record or several): yield each record, or return "
        "[record, ...]"
    )


class StreamOperator:
    """Base operator: identity, lifecycle, snapshot hooks.

    Attributes:
        name: display name.
        uid: stable id; snapshots are keyed by it.
        keyed: True when the operator needs a keyed state backend.
        generates_watermarks: True for an operator that emits watermarks itself (a
            generator, ``assign_timestamps``, or one that holds them back behind its own
            output, ``map_async``): the task stops upstream watermarks at it, except the
            final one.
        forwards_watermark_status: True for such an operator that still lets the idle and
            active statuses of its inputs through (it keeps event time, it only delays it).
        key_selector: record -> key, for keyed operators.
        mailbox: the task's mailbox, set by the task for chained operators (timers,
            periodic watermarks); None in a harness without a task.
        watermark_split: set by a watermark generator's ``process_batch`` that returned
            only the first part of its output: the ``(watermark, records)`` pairs the task
            sends next, in order (per-record watermarks); the task resets it to None.
    """

    keyed = False
    generates_watermarks = False
    forwards_watermark_status = False
    watermark_split: list[tuple[float, list[Any]]] | None = None

    def __init__(self, name: str, uid: str, key_selector: Callable[[Any], Any] | None = None):
        self.name = name
        self.uid = uid
        self.key_selector = key_selector
        self.subtask = 0
        self.parallelism = 1
        self.keyed_backend: KeyedStateBackend | None = None
        self.operator_state = OperatorStateStore()
        self.ctx: RuntimeContext
        self.mailbox: OperatorMailbox | None = None
        self.records_in = 0
        self.records_out = 0
        # replaced before ``open`` by a runner that keeps timers elsewhere (Spark)
        self.timer_service_factory: TimerServiceFactory = embedded_timer_service

    def setup(
        self,
        subtask: int,
        parallelism: int,
        max_parallelism: int,
        keyed_backend: KeyedStateBackend | None,
    ) -> None:
        """Bind the operator to its instance (before restore and ``open``)."""
        self.subtask = subtask
        self.parallelism = parallelism
        self.keyed_backend = keyed_backend
        self.ctx = RuntimeContext(
            self.name, self.uid, subtask, parallelism, max_parallelism, keyed_backend,
            self.operator_state,
        )

    def keyed_state_backend(self, job_backend: StateBackend) -> StateBackend:
        """The state backend that holds this keyed operator's state: the job's, unless the
        operator keeps its own kind of state (the columnar operators' arrays).

        Args:
            job_backend: the backend the job runs with.
        """
        return job_backend

    def fail(self, record: Any, exc: BaseException, position: Any = None) -> UserFunctionError:
        """Return the error that reports ``exc`` raised on ``record``."""
        return UserFunctionError(
            self.name, self.uid, self.subtask, self.parallelism, record, exc, position
        )

    def open(self) -> None:
        """Called after restore, before the first record."""

    def create_timer_service(self, clock: ProcessingClock, on_event_time: Fire,
                             on_processing_time: Fire) -> InternalTimers:
        """This keyed instance's timer service, from its ``timer_service_factory`` (in
        ``open``): ``on_event_time`` / ``on_processing_time`` ``(timestamp, namespace) ->
        outputs`` fire with the timer's key as the current key. Its event time is kept
        with :meth:`snapshot_timers`."""
        return self.timer_service_factory(self, clock, on_event_time, on_processing_time)

    def snapshot_timers(self, timers: InternalTimers) -> None:
        """Keep the event time of ``timers`` in operator state (the timers themselves are
        keyed state): in ``snapshot_state``."""
        snapshot_watermark(self, timers.watermark)

    def process_batch(self, batch: list[Any]) -> list[Any]:
        """Process a batch; return the output batch."""
        return batch

    def process_watermark(self, timestamp: float) -> list[Any]:
        """Event time advanced to ``timestamp``; return records to emit before it."""
        return []

    def end_input(self) -> list[Any]:
        """All input consumed; return final records."""
        return []

    def drain(self) -> Awaitable[None] | None:
        """Event time is about to end (the final watermark comes next): finish the work
        still in flight and emit its results now, so they come before that watermark and
        the end of data (Flink's ``AsyncWaitOperator`` waits in ``endInput`` likewise). The
        task awaits a coroutine result; the default has nothing in flight."""
        return None

    def snapshot_state(self, checkpoint_id: int) -> Awaitable[None] | None:
        """Synchronous part of a checkpoint: move what must be kept into operator state."""
        return None

    def notify_checkpoint_complete(self, checkpoint_id: int) -> Awaitable[None] | None:
        """Checkpoint ``checkpoint_id`` completed."""
        if self.keyed_backend is not None:
            self.keyed_backend.notify_checkpoint_complete(checkpoint_id)
        return None

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> Awaitable[None] | None:
        """Checkpoint ``checkpoint_id`` was aborted."""
        return None

    def close(self) -> Awaitable[None] | None:
        """Release resources; called after success and after failure (a coroutine result is
        awaited by the task)."""
        if self.keyed_backend is not None:
            self.keyed_backend.dispose()
        return None
