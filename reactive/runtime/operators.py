"""Stream operators: the runtime objects that run user functions over record batches.

Each operator turns an input batch (``list``) into an output batch in a tight loop; a
chain of operators in one task passes batches from one to the next without a queue. A user
function that raises is reported as :class:`~reactive.errors.UserFunctionError` naming the
operator, subtask and record (the loop variable of the failing iteration).
"""

from __future__ import annotations

import copy
import inspect
import warnings
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..errors import UserFunctionError
from ..functions import ProcessFunction, RuntimeContext
from ..sinks import Sink, SinkWriter
from ..sources import Source, SourceReader
from ..state.backend import KeyedStateBackend
from ..state.descriptors import ValueStateDescriptor
from ..state.operator_state import OperatorStateStore

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
    "maybe_await",
]


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
    """``process(fn)`` on a non-keyed stream."""

    def __init__(self, name: str, uid: str, fn: ProcessFunction):
        super().__init__(name, uid)
        self.fn = instance_copy(fn)

    def open(self) -> None:
        self.fn.open(self.ctx)

    def process_batch(self, batch: list[Any]) -> list[Any]:
        fn = self.fn.process_element
        ctx = self.ctx
        out: list[Any] = []
        extend = out.extend
        r = None
        try:
            for r in batch:
                res = fn(r, ctx)
                if res is not None:
                    extend(res)
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
            for r in batch:
                set_key(key_of(r))
                res = fn(r, ctx)
                if res is not None:
                    extend(res)
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
    are operator state (e.g. pre-committed transactions)."""

    STATE = "sink-state"

    def __init__(self, name: str, uid: str, sink: Sink):
        super().__init__(name, uid)
        self.sink = sink
        self.writer: SinkWriter

    def setup(self, subtask: int, parallelism: int, max_parallelism: int,
              keyed_backend: KeyedStateBackend | None) -> None:
        super().setup(subtask, parallelism, max_parallelism, keyed_backend)
        self.writer = self.sink.create_writer(subtask, parallelism)

    async def restore(self) -> None:
        """Give the writer the entries of the restored checkpoint (commit pending ones)."""
        entries = self.operator_state.get_list_state(self.STATE, "split").get()
        if entries:
            await maybe_await(self.writer.restore_state(entries))

    async def write(self, batch: list[Any]) -> None:
        """Write a batch, reporting a failure with the batch's first record."""
        try:
            await maybe_await(self.writer.write(batch))
        except Exception as exc:
            raise self.fail(batch[0] if batch else None, exc) from exc

    async def snapshot_state(self, checkpoint_id: int) -> None:
        entries = await maybe_await(self.writer.snapshot_state(checkpoint_id))
        self.operator_state.get_list_state(self.STATE, "split").update(entries or [])

    def notify_checkpoint_complete(self, checkpoint_id: int) -> Awaitable[None] | None:
        return self.writer.notify_checkpoint_complete(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> Awaitable[None] | None:
        return self.writer.notify_checkpoint_aborted(checkpoint_id)

    def close(self) -> None:
        self.writer.close()
