"""Stream operators: the runtime objects that run user functions over record batches.

Each operator turns an input batch (``list``) into an output batch in a tight loop; a
chain of operators in one task passes batches from one to the next without a queue. A user
function that raises is reported as :class:`~reactive.errors.UserFunctionError` naming the
operator, subtask and record (the loop variable of the failing iteration).
"""

from __future__ import annotations

import copy
import inspect
import types
import warnings
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError, UserFunctionError
from ..functions import ProcessFunction, RuntimeContext
from ..sinks import Sink, SinkWriter
from ..sources import Source, SourceReader
from ..state.backend import KeyedStateBackend
from ..state.descriptors import ValueStateDescriptor
from ..state.operator_state import OperatorListState, OperatorStateStore, RedistributionMode

if TYPE_CHECKING:
    from ..time.mailbox import OperatorMailbox

__all__ = [
    "FilterOperator",
    "FlatMapOperator",
    "KeyedProcessOperator",
    "MapOperator",
    "ProcessOperator",
    "ReduceOperator",
    "SinkOperator",
    "SourceOperator",
    "StreamOperator",
    "checked_outputs",
    "maybe_await",
]

_GENERATOR = types.GeneratorType


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
    text = repr(res)
    text = text if len(text) <= 80 else text[:77] + "..."
    raise TypeError(
        f"{method} must yield its outputs (or return None or a list), but it returned a "
        f"{type(res).__name__}: {text}; a returned {type(res).__name__} is not taken apart "
        f"into records (it may be one record or several): yield each record, or return "
        "[record, ...]"
    )


async def maybe_await(value: Awaitable[Any] | Any) -> Any:
    """Await ``value`` when it is awaitable (hooks may be sync or async)."""
    if inspect.isawaitable(value):
        return await value
    return value


class StreamOperator:
    """Base operator: identity, lifecycle, snapshot hooks.

    Attributes:
        name: display name.
        uid: stable id; snapshots are keyed by it.
        keyed: True when the operator needs a keyed state backend.
        generates_watermarks: True for a watermark generator (``assign_timestamps``): the
            task stops upstream watermarks at it, except the final one.
        key_selector: record -> key, for keyed operators.
        mailbox: the task's mailbox, set by the task for chained operators (timers,
            periodic watermarks); None in a harness without a task.
    """

    keyed = False
    generates_watermarks = False

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

    def fail(self, record: Any, exc: BaseException, position: Any = None) -> UserFunctionError:
        """Return the error that reports ``exc`` raised on ``record``."""
        return UserFunctionError(
            self.name, self.uid, self.subtask, self.parallelism, record, exc, position
        )

    def open(self) -> None:
        """Called after restore, before the first record."""

    def process_batch(self, batch: list[Any]) -> list[Any]:
        """Process a batch; return the output batch."""
        return batch

    def process_watermark(self, timestamp: float) -> list[Any]:
        """Event time advanced to ``timestamp``; return records to emit before it."""
        return []

    def end_input(self) -> list[Any]:
        """All input consumed; return final records."""
        return []

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

    def close(self) -> None:
        """Release resources; called after success and after failure."""
        if self.keyed_backend is not None:
            self.keyed_backend.dispose()


class MapOperator(StreamOperator):
    """``map(fn)``: one output per input."""

    def __init__(self, name: str, uid: str, fn: Callable[[Any], Any]):
        super().__init__(name, uid)
        self.fn = fn

    def process_batch(self, batch: list[Any]) -> list[Any]:
        fn = self.fn
        out: list[Any] = []
        append = out.append
        r = None
        try:
            for r in batch:
                append(fn(r))
        except Exception as exc:
            raise self.fail(r, exc) from exc
        return out


class FilterOperator(StreamOperator):
    """``filter(pred)``: keep records for which ``pred`` is true."""

    def __init__(self, name: str, uid: str, fn: Callable[[Any], Any]):
        super().__init__(name, uid)
        self.fn = fn

    def process_batch(self, batch: list[Any]) -> list[Any]:
        fn = self.fn
        out: list[Any] = []
        append = out.append
        r = None
        try:
            for r in batch:
                if fn(r):
                    append(r)
        except Exception as exc:
            raise self.fail(r, exc) from exc
        return out


class FlatMapOperator(StreamOperator):
    """``flat_map(fn)``: ``fn`` returns an iterable of outputs (or None)."""

    def __init__(self, name: str, uid: str, fn: Callable[[Any], Iterable[Any] | None]):
        super().__init__(name, uid)
        self.fn = fn

    def process_batch(self, batch: list[Any]) -> list[Any]:
        fn = self.fn
        out: list[Any] = []
        extend = out.extend
        r = None
        try:
            for r in batch:
                res = fn(r)
                if res is not None:
                    extend(res)
        except Exception as exc:
            raise self.fail(r, exc) from exc
        return out


class ProcessOperator(StreamOperator):
    """``process(fn)`` on a non-keyed stream.

    ``fn.process_element`` yields its outputs, or returns None or a list of them; any other
    return value (a tuple, a string, ...) fails the job (see :func:`checked_outputs`).
    """

    def __init__(self, name: str, uid: str, fn: ProcessFunction):
        super().__init__(name, uid)
        self.fn = instance_copy(fn)
        self._yields = self._is_generator_function()

    def _is_generator_function(self) -> bool:
        """True when ``process_element`` is a generator function: every call then returns a
        generator, and the per-record loop needs no check of what it returned."""
        return inspect.isgeneratorfunction(getattr(self.fn, "process_element", None))

    def open(self) -> None:
        self.fn.open(self.ctx)
        self._yields = self._is_generator_function()  # open() may have replaced it

    def process_batch(self, batch: list[Any]) -> list[Any]:
        fn = self.fn.process_element
        ctx = self.ctx
        out: list[Any] = []
        extend = out.extend
        r = None
        try:
            if self._yields:
                for r in batch:
                    extend(fn(r, ctx))
            else:
                generator = _GENERATOR
                for r in batch:
                    res = fn(r, ctx)
                    # identity checks for the common cases (a list; a generator from a
                    # wrapped generator function); anything else but None is checked before
                    # it is taken apart into records
                    t = type(res)
                    if t is list or t is generator:
                        extend(res)
                    elif res is not None:
                        extend(checked_outputs(res, "process_element"))
        except Exception as exc:
            raise self.fail(r, exc) from exc
        return out

    def close(self) -> None:
        try:
            self.fn.close()
        finally:
            super().close()


class KeyedProcessOperator(ProcessOperator):
    """``key_by(k).process(fn)``: state calls are scoped to each record's key."""

    keyed = True

    def __init__(self, name: str, uid: str, fn: ProcessFunction,
                 key_selector: Callable[[Any], Any]):
        super().__init__(name, uid, fn)
        self.key_selector = key_selector

    def process_batch(self, batch: list[Any]) -> list[Any]:
        fn = self.fn.process_element
        ctx = self.ctx
        key_of = self.key_selector
        assert key_of is not None and self.keyed_backend is not None
        set_key = self.keyed_backend.set_current_key
        out: list[Any] = []
        extend = out.extend
        r = None
        try:
            if self._yields:  # see ProcessOperator.process_batch
                for r in batch:
                    set_key(key_of(r))
                    extend(fn(r, ctx))
            else:
                generator = _GENERATOR
                for r in batch:
                    set_key(key_of(r))
                    res = fn(r, ctx)
                    t = type(res)
                    if t is list or t is generator:
                        extend(res)
                    elif res is not None:
                        extend(checked_outputs(res, "process_element"))
        except Exception as exc:
            raise self.fail(r, exc) from exc
        return out


class ReduceOperator(StreamOperator):
    """``key_by(k).reduce(fn)``: emits the running ``fn(accumulated, record)`` per key."""

    keyed = True

    def __init__(self, name: str, uid: str, key_selector: Callable[[Any], Any],
                 fn: Callable[[Any, Any], Any]):
        super().__init__(name, uid, key_selector)
        self.fn = fn

    def open(self) -> None:
        self.state = self.ctx.get_state(ValueStateDescriptor("reduce"))

    def process_batch(self, batch: list[Any]) -> list[Any]:
        fn = self.fn
        key_of = self.key_selector
        assert key_of is not None and self.keyed_backend is not None
        set_key = self.keyed_backend.set_current_key
        value = self.state.value
        update = self.state.update
        out: list[Any] = []
        append = out.append
        r = None
        try:
            for r in batch:
                set_key(key_of(r))
                acc = value()
                acc = r if acc is None else fn(acc, r)
                update(acc)
                append(acc)
        except Exception as exc:
            raise self.fail(r, exc) from exc
        return out


class SourceOperator(StreamOperator):
    """Runs a :class:`~reactive.sources.SourceReader`; its position is operator state."""

    POSITION = "source-position"

    def __init__(self, name: str, uid: str, source: Source):
        super().__init__(name, uid)
        self.source = source
        self.reader: SourceReader

    def setup(self, subtask: int, parallelism: int, max_parallelism: int,
              keyed_backend: KeyedStateBackend | None) -> None:
        super().setup(subtask, parallelism, max_parallelism, keyed_backend)
        self.reader = self.source.create_reader(subtask, parallelism)

    def open(self) -> None:
        restored = self.operator_state.get_list_state(self.POSITION, "split")
        if restored.get():
            self.reader.restore_state(restored.get())

    def snapshot_state(self, checkpoint_id: int) -> None:
        self.operator_state.get_list_state(self.POSITION, "split").update(
            self.reader.snapshot_state()
        )

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.reader.notify_checkpoint_complete(checkpoint_id)

    def close(self) -> None:
        self.reader.close()


class SinkOperator(StreamOperator):
    """Hands batches to a :class:`~reactive.sinks.SinkWriter`; its ``snapshot_state`` entries
    are operator state (e.g. pre-committed transactions).

    The entries are redistributed ``"split"`` when the parallelism changes, unless the
    writer declares ``state_redistribution = "union"`` (two-phase-commit writers: every
    instance must see every pending transaction, see ``reactive.two_phase_commit``). A
    writer with an ``async start_fresh()`` method gets it called instead of
    ``restore_state`` when there is nothing to restore, before the first record.
    """

    STATE = "sink-state"

    def __init__(self, name: str, uid: str, sink: Sink):
        super().__init__(name, uid)
        self.sink = sink
        self.writer: SinkWriter

    def setup(self, subtask: int, parallelism: int, max_parallelism: int,
              keyed_backend: KeyedStateBackend | None) -> None:
        super().setup(subtask, parallelism, max_parallelism, keyed_backend)
        self.writer = self.sink.create_writer(subtask, parallelism)

    def _state(self) -> OperatorListState:
        mode: RedistributionMode = getattr(self.writer, "state_redistribution", "split")
        return self.operator_state.get_list_state(self.STATE, mode)

    async def restore(self) -> None:
        """Give the writer the entries of the restored checkpoint (commit pending ones), or
        tell it that it starts fresh."""
        entries = self._state().get()
        if entries:
            await maybe_await(self.writer.restore_state(entries))
            return
        start_fresh = getattr(self.writer, "start_fresh", None)
        if start_fresh is not None:
            await maybe_await(start_fresh())

    async def write(self, batch: list[Any]) -> None:
        """Write a batch, reporting a failure with the batch's first record.

        Raises:
            ConfigurationError: as the writer raised it (a misconfigured sink is not the
                record's fault).
            UserFunctionError: wrapping any other error of the writer.
        """
        try:
            await maybe_await(self.writer.write(batch))
        except ConfigurationError:
            raise
        except Exception as exc:
            raise self.fail(batch[0] if batch else None, exc) from exc

    async def snapshot_state(self, checkpoint_id: int) -> None:
        entries = await maybe_await(self.writer.snapshot_state(checkpoint_id))
        self._state().update(entries or [])

    def notify_checkpoint_complete(self, checkpoint_id: int) -> Awaitable[None] | None:
        return self.writer.notify_checkpoint_complete(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> Awaitable[None] | None:
        return self.writer.notify_checkpoint_aborted(checkpoint_id)

    def close(self) -> None:
        self.writer.close()
