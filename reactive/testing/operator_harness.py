"""One operator without a job, for tests: records, watermarks, timers, snapshots and restores.

:class:`OperatorTestHarness` plays the task around a single operator instance (Flink's
``KeyedOneInputStreamOperatorTestHarness``): it creates the keyed state backend of the
instance's key-group range (the heap backend unless told otherwise) and the operator state,
binds the operator to a mailbox whose actions it runs after every call, feeds it batches,
watermarks and processing time (a :class:`~reactive.time.clock.ManualClock`), and collects
what it emits. Snapshots go through the runtime's own checkpoint code (the synchronous part,
then the asynchronous part writing the backend's files), and an :class:`OperatorSnapshot`
restores through the same key-group and operator-state assignment as a job restore, so a
snapshot restores into a new harness at the same or another parallelism.

::

    harness = OperatorTestHarness.for_keyed_process(Count(), key_selector=lambda w: w)
    harness.open()
    assert harness.process_elements(["a", "b", "a"]) == [("a", 1), ("b", 1), ("a", 2)]
    snapshot = await harness.snapshot()
    harness.close()
    restored = OperatorTestHarness.for_keyed_process(Count(), key_selector=lambda w: w)
    restored.open(restore_from=snapshot)
    assert restored.process_element("a") == [("a", 3)]

The operators it runs are the synchronous ones (map, filter, flat_map, reduce, process
functions with timers, window operators, ``assign_timestamps``); ``map_async`` and sources
and sinks need a task.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Coroutine, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any, TypedDict, Unpack

from ..checkpoint.contract import OperatorSubtaskState
from ..checkpoint.state_assignment_operation import StateAssignmentOperation
from ..checkpoint.storage import CheckpointStorage
from ..defaults import default_state_backend
from ..functions import ProcessFunction
from ..key_encoding import bind_key_serializer
from ..keygroups import KeyGroupRange, assign_to_key_group, key_group_range_for_operator
from ..runtime.events import MAX_WATERMARK, CheckpointBarrier
from ..runtime.operators import (
    MapOperator,
    ProcessOperator,
    StreamOperator,
    TimedKeyedProcessOperator,
    maybe_await,
)
from ..runtime.subtask_checkpoint_coordinator import SubtaskCheckpointCoordinator
from ..serialization import Serializer
from ..state.api import State
from ..state.backend import KeyedStateBackend, StateBackend
from ..state.descriptors import StateDescriptor
from ..time.clock import ManualClock, ProcessingClock
from ..time.mailbox import OperatorMailbox
from ..time.timers import InternalTimerService
from ..time.watermarks import WatermarkStatus
from ..windowing.assigners import WindowAssigner
from ..windowing.functions import AggregateFunction, ProcessWindowFunction
from ..windowing.window_operator import WindowOperator
from .harness_task import Acknowledgements, HarnessTask, Identity, synchronous
from .operator_snapshot import OperatorSnapshot, ScratchDirectory

__all__ = ["HarnessOptions", "OperatorSnapshot", "OperatorTestHarness"]


class HarnessOptions(TypedDict, total=False):
    """The keyword arguments of :class:`OperatorTestHarness` that its ``for_*`` constructors
    pass on (see the class for their meaning)."""

    subtask: int
    parallelism: int
    max_parallelism: int
    state_backend: StateBackend
    key_serializer: Serializer
    directory: str | Path
    job_name: str


class OperatorTestHarness:
    """Runs one instance of one operator without a job (Flink's
    ``KeyedOneInputStreamOperatorTestHarness`` / ``OneInputStreamOperatorTestHarness``).

    Call :meth:`open` (optionally restoring an :class:`OperatorSnapshot`), then feed it with
    :meth:`process_element`, :meth:`process_elements`, :meth:`process_watermark`,
    :meth:`set_processing_time` and :meth:`end_input` (a two-input operator's second input
    with :meth:`process_element2`); each returns the records emitted
    during the call, which also accumulate in :attr:`output`. ``await``
    :meth:`snapshot` takes a checkpoint of the instance. Use it as a context manager (``with``
    or ``async with``) to open and close it.

    Args:
        operator (StreamOperator): the operator, not yet set up (one harness per operator
            object). Build one with the ``for_*`` class methods, or directly.
        subtask (int): the instance's index, ``0 <= subtask < parallelism``.
        parallelism (int): the operator's number of instances (it decides the key-group
            range of the instance and the share of operator state it restores).
        max_parallelism (int): the number of key groups.
        state_backend (StateBackend | None): the keyed state backend factory; None: the heap
            backend.
        clock (ProcessingClock | None): the operator's processing-time clock, when it has
            one; :meth:`set_processing_time` needs a :class:`ManualClock`. None: a new
            ``ManualClock`` at 0.0 seconds.
        key_serializer (Serializer | None): the ``key_by`` key serializer, for keys without
            a canonical encoding.
        directory (str | Path | None): where snapshots write their files (under
            ``<directory>/<job_name>``); None: a temporary directory removed when neither
            the harness nor a snapshot refers to it, or, for a harness that restores, the
            snapshot's directory (checkpoint ids continue after the restored one).
        job_name (str): the job name given to the state backend and used in paths.

    Attributes:
        operator (StreamOperator): the operator.
        clock (ProcessingClock): its processing-time clock.
        output (list[Any]): every record the operator emitted, in order.
        watermarks (list[float]): the watermarks (seconds) that left the operator: those it
            forwarded after :meth:`process_watermark` and those it generated.
        watermark_statuses (list[WatermarkStatus]): idle/active statuses it emitted.
        key_group_range (KeyGroupRange | None): the instance's key groups (keyed operators,
            after :meth:`open`).

    Raises:
        ValueError: if ``subtask`` or ``parallelism`` is out of range.
    """

    def __init__(self, operator: StreamOperator, *, subtask: int = 0, parallelism: int = 1,
                 max_parallelism: int = 128, state_backend: StateBackend | None = None,
                 clock: ProcessingClock | None = None, key_serializer: Serializer | None = None,
                 directory: str | Path | None = None, job_name: str = "harness") -> None:
        if not 1 <= parallelism <= max_parallelism:
            raise ValueError(f"parallelism must be in 1..{max_parallelism}, got {parallelism}")
        if not 0 <= subtask < parallelism:
            raise ValueError(f"subtask must be in 0..{parallelism - 1}, got {subtask}")
        self.operator = operator
        self.subtask = subtask
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism
        self.state_backend = state_backend
        self.clock: ProcessingClock = clock if clock is not None else ManualClock()
        self.key_serializer = key_serializer
        self.directory = None if directory is None else Path(directory)
        self.job_name = job_name
        self.output: list[Any] = []
        self.watermarks: list[float] = []
        self.watermark_statuses: list[WatermarkStatus] = []
        self.key_group_range: KeyGroupRange | None = None
        self._task = HarnessTask(self)
        self._storage: CheckpointStorage | None = None
        self._keep_alive: list[ScratchDirectory] = []
        self._next_checkpoint_id = 1
        self._opened = False
        self._closed = False

    # ------------------------------------------------------------------ constructors
    @classmethod
    def for_keyed_process(cls, fn: ProcessFunction, key_selector: Callable[[Any], Any], *,
                          uid: str = "process", clock: ProcessingClock | None = None,
                          **options: Unpack[HarnessOptions]) -> OperatorTestHarness:
        """A harness of ``key_by(key_selector).process(fn)``: keyed state, event- and
        processing-time timers.

        Args:
            fn (ProcessFunction): the ``KeyedProcessFunction`` (the operator runs a copy:
                reach it as ``harness.operator.fn``).
            key_selector (Callable[[Any], Any]): record -> key.
            uid (str): the operator's uid.
            clock (ProcessingClock | None): processing-time clock (None: a ``ManualClock``
                at 0.0 seconds).
            **options: the other arguments of :class:`OperatorTestHarness`.

        Returns:
            OperatorTestHarness: the harness, not opened yet.
        """
        clock = clock if clock is not None else ManualClock()
        op = TimedKeyedProcessOperator(type(fn).__name__, uid, fn, key_selector, clock)
        return cls(op, clock=clock, **options)

    @classmethod
    def for_process(cls, fn: ProcessFunction, *, uid: str = "process",
                    **options: Unpack[HarnessOptions]) -> OperatorTestHarness:
        """A harness of ``process(fn)`` on a non-keyed stream (operator state only).

        Args:
            fn (ProcessFunction): the process function (the operator runs a copy).
            uid (str): the operator's uid.
            **options: the other arguments of :class:`OperatorTestHarness`.

        Returns:
            OperatorTestHarness: the harness, not opened yet.
        """
        return cls(ProcessOperator(type(fn).__name__, uid, fn), **options)

    @classmethod
    def for_map(cls, fn: Callable[[Any], Any], *, uid: str = "map",
                **options: Unpack[HarnessOptions]) -> OperatorTestHarness:
        """A harness of ``map(fn)``.

        Args:
            fn (Callable[[Any], Any]): record -> output record.
            uid (str): the operator's uid.
            **options: the other arguments of :class:`OperatorTestHarness`.

        Returns:
            OperatorTestHarness: the harness, not opened yet.
        """
        return cls(MapOperator("map", uid, fn), **options)

    @classmethod
    def for_window(cls, key_selector: Callable[[Any], Any], assigner: WindowAssigner,
                   timestamp_fn: Callable[[Any], float], *,
                   aggregate: AggregateFunction | None = None,
                   process: ProcessWindowFunction | None = None,
                   allowed_lateness: float = 0.0, late_side_output: bool = False,
                   uid: str = "window", clock: ProcessingClock | None = None,
                   **options: Unpack[HarnessOptions]) -> OperatorTestHarness:
        """A harness of ``key_by(key_selector).window(assigner).aggregate(...)`` (or
        ``.process(...)``): windows fire on the watermarks fed to it.

        Args:
            key_selector (Callable[[Any], Any]): record -> key.
            assigner (WindowAssigner): an event-time window assigner
                (``TumblingEventTimeWindows.of(60)`` ...).
            timestamp_fn (Callable[[Any], float]): record -> event time (seconds).
            aggregate (AggregateFunction | None): incremental aggregation (emits
                ``WindowResult`` records), or None.
            process (ProcessWindowFunction | None): whole-window function, or None (give
                exactly one of the two).
            allowed_lateness (float): seconds after a window's end during which late
                records still update it.
            late_side_output (bool): emit late records, wrapped in
                ``reactive.windowing.window_operator.LateRecord``, instead of counting them
                in ``harness.operator.late_records``.
            uid (str): the operator's uid.
            clock (ProcessingClock | None): processing-time clock (None: a ``ManualClock``).
            **options: the other arguments of :class:`OperatorTestHarness`.

        Returns:
            OperatorTestHarness: the harness, not opened yet.

        Raises:
            ValueError: unless exactly one of ``aggregate`` and ``process`` is given.
        """
        if (aggregate is None) == (process is None):
            raise ValueError("give exactly one of aggregate= and process=")
        clock = clock if clock is not None else ManualClock()
        op = WindowOperator("window", uid, key_selector, assigner, timestamp_fn,
                            aggregate=aggregate, process=process,
                            allowed_lateness=allowed_lateness, clock=clock,
                            late_side_output=lambda: late_side_output)
        return cls(op, clock=clock, **options)

    # ------------------------------------------------------------------ lifecycle
    def open(self, restore_from: OperatorSnapshot | None = None) -> OperatorTestHarness:
        """Set the operator up as its task would: keyed backend, restored state, ``open``.

        Args:
            restore_from (OperatorSnapshot | None): state to restore (of any parallelism
                with the same max parallelism), or None for a fresh start.

        Returns:
            OperatorTestHarness: the harness itself.

        Raises:
            RuntimeError: if the harness was opened before.
            RestoreError: if the snapshot's max parallelism differs, or a handle cannot be
                read by the state backend.
        """
        if self._opened or self._closed:
            raise RuntimeError("an OperatorTestHarness opens once")
        op = self.operator
        if self.directory is not None:
            self._storage = CheckpointStorage(self.directory, self.job_name)
        elif restore_from is not None:
            # write next to the restored files: incremental snapshots may reference them
            self._storage = CheckpointStorage(restore_from.job_dir.parent,
                                              restore_from.job_dir.name)
            self._keep_alive.extend(restore_from._keep_alive)
        else:
            scratch = ScratchDirectory()
            self._keep_alive.append(scratch)
            self._storage = CheckpointStorage(scratch.path, self.job_name)
        keyed_backend: KeyedStateBackend | None = None
        if op.keyed:
            if self.state_backend is None:
                self.state_backend = default_state_backend()
            self.key_group_range = key_group_range_for_operator(
                self.subtask, self.parallelism, self.max_parallelism)
            keyed_backend = self.state_backend.create_keyed_backend(
                job_name=self.job_name, operator_uid=op.uid, subtask=self.subtask,
                key_group_range=self.key_group_range, max_parallelism=self.max_parallelism)
            if self.key_serializer is not None:
                bind_key_serializer(keyed_backend, self.key_serializer, op.uid)
        op.setup(self.subtask, self.parallelism, self.max_parallelism, keyed_backend)
        op.mailbox = OperatorMailbox(self._task, 0)
        self._opened = True  # from here close() releases the backend
        if restore_from is not None:
            checkpoint = restore_from.as_completed_checkpoint(op.uid)
            assigned = StateAssignmentOperation(
                checkpoint, self.max_parallelism, {op.uid}).for_subtask(
                op.uid, self.subtask, self.parallelism, self.key_group_range)
            if keyed_backend is not None and assigned.keyed_handles:
                keyed_backend.restore([h.to_json() for h in assigned.keyed_handles],
                                      checkpoint.job_dir)
            if assigned.operator_state:
                op.operator_state.restore(assigned.operator_state)
            self._next_checkpoint_id = restore_from.checkpoint_id + 1
        op.open()
        self._run_mailbox()
        return self

    def close(self) -> None:
        """Close the operator (its keyed backend is disposed); closing twice does nothing.

        Raises:
            TypeError: if the operator's ``close`` is a coroutine (use :meth:`aclose`).
        """
        if self._closed:
            return
        self._closed = True
        if self._opened:
            synchronous(self.operator.close(), "the operator's close()")

    async def aclose(self) -> None:
        """Close the operator, awaiting its ``close`` when it is a coroutine."""
        if self._closed:
            return
        self._closed = True
        if self._opened:
            await maybe_await(self.operator.close())

    def __enter__(self) -> OperatorTestHarness:
        if not self._opened:
            self.open()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    async def __aenter__(self) -> OperatorTestHarness:
        return self.__enter__()

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()

    def _check_open(self) -> None:
        if not self._opened:
            raise RuntimeError("open() the OperatorTestHarness first")
        if self._closed:
            raise RuntimeError("the OperatorTestHarness is closed")

    # ------------------------------------------------------------------ input
    def process_element(self, record: Any) -> list[Any]:
        """Process one record (a batch of one).

        Args:
            record (Any): the record.

        Returns:
            list[Any]: the records emitted during the call.

        Raises:
            UserFunctionError: the operator's function failed (naming the record).
        """
        return self.process_elements([record])

    def process_elements(self, records: Iterable[Any]) -> list[Any]:
        """Process ``records`` as one batch, then run the mailbox actions it posted.

        Args:
            records (Iterable[Any]): the batch's records. A keyed operator instance of
                parallelism > 1 accepts only the keys of its key groups (see
                :meth:`owns_key`).

        Returns:
            list[Any]: the records emitted during the call.

        Raises:
            UserFunctionError: the operator's function failed (naming the record).
        """
        self._check_open()
        start = len(self.output)
        batch = list(records)
        if batch:
            self.operator.records_in += len(batch)
            out = self.operator.process_batch(batch)
            self.operator.records_out += len(out)
            self.output.extend(out)
            split, self.operator.watermark_split = self.operator.watermark_split, None
            for watermark, part in split or ():  # per-record watermarks cut the batch
                self.watermarks.append(watermark)
                self.operator.records_out += len(part)
                self.output.extend(part)
        self._run_mailbox()
        return self.output[start:]

    def process_element2(self, record: Any) -> list[Any]:
        """Process one record of a two-input operator's second input (Flink's
        ``TwoInputStreamOperatorTestHarness.processElement2``).

        Args:
            record (Any): the record.

        Returns:
            list[Any]: the records emitted during the call.

        Raises:
            TypeError: the operator has one input.
            UserFunctionError: the operator's function failed (naming the record).
        """
        return self.process_elements2([record])

    def process_elements2(self, records: Iterable[Any]) -> list[Any]:
        """Process ``records`` as one batch of a two-input operator's second input
        (:meth:`process_elements` feeds the first).

        Args:
            records (Iterable[Any]): the batch's records.

        Returns:
            list[Any]: the records emitted during the call.

        Raises:
            TypeError: the operator has one input.
            UserFunctionError: the operator's function failed (naming the record).
        """
        self._check_open()
        process = getattr(self.operator, "process_batch2", None)
        if process is None:
            raise TypeError(f"operator {self.operator.name!r} has one input: use "
                            "process_element(s)")
        start = len(self.output)
        batch = list(records)
        if batch:
            self.operator.records_in += len(batch)
            out = process(batch)
            self.operator.records_out += len(out)
            self.output.extend(out)
        self._run_mailbox()
        return self.output[start:]

    def process_watermark(self, timestamp: float) -> list[Any]:
        """Advance event time to ``timestamp``: due event-time timers fire (windows too).

        Like the task, the harness forwards the watermark after the records it made the
        operator emit (into :attr:`watermarks`), unless the operator generates its own.

        Args:
            timestamp (float): the watermark (seconds); ``float("inf")`` ends event time.

        Returns:
            list[Any]: the records emitted during the call.
        """
        self._check_open()
        start = len(self.output)
        op = self.operator
        self.output.extend(op.process_watermark(timestamp))
        if not op.generates_watermarks or timestamp == MAX_WATERMARK:
            self.watermarks.append(timestamp)
        self._run_mailbox()
        return self.output[start:]

    def set_processing_time(self, timestamp: float) -> list[Any]:
        """Move the :class:`ManualClock` to ``timestamp`` and fire what became due
        (processing-time timers, idleness checks).

        Args:
            timestamp (float): processing time (seconds); the clock never goes back.

        Returns:
            list[Any]: the records emitted during the call.

        Raises:
            TypeError: if the harness's clock is not a :class:`ManualClock`.
        """
        self._check_open()
        if not isinstance(self.clock, ManualClock):
            raise TypeError("set_processing_time needs a ManualClock (pass clock=ManualClock() "
                            f"to the harness and the operator), not {type(self.clock).__name__}")
        start = len(self.output)
        self.clock.advance_to(timestamp)
        self._run_mailbox()
        return self.output[start:]

    def end_input(self, final_watermark: bool = True) -> list[Any]:
        """End the input as the task does: the operator drains, gets the final watermark
        (``+inf``: every event-time timer fires) and ``end_input``.

        Args:
            final_watermark (bool): send the final watermark first (the runtime always
                does); False calls ``end_input`` only.

        Returns:
            list[Any]: the records emitted during the call.
        """
        self._check_open()
        start = len(self.output)
        op = self.operator
        if final_watermark:
            synchronous(op.drain(), "the operator's drain()")
            self.process_watermark(MAX_WATERMARK)
        self.output.extend(op.end_input())
        self._run_mailbox()
        return self.output[start:]

    def _run_mailbox(self) -> None:
        mail = self._task.mail
        while mail:
            synchronous(mail.popleft()(), "a mailbox action")

    # ------------------------------------------------------------------ output and state
    def take_output(self) -> list[Any]:
        """Return the records emitted so far and clear :attr:`output`.

        Returns:
            list[Any]: the records, in the order the operator emitted them.
        """
        out = self.output[:]
        self.output.clear()
        return out

    @property
    def keyed_backend(self) -> KeyedStateBackend | None:
        """The operator instance's keyed state backend (None for a non-keyed operator)."""
        return self.operator.keyed_backend

    def owns_key(self, key: Any) -> bool:
        """Whether ``key`` belongs to this instance's key groups.

        Args:
            key (Any): a ``key_by`` key.

        Returns:
            bool: True for a non-keyed operator, or a key of this instance's key groups.
        """
        if self.key_group_range is None:
            return True
        return assign_to_key_group(key, self.max_parallelism,
                                   self.key_serializer) in self.key_group_range

    def get_state(self, descriptor: StateDescriptor, key: Any) -> State:
        """The keyed state ``descriptor`` of ``key``, for assertions.

        It makes ``key`` the backend's current key: read the returned state before feeding
        the harness again.

        Args:
            descriptor (StateDescriptor): the state's descriptor (same name and kind as the
                function's).
            key (Any): the key.

        Returns:
            State: the state scoped to ``key`` (``.value()``, ``.get()`` ...).

        Raises:
            RuntimeError: for a non-keyed operator.
            StateAccessError: if ``key`` is not in this instance's key groups.
        """
        self._check_open()
        backend = self.operator.keyed_backend
        if backend is None:
            raise RuntimeError(f"operator {self.operator.uid!r} has no keyed state")
        backend.set_current_key(key)
        return backend.get_state(descriptor)

    def _timers(self) -> InternalTimerService | None:
        timers = getattr(self.operator, "timers", None)
        return timers if isinstance(timers, InternalTimerService) else None

    def num_event_time_timers(self) -> int:
        """The number of registered event-time timers, over all keys (0 without timers)."""
        timers = self._timers()
        return 0 if timers is None else timers.num_event_time_timers()

    def num_processing_time_timers(self) -> int:
        """The number of registered processing-time timers, over all keys."""
        timers = self._timers()
        return 0 if timers is None else timers.num_processing_time_timers()

    # ------------------------------------------------------------------ checkpoints
    async def snapshot(self, checkpoint_id: int | None = None, *,
                       savepoint: bool = False) -> OperatorSnapshot:
        """Take a checkpoint of the instance, as a barrier would between two batches: the
        operator's ``snapshot_state`` and the backend's synchronous part, then the
        asynchronous part that writes the files.

        Args:
            checkpoint_id (int | None): the checkpoint's id (None: one more than the last
                one taken or restored, from 1).
            savepoint (bool): take a self-contained savepoint (no shared files).

        Returns:
            OperatorSnapshot: the instance's state, restorable into new harnesses.

        Raises:
            Exception: what made the snapshot fail (e.g. ``StateSerializationError``).
        """
        self._check_open()
        assert self._storage is not None
        cid = self._next_checkpoint_id if checkpoint_id is None else checkpoint_id
        self._next_checkpoint_id = max(self._next_checkpoint_id, cid + 1)
        op = self.operator
        acks = Acknowledgements()
        spawned: list[Coroutine[Any, Any, None]] = []

        async def no_broadcast(event: Any) -> None:
            return None

        coordinator = SubtaskCheckpointCoordinator(
            Identity(f"{op.name} ({self.subtask + 1}/{self.parallelism})", self.subtask),
            [op], self._storage, acks, spawned.append, no_broadcast, lambda: self._closed)
        barrier = CheckpointBarrier(cid, time.time(), "savepoint" if savepoint else "checkpoint")
        await coordinator.checkpoint_state(barrier, 0.0)
        for part in spawned:
            await part
        self._run_mailbox()
        if acks.declined is not None:
            raise acks.declined
        assert acks.states is not None
        # the entry travels as checkpoint metadata does: as JSON
        entry = OperatorSubtaskState.from_json(
            json.loads(json.dumps(acks.states[op.uid].to_json())))
        return OperatorSnapshot(cid, self.max_parallelism, self.parallelism,
                                self._storage.job_dir, {self.subtask: entry},
                                tuple(self._keep_alive))

    async def notify_checkpoint_complete(self, checkpoint_id: int) -> list[Any]:
        """Tell the operator that checkpoint ``checkpoint_id`` completed.

        Args:
            checkpoint_id (int): the completed checkpoint.

        Returns:
            list[Any]: the records emitted during the call.
        """
        self._check_open()
        start = len(self.output)
        await maybe_await(self.operator.notify_checkpoint_complete(checkpoint_id))
        self._run_mailbox()
        return self.output[start:]

    async def notify_checkpoint_aborted(self, checkpoint_id: int) -> list[Any]:
        """Tell the operator that checkpoint ``checkpoint_id`` was aborted.

        Args:
            checkpoint_id (int): the aborted checkpoint.

        Returns:
            list[Any]: the records emitted during the call.
        """
        self._check_open()
        start = len(self.output)
        await maybe_await(self.operator.notify_checkpoint_aborted(checkpoint_id))
        self._run_mailbox()
        return self.output[start:]
