"""The checkpoint coordinator (Flink's ``CheckpointCoordinator``).

It triggers checkpoint n by posting a barrier-injection action into every source task's
mailbox, collects one acknowledgement per task (sent when the task's asynchronous part has
written its files) in a :class:`~.pending_checkpoint.PendingCheckpoint`, and completes the
checkpoint by writing the metadata that one finalizes, atomically; only then does it notify
every task (``notify_checkpoint_complete``), which commits pending side effects. A
checkpoint that times out or is declined is aborted; after ``tolerable_failed_checkpoints``
consecutive failures the job fails. Source: Carbone et al., "Lightweight Asynchronous
Snapshots for Distributed Dataflows" (2015), section 3, and Carbone 2018 (PhD thesis),
section 4.5.

A *savepoint* is a checkpoint triggered with kind ``"savepoint"``: its barriers tell the
backends to write self-contained snapshots (``SnapshotContext.savepoint``: no shared files),
and its metadata is written with paths relative to its own directory (``self_contained``),
so it can be moved and restored anywhere, at another parallelism (Carbone 2018 (PhD thesis),
section 4.2). As in Flink 1.15+, an intermediate savepoint does not commit side effects
(``commit=False``: the tasks are not notified; the next completed checkpoint commits what it
pre-committed), so that a failover to the previous checkpoint cannot replay records a savepoint
already committed; stop-with-savepoint commits (``commit=True``), since the job ends with it.

Whoever must not move on before side effects are committed (stop-with-savepoint, the job's
final checkpoint) waits with ``await_commit=True``: the checkpoint's ``committed`` future
resolves when every task has run its ``notify_checkpoint_complete`` (Flink waits for
``notifyCheckpointComplete`` of the final/synchronous savepoint the same way). When the
attempt ends, :meth:`shutdown` fails every future still pending, so no caller hangs.

With ``mode="synchronous"`` (the baseline of the ABS paper's evaluation, Carbone 2018 (PhD
thesis), section 3.4.2) the coordinator halts the sources right behind the barriers until the
checkpoint completes or is aborted, and the tasks write their snapshots before they go on
(:mod:`reactive.checkpoint.synchronous_snapshots`).

No file work runs on the event loop (it is the application's loop too): the metadata is
written and fsynced, aborted checkpoints are discarded and retention deletes files in worker
threads (:mod:`.off_loop`), like Flink's coordinator hands them to its ``ioExecutor``. The
order still holds across those awaits: a checkpoint counts as completed (``latest_completed``,
notifications, ``done``) only after its ``_metadata`` is durable; it keeps its concurrency
slot until then, so no checkpoint is triggered in between; completions are finalized one at a
time and in id order (a checkpoint whose turn comes after a newer one completed is subsumed,
as a pending one would be); retention runs after, on its own lock (see
:mod:`.completed_checkpoint_store`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..awaiting import wait_with_timeout
from ..config import CheckpointConfig
from ..errors import (
    CheckpointError,
    CheckpointProgressError,
    ConfigurationError,
    StateSerializationError,
)
from .barrier import CheckpointBarrier
from .checkpointable_task import CheckpointableTask
from .completed_checkpoint_store import CompletedCheckpointStore
from .contract import OperatorSubtaskState, Reconfiguration
from .failure_reason import CheckpointFailureReason
from .metadata import CompletedCheckpoint
from .off_loop import in_thread, wait_all
from .pending_checkpoint import OperatorInfo, PendingCheckpoint, TaskAcknowledgeResult
from .stats import CheckpointStats
from .storage import CheckpointStorage
from .synchronous_snapshots import halt_sources

__all__ = ["CheckpointCoordinator", "OperatorInfo", "PendingCheckpoint"]

log = logging.getLogger(__name__)


class CheckpointCoordinator:
    """Triggers, tracks, completes and aborts the checkpoints of one job attempt.

    Args:
        config: the checkpoint configuration.
        storage: where checkpoints are written.
        job_name: the dataflow's name.
        max_parallelism: stored in the metadata; a restore checks it.
        operators: every operator of the job.
        first_id: id of the first checkpoint of this attempt (ids never repeat per job).
        history: list the statistics of each checkpoint are appended to.
        run_id: the run (one ``Dataflow.start``) the checkpoints belong to; stored in the
            metadata so failover restores only this run's lineage.
        store: the job's completed checkpoints, already read (``CompletedCheckpointStore.open``
            reads them off the loop); None reads them here, on the calling thread.

    Attributes:
        rescaled: the parallelism of the operators a ``job.rescale`` of the run changed,
            by uid (set by the job's runner; every checkpoint's metadata records it).
    """

    def __init__(
        self,
        config: CheckpointConfig,
        storage: CheckpointStorage,
        job_name: str,
        max_parallelism: int,
        operators: Sequence[OperatorInfo],
        first_id: int,
        history: list[CheckpointStats],
        run_id: str = "",
        store: CompletedCheckpointStore | None = None,
    ) -> None:
        self.config = config
        self.storage = storage
        self.job_name = job_name
        self.max_parallelism = max_parallelism
        self.operators = {op.uid: op for op in operators}
        self.next_id = first_id
        self.history = history
        self.run_id = run_id
        self.rescaled: Mapping[str, int] = {}
        # checkpoints completed with commit=True whose notifications have not all run yet
        self._committing: dict[int, PendingCheckpoint] = {}
        # all acknowledged, _metadata being written: out of `pending` (nothing may abort it
        # now) but still holding a concurrency slot, and failed by shutdown()
        self._finalizing: dict[int, PendingCheckpoint] = {}
        self._finalize_lock = asyncio.Lock()
        self.store = store if store is not None else CompletedCheckpointStore(
            storage, config.retained)
        self.store.in_flight = self._in_flight
        # discards of aborted checkpoints running in worker threads (run() waits for them)
        self._file_work: set[asyncio.Task[None]] = set()
        # set once run() removed the orphaned shared files: no checkpoint before that (an
        # upload may re-create a file of the same name while it is being deleted)
        self._ready = asyncio.Event()
        self.tasks: list[CheckpointableTask] = []
        self.sources: list[CheckpointableTask] = []
        # tasks replaced by a rescale at its barrier, with the id of that rescale's
        # checkpoint: they are still told about the checkpoints up to it (see retire)
        self._retiring: tuple[int, list[CheckpointableTask]] | None = None
        self.pending: dict[int, PendingCheckpoint] = {}
        self.consecutive_failures = 0
        # why the consecutive failures failed, counted per reason (for the job's error)
        self._failure_streak: dict[CheckpointFailureReason, int] = {}
        self.latest_completed: CompletedCheckpoint | None = None
        self._periodic = config.interval is not None
        # the job is finishing: the final checkpoint is aligned
        self._finishing = False
        self._stopped = asyncio.Event()
        self._failure: CheckpointError | None = None
        self._slot_free = asyncio.Event()
        self._slot_free.set()
        self.synchronous = config.mode == "synchronous"

    def attach(self, tasks: Sequence[CheckpointableTask],
               operators: Sequence[OperatorInfo] | None = None) -> None:
        """Register the job's tasks (sources are those with a source operator) and, when
        given, its operators (known once the execution graph made their instances; None
        keeps those given to the constructor)."""
        if operators is not None:
            self.operators = {op.uid: op for op in operators}
        self.tasks = list(tasks)
        self.sources = [t for t in tasks if t.source is not None]
        if self.config.unaligned and any(t.is_iteration_head for t in tasks):
            raise ConfigurationError(
                "unaligned checkpoints do not support iterations: the loop head logs its "
                "back edge between aligned barriers (CheckpointConfig(unaligned=False))")

    def retire(self, tasks: Sequence[CheckpointableTask], checkpoint_id: int) -> None:
        """``tasks`` are being replaced (a rescale that starts its new tasks at the barrier
        of ``checkpoint_id``, before that checkpoint completed): they acknowledge the
        checkpoints up to it and, besides the tasks :meth:`attach` registers next, are
        told when those complete (their sinks commit their pre-committed transactions) or
        are aborted. :meth:`retired` ends that."""
        self._retiring = (checkpoint_id, list(tasks))

    def retired(self, tasks: Sequence[CheckpointableTask]) -> None:
        """``tasks``, given to :meth:`retire`, have ended (a later :meth:`retire` of other
        tasks stays)."""
        if self._retiring is not None and self._retiring[1] == list(tasks):
            self._retiring = None

    def _told(self, checkpoint_id: int) -> list[CheckpointableTask]:
        """The tasks told about ``checkpoint_id``'s completion or abort."""
        retiring = self._retiring
        if retiring is not None and checkpoint_id <= retiring[0]:
            return [*retiring[1], *self.tasks]
        return self.tasks

    # ------------------------------------------------------------------ triggering
    async def run(self) -> None:
        """Trigger periodic checkpoints and enforce timeouts until :meth:`stop`.

        Raises:
            CheckpointError: after too many consecutive failed checkpoints.
        """
        try:
            await self.store.remove_orphans()
        except OSError as exc:  # housekeeping: never fail the job for it
            log.warning("removing unreferenced shared files failed: %s", exc)
        finally:
            self._ready.set()
        try:
            await self._trigger_loop()
        finally:
            # discards still running in threads end with the attempt, not after it
            await wait_all(self._file_work)

    async def _trigger_loop(self) -> None:
        interval = self.config.interval
        next_trigger = time.monotonic() + (interval or 0.0)
        tick = min(0.05, interval) if interval else 0.05
        while not self._stopped.is_set():
            if self._failure is not None:
                raise self._failure
            now = time.monotonic()
            for p in list(self.pending.values()):
                if now >= p.deadline:
                    self.abort(p.checkpoint_id, CheckpointFailureReason.CHECKPOINT_EXPIRED,
                               f"timed out after {self.config.timeout} s")
            if self._periodic and interval and now >= next_trigger:
                if self._slots_taken() < self.config.max_concurrent:
                    self.trigger()
                next_trigger = now + interval
            # never wait_for: it can swallow the attempt's cancellation (see cancellation)
            await wait_with_timeout(self._stopped.wait(), tick)
        if self._failure is not None:
            raise self._failure

    def stop(self) -> None:
        """Stop triggering; pending checkpoints are left to finish or be dropped."""
        self._periodic = False
        self._stopped.set()

    @property
    def failure(self) -> CheckpointError | None:
        """The error that stopped the coordinator (too many failed checkpoints, state that
        cannot be serialized), or None."""
        return self._failure

    def stop_periodic(self) -> None:
        """Stop periodic triggers (the job is finishing) but keep enforcing timeouts."""
        self._periodic = False
        self._finishing = True

    def trigger(self, kind: str = "checkpoint", commit: bool = True,
                updates: tuple[Any, ...] = (),
                reconfigurations: tuple[Reconfiguration, ...] = (),
                rescaled: Mapping[str, int] | None = None) -> PendingCheckpoint:
        """Inject barrier n into every source task and return the pending checkpoint.

        Args:
            kind: ``"checkpoint"`` or ``"savepoint"``.
            commit: notify the tasks on completion (see the module docstring).
            updates: a reconfiguration the barrier carries (``CheckpointBarrier.updates``).
            reconfigurations: how its metadata records them.
            rescaled: a rescale's new :attr:`rescaled`, recorded by this checkpoint and,
                once it completed, by every later one (None: unchanged).
        """
        cid = self.next_id
        self.next_id += 1
        now = time.monotonic()
        stats = CheckpointStats(cid, kind=kind, trigger_time=time.time())
        pending = PendingCheckpoint(
            cid, kind, now + self.config.timeout, time.perf_counter(),
            {t.task_id for t in self.tasks}, stats, commit, self.operators,
            reconfigurations, self.rescaled if rescaled is None else dict(rescaled),
        )
        self.pending[cid] = pending
        self.history.append(stats)
        if self._slots_taken() >= self.config.max_concurrent:
            self._slot_free.clear()
        # savepoints, the final checkpoint and a reconfiguration stay aligned (see
        # reactive.runtime.unaligned): the records a barrier overtook would otherwise
        # meet the new version though they are before it
        unaligned = (self.config.unaligned and kind == "checkpoint" and not self._finishing
                     and not updates)
        barrier = CheckpointBarrier(cid, stats.trigger_time, "savepoint" if kind == "savepoint"
                                    else "checkpoint", unaligned, updates)
        for task in self.sources:
            task.post(functools.partial(task.trigger_checkpoint, barrier))
        if self.synchronous:
            # halted right behind the barrier until the checkpoint completes or is aborted
            halt_sources(self.sources, pending.done)
        return pending

    async def checkpoint(
        self,
        kind: str = "checkpoint",
        *,
        commit: bool = True,
        on_trigger: Callable[[], None] | None = None,
        await_commit: bool = False,
        updates: tuple[Any, ...] = (),
        reconfigurations: tuple[Reconfiguration, ...] = (),
        rescaled: Mapping[str, int] | None = None,
    ) -> CompletedCheckpoint:
        """Trigger a checkpoint (when a concurrency slot is free) and wait for completion.

        Args:
            kind: ``"checkpoint"`` or ``"savepoint"``.
            commit: notify the tasks on completion (False: an intermediate savepoint).
            on_trigger: called right after the barrier-injection actions were posted to the
                source tasks (synchronously, so an action it posts runs right after them;
                stop-with-savepoint parks the sources this way).
            await_commit: with ``commit``, return only after every task has finished its
                ``notify_checkpoint_complete`` (its commits).
            updates, reconfigurations, rescaled: a reconfiguration its barrier carries
                (see :meth:`trigger`).

        Raises:
            CheckpointError: if it is aborted, the coordinator is stopped, or the attempt
                ends (fails, is cancelled) before it completed (or, with ``await_commit``,
                before every commit ran).
        """
        if self._stopped.is_set():
            raise CheckpointError("the job is finishing or stopped: no more checkpoints")
        await self._ready.wait()
        while self._slots_taken() >= self.config.max_concurrent or self._stopped.is_set():
            if self._stopped.is_set():
                raise CheckpointError("the job is finishing or stopped: no more checkpoints")
            self._slot_free.clear()
            await self._slot_free.wait()
        pending = self.trigger(kind, commit, updates, reconfigurations, rescaled)
        if on_trigger is not None:
            on_trigger()
        completed = await pending.done
        if commit and await_commit:
            await pending.committed
        return completed

    # ------------------------------------------------------------------ acknowledgements
    async def acknowledge(
        self,
        checkpoint_id: int,
        task: CheckpointableTask,
        states: Mapping[str, OperatorSubtaskState],
        stats: Mapping[str, float],
    ) -> None:
        """A task finished its snapshot for ``checkpoint_id``; complete when it is the last.

        Args:
            states: the state of each of the task's operator instances, by operator uid.
            stats: the task's figures (see :meth:`PendingCheckpoint.acknowledge`).
        """
        p = self.pending.get(checkpoint_id)
        if p is None:
            return  # aborted meanwhile
        result = p.acknowledge(task.task_id, task.subtask, states, stats)
        if result is TaskAcknowledgeResult.SUCCESS and p.is_fully_acknowledged:
            await self._complete(p)

    async def _complete(self, p: PendingCheckpoint) -> None:
        self.pending.pop(p.checkpoint_id, None)
        self._finalizing[p.checkpoint_id] = p
        try:
            # one at a time, in arrival order: a second completion must not interleave its
            # "abort the older pending ones" or its notifications with this one's
            async with self._finalize_lock:
                completed = await self._finalize(p)
        finally:
            self._finalizing.pop(p.checkpoint_id, None)
            self._free_slot()
        if completed is None:
            return
        log.debug("completed checkpoint %d in %.3f s (%d bytes)", p.checkpoint_id,
                  p.stats.duration, p.stats.size)
        try:
            # registration happens at the call, before any other task runs; the deletions
            # run in threads, one pass at a time (the store's own lock)
            await self.store.add(completed)
        except OSError as exc:  # retention is housekeeping: never fail the job for it
            log.warning("checkpoint retention failed: %s", exc)

    async def _finalize(self, p: PendingCheckpoint) -> CompletedCheckpoint | None:
        """Write ``p``'s metadata durably, then make it the latest completed checkpoint and
        notify the tasks; None when it failed or was subsumed meanwhile."""
        latest = self.latest_completed
        if latest is not None and latest.checkpoint_id > p.checkpoint_id:
            # a newer checkpoint finalized while this one waited for its turn: completing
            # this one now would make an older state "latest" (a pending one would have been
            # aborted as subsumed by that completion; so is this one)
            self._fail_pending(p, CheckpointFailureReason.CHECKPOINT_SUBSUMED,
                               f"subsumed by checkpoint {latest.checkpoint_id}")
            return None
        try:
            metadata = p.finalize(
                job=self.job_name, max_parallelism=self.max_parallelism,
                mode=self.config.mode, run_id=self.run_id,
                checkpoint_dir_name=self.storage.checkpoint_dir(p.checkpoint_id).name)
        except CheckpointError as exc:
            self._fail_pending(p, CheckpointFailureReason.FINALIZE_CHECKPOINT_FAILURE,
                               str(exc))
            return None
        try:
            # in a worker thread (write, fsync, rename, fsync of the directory): the loop
            # keeps running the tasks and the application meanwhile. Nothing below happens
            # before the metadata is durable: that is what makes the checkpoint completed
            path = await in_thread(self.storage.write_metadata, p.checkpoint_id, metadata)
        except OSError as exc:
            self._fail_pending(p, CheckpointFailureReason.IO_EXCEPTION,
                               f"writing the metadata failed: {exc}")
            return None
        completed = CompletedCheckpoint(p.checkpoint_id, path, metadata)
        self.latest_completed = completed
        # a rescale is in effect from its checkpoint on (no later checkpoint was triggered
        # while it was pending: a reconfiguration takes every slot)
        self.rescaled = p.rescaled
        self.consecutive_failures = 0
        self._failure_streak.clear()
        for older in [cid for cid in self.pending if cid < p.checkpoint_id]:
            self.abort(older, CheckpointFailureReason.CHECKPOINT_SUBSUMED,
                       f"subsumed by checkpoint {p.checkpoint_id}")
        if p.commit:
            self._committing[p.checkpoint_id] = p
            told = self._told(p.checkpoint_id)
            # by identity: a retiring task and its successor may share a display name
            waiting = {id(t) for t in told}
            for task in told:
                task.post(functools.partial(self._notify_complete, task, p, waiting))
        # resolved after the notifications are queued, so whoever waits for this checkpoint
        # (e.g. the final one) acts after every task was told to commit
        p.complete(completed)
        return completed

    async def _notify_complete(self, task: CheckpointableTask, p: PendingCheckpoint,
                               waiting: set[int]) -> None:
        """Mailbox action: the task commits; the last one resolves ``p.committed``."""
        await task.notify_checkpoint_complete(p.checkpoint_id)
        waiting.discard(id(task))
        if not waiting:
            self._committing.pop(p.checkpoint_id, None)
            if not p.committed.done():
                p.committed.set_result(None)

    def shutdown(self, reason: str) -> None:
        """The attempt ends: stop, and fail every checkpoint and commit still awaited.

        Called by the job when the attempt's task group exits (failure, cancellation or
        finish), so ``job.checkpoint()``, ``savepoint`` and ``stop`` never wait forever.
        """
        self.stop()
        self._ready.set()
        error = CheckpointError(reason)
        for p in [*self.pending.values(), *self._finalizing.values(),
                  *self._committing.values()]:
            if p.stats.status == "pending":
                p.stats.status = "aborted"
                p.stats.failure = CheckpointFailureReason.CHECKPOINT_COORDINATOR_SHUTDOWN.message
                p.stats.failure_reason = CheckpointFailureReason.CHECKPOINT_COORDINATOR_SHUTDOWN.name
            p.fail_waiters(error)
        self.pending.clear()
        self._finalizing.clear()
        self._committing.clear()
        self._slot_free.set()

    def decline(self, checkpoint_id: int, task: CheckpointableTask, reason: BaseException,
                failure_reason: CheckpointFailureReason = CheckpointFailureReason.CHECKPOINT_DECLINED
                ) -> None:
        """A task could not snapshot: abort the checkpoint.

        Args:
            failure_reason: ``CHECKPOINT_DECLINED_SUBSUMED`` when a newer checkpoint's barrier
                overtook it at the task (it does not count towards
                ``tolerable_failed_checkpoints``).
        """
        log.warning("task %s declined checkpoint %d: %r", task.task_id, checkpoint_id, reason)
        self.abort(checkpoint_id, failure_reason,
                   f"declined by {task.task_id}: {type(reason).__name__}: {reason}")
        if isinstance(reason, StateSerializationError):
            # deterministic: every later checkpoint would fail the same way, so the job
            # fails now rather than running on to a final checkpoint that cannot succeed
            self._failure = reason
            self._stopped.set()

    def abort(self, checkpoint_id: int, reason: CheckpointFailureReason, detail: str = "") -> None:
        """Abort a pending checkpoint: drop its files and tell the tasks.

        Args:
            reason: why; whether it counts as a failure is the reason's.
            detail: what happened, in words (default: the reason's message).
        """
        p = self.pending.get(checkpoint_id)
        if p is None:
            return
        self._fail_pending(p, reason, detail)

    def _fail_pending(self, p: PendingCheckpoint, why: CheckpointFailureReason,
                      detail: str = "") -> None:
        reason = detail or why.message
        self.pending.pop(p.checkpoint_id, None)
        p.abort(why, reason)
        self._discard_in_background(p.checkpoint_id)
        self._free_slot()
        for task in self._told(p.checkpoint_id):
            task.post(functools.partial(task.notify_checkpoint_aborted, p.checkpoint_id))
        log.warning("checkpoint %d aborted: %s", p.checkpoint_id, reason)
        if why.counts_as_failure:
            self.consecutive_failures += 1
            self._failure_streak[why] = self._failure_streak.get(why, 0) + 1
            if self.consecutive_failures > self.config.tolerable_failed_checkpoints:
                self._failure = self._too_many_failures(reason)
                self._stopped.set()

    def _too_many_failures(self, last: str) -> CheckpointError:
        """The error that fails the attempt after too many consecutive failed checkpoints:
        a :class:`~reactive.errors.CheckpointProgressError` when none completed in this
        attempt (a restart would repeat it), naming the reasons."""
        reasons = ", ".join(f"{n} {why.message}" for why, n in self._failure_streak.items())
        text = (f"{self.consecutive_failures} consecutive checkpoints failed (tolerable: "
                f"{self.config.tolerable_failed_checkpoints}: {reasons}); last: {last}")
        if self.latest_completed is not None:
            return CheckpointError(text)
        hint = ""
        if CheckpointFailureReason.CHECKPOINT_EXPIRED in self._failure_streak:
            hint = (" Checkpoints that time out while the job runs are usually stuck behind "
                    "backpressure: a barrier waits behind every record queued in front of "
                    "a slow operator or sink; raise CheckpointConfig.timeout, speed up "
                    "the slow step, or take unaligned checkpoints "
                    "(CheckpointConfig(unaligned=True)).")
        return CheckpointProgressError(
            f"no checkpoint completed in this job attempt: {text}. A restart would restore "
            "the same state and repeat the attempt, so the job fails." + hint)

    def _discard_in_background(self, checkpoint_id: int) -> None:
        """Remove an aborted checkpoint's directory in a worker thread.

        Its id is never used again, so nothing can write a newer checkpoint there; a task's
        asynchronous part still writing into it meanwhile only delays the removal (the next
        retention pass removes what it re-created). Until it is gone, the directory counts as
        a checkpoint in flight, which only defers deleting shared files.
        """
        task = asyncio.get_running_loop().create_task(
            in_thread(self.storage.discard, checkpoint_id))
        self._file_work.add(task)
        task.add_done_callback(self._file_work_done)

    def _file_work_done(self, task: asyncio.Task[None]) -> None:
        self._file_work.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("removing an aborted checkpoint failed: %s", task.exception())

    def _in_flight(self) -> bool:
        """A checkpoint is triggered and not completed or aborted yet."""
        return bool(self.pending or self._finalizing)

    def _slots_taken(self) -> int:
        taken = len(self.pending) + len(self._finalizing)
        if any(p.reconfigurations for p in (*self.pending.values(), *self._finalizing.values())):
            # a checkpoint carrying a reconfiguration takes every slot: a later one
            # completing first would subsume it and commit output of the new version under
            # a checkpoint that does not record the reconfiguration
            return max(taken, self.config.max_concurrent)
        return taken

    def _free_slot(self) -> None:
        if self._slots_taken() < self.config.max_concurrent:
            self._slot_free.set()
