"""Running a dataflow: the job handle, attempts, and the restart strategy.

A :class:`Job` runs attempts until one finishes. Each attempt builds the execution graph,
restores the latest completed checkpoint (or the one asked for), and runs every task, the
checkpoint coordinator and the asynchronous snapshot parts in one ``asyncio.TaskGroup``:
the first failure cancels everything else in the attempt (structured concurrency). The
restart strategy then decides whether a new attempt starts from the latest completed
checkpoint or the failure reaches the caller as :class:`~reactive.errors.JobFailedError`.

Savepoints (Flink's savepoints and stop-with-savepoint; thesis 4.2): ``job.savepoint(path)``
takes a self-contained checkpoint of kind ``savepoint`` and moves it to ``path``;
``job.stop(savepoint=True)`` takes one with the sources parked right after they injected its
barrier (no record after the savepoint is processed), commits side effects, and cancels the
job. A later run restores it with ``restore_from=path`` at any parallelism (key groups and
operator state are reassigned by :class:`~reactive.checkpoint.state_assignment.StateAssignmentOperation`)
and with either built-in backend.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..checkpoint.completed_checkpoint_store import CompletedCheckpointStore
from ..checkpoint.coordinator import CheckpointCoordinator, OperatorInfo
from ..checkpoint.durable_files import sync_created
from ..checkpoint.lineage import (
    ReplayPolicy,
    committed_output,
    lineage_candidates,
    resume_candidates,
    select_restore,
)
from ..checkpoint.metadata import CompletedCheckpoint
from ..checkpoint.off_loop import in_thread
from ..checkpoint.savepoints import move_savepoint
from ..checkpoint.state_assignment_operation import StateAssignmentOperation
from ..checkpoint.stats import DEFAULT_HISTORY, CheckpointHistory
from ..checkpoint.storage import CheckpointStorage
from ..config import CheckpointConfig, RestartStrategy
from ..embedding.committed_results import DEFAULT_CAPACITY, CommittedResults
from ..embedding.state_query import CommittedStateCache, StateQueryError, query_live
from ..errors import (
    CheckpointError,
    CheckpointProgressError,
    ConfigurationError,
    JobCancelledError,
    JobFailedError,
    ReactiveError,
    RestoreError,
    StateNotReadyError,
    StateSerializationError,
)
from ..sinks import Sink
from ..state.backend import StateBackend
from ..two_phase_commit import TwoPhaseCommitSink
from .directory_lock import DirectoryLock
from .execution_graph import ExecutionGraph, validate
from .metrics import JobMetrics
from .source_lifecycle import describe_end, read_accepted_input, tell_end, tell_start
from .switch_interval import short_switch_interval
from .task import StreamTask, TaskEnvironment
from .task_mailbox import Suspension

if TYPE_CHECKING:
    from ..graph import LogicalGraph

__all__ = ["Job", "JobOptions", "JobStatus"]

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


def _occupied(target: Path) -> bool:
    """Blocking: ``target`` exists and is not an empty directory."""
    return target.exists() and (not target.is_dir() or any(target.iterdir()))


class Job:
    """Handle of a started job (returned by ``Dataflow.start``).

    Attributes:
        name: the dataflow's name.
        status: ``created``, ``running``, ``restarting``, ``finished``, ``failed`` or
            ``cancelled``.
        metrics: live :class:`~reactive.runtime.metrics.JobMetrics`.
        restored_from: the checkpoint the latest attempt restored, if any.
        run_id: this run's id (one per ``Dataflow.start``, Flink's job id); every checkpoint
            the run completes names it, and failover restores only this run's lineage.
    """

    def __init__(self, flow: LogicalGraph, options: JobOptions) -> None:
        self.flow = flow
        self.options = options
        self.name = flow.name
        self.status: JobStatus = "created"
        self.metrics = JobMetrics(CheckpointHistory(
            options.checkpoints.history if options.checkpoints is not None else DEFAULT_HISTORY))
        self.restored_from: CompletedCheckpoint | None = None
        self.run_id = uuid.uuid4().hex[:16]
        # where this run's lineage starts, and the first checkpoint id it may use
        self._initial: CompletedCheckpoint | None = None
        self._first_id = 1
        self._next_id = 1
        self.storage = (
            CheckpointStorage(options.checkpoints.directory, flow.name)
            if options.checkpoints is not None else None
        )
        self._coordinator: CheckpointCoordinator | None = None
        self._task: asyncio.Task[None] | None = None
        self._tasks: list[StreamTask] = []  # the running attempt's tasks
        self._results: dict[str, list[CommittedResults]] = {}  # by sink uid
        self._committed_state = CommittedStateCache()
        # savepoints of this run moved out of checkpoint storage (the store lists them at
        # their old directory), by checkpoint id
        self._moved: dict[int, CompletedCheckpoint] = {}
        # set once the run knows the checkpoint it starts from (or that it starts fresh)
        self._restore_chosen = asyncio.Event()
        self._live_queries: set[asyncio.Future[Any]] = set()
        self._running = asyncio.Event()
        self._stopping = False
        self._locks: list[DirectoryLock] = []
        self._cancel_requested = False  # cancel() (or stop()) was called
        # how _main ended (None: finished); stays unset for a task cancelled before it began
        self._end_error: BaseException | None = None
        self._main_ended = False
        validate(flow.transformations, flow.parallelism, flow.max_parallelism)
        if options.restore_from is not None:
            # fail fast, before anything runs: a wrong path, another max parallelism, or
            # state of operators the program lacks (unless allow_non_restored_state)
            StateAssignmentOperation(CheckpointStorage.load(options.restore_from, verify=False),
                            flow.max_parallelism,
                            {t.resolved_uid for t in flow.transformations},
                            options.allow_non_restored_state)

    def start(self) -> None:
        """Start the job's main coroutine on the running loop (called by ``Dataflow.start``).

        The job owns this one task; ``wait`` and ``cancel`` end it. First the run takes,
        for its lifetime, the lock of its checkpoint directory and of every directory a
        sink owns (``Sink.exclusive_directories``).

        Raises:
            DirectoryLockedError: another run holds one of them (naming its pid, host and
                start time); nothing was started.
        """
        self._lock_directories()
        tell_start(self.flow.transformations)
        task = asyncio.get_running_loop().create_task(self._main(), name=f"job {self.name}")
        # callbacks, not _main's finally: a task cancelled before its first step never runs
        # its coroutine at all
        task.add_done_callback(lambda _: self._release_directories())
        task.add_done_callback(self._tell_sources_the_end)
        self._task = task

    def _lock_directories(self) -> None:
        locks = []
        if self.storage is not None:
            locks.append(DirectoryLock(self.storage.job_dir, "_lock",
                                       f"checkpoint directory of job {self.name!r}"))
        seen = set()
        for t in self.flow.transformations:
            sink = getattr(t, "sink", None)
            for directory in sink.exclusive_directories() if sink is not None else ():
                key = os.path.realpath(directory)
                if key not in seen:
                    seen.add(key)
                    locks.append(DirectoryLock(directory, ".reactive-lock",
                                               f"output directory of sink {t.resolved_uid!r}"))
        try:
            for lock in locks:
                lock.acquire(self.name, self.run_id)
                self._locks.append(lock)
        except BaseException:
            self._release_directories()
            raise

    def _release_directories(self) -> None:
        locks, self._locks = self._locks, []
        for lock in locks:
            lock.release()

    async def wait(self) -> None:
        """Wait until the job finishes.

        Returns normally when the job finished or was stopped with ``stop``.

        Raises:
            JobFailedError: when it failed for good (``__cause__`` is the failure).
            JobCancelledError: when it was cancelled.
        """
        assert self._task is not None
        try:
            await asyncio.shield(self._task)
        except asyncio.CancelledError:
            if self._task.cancelled() and self._stopping:
                return
            if self._task.cancelled():
                raise JobCancelledError(f"job {self.name!r} was cancelled") from None
            raise

    async def cancel(self) -> None:
        """Cancel the job and wait until every task stopped; checkpoints stay on disk.

        A task that fails while the job winds down (a source's clean-up raising, say) does
        not turn the cancel into a restart: the job ends ``cancelled``.

        Raises:
            asyncio.CancelledError: when the caller itself is cancelled meanwhile (its own
                cancellation is never swallowed).
        """
        if self._task is None or self._task.done():
            return
        self._cancel_requested = True
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # the caller was cancelled too: that is not ours to swallow
        except ReactiveError:
            pass
        self.status = "cancelled"

    # ------------------------------------------------------------------ embedding
    def results(self, sink: str | Sink, committed: bool = True,
                capacity: int = DEFAULT_CAPACITY) -> CommittedResults:
        """The records that reach ``sink`` (its uid, or the sink object given to
        ``stream.sink``), as an async iterator: ``async for record in job.results(...)``.

        Read committed (the default): a record is yielded once the checkpoint that covers it
        completed, so a failure never takes back what the application saw; without
        checkpointing, records come at the end of input. Read uncommitted: at once (after a
        failure the replayed records come again). Iteration ends when the job finishes and
        raises its error when it fails for good. Ask before the job's first records reach
        the sink (right after ``start``) to see all of them (asked later, it logs a warning
        with how many it will not yield).

        The iterator is bounded: while ``capacity`` records wait to be read, the sink waits
        (backpressure into the job). Close it when done reading (``await it.aclose()`` or
        ``async with job.results(...) as it``): an iterator neither read nor closed stalls
        the job.

        Args:
            sink: the sink's uid or the sink object.
            committed: read committed (True) or uncommitted (False).
            capacity: records released and not yet read before the sink waits.

        Raises:
            ConfigurationError: the job has no such sink, or ``capacity`` is below 1.
        """
        uid = self._sink_uid(sink)
        reached = self.metrics.operators.get(uid, {}).get("records_in", 0)
        if reached:
            log.warning("job %r: results(%r) asked after %d records reached the sink; it "
                        "yields only later records (ask right after start to see all)",
                        self.name, uid, reached)
        iterator = CommittedResults(committed, capacity)
        registered = self._results.setdefault(uid, [])
        registered.append(iterator)
        # closed by the application: the next attempts no longer tap the sink for it
        iterator._on_close = functools.partial(registered.remove, iterator)
        for task in self._tasks:  # an attempt already running: tap it now
            if task.sink is not None and task.sink.uid == uid:
                task.sink.writer = iterator.wrap(task.sink.writer)
        return iterator

    def _sink_uid(self, sink: str | Sink) -> str:
        for t in self.flow.transformations:
            target = getattr(t, "sink", None)
            if target is None:
                continue
            if (isinstance(sink, str) and t.resolved_uid == sink) or target is sink:
                return t.resolved_uid
        sinks = sorted(t.resolved_uid for t in self.flow.transformations
                       if getattr(t, "sink", None) is not None)
        raise ConfigurationError(f"job {self.name!r} has no sink {sink!r}; its sinks: {sinks}")

    def _tap_sinks(self, tasks: list[StreamTask]) -> None:
        for task in tasks:
            if task.sink is not None:
                for iterator in self._results.get(task.sink.uid, ()):
                    task.sink.writer = iterator.wrap(task.sink.writer)

    async def query_state(self, uid: str, state: str, key: Any, committed: bool = True) -> Any:
        """The value of keyed state ``state`` of operator ``uid`` for ``key`` (thesis 4.3.1,
        queryable state; a point lookup in this process, no server).

        Read committed (the default) answers from the latest checkpoint this run completed
        that a failure cannot take back (not an intermediate savepoint), or the one it
        restored: a value no failure can take back. The snapshot's files are read in a
        worker thread (a cache keeps the last key groups read). Read uncommitted asks the
        running instance that owns the key's key group, between two of its batches.

        Returns:
            the value (a list for list state, a dict for map state, for live lookups), or
            None when the key has none.

        Raises:
            StateNotReadyError: committed, when there is no completed checkpoint to answer
                from yet (the run completed none and restored none); ask again later.
            StateQueryError: committed, when checkpointing is off (nothing is ever
                committed) and nothing was restored.
            StateQueryError: no operator ``uid`` or no state ``state`` (live lookups).
            StateQueryError: also for a live lookup when the job is not running.
            RestoreError: committed, when the checkpoint's files cannot be read.
        """
        if committed:
            return await self._query_committed(uid, state, key)
        await self._wait_attempt()
        if self.status != "running":
            raise StateQueryError(f"job {self.name!r} is {self.status}: no live state to query")
        return await query_live(self._tasks, uid, state, key, self.flow.max_parallelism,
                                self._live_queries)

    async def _query_committed(self, uid: str, state: str, key: Any) -> Any:
        assert self._task is not None
        if not self._restore_chosen.is_set():
            # a resume or restore_from is still reading the candidates' files: the run's
            # committed state is that checkpoint's, not "nothing"
            chosen = asyncio.ensure_future(self._restore_chosen.wait())
            try:
                await asyncio.wait({chosen, self._task}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                chosen.cancel()
            if not self._restore_chosen.is_set():
                raise StateQueryError(f"job {self.name!r} is {self.status}: it ended before "
                                      "choosing the checkpoint to start from")
        while True:
            latest = self._latest_committed()
            if latest is None:
                if self.options.checkpoints is None and self._restore_chosen.is_set():
                    raise StateQueryError(
                        f"job {self.name!r} runs without checkpointing and restored nothing: "
                        "it has no committed state; query with committed=False")
                raise StateNotReadyError(
                    f"job {self.name!r} has no completed checkpoint yet: its committed state "
                    "is not ready (ask again after a checkpoint completes, or query with "
                    "committed=False)")
            try:
                return await self._committed_state.lookup(latest, uid, state, key)
            except (RestoreError, OSError):
                # retention may have subsumed it while the lookup read it: ask the newer one
                if self._latest_committed() is latest:
                    raise

    def _latest_committed(self) -> CompletedCheckpoint | None:
        """The newest checkpoint of this run that committed output (an intermediate
        savepoint does not: failover never restores one), at its current directory; else
        the checkpoint the run started from."""
        coordinator = self._coordinator
        if coordinator is not None:
            for checkpoint in reversed(coordinator.store.checkpoints):
                if (checkpoint.metadata.get("run_id") == self.run_id
                        and committed_output(checkpoint.metadata)):
                    return self._moved.get(checkpoint.checkpoint_id, checkpoint)
        return self._initial

    async def _wait_attempt(self) -> None:
        """Wait until an attempt runs or the job ended."""
        assert self._task is not None
        if not self._running.is_set():
            running = asyncio.ensure_future(self._running.wait())
            try:
                await asyncio.wait({running, self._task}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                running.cancel()

    async def _wait_running(self) -> CheckpointCoordinator:
        """Wait until an attempt runs; raise CheckpointError if the job ended first."""
        await self._wait_attempt()
        assert self._task is not None
        coordinator = self._coordinator
        if coordinator is None or self.status != "running" or self._task.done():
            raise CheckpointError(f"job {self.name!r} is {self.status}: cannot checkpoint")
        return coordinator

    async def checkpoint(self) -> CompletedCheckpoint:
        """Trigger a checkpoint now and wait for it to complete.

        It covers every record a :class:`~reactive.PushSource` of the job accepted before
        the call (the barrier is injected once the source has read them).

        Returns:
            the completed checkpoint (``checkpoint_id``, ``path``).

        Raises:
            CheckpointError: without checkpointing, when the job is not running, or when the
                checkpoint is aborted.
        """
        if self.options.checkpoints is None:
            raise CheckpointError("checkpointing is off: pass checkpoints=CheckpointConfig(...)")
        await read_accepted_input(self.flow.transformations)
        coordinator = await self._wait_running()
        return await coordinator.checkpoint()

    async def savepoint(self, path: str | os.PathLike[str] | None = None) -> CompletedCheckpoint:
        """Take a savepoint now and wait for it (Flink's savepoint; thesis 4.2).

        Like :meth:`checkpoint`, it covers every record a :class:`~reactive.PushSource`
        accepted before the call. A savepoint is a full, self-contained checkpoint: no file
        shared with other checkpoints (RocksDB writes a full snapshot), every path relative
        to its own directory, so it can be moved to another directory or machine and
        restored with ``restore_from`` at another parallelism or with the other backend.
        Retention never deletes it. It does not commit side effects (two-phase-commit sinks commit its
        transactions with the next checkpoint, or when a run restores it).

        Args:
            path: the savepoint directory to create (must not exist or be empty); None keeps
                it in checkpoint storage as ``<directory>/<job>/chk-<n>``.

        Returns:
            the savepoint (``path`` is its directory).

        Raises:
            CheckpointError: without checkpointing, when the job is not running, when
                ``path`` is not empty, or when the savepoint is aborted.
            OSError: when moving it to ``path`` fails (it then stays in checkpoint storage).
        """
        return await self._savepoint(path, stop=False)

    async def stop(self, savepoint: bool = True, path: str | os.PathLike[str] | None = None
                   ) -> CompletedCheckpoint | None:
        """Stop the job, with a savepoint by default (Flink's stop-with-savepoint).

        The sources are parked right after they inject the savepoint's barrier, so no record
        after it is processed; every record a :class:`~reactive.PushSource` accepted before
        the call is before it (records accepted while the stop runs may not be:
        ``source.durable`` counts the covered ones); when it completes, side effects are
        committed (every task's ``notify_checkpoint_complete`` has finished) and then the
        job is cancelled; ``wait`` then returns normally and ``status`` is ``stopped``. If
        the stop fails (the savepoint is aborted, moving it to ``path`` fails, or the caller
        is cancelled meanwhile), the sources resume and the job keeps running.

        Args:
            savepoint: take a savepoint first (False: just stop, like ``cancel``).
            path: where to put the savepoint (see :meth:`savepoint`).

        Returns:
            the savepoint, or None without one.

        Raises:
            CheckpointError: as :meth:`savepoint`; the job is then still running.
            OSError: when moving the savepoint to ``path`` fails; it then stays in checkpoint
                storage (side effects up to it are committed) and the job is still running.
        """
        completed = await self._savepoint(path, stop=True) if savepoint else None
        self._stopping = True
        await self.cancel()
        self.status = "stopped"
        return completed

    async def _savepoint(self, path: str | os.PathLike[str] | None,
                         stop: bool) -> CompletedCheckpoint:
        if self.options.checkpoints is None:
            raise CheckpointError("savepoints need checkpoint storage: pass "
                                  "checkpoints=CheckpointConfig(directory=...)")
        # inline: one stat (and a directory peek) takes microseconds, while a hop to a worker
        # thread waits for the GIL the busy loop holds, and the records read meanwhile all
        # land before the savepoint
        if path is not None and _occupied(Path(path)):
            raise CheckpointError(f"savepoint target {Path(path)} exists and is not an "
                                  "empty directory")
        await read_accepted_input(self.flow.transformations)
        coordinator = await self._wait_running()
        # stop: the sources are parked right behind the savepoint's barrier (Flink's
        # synchronous savepoint): they run their mail (checkpoint notifications) but read
        # no more input, so nothing after the savepoint reaches an operator, and an
        # at-least-once sink does not see records that a restore of the savepoint replays
        parked: list[Suspension] = []

        def park() -> None:
            parked.extend(task.mailbox.suspend_default_action() for task in coordinator.sources)

        try:
            completed = await coordinator.checkpoint(
                "savepoint", commit=stop, on_trigger=park if stop else None,
                await_commit=stop)
            if path is not None:
                completed = await in_thread(move_savepoint, completed, Path(path))
                self._moved[completed.checkpoint_id] = completed
                for stats in self.metrics.checkpoints:
                    if stats.checkpoint_id == completed.checkpoint_id:
                        stats.path = str(completed.path)
        except BaseException:
            # any failure of the stop (the checkpoint, the move, the caller's cancellation)
            # leaves the job running: parked sources would keep it "running" with no record
            # moving while checkpoints still complete
            for suspension in parked:
                suspension.resume()
            raise
        log.info("savepoint %d written to %s", completed.checkpoint_id, completed.path)
        return completed

    # ------------------------------------------------------------------ attempts
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
            lineage_candidates(self.storage, self.run_id, self._first_id, self._initial),
            self._replay_policy(), "failover")

    def _resumable(self) -> bool:
        """Whether ``resume=True`` has a completed checkpoint to continue from: one this run
        completed, or the one a resume started it from (a run that completed none leaves the
        run before it to resume)."""
        return self.storage is not None and (
            bool(self.metrics.completed_checkpoints)
            or (self._initial is not None and self.options.restore_from is None))

    async def _forget_if_nothing_completed(self) -> None:
        """A run that failed (was not killed) before completing any checkpoint committed no
        output: drop its run record, so ``resume`` continues the run before it (e.g. after
        a fresh run refused to start over the committed output of that run)."""
        if self.storage is not None and not self.metrics.totals.completed:
            try:
                await in_thread(self.storage.forget_run, self.run_id)
            except OSError as exc:
                log.warning("could not remove the record of run %s: %s", self.run_id, exc)

    async def _main(self) -> None:
        """Run the job; then end every results iterator (with the job's error, if any)."""
        error: BaseException | None = None
        try:
            # the directories the locks created at start, made durable off the loop
            created = [d for lock in self._locks for d in lock.created]
            if created:
                await in_thread(sync_created, created)
            with short_switch_interval():  # worker threads get the GIL from a busy loop
                await self._run_all_attempts()
        except asyncio.CancelledError:
            error = JobCancelledError(f"job {self.name!r} was cancelled")
            raise
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._end_error, self._main_ended = error, True
            self._recover_results(self._committed_output_id())
            # before the task completes: a run awaiting this one may start the next at once
            self._release_directories()
            for results in self._results.values():
                for iterator in results:
                    iterator.end(error)

    def _recover_results(self, checkpoint_id: int | None) -> None:
        """The job goes on (or ends) at checkpoint ``checkpoint_id``: the results iterators
        release the held records it covers (see ``CommittedResults.recover``)."""
        for results in self._results.values():
            for iterator in results:
                iterator.recover(checkpoint_id)

    def _committed_output_id(self) -> int | None:
        """The id of :meth:`_latest_committed`'s checkpoint, if any."""
        latest = self._latest_committed()
        return latest.checkpoint_id if latest is not None else None

    def _tell_sources_the_end(self, task: asyncio.Task[None]) -> None:
        # a task cancelled before its first step never ran _main
        error = self._end_error if self._main_ended else asyncio.CancelledError()
        tell_end(self.flow.transformations, describe_end(self.name, error, self._stopping))

    async def _run_all_attempts(self) -> None:
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
        self._initial = restore
        self._restore_chosen.set()
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
        attempt = 0
        strategy = self.options.restart
        while True:
            attempt += 1
            try:
                await self._run_attempt(restore)
                self.status = "finished"
                return
            except asyncio.CancelledError:
                self.status = "cancelled"
                raise
            except BaseException as exc:
                cause = _root_cause(exc)
                if isinstance(cause, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
                    raise
                if self._cancel_requested:
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

    async def _run_attempt(self, restore: CompletedCheckpoint | None) -> None:
        flow = self.flow
        options = self.options
        config = options.checkpoints
        self.restored_from = restore
        if restore is not None:
            self.metrics.restored_checkpoints.append(restore.checkpoint_id)
        from ..defaults import default_state_backend, register_builtin_key_group_readers

        backend = options.state_backend or default_state_backend()
        if restore is not None:
            # the restored snapshots may be of another backend than the one restoring them
            register_builtin_key_group_readers()
        assignment = None
        uids = {t.resolved_uid for t in flow.transformations}
        if restore is not None:
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
        try:
            await self._run_tasks(flow, options, config, backend, assignment, coordinator)
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
            self._tasks = []
            for waiting in list(self._live_queries):
                if not waiting.done():
                    waiting.set_exception(StateQueryError(
                        f"job {self.name!r}: the attempt ended before the live state query "
                        "was answered; ask again after the restart"))

    async def _run_tasks(self, flow: LogicalGraph, options: JobOptions,
                         config: CheckpointConfig | None, backend: StateBackend,
                         assignment: StateAssignmentOperation | None,
                         coordinator: CheckpointCoordinator | None) -> None:
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
                storage=self.storage,
                coordinator=coordinator,
                spawn=spawn,
                on_source_finished=on_source_finished,
            )
            graph = ExecutionGraph(
                flow.transformations, flow.parallelism, flow.max_parallelism, flow.batch_size,
                flow.channel_capacity, env, backend,
            )
            if assignment is not None:
                # off the loop, one operator instance per worker-thread step, before any
                # task runs (so nothing else touches the backends meanwhile)
                await graph.restore(assignment)
            tasks = graph.tasks
            self._tasks = tasks
            self._tap_sinks(tasks)
            sources = [t for t in tasks if t.source is not None]
            # an iteration's loop ends after its input, like a source: the final
            # checkpoint waits for it
            sources_left.update(id(t) for t in tasks
                                if t.source is not None or t.is_iteration_head)
            self.metrics.attach(tasks)
            if coordinator is not None:
                coordinator.operators = {
                    t.resolved_uid: OperatorInfo(
                        t.resolved_uid, t.name, graph.parallelism[t.id],
                        any(op.keyed and op.uid == t.resolved_uid
                            for task in tasks for op in task.operators),
                    )
                    for t in flow.transformations
                }
                coordinator.attach(tasks)
                tg.create_task(coordinator.run())
            self._coordinator = coordinator
            for task in tasks:
                tg.create_task(task.run(), name=task.task_id)
            tg.create_task(self._finish(all_sources_done, sources, coordinator))
            self.status = "running"
            self._running.set()
        self.metrics.attach([])

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
