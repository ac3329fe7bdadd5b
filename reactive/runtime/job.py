"""The job handle: what ``Dataflow.start`` returns to the application (Flink's
``JobClient``): wait, cancel, stop, checkpoints and savepoints, function updates, committed
results, state queries and metrics.

The handle owns the run's one asyncio task and the locks of its directories; the attempts
themselves (wiring, restore selection, restarts, the final checkpoint) are the
:class:`~reactive.runtime.job_runner.JobRunner`'s.

Savepoints (Flink's savepoints and stop-with-savepoint; Carbone 2018 (PhD thesis), section 4.2):
``job.savepoint(path)`` takes a self-contained checkpoint of kind ``savepoint`` and moves it to
``path``; ``job.stop(savepoint=True)`` takes one with the sources parked right after they
injected its barrier (no record after the savepoint is processed), commits side effects, and
cancels the job. A later run restores it with ``restore_from=path`` at any parallelism (key
groups and operator state are reassigned by
:class:`~reactive.checkpoint.state_assignment.StateAssignmentOperation`) and with either built-in
backend.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..checkpoint.checkpointable_task import Resumable
from ..checkpoint.durable_files import sync_created
from ..checkpoint.lineage import committed_output
from ..checkpoint.metadata import CompletedCheckpoint
from ..checkpoint.off_loop import in_thread
from ..checkpoint.savepoints import move_savepoint
from ..checkpoint.state_assignment_operation import StateAssignmentOperation
from ..checkpoint.stats import DEFAULT_HISTORY, CheckpointHistory
from ..checkpoint.storage import CheckpointStorage
from ..errors import (
    CheckpointError,
    ConfigurationError,
    JobCancelledError,
    ReactiveError,
    RestoreError,
    StateNotReadyError,
)
from ..sinks import Sink
from .committed_results import DEFAULT_CAPACITY, CommittedResults
from .directory_lock import DirectoryLock
from .execution_graph import validate
from .job_reconfiguration import JobReconfiguration
from .job_runner import JobOptions, JobRunner, JobStatus
from .metrics import JobMetrics
from .operators import SinkOperator
from .source_lifecycle import describe_end, read_accepted_input, tell_end, tell_start
from .state_query import CommittedStateCache, StateQueryError, query_live
from .switch_interval import short_switch_interval
from .task import StreamTask

if TYPE_CHECKING:
    from ..checkpoint.coordinator import CheckpointCoordinator
    from ..graph import LogicalGraph

__all__ = ["Job", "JobOptions", "JobStatus"]

log = logging.getLogger(__name__)


def _tap(sink: SinkOperator, iterator: CommittedResults) -> None:
    """Copy what ``sink``'s writer writes to ``iterator`` (in the sink's task, or before
    it runs)."""
    if not iterator.closed:
        sink.writer = iterator.wrap(sink.writer)


def _occupied(target: Path) -> bool:
    """Blocking: ``target`` exists and is not an empty directory."""
    return target.exists() and (not target.is_dir() or any(target.iterdir()))


class Job(JobReconfiguration):
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
        self.metrics = JobMetrics(CheckpointHistory(
            options.checkpoints.history if options.checkpoints is not None else DEFAULT_HISTORY))
        self.run_id = uuid.uuid4().hex[:16]
        self.storage = (
            CheckpointStorage(options.checkpoints.directory, flow.name)
            if options.checkpoints is not None else None
        )
        self._runner = JobRunner(flow, options, self.storage, self.run_id, self.metrics,
                                 self._tap_sinks, self._recover_results)
        self._task: asyncio.Task[None] | None = None
        self._results: dict[str, list[CommittedResults]] = {}  # by sink uid
        self._committed_state = CommittedStateCache()
        # savepoints of this run moved out of checkpoint storage (the store lists them at
        # their old directory), by checkpoint id
        self._moved: dict[int, CompletedCheckpoint] = {}
        self._stopping = False
        self._locks: list[DirectoryLock] = []
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

    @property
    def status(self) -> JobStatus:
        """``created``, ``running``, ``restarting``, ``finished``, ``failed``,
        ``cancelled`` or ``stopped``."""
        return self._runner.status

    @status.setter
    def status(self, value: JobStatus) -> None:
        self._runner.status = value

    @property
    def restored_from(self) -> CompletedCheckpoint | None:
        """The checkpoint the latest attempt restored, if any."""
        return self._runner.restored_from

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
        self._runner.cancel_requested = True
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
        # an attempt already running: each instance taps its writer itself, between two
        # batches (a mailbox action), never while a call into the writer is in flight
        for task in self._runner.tasks:
            if task.sink is not None and task.sink.uid == uid:
                task.post(functools.partial(_tap, task.sink, iterator))
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
        """Tap the sinks of an attempt's tasks before they run."""
        for task in tasks:
            if task.sink is not None:
                for iterator in self._results.get(task.sink.uid, ()):
                    _tap(task.sink, iterator)

    async def query_state(self, uid: str, state: str, key: Any, committed: bool = True) -> Any:
        """The value of keyed state ``state`` of operator ``uid`` for ``key`` (queryable
        state: Carbone 2018 (PhD thesis), section 4.3.1; a point lookup in this process, no
        server).

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
        return await query_live(self._runner.tasks, uid, state, key, self.flow.max_parallelism,
                                self._runner.live_queries)

    async def _query_committed(self, uid: str, state: str, key: Any) -> Any:
        assert self._task is not None
        if not self._runner.restore_chosen.is_set():
            # a resume or restore_from is still reading the candidates' files: the run's
            # committed state is that checkpoint's, not "nothing"
            chosen = asyncio.ensure_future(self._runner.restore_chosen.wait())
            try:
                await asyncio.wait({chosen, self._task}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                chosen.cancel()
            if not self._runner.restore_chosen.is_set():
                raise StateQueryError(f"job {self.name!r} is {self.status}: it ended before "
                                      "choosing the checkpoint to start from")
        while True:
            latest = self._latest_committed()
            if latest is None:
                if self.options.checkpoints is None and self._runner.restore_chosen.is_set():
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
        coordinator = self._runner.coordinator
        if coordinator is not None:
            for checkpoint in reversed(coordinator.store.checkpoints):
                if (checkpoint.metadata.run_id == self.run_id
                        and committed_output(checkpoint.metadata)):
                    return self._moved.get(checkpoint.checkpoint_id, checkpoint)
        return self._runner.initial

    async def _wait_attempt(self) -> None:
        """Wait until an attempt runs or the job ended."""
        assert self._task is not None
        if not self._runner.running.is_set():
            running = asyncio.ensure_future(self._runner.running.wait())
            try:
                await asyncio.wait({running, self._task}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                running.cancel()

    async def _wait_running(self) -> CheckpointCoordinator:
        """Wait until an attempt runs; raise CheckpointError if the job ended first."""
        await self._wait_attempt()
        assert self._task is not None
        coordinator = self._runner.coordinator
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
        """Take a savepoint now and wait for it (Flink's savepoint; Carbone 2018 (PhD thesis),
        section 4.2).

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
        parked: list[Resumable] = []

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

    async def _main(self) -> None:
        """Run the job; then end every results iterator (with the job's error, if any)."""
        error: BaseException | None = None
        try:
            # the directories the locks created at start, made durable off the loop
            created = [d for lock in self._locks for d in lock.created]
            if created:
                await in_thread(sync_created, created)
            with short_switch_interval():  # worker threads get the GIL from a busy loop
                await self._runner.run_all_attempts()
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
