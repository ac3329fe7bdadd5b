"""Running a job's attempts: wiring each one, choosing what it restores, and the final
checkpoint (the runner behind the :class:`~reactive.runtime.job.Job` handle).

A :class:`JobRunner` runs attempts until one finishes. Each attempt builds the execution
graph, restores the latest completed checkpoint (or the one asked for), and runs every task,
the checkpoint coordinator and the asynchronous snapshot parts in one ``asyncio.TaskGroup``:
the first failure cancels everything else in the attempt (structured concurrency). The
restart strategy then decides whether a new attempt starts from the latest completed
checkpoint (:mod:`reactive.checkpoint.lineage` selects it) or the failure reaches the caller
as :class:`~reactive.errors.JobFailedError`. When every source has ended, the runner takes
the final checkpoint (Flink's FLIP-147) and lets end-of-input flow through the graph.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..checkpoint.completed_checkpoint_store import CompletedCheckpointStore
from ..checkpoint.coordinator import CheckpointCoordinator
from ..checkpoint.lineage import (
    ReplayPolicy,
    lineage_candidates,
    resume_candidates,
    select_restore,
)
from ..checkpoint.metadata import CompletedCheckpoint
from ..checkpoint.off_loop import in_thread
from ..checkpoint.state_assignment_operation import StateAssignmentOperation
from ..checkpoint.storage import CheckpointStorage
from ..config import CheckpointConfig, RestartStrategy
from ..errors import (
    CheckpointError,
    CheckpointProgressError,
    ConfigurationError,
    JobFailedError,
    ReactiveError,
    ReconfigurationError,
    RestoreError,
    StateSerializationError,
)
from ..state.backend import StateBackend
from ..two_phase_commit import TwoPhaseCommitSink
from .execution_graph import ExecutionGraph, parallelism_of
from .handover import StateHandOver, StateTransfer
from .metrics import JobMetrics
from .reconfiguration import FunctionUpdate, OperatorChange, apply_updates
from .rescale import (
    RescaleSwitch,
    RunningAttempt,
    handover_refused,
    outcome_of,
    plan_rescale,
    switch_at_barrier,
    switch_waits,
)
from .state_query import StateQueryError
from .task import StreamTask, TaskEnvironment

if TYPE_CHECKING:
    from ..graph import LogicalGraph

__all__ = ["JobOptions", "JobRunner", "JobStatus"]

log = logging.getLogger(__name__)

JobStatus = Literal["created", "running", "restarting", "finished", "failed", "cancelled",
                    "stopped"]


@dataclass(frozen=True)
class JobOptions:
    """The options of ``Dataflow.start`` (see there)."""

    checkpoints: CheckpointConfig | None
    restart: RestartStrategy
    state_backend: StateBackend | None
    resume: bool
    restore_from: Path | None
    allow_non_restored_state: bool = False
    allow_replayed_output: bool = False



# Failures that a restart would only repeat: the job fails at once with the reason (a
# restore that cannot be honoured must never turn into a fresh start or a retry loop).
_NOT_RESTARTABLE = (RestoreError, StateSerializationError, ConfigurationError,
                    CheckpointProgressError)


def _not_restartable(exc: BaseException) -> bool:
    """True when ``exc``, or what it wraps (a user-function error around a key that has no
    canonical encoding, say), is a failure a restart would only repeat."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, _NOT_RESTARTABLE):
            return True
        seen.add(id(cur))
        cur = cur.__cause__
    return False


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in _leaves(e)]
    return [exc]


def _root_cause(exc: BaseException) -> BaseException:
    """The failure that ended an attempt, out of (nested) exception groups.

    A failure that no restart can fix wins over the errors it caused elsewhere (e.g. the
    final checkpoint failing because the coordinator stopped on that failure).
    """
    leaves = _leaves(exc)
    real = [e for e in leaves if not isinstance(e, asyncio.CancelledError)]
    for e in real:
        if _not_restartable(e):
            return e
    return real[0] if real else leaves[0]


class JobRunner:
    """The attempts of one run (one ``Dataflow.start``), behind its :class:`Job` handle.

    Args:
        flow: the logical graph.
        options: the run's options.
        storage: checkpoint storage, None without checkpointing.
        run_id: the run's id (see ``Job.run_id``).
        metrics: the job's metrics, updated as attempts run.
        tap_sinks: called with an attempt's tasks before they run (the handle taps the
            sinks its results iterators read).
        recover_results: called with the checkpoint id a restart restores (None: from the
            start of the input), see ``CommittedResults.recover``.

    Attributes:
        status: the job's status (``JobStatus``).
        restored_from: the checkpoint the latest attempt restored, if any.
        initial: the checkpoint this run's lineage starts from, once ``restore_chosen`` is
            set.
        coordinator: the running attempt's checkpoint coordinator, if any.
        tasks: the running attempt's tasks.
        running: set once an attempt runs.
        restore_chosen: set once the run knows the checkpoint it starts from (or that it
            starts fresh).
        live_queries: live state lookups waiting for a task's answer; failed when the
            attempt ends.
        cancel_requested: ``cancel()`` (or ``stop()``) was called: a failure while the
            attempt winds down ends the run as cancelled, never restarts it.
        updates: the function updates of this run, each with the id of the checkpoint that
            carried it, oldest first (the run's version history: an attempt restoring
            checkpoint n runs every update carried by a checkpoint <= n; Carbone 2018 (PhD
            thesis), section 4.5.5).
        parallelism: the running (or next) attempt's parallelism of each operator, by uid.
        rescale_phases: per completed ``rescale`` of the run, seconds spent in each phase
            of its switch. Switched after the commits: ``teardown`` (the old tasks end),
            ``prepare`` (checkpoint store, state assignment, the new graph built),
            ``restore`` (the checkpoint's state read into the new instances) or
            ``hand-over`` (the state handed over in memory taken over), ``start`` (until
            the new tasks run). Switched at the barrier: ``barrier`` (from the call until
            every old task took its snapshot's synchronous part), ``prepare`` (the new
            graph built), ``hand-over``, ``start`` (the new tasks created).
        rescale_transfers: per completed ``rescale`` of the run, its checkpoint id and how
            the new instances got their state: ``"in memory"`` (handed over at the barrier,
            :mod:`.handover`) or ``"checkpoint restored: <why>"``.
        rescale_started: per completed ``rescale``, the ``time.perf_counter()`` at which
            its new tasks were created.
        switch_at_barrier: a rescale handed over in memory starts the new tasks at its
            barrier where it can (:meth:`rescale`); False makes it wait for its checkpoint
            and its commits (the baseline ``bench.rescale`` compares against).
    """

    def __init__(self, flow: LogicalGraph, options: JobOptions,
                 storage: CheckpointStorage | None, run_id: str, metrics: JobMetrics,
                 tap_sinks: Callable[[list[StreamTask]], None],
                 recover_results: Callable[[int | None], None]) -> None:
        self.flow = flow
        self.options = options
        self.name = flow.name
        self.storage = storage
        self.run_id = run_id
        self.metrics = metrics
        self.status: JobStatus = "created"
        self.restored_from: CompletedCheckpoint | None = None
        # where this run's lineage starts, and the first checkpoint id it may use
        self.initial: CompletedCheckpoint | None = None
        self._first_id = 1
        self._next_id = 1
        self.coordinator: CheckpointCoordinator | None = None
        self.tasks: list[StreamTask] = []  # the running attempt's tasks
        self.restore_chosen = asyncio.Event()
        self.running = asyncio.Event()
        self.live_queries: set[asyncio.Future[Any]] = set()
        self.cancel_requested = False
        self.updates: list[tuple[int, FunctionUpdate | OperatorChange]] = []
        self.parallelism = parallelism_of(flow.transformations, flow.parallelism)
        # a rescale in progress: the checkpoint the next attempt restores, and the future
        # resolved once that attempt runs
        self._switch_to: CompletedCheckpoint | None = None
        self._switched: asyncio.Future[None] | None = None
        self.rescale_phases: list[dict[str, float]] = []
        self.rescale_transfers: list[tuple[int, str]] = []
        self.rescale_started: list[float] = []
        self.switch_at_barrier = True
        self._phases: dict[str, float] | None = None
        self._phase_start = 0.0
        self.attempt: RunningAttempt | None = None
        self.tap_sinks = tap_sinks
        self._recover_results = recover_results

    # ------------------------------------------------------------------ restore selection
    def _replay_policy(self) -> ReplayPolicy:
        """What the job's sinks allow when a restore falls back past committed output."""
        exactly_once, dedup = [], []
        for t in self.flow.transformations:
            sink = t.sink
            if sink is None or not getattr(sink, "exactly_once", False):
                continue
            label = f"{t.name} (uid {t.resolved_uid!r})"
            if getattr(sink, "deduplicates_by_checkpoint_id", False):
                dedup.append(label)
            else:
                exactly_once.append(label)
        return ReplayPolicy(self.options.allow_replayed_output, exactly_once, dedup)

    def _initial_restore(self) -> CompletedCheckpoint | None:
        """The checkpoint this run starts from (see ``reactive.checkpoint.lineage``)."""
        o = self.options
        if o.restore_from is not None:
            return CheckpointStorage.load(o.restore_from)
        if o.resume and self.storage is not None:
            return select_restore(resume_candidates(self.storage), self._replay_policy(),
                                  "resume")
        return None

    def _failover_restore(self) -> CompletedCheckpoint | None:
        """The newest checkpoint of this run's lineage that can be restored, if any."""
        if self.storage is None:
            return None
        return select_restore(
            lineage_candidates(self.storage, self.run_id, self._first_id, self.initial),
            self._replay_policy(), "failover")

    def _overrides(self, restore: CompletedCheckpoint | None) -> dict[str, int]:
        """The parallelism a restore of ``restore`` runs at, where it is not the program's:
        what the checkpoint recorded (``CheckpointMetadata.rescaled``), except for the
        checkpoint a ``restore_from`` names, which runs as the program says."""
        if restore is None or (self.options.restore_from is not None
                               and restore is self.initial):
            return {}
        known = {t.resolved_uid for t in self.flow.transformations}
        return {uid: p for uid, p in restore.metadata.rescaled.items() if uid in known}

    def _phase(self, name: str) -> None:
        """A phase of a rescale's switch ended (nothing when no switch runs)."""
        if self._phases is not None:
            now = time.perf_counter()
            self._phases[name] = now - self._phase_start
            self._phase_start = now

    def _resumable(self) -> bool:
        """Whether ``resume=True`` has a completed checkpoint to continue from: one this run
        completed, or the one a resume started it from (a run that completed none leaves the
        run before it to resume)."""
        return self.storage is not None and (
            bool(self.metrics.completed_checkpoints)
            or (self.initial is not None and self.options.restore_from is None))

    async def _forget_if_nothing_completed(self) -> None:
        """A run that failed (was not killed) before completing any checkpoint committed no
        output: drop its run record, so ``resume`` continues the run before it (e.g. after
        a fresh run refused to start over the committed output of that run)."""
        if self.storage is not None and not self.metrics.totals.completed:
            try:
                await in_thread(self.storage.forget_run, self.run_id)
            except OSError as exc:
                log.warning("could not remove the record of run %s: %s", self.run_id, exc)

    def fail_attempt(self, reason: BaseException) -> None:
        """Fail the running attempt with ``reason`` (raised in one of its tasks, between two
        batches): the restart strategy then restores the last completed checkpoint."""
        def fail() -> None:
            raise reason

        if self.tasks:
            self.tasks[0].post(fail)

    # ------------------------------------------------------------------ attempts
    async def run_all_attempts(self) -> None:
        """Choose the checkpoint the run starts from, then run attempts until one finishes
        or the restart strategy gives up.

        Raises:
            JobFailedError: the run failed for good (``__cause__`` is the failure).
            asyncio.CancelledError: the run was cancelled (also for a failure while it wound
                down after ``cancel_requested``).
        """
        # the file work of choosing a restore (reading metadata, hashing every file it
        # references), of the run record (write, fsync) and of listing the directory runs in
        # worker threads: the loop may be the application's, and it keeps running meanwhile
        o = self.options
        try:
            # a hop only when there is file work: a job without one reaches its sources in
            # the same loop turn as before
            restore = await in_thread(self._initial_restore) \
                if o.restore_from is not None or (o.resume and self.storage is not None) \
                else None
        except ReactiveError as exc:
            self.status = "failed"
            raise JobFailedError(self.name, 1, exc) from exc
        self.initial = restore
        self.restore_chosen.set()
        # checkpoint ids continue after the restored one and after every id on disk, so
        # no id (and no file named after one, like a sink's part-<subtask>-<id>) repeats
        on_disk = await in_thread(self.storage.latest_id) if self.storage is not None else 0
        self._first_id = self._next_id = max(
            on_disk, restore.checkpoint_id if restore is not None else 0) + 1
        if self.storage is not None:
            try:
                # before any checkpoint: a later resume must find where this run started
                await in_thread(self.storage.record_run, self.run_id, self._first_id, restore)
            except OSError as exc:
                self.status = "failed"
                raise JobFailedError(self.name, 1, exc) from exc
        try:
            await self._run_attempts(restore)
        finally:
            switched, self._switched = self._switched, None
            if switched is not None and not switched.done():
                switched.set_exception(ReconfigurationError(
                    f"job {self.name!r} ended ({self.status}) before the rescaled job ran"))
                switched.exception()  # retrieved: the rescale may have stopped waiting

    async def _run_attempts(self, restore: CompletedCheckpoint | None) -> None:
        attempt = 0
        strategy = self.options.restart
        handover: StateHandOver | None = None
        while True:
            attempt += 1
            try:
                await self._run_attempt(restore, handover)
                self.status = "finished"
                return
            except asyncio.CancelledError:
                self.status = "cancelled"
                raise
            except BaseException as exc:
                handover = None
                cause = _root_cause(exc)
                if isinstance(cause, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
                    raise
                if self.cancel_requested:
                    # the job was cancelled and a task failed while the attempt wound down
                    # (e.g. a source's clean-up, or an asynchronous snapshot part spawned
                    # into the closing task group): Python 3.11's TaskGroup raises that
                    # error instead of the cancellation, but a cancel must never turn into a
                    # restart. A flag, not Task.cancelling(): on 3.11 a TaskGroup whose child
                    # fails while it waits in __aexit__ leaves its own cancel request on the
                    # job's task, so cancelling() counts failures too.
                    log.debug("job %r: %s: %s while cancelling", self.name,
                              type(cause).__name__, cause)
                    self.status = "cancelled"
                    raise asyncio.CancelledError from exc
                if isinstance(cause, RescaleSwitch) and self._switch_to is not None:
                    # not a failure: the next attempt takes over the state handed over at
                    # the rescale's barrier, or restores its checkpoint, at its parallelism,
                    # and no restart is counted
                    restore, self._switch_to = self._switch_to, None
                    handover = cause.handover
                    self._phase("teardown")
                    attempt -= 1
                    self._recover_results(restore.checkpoint_id)
                    continue
                if attempt > strategy.attempts or _not_restartable(cause):
                    self.status = "failed"
                    await self._forget_if_nothing_completed()
                    raise JobFailedError(self.name, attempt, cause,
                                         resumable=self._resumable()) from cause
                self.metrics.restarts += 1
                self.status = "restarting"
                log.warning("job %r failed (%s: %s); restart %d of %d in %.2f s", self.name,
                            type(cause).__name__, cause, attempt, strategy.attempts,
                            strategy.delay)
                await asyncio.sleep(strategy.delay)
                try:
                    restore = await in_thread(self._failover_restore)
                except RestoreError as restore_exc:
                    self.status = "failed"
                    await self._forget_if_nothing_completed()
                    raise JobFailedError(self.name, attempt, restore_exc,
                                         resumable=self._resumable()) from restore_exc
                self._recover_results(restore.checkpoint_id if restore is not None else None)

    async def _run_attempt(self, restore: CompletedCheckpoint | None,
                           handover: StateHandOver | None = None) -> None:
        """Run one attempt from ``restore`` (None: from the start), or, after a rescale,
        from ``handover``: the state the old instances handed over in memory at the barrier
        of ``restore``, the rescale's checkpoint (nothing is read from it then)."""
        flow = self.flow
        options = self.options
        config = options.checkpoints
        if handover is None:
            self.restored_from = restore
            if restore is not None:
                self.metrics.restored_checkpoints.append(restore.checkpoint_id)
        elif restore is not None:
            self.metrics.handed_over.append(restore.checkpoint_id)
        from ..defaults import default_state_backend, register_builtin_key_group_readers

        backend = options.state_backend or default_state_backend()
        if restore is not None:
            # the restored snapshots may be of another backend than the one restoring them
            register_builtin_key_group_readers()
        assignment = None
        overrides = self._overrides(restore)
        self.parallelism = parallelism_of(flow.transformations, flow.parallelism, overrides)
        uids = {t.resolved_uid for t in flow.transformations}
        if restore is not None and handover is None:
            assignment = StateAssignmentOperation(restore, flow.max_parallelism, uids,
                                         options.allow_non_restored_state)
        if self.storage is not None:
            # pending transactions of retained checkpoints and savepoints stay (see
            # TwoPhaseCommitSink.abort_lingering): the sinks learn which before they start
            bound = await in_thread(self.storage.highest_completed_id)
            for t in flow.transformations:
                if isinstance(t.sink, TwoPhaseCommitSink):
                    t.sink.highest_completed_checkpoint_id = bound
        coordinator: CheckpointCoordinator | None = None
        if config is not None and self.storage is not None:
            # read in worker threads: the retained checkpoints' metadata and the directory
            store = await CompletedCheckpointStore.open(self.storage, config.retained)
            # this run's own record reserved _first_id: only directories count here
            on_disk = await in_thread(self.storage.latest_id, False)
            coordinator = CheckpointCoordinator(
                config, self.storage, flow.name, flow.max_parallelism,
                [], max(self._next_id, on_disk + 1),
                self.metrics.checkpoints,
                self.run_id,
                store,
            )
            coordinator.rescaled = overrides
        try:
            await self._run_tasks(flow, options, config, backend, assignment, coordinator,
                                  overrides, handover, restore)
        except BaseException as exc:
            if coordinator is not None:
                coordinator.shutdown(f"job {self.name!r} attempt ended before the checkpoint "
                                     f"completed: {type(_root_cause(exc)).__name__}: "
                                     f"{_root_cause(exc)}")
            raise
        finally:
            if coordinator is not None:
                self._next_id = coordinator.next_id
                coordinator.shutdown(f"job {self.name!r} ended")
            self.tasks = []
            self.attempt = None
            for waiting in list(self.live_queries):
                if not waiting.done():
                    waiting.set_exception(StateQueryError(
                        f"job {self.name!r}: the attempt ended before the live state query "
                        "was answered; ask again after the restart"))

    async def _run_tasks(self, flow: LogicalGraph, options: JobOptions,
                         config: CheckpointConfig | None, backend: StateBackend,
                         assignment: StateAssignmentOperation | None,
                         coordinator: CheckpointCoordinator | None,
                         overrides: dict[str, int], handover: StateHandOver | None = None,
                         restore: CompletedCheckpoint | None = None) -> None:
        # by identity: task ids are display names, and two sources may share one
        sources_left: set[int] = set()
        all_sources_done = asyncio.Event()
        async with asyncio.TaskGroup() as tg:

            def spawn(coro: Coroutine[Any, Any, None]) -> None:
                tg.create_task(coro)

            def on_source_finished(task: StreamTask) -> None:
                sources_left.discard(id(task))
                if not sources_left:
                    all_sources_done.set()

            env = TaskEnvironment(
                job_name=flow.name,
                max_parallelism=flow.max_parallelism,
                batch_size=flow.batch_size,
                buffer_timeout=flow.buffer_timeout,
                exactly_once=config is None or config.mode != "at_least_once",
                unaligned=config is not None and config.unaligned,
                synchronous=config is not None and config.mode == "synchronous",
                storage=self.storage,
                coordinator=coordinator,
                spawn=spawn,
                on_source_finished=on_source_finished,
            )
            graph = ExecutionGraph(
                flow.transformations, flow.parallelism, flow.max_parallelism, flow.batch_size,
                flow.channel_capacity, env, backend, overrides,
            )
            if assignment is not None:
                # off the loop, one operator instance per worker-thread step, before any
                # task runs (so nothing else touches the backends meanwhile)
                self._phase("prepare")
                await graph.restore(assignment)
                self._phase("restore")
                restore = assignment.checkpoint
            elif handover is not None:
                # by reference, on the loop's thread: no file is read
                self._phase("prepare")
                graph.take_over(handover)
                self._phase("hand-over")
            if restore is not None:
                # the versions the restored checkpoint ran: before any operator opens
                restored_id = restore.checkpoint_id
                updates = [u for cid, u in self.updates if cid <= restored_id]
                for task in graph.tasks:
                    apply_updates(task.operators, updates, opened=False)
            tasks = graph.tasks
            self.tasks = tasks
            self.tap_sinks(tasks)
            sources = [t for t in tasks if t.source is not None]
            # an iteration's loop ends after its input, like a source: the final
            # checkpoint waits for it
            sources_left.update(id(t) for t in tasks
                                if t.source is not None or t.is_iteration_head)
            self.metrics.attach(tasks)
            if coordinator is not None:
                coordinator.attach(tasks, graph.operator_infos())
                tg.create_task(coordinator.run())
            self.coordinator = coordinator
            handles = {id(task): tg.create_task(task.run(), name=task.task_id)
                       for task in tasks}
            self.attempt = RunningAttempt(env, backend, tg.create_task, sources,
                                            sources_left, handles)
            tg.create_task(self._finish(all_sources_done, sources, coordinator))
            self.status = "running"
            self.running.set()
            switched, self._switched = self._switched, None
            if switched is not None and not switched.done():
                self._phase("start")
                self.rescale_started.append(time.perf_counter())
                if self._phases is not None:
                    self.rescale_phases.append(self._phases)
                switched.set_result(None)
            self._phases = None
        self.metrics.attach([])

    async def rescale(self, coordinator: CheckpointCoordinator,
                      request: int | dict[str, int],
                      state_transfer: StateTransfer = "auto") -> CompletedCheckpoint:
        """Rescale the running attempt (see ``Job.rescale``): a checkpoint whose barrier
        carries the plan; the new tasks take over the state the instances handed over at
        the barrier, or restore the checkpoint, at the new parallelism in this process
        (:attr:`rescale_transfers` says which).

        Handed over in memory, the new tasks start as soon as every old task took its
        snapshot's synchronous part (:func:`~.rescale.switch_at_barrier`): the old tasks' snapshots
        write meanwhile, and the old tasks end once the checkpoint completed and they
        committed. Otherwise (a restore, or :func:`~.rescale.switch_waits`) the attempt ends after
        the checkpoint's commits and the next one starts.

        Raises:
            ReconfigurationError: the request is invalid (nothing was sent), or the
                checkpoint failed (before the switch the job runs on at its parallelism;
                after it, the attempt fails and the restart strategy restores the last
                completed checkpoint), or the job failed or ended before the rescaled
                tasks ran.
        """
        plan = plan_rescale(self.flow, self.parallelism, request)
        if not plan.changed:
            try:
                return await coordinator.checkpoint()
            except CheckpointError as exc:
                raise ReconfigurationError(f"rescale of job {self.name!r}: {exc}") from exc
        if state_transfer not in ("auto", "checkpoint"):
            raise ReconfigurationError(f"state_transfer must be 'auto' or 'checkpoint', got "
                                       f"{state_transfer!r}")
        tasks = self.tasks
        instances = sum(len(t.operators) for t in tasks)
        refused = handover_refused(self.flow, self.options.checkpoints, state_transfer)
        at_barrier = (refused is None
                      and switch_waits(self, self.options.checkpoints) is None)
        if refused is None:
            plan = dataclasses.replace(plan, handover=StateHandOver(
                expected=instances if at_barrier else 0))
        program = parallelism_of(self.flow.transformations, self.flow.parallelism)
        rescaled = {uid: p for uid, p in plan.parallelism.items() if p != program[uid]}
        what = ", ".join(r.describe() for r in plan.changed)
        t_call = time.perf_counter()
        checkpoint = asyncio.ensure_future(outcome_of(coordinator.checkpoint(
            await_commit=True, updates=(plan,), reconfigurations=plan.changed,
            rescaled=rescaled)))
        handover = plan.handover
        switched = False
        try:
            if at_barrier and handover is not None:
                settled = asyncio.ensure_future(handover.settled.wait())
                try:
                    await asyncio.wait({checkpoint, settled},
                                       return_when=asyncio.FIRST_COMPLETED)
                finally:
                    settled.cancel()
                if (not checkpoint.done() and self.tasks is tasks
                        and handover.refusal(instances) is None):
                    try:
                        switch_at_barrier(self, coordinator, plan, handover, rescaled,
                                          time.perf_counter() - t_call, checkpoint, what)
                    except Exception as exc:
                        # new instances may hold parts of the old ones' state: no going on
                        self.fail_attempt(exc)
                        raise ReconfigurationError(
                            f"rescale of job {self.name!r} ({what}): the new tasks could not "
                            f"take the state over ({exc}); the job restarts from its last "
                            "completed checkpoint") from exc
                    switched = True
            await asyncio.wait({checkpoint})
        except BaseException:
            if not switched:
                checkpoint.cancel()
                plan.resume()
            raise
        outcome = None if checkpoint.cancelled() else checkpoint.result()
        if not isinstance(outcome, CompletedCheckpoint):
            if not switched:
                plan.resume()  # the sources read on, at the parallelism they had
            elif outcome is None:
                outcome = CheckpointError("the attempt ended")
            if outcome is not None and not isinstance(outcome, CheckpointError):
                raise outcome
            after = ("the attempt fails and restarts from its last completed checkpoint"
                     if switched else "the job runs on from its last completed checkpoint")
            raise ReconfigurationError(
                f"rescale of job {self.name!r} ({what}) failed: the checkpoint carrying it "
                f"did not complete ({outcome}); {after}, at the parallelism that "
                "checkpoint recorded") from outcome
        completed = outcome
        if switched:
            self.metrics.handed_over.append(completed.checkpoint_id)
            self.rescale_transfers.append((completed.checkpoint_id, "in memory"))
            log.info("job %r rescaled at checkpoint %d (%s; state in memory, switched at "
                     "its barrier)", self.name, completed.checkpoint_id, what)
            return completed
        if self.tasks is not tasks:
            raise ReconfigurationError(
                f"rescale of job {self.name!r} ({what}): the attempt ended right after "
                f"checkpoint {completed.checkpoint_id} completed; the job restarts from its "
                "last completed checkpoint, at the parallelism that checkpoint recorded")
        if handover is not None:
            refused = handover.refusal(instances)
            if refused is not None:
                handover = None
        self.rescale_transfers.append(
            (completed.checkpoint_id, "in memory" if handover is not None
             else f"checkpoint restored: {refused}"))
        switched_future = asyncio.get_running_loop().create_future()
        self._switched, self._switch_to = switched_future, completed
        self._phases, self._phase_start = {}, time.perf_counter()
        self.running.clear()
        self.fail_attempt(RescaleSwitch(completed.checkpoint_id, plan, handover))
        await switched_future
        log.info("job %r rescaled at checkpoint %d (%s; state %s)", self.name,
                 completed.checkpoint_id, what, self.rescale_transfers[-1][1])
        return completed

    async def _finish(self, all_sources_done: asyncio.Event, sources: list[StreamTask],
                      coordinator: CheckpointCoordinator | None) -> None:
        """When every source has ended: take the final checkpoint (so two-phase-commit sinks
        commit the last epoch), then let end-of-input flow through the graph."""
        await all_sources_done.wait()
        if coordinator is not None:
            coordinator.stop_periodic()
            for attempt in range(3):
                try:
                    # wait for the commits too: end-of-input must not overtake them, and a
                    # commit still running must not be cancelled when the tasks end
                    await coordinator.checkpoint(await_commit=True)
                    break
                except CheckpointError as exc:
                    if coordinator.failure is not None:
                        # the coordinator failed the job: that is the reason, whichever
                        # of the two tasks reports it first
                        raise coordinator.failure  # noqa: B904 - its own __cause__ stays
                    if attempt == 2:
                        raise CheckpointError(f"the final checkpoint failed: {exc}") from exc
            coordinator.stop()
        for task in sources:
            task.post(task.end)
