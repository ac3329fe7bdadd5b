"""The task's side of checkpoints (Flink's ``SubtaskCheckpointCoordinator``).

When barrier n has been aligned at a task (or injected, at a source), the task calls
:meth:`SubtaskCheckpointCoordinator.checkpoint_state`: the *synchronous part* asks every
chained operator to snapshot (``snapshot_state``: sinks pre-commit here), captures the keyed
state (the backends' cheap synchronous parts) and serializes the operator state, then the
barrier is forwarded downstream and the *asynchronous part* runs in the job's task group:
it writes the files and acknowledges to the checkpoint coordinator with the state handles,
or declines the checkpoint when anything fails (Carbone 2018 (PhD thesis), section 4.5.1; ABS
paper, Algorithm 1). Completion and abort notifications reach the operators through it too.

In the synchronous-snapshot baseline (``synchronous``, set by the task from its environment
for ``mode="synchronous"``; Carbone 2018 (PhD thesis), section 3.4.2) the task runs the writing
in place of spawning it: it processes nothing else until its snapshot is written and
acknowledged, and the statistics count the whole snapshot as its synchronous part.

For an unaligned checkpoint (``reactive.runtime.unaligned``) the task passes the future of
its in-flight records: the asynchronous part writes them, once complete, as the head
operator's ``channel_state`` and acknowledges after that.
"""

from __future__ import annotations

import asyncio
import functools
import pickle
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from ..checkpoint.channel_state import FORMAT as CHANNEL_STATE_FORMAT
from ..checkpoint.channel_state import InFlightEntry, serialize_channel_state
from ..checkpoint.contract import (
    OPERATOR_STATE_FORMAT,
    FileRef,
    KeyedStateHandle,
    OperatorSubtaskState,
    StateHandle,
)
from ..checkpoint.durable_files import write_atomic
from ..checkpoint.failure_reason import CheckpointFailureReason
from ..errors import ReactiveError, StateSerializationError
from ..state.backend import KeyedStateSnapshot, SnapshotContext
from .events import CheckpointBarrier
from .operators import StreamOperator, maybe_await
from .reconfiguration import RescalePlan, apply_updates

if TYPE_CHECKING:
    from ..checkpoint.storage import CheckpointStorage

__all__ = ["CheckpointAcknowledger", "SubtaskCheckpointCoordinator", "TaskIdentity"]


class TaskIdentity(Protocol):
    """How the checkpoint coordinator tells tasks apart."""

    @property
    def task_id(self) -> str: ...

    @property
    def subtask(self) -> int: ...


class CheckpointAcknowledger(Protocol):
    """The checkpoint coordinator as a task sees it."""

    async def acknowledge(self, checkpoint_id: int, task: Any,
                          states: Mapping[str, OperatorSubtaskState],
                          stats: Mapping[str, float]) -> None: ...

    def decline(self, checkpoint_id: int, task: Any, reason: BaseException,
                failure_reason: CheckpointFailureReason = ...) -> None: ...


_Capture = tuple[StreamOperator, SnapshotContext, KeyedStateSnapshot | None, bytes | None]


def serialize_operator_state(uid: str, states: dict[str, tuple[str, list[Any]]]) -> bytes:
    """Pickle an operator's state in the synchronous part of its snapshot.

    Operator-state entries are often mutable objects the operator keeps changing in place
    (a source's position, a counter); serializing them before the barrier moves on is what
    makes the snapshot hold the values *at* the barrier (a shallow copy would let later
    in-place changes leak into the checkpoint). Operator state is small by design.

    Raises:
        StateSerializationError: naming the operator and the state that cannot be pickled.
    """
    try:
        return pickle.dumps(states, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        for name, entry in states.items():
            try:
                pickle.dumps(entry, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as inner:
                raise StateSerializationError(uid, name, None, inner) from inner
        raise StateSerializationError(uid, "<operator state>", None, exc) from exc


class SubtaskCheckpointCoordinator:
    """Takes one task's snapshots and reports them.

    Args:
        task: the task (its id and subtask index go into acknowledgements).
        operators: the task's chain, head first.
        storage: checkpoint storage (None: checkpointing is off and barriers are forwarded
            only).
        acknowledger: the checkpoint coordinator.
        spawn: runs a coroutine in the job's task group (the asynchronous parts).
        broadcast: sends an event on every output channel of the task.
        is_closed: whether the task has closed its operators (a failure or the end).

    Attributes:
        synchronous: write each snapshot in the task before going on (the synchronous
            baseline) instead of in an asynchronous part.
    """

    def __init__(self, task: TaskIdentity, operators: list[StreamOperator],
                 storage: CheckpointStorage | None, acknowledger: CheckpointAcknowledger | None,
                 spawn: Callable[[Coroutine[Any, Any, None]], None],
                 broadcast: Callable[[Any], Awaitable[None]],
                 is_closed: Callable[[], bool]) -> None:
        self.task = task
        self.operators = operators
        self.storage = storage
        self.acknowledger = acknowledger
        self.spawn = spawn
        self.broadcast = broadcast
        self.is_closed = is_closed
        self.synchronous = False
        # set when the newest asynchronous part has ended (acknowledged, declined or
        # cancelled): the next part acknowledges only after it (see _async_part)
        self._previous_part: asyncio.Event | None = None
        # checkpoint id -> the captures of its asynchronous part while it runs: an abort
        # discards them, so a part that cannot end by itself (a hung writer) does not hold
        # back the acknowledgements of the parts after it
        self._in_flight: dict[int, list[_Capture]] = {}

    async def checkpoint_state(
        self, barrier: CheckpointBarrier, alignment: float,
        in_flight: asyncio.Future[list[InFlightEntry]] | None = None,
    ) -> None:
        """Snapshot for ``barrier`` (synchronous part), forward it, start the asynchronous
        part.

        Args:
            barrier: the checkpoint's barrier.
            alignment: seconds the task spent aligning it (0 at a source).
            in_flight: an unaligned checkpoint's in-flight input records, resolved once
                the barrier arrived on every input (None: aligned, or a source).
        """
        storage, acknowledger = self.storage, self.acknowledger
        if storage is None or acknowledger is None:
            return
        cid = barrier.checkpoint_id
        t0 = time.perf_counter()
        captures: list[_Capture] = []
        try:
            for op in self.operators:
                await maybe_await(op.snapshot_state(cid))
                ctx = SnapshotContext(
                    cid, storage.job_dir, storage.checkpoint_dir(cid), storage.shared_dir,
                    op.uid, self.task.subtask, barrier.kind == "savepoint",
                )
                keyed = op.keyed_backend.snapshot(ctx) if op.keyed_backend is not None else None
                opstate = None if op.operator_state.is_empty() else serialize_operator_state(
                    op.uid, op.operator_state.snapshot())
                captures.append((op, ctx, keyed, opstate))
        except Exception as exc:
            for _, _, keyed, _ in captures:
                if keyed is not None:
                    keyed.discard()
            acknowledger.decline(cid, self.task, exc)
            if in_flight is not None:
                in_flight.cancel()
            await self.broadcast(barrier)
            return
        if barrier.updates:
            # the snapshot instant: the captures hold the state the old version left, the
            # records after this barrier meet the new version (Carbone 2018 (PhD thesis),
            # section 4.5.5)
            try:
                for plan in barrier.updates:
                    if isinstance(plan, RescalePlan) and plan.handover is not None:
                        for op, _, _, opstate in captures:
                            plan.handover.capture(op, opstate)
                apply_updates(self.operators, barrier.updates)
                # a rescale: a source reads nothing after its barrier (its mail, the
                # commits, still runs), so the old graph receives no record after the
                # snapshot instant. Only sources: a downstream task quiesced too could block
                # a timer's output, and with it the commits, on a full channel.
                if getattr(self.task, "source", None) is not None:
                    for plan in barrier.updates:
                        if isinstance(plan, RescalePlan):
                            plan.quiesce(self.task.mailbox)  # type: ignore[attr-defined]
            except BaseException:
                for _, _, keyed, _ in captures:
                    if keyed is not None:
                        keyed.discard()
                raise
        sync = time.perf_counter() - t0
        self._in_flight[cid] = captures
        await self.broadcast(barrier)
        previous, ended = self._previous_part, asyncio.Event()
        self._previous_part = ended
        if self.synchronous:
            # the barrier goes on first, so the tasks downstream drain and snapshot while
            # this one writes; this task reads nothing until its snapshot is written
            await _setting_when_done(ended, functools.partial(
                self._async_part, cid, captures, alignment, sync, previous, in_task=True))
        else:
            self.spawn(_setting_when_done(ended, functools.partial(
                self._async_part, cid, captures, alignment, sync, previous,
                in_flight=in_flight)))

    async def _async_part(
        self,
        cid: int,
        captures: list[_Capture],
        alignment: float,
        sync: float,
        previous: asyncio.Event | None,
        in_task: bool = False,
        in_flight: asyncio.Future[list[InFlightEntry]] | None = None,
    ) -> None:
        """Write the captured snapshot and acknowledge it (or decline the checkpoint).

        Acknowledgements leave in checkpoint order: with several checkpoints in flight a
        later part can finish writing first, and acknowledging it first could complete
        checkpoint n+1 before n, which the coordinator then aborts as subsumed (a fully
        written checkpoint lost, and a two-phase-commit sink committing n's transaction
        with n+1's notification). Only the acknowledgement waits; the writing does not.

        Args:
            previous: set when the task's previous asynchronous part has ended (see
                :func:`_setting_when_done`).
            in_task: run by the task itself (the synchronous baseline): the writing counts
                as synchronous time and the asynchronous part as 0.
            in_flight: an unaligned checkpoint's in-flight records (see
                :meth:`checkpoint_state`), written as the head operator's channel state.
        """
        coordinator = self.acknowledger
        assert coordinator is not None
        t0 = time.perf_counter()
        states: dict[str, OperatorSubtaskState] = {}
        size = 0
        try:
            for op, ctx, keyed, opstate in captures:
                keyed_state: KeyedStateHandle | None = None
                operator_state: StateHandle | None = None
                if keyed is not None:
                    # the backend's own JSON (the plug-in boundary), checked here: a handle
                    # the runtime cannot read declines the checkpoint, naming the operator
                    keyed_state = KeyedStateHandle.from_json(
                        await keyed.write(), f"keyed state of operator {op.uid!r}, "
                        f"subtask {self.task.subtask}")
                    size += keyed_state.size
                if opstate is not None:
                    path = ctx.exclusive_path(".opstate")
                    blob = opstate
                    # inline: a hop to a worker thread waits for the GIL held by the busy
                    # loop (measured ~100 ms under load), far longer than this small write
                    n, sha = write_atomic(path, [blob])
                    operator_state = StateHandle(
                        OPERATOR_STATE_FORMAT, (FileRef(ctx.relative(path), n, sha),))
                    size += n
                states[op.uid] = OperatorSubtaskState(
                    keyed_state, operator_state,
                    None if op.keyed_backend is None else op.keyed_backend.key_group_range)
            if in_flight is not None:
                entries = await in_flight
                if entries:
                    op, ctx = captures[0][0], captures[0][1]
                    path = ctx.exclusive_path(".inflight")
                    n, sha = write_atomic(path, [serialize_channel_state(entries)])
                    states[op.uid] = replace(states[op.uid], channel_state=StateHandle(
                        CHANNEL_STATE_FORMAT, (FileRef(ctx.relative(path), n, sha),)))
                    size += n
        except asyncio.CancelledError:
            # the attempt is being torn down: release what the synchronous part captured
            self._in_flight.pop(cid, None)
            for _, _, keyed, _ in captures:
                if keyed is not None:
                    keyed.discard()
            raise
        except Exception as exc:
            for _, _, keyed, _ in captures:
                if keyed is not None:
                    keyed.discard()
            if self._in_flight.pop(cid, None) is not None:
                coordinator.decline(cid, self.task, exc)
            # else the checkpoint was aborted, which discarded the captures: nothing to say
            return
        self._in_flight.pop(cid, None)
        if self.is_closed():
            # the task failed (or ended) while this part ran and its operators were closed:
            # a disposed heap backend serializes empty key groups, and acknowledging them
            # would complete a checkpoint that silently lost this instance's state
            coordinator.decline(cid, self.task, ReactiveError(
                f"task {self.task.task_id} closed during the asynchronous part of checkpoint {cid}"))
            return
        written = time.perf_counter() - t0
        stats = {"alignment": alignment, "sync": sync + written if in_task else sync,
                 "async": 0.0 if in_task else written, "size": float(size)}
        if previous is not None:
            # the files are written (and were complete when written): a close meanwhile
            # does not change them
            await previous.wait()
        await coordinator.acknowledge(cid, self.task, states, stats)

    async def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Mailbox action: checkpoint ``checkpoint_id`` completed (commit side effects)."""
        for op in self.operators:
            await maybe_await(op.notify_checkpoint_complete(checkpoint_id))

    async def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Mailbox action: checkpoint ``checkpoint_id`` was aborted: its asynchronous part,
        if it still runs, is discarded (it fails at its next step: the paced heap writer at
        its next piece, a forked writer's child is killed), then the operators are told."""
        for _, _, keyed, _ in self._in_flight.pop(checkpoint_id, ()):
            if keyed is not None:
                keyed.discard()
        for op in self.operators:
            await maybe_await(op.notify_checkpoint_aborted(checkpoint_id))


async def _setting_when_done(ended: asyncio.Event,
                             part: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run an asynchronous part, then set ``ended`` however it ended (acknowledged,
    declined, failed or cancelled): the task's next part acknowledges after it."""
    try:
        await part()
    finally:
        ended.set()
