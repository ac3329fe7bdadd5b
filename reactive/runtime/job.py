"""Running a dataflow: the job handle, attempts, and the restart strategy.

A :class:`Job` runs attempts until one finishes. Each attempt builds the execution graph,
restores the latest completed checkpoint (or the one asked for), and runs every task, the
checkpoint coordinator and the asynchronous snapshot parts in one ``asyncio.TaskGroup``:
the first failure cancels everything else in the attempt (structured concurrency). The
restart strategy then decides whether a new attempt starts from the latest completed
checkpoint or the failure reaches the caller as :class:`~reactive.errors.JobFailedError`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..checkpoint.coordinator import CheckpointCoordinator, OperatorInfo
from ..checkpoint.state_assignment import StateAssignment
from ..checkpoint.storage import CheckpointStorage, CompletedCheckpoint
from ..config import CheckpointConfig, RestartStrategy
from ..errors import CheckpointError, JobCancelledError, JobFailedError, ReactiveError
from ..state.backend import StateBackend
from .execution_graph import ExecutionGraph, validate
from .metrics import JobMetrics
from .task import StreamTask, TaskEnvironment

if TYPE_CHECKING:
    from ..dataflow import Dataflow

__all__ = ["Job", "JobOptions", "JobStatus"]

log = logging.getLogger("reactive.job")

JobStatus = Literal["created", "running", "restarting", "finished", "failed", "cancelled"]


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
        validate(flow.transformations, flow.parallelism, flow.max_parallelism)
        if options.restore_from is not None:
            # fail fast on a wrong path, before anything runs
            CheckpointStorage.load(options.restore_from, verify=False)

    def start(self) -> None:
        """Start the job's main coroutine on the running loop (called by ``Dataflow.start``).

        The job owns this one task; ``wait`` and ``cancel`` end it.
        """
        self._task = asyncio.get_running_loop().create_task(self._main(), name=f"job {self.name}")

    async def wait(self) -> None:
        """Wait until the job finishes.

        Raises:
            JobFailedError: when it failed for good (``__cause__`` is the failure).
            JobCancelledError: when it was cancelled.
        """
        assert self._task is not None
        try:
            await asyncio.shield(self._task)
        except asyncio.CancelledError:
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
