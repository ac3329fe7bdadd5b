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
operator state are reassigned by :class:`~reactive.checkpoint.state_assignment.StateAssignment`)
and with either built-in backend.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..checkpoint.coordinator import CheckpointCoordinator, OperatorInfo
from ..checkpoint.state_assignment import StateAssignment
from ..checkpoint.storage import CheckpointStorage, CompletedCheckpoint, move_savepoint
from ..config import CheckpointConfig, RestartStrategy
from ..errors import CheckpointError, JobCancelledError, JobFailedError, ReactiveError
from ..state.backend import StateBackend
from .execution_graph import ExecutionGraph, validate
from .metrics import JobMetrics
from .operators import maybe_await
from .task import StreamTask, TaskEnvironment

if TYPE_CHECKING:
    from ..dataflow import Dataflow

__all__ = ["Job", "JobOptions", "JobStatus"]

log = logging.getLogger("reactive.job")

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


def _root_cause(exc: BaseException) -> BaseException:
    """The first real failure inside (nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup):
        real = [e for e in exc.exceptions if not isinstance(e, asyncio.CancelledError)]
        exc = real[0] if real else exc.exceptions[0]
    return exc


class _SourceHold:
    """Parks source tasks after a stop-with-savepoint barrier (Flink's synchronous savepoint).

    ``park`` posts one mailbox action per source task, right behind the barrier-injection
    action; it runs the task's later mailbox actions (checkpoint notifications) but reads no
    more input until ``release``. So nothing after the savepoint reaches an operator, and an
    at-least-once sink does not see records that a restore of the savepoint replays.
    """

    def __init__(self, sources: list[StreamTask]) -> None:
        self.sources = sources
        self.released = False

    def park(self) -> None:
        for task in self.sources:
            task.gate.post(functools.partial(self._hold, task))

    async def _hold(self, task: StreamTask) -> None:
        while not self.released:
            _, action = await task.gate.get()
            await maybe_await(action())

    def release(self) -> None:
        """Let the sources read again (the savepoint failed)."""
        self.released = True
        for task in self.sources:
            task.gate.post(_no_op)  # wakes the parked loop so it sees ``released``


def _no_op() -> None:
    return None


class Job:
    """Handle of a started job (returned by ``Dataflow.start``).

    Attributes:
        name: the dataflow's name.
        status: ``created``, ``running``, ``restarting``, ``finished``, ``failed`` or
            ``cancelled``.
        metrics: live :class:`~reactive.runtime.metrics.JobMetrics`.
        restored_from: the checkpoint the latest attempt restored, if any.
    """

    def __init__(self, flow: Dataflow, options: JobOptions) -> None:
        self.flow = flow
        self.options = options
        self.name = flow.name
        self.status: JobStatus = "created"
        self.metrics = JobMetrics()
        self.restored_from: CompletedCheckpoint | None = None
        self.storage = (
            CheckpointStorage(options.checkpoints.directory, flow.name)
            if options.checkpoints is not None else None
        )
        self._coordinator: CheckpointCoordinator | None = None
        self._task: asyncio.Task[None] | None = None
        self._running = asyncio.Event()
        self._stopping = False
        validate(flow.transformations, flow.parallelism, flow.max_parallelism)
        if options.restore_from is not None:
            # fail fast, before anything runs: a wrong path, another max parallelism, or
            # state of operators the program lacks (unless allow_non_restored_state)
            StateAssignment(CheckpointStorage.load(options.restore_from, verify=False),
                            flow.max_parallelism,
                            {t.resolved_uid for t in flow.transformations},
                            options.allow_non_restored_state)

    def start(self) -> None:
        """Start the job's main coroutine on the running loop (called by ``Dataflow.start``).

        The job owns this one task; ``wait`` and ``cancel`` end it.
        """
        self._task = asyncio.get_running_loop().create_task(self._main(), name=f"job {self.name}")

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
        """Cancel the job and wait until every task stopped; checkpoints stay on disk."""
        if self._task is None or self._task.done():
            return
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        except ReactiveError:
            pass
        self.status = "cancelled"

    async def checkpoint(self) -> CompletedCheckpoint:
        """Trigger a checkpoint now and wait for it to complete.

        Returns:
            the completed checkpoint (``checkpoint_id``, ``path``).

        Raises:
            CheckpointError: without checkpointing, when the job is not running, or when the
                checkpoint is aborted.
        """
        if self.options.checkpoints is None:
            raise CheckpointError("checkpointing is off: pass checkpoints=CheckpointConfig(...)")
        await self._running.wait()
        coordinator = self._coordinator
        if coordinator is None or self.status != "running":
            raise CheckpointError(f"job {self.name!r} is {self.status}: cannot checkpoint")
        return await coordinator.checkpoint()

    async def savepoint(self, path: str | os.PathLike[str] | None = None) -> CompletedCheckpoint:
        """Take a savepoint now and wait for it (Flink's savepoint; thesis 4.2).

        A savepoint is a full, self-contained checkpoint: no file shared with other
        checkpoints (RocksDB writes a full snapshot), every path relative to its own
        directory, so it can be moved to another directory or machine and restored with
        ``restore_from`` at another parallelism or with the other backend. Retention never
        deletes it. It does not commit side effects (two-phase-commit sinks commit its
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
        after it is processed; when it completes, side effects are committed (the tasks are
        notified) and the job is cancelled; ``wait`` then returns normally and ``status`` is
        ``stopped``. If the savepoint fails, the sources resume and the job keeps running.

        Args:
            savepoint: take a savepoint first (False: just stop, like ``cancel``).
            path: where to put the savepoint (see :meth:`savepoint`).

        Returns:
            the savepoint, or None without one.

        Raises:
            CheckpointError: as :meth:`savepoint`; the job is then still running.
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
        if path is not None:
            target = Path(path)
            if target.exists() and (not target.is_dir() or any(target.iterdir())):
                raise CheckpointError(f"savepoint target {target} exists and is not an "
                                      "empty directory")
        await self._running.wait()
        coordinator = self._coordinator
        if coordinator is None or self.status != "running":
            raise CheckpointError(f"job {self.name!r} is {self.status}: cannot take a savepoint")
        hold = _SourceHold(coordinator.sources) if stop else None
        try:
            completed = await coordinator.checkpoint(
                "savepoint", commit=stop, on_trigger=hold.park if hold else None)
        except BaseException:
            if hold is not None:
                hold.release()
            raise
        if path is not None:
            completed = await asyncio.to_thread(move_savepoint, completed, Path(path))
            for stats in self.metrics.checkpoints:
                if stats.checkpoint_id == completed.checkpoint_id:
                    stats.path = str(completed.path)
        log.info("savepoint %d written to %s", completed.checkpoint_id, completed.path)
        return completed

    # ------------------------------------------------------------------ attempts
    def _initial_restore(self) -> CompletedCheckpoint | None:
        o = self.options
        if o.restore_from is not None:
            return CheckpointStorage.load(o.restore_from)
        if o.resume and self.storage is not None:
            return self.storage.latest_restorable()
        return None

    async def _main(self) -> None:
        restore = self._initial_restore()
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
                if attempt > strategy.attempts:
                    self.status = "failed"
                    raise JobFailedError(self.name, attempt, cause) from cause
                self.metrics.restarts += 1
                self.status = "restarting"
                log.warning("job %r failed (%s: %s); restart %d of %d in %.2f s", self.name,
                            type(cause).__name__, cause, attempt, strategy.attempts,
                            strategy.delay)
                await asyncio.sleep(strategy.delay)
                restore = self.storage.latest_restorable() if self.storage else None

    async def _run_attempt(self, restore: CompletedCheckpoint | None) -> None:
        flow = self.flow
        options = self.options
        config = options.checkpoints
        self.restored_from = restore
        if restore is not None:
            self.metrics.restored_checkpoints.append(restore.checkpoint_id)
        backend = options.state_backend
        if backend is None:
            from ..defaults import default_state_backend

            backend = default_state_backend()
        assignment = None
        uids = {t.resolved_uid for t in flow.transformations}
        if restore is not None:
            assignment = StateAssignment(restore, flow.max_parallelism, uids,
                                         options.allow_non_restored_state)
        sources_left: set[str] = set()
        all_sources_done = asyncio.Event()
        coordinator: CheckpointCoordinator | None = None
        if config is not None and self.storage is not None:
            coordinator = CheckpointCoordinator(
                config, self.storage, flow.name, flow.max_parallelism,
                [], self.storage.latest_id() + 1, self.metrics.checkpoints,
            )

        async with asyncio.TaskGroup() as tg:

            def spawn(coro: Coroutine[Any, Any, None]) -> None:
                tg.create_task(coro)

            def on_source_finished(task: StreamTask) -> None:
                sources_left.discard(task.task_id)
                if not sources_left:
                    all_sources_done.set()

            env = TaskEnvironment(
                job_name=flow.name,
                max_parallelism=flow.max_parallelism,
                batch_size=flow.batch_size,
                buffer_timeout=flow.buffer_timeout,
                exactly_once=config is None or config.mode == "exactly_once",
                storage=self.storage,
                coordinator=coordinator,
                spawn=spawn,
                on_source_finished=on_source_finished,
            )
            graph = ExecutionGraph(
                flow.transformations, flow.parallelism, flow.max_parallelism, flow.batch_size,
                flow.channel_capacity, env, backend, assignment,
            )
            tasks = graph.tasks
            sources = [t for t in tasks if t.source is not None]
            sources_left.update(t.task_id for t in sources)
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
                    await coordinator.checkpoint()
                    break
                except CheckpointError as exc:
                    if attempt == 2:
                        raise CheckpointError(f"the final checkpoint failed: {exc}") from exc
            coordinator.stop()
        for task in sources:
            task.gate.post(task.end)
