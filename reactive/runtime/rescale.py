"""Rescaling a running job (``job.rescale``): a change of parallelism carried by a
checkpoint's barrier (Carbone 2018 (PhD thesis), section 4.5.5, reconfiguration through the
epoch marker) and applied by an in-process restore at the new parallelism (Carbone 2018,
section 4.2: key groups and operator state reassigned as a restore assigns them).

The barrier of the rescale's checkpoint carries a
:class:`~reactive.runtime.reconfiguration.RescalePlan`. Every task takes
its snapshot at the barrier's snapshot instant; a source task, right after it injected the
barrier, *quiesces*: it reads no more input and only runs its mail (completion
notifications), so no record after the barrier reaches an operator of the old execution
graph. Once the checkpoint completed and every task committed (two-phase-commit sinks
commit their transactions as after any checkpoint), the job's runner ends the attempt
and starts the next one from that checkpoint at the new parallelism, in the same process:
keyed state and timers by key-group ranges, operator state round robin, union or broadcast,
sources from their positions, pending transactions committed as a restore commits them
(:class:`~reactive.checkpoint.state_assignment_operation.StateAssignmentOperation`). The
job handle, its results iterators and metrics carry over.

On the heap backend nothing is read from the checkpoint: every instance's state was
captured at the barrier's snapshot instant and the new instances take it over by reference
(:mod:`.handover`); the checkpoint is restored instead where the hand-over refuses (another
backend, processing-time timers pending, unaligned checkpoints, an iteration) or when
``state_transfer="checkpoint"`` asks for it. Handed over, the switch does not wait for the
checkpoint (:func:`switch_at_barrier`): once every old task took its snapshot's synchronous
part, the new execution graph starts in the running attempt (same task group, same
checkpoint coordinator) while the old tasks' asynchronous parts write, their snapshots kept
copy-on-write through the new instances; the old tasks end once the checkpoint completed
and they committed (a two-phase-commit sink's old instances commit the transactions they
pre-committed at the barrier; its new instances start without them). So the pause is the
barrier's travel and the new graph's start, not the snapshot's writing (Megaphone, Hoffmann
et al., VLDB 2019, and Rhino, Del Monte et al., SIGMOD 2020, migrate state while the
dataflow runs for the same reason). :func:`switch_waits` says when the switch waits instead
(a Kafka sink, whose new instances fence the old ones' transactions; synchronous snapshots).

If the checkpoint fails before the switch, the quiesced tasks resume and the job runs on at
the parallelism it had (the last completed checkpoint's configuration); after a switch at
the barrier, the attempt fails and restarts from the last completed checkpoint (the new
tasks ran on state no completed checkpoint holds, and committed nothing).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ..checkpoint.contract import Reconfiguration
from ..checkpoint.metadata import CompletedCheckpoint
from ..errors import ConfigurationError, ReconfigurationError
from ..two_phase_commit import TwoPhaseCommitSink
from .execution_graph import ExecutionGraph, validate
from .handover import StateHandOver, StateTransfer
from .reconfiguration import RescalePlan, apply_updates

if TYPE_CHECKING:
    from ..checkpoint.coordinator import CheckpointCoordinator
    from ..config import CheckpointConfig
    from ..graph import LogicalGraph
    from ..state.backend import StateBackend
    from .metrics import JobMetrics
    from .reconfiguration import FunctionUpdate, OperatorChange
    from .task import StreamTask, TaskEnvironment

__all__ = ["RescaleSwitch", "RunningAttempt", "SwitchingRunner", "handover_refused", "outcome_of",
           "plan_rescale", "switch_at_barrier", "switch_waits"]


class RescaleSwitch(Exception):
    """Ends the running attempt so that the next one runs at the plan's parallelism from
    ``handover`` (the state handed over in memory at the barrier of ``checkpoint_id``) or,
    when it is None, from a restore of ``checkpoint_id`` (never a failure: the runner
    counts no restart)."""

    def __init__(self, checkpoint_id: int, plan: RescalePlan,
                 handover: StateHandOver | None = None) -> None:
        super().__init__(f"rescale at checkpoint {checkpoint_id}")
        self.checkpoint_id = checkpoint_id
        self.plan = plan
        self.handover = handover


def plan_rescale(flow: LogicalGraph, current: Mapping[str, int],
                 request: int | Mapping[str, int]) -> RescalePlan:
    """The plan that takes a job running at ``current`` to ``request``.

    Args:
        flow: the job's logical graph.
        current: the parallelism each operator runs at, by uid.
        request: one parallelism for every operator (an operator with a lower bound, a
            non-parallel source say, gets its bound), or ``{uid: parallelism}`` for some.

    Returns:
        the plan (``changed`` is empty when nothing changes).

    Raises:
        ReconfigurationError: an unknown uid, a parallelism below 1, above the max
            parallelism or above what an operator supports (nothing was sent).
    """
    uids = {t.resolved_uid: t for t in flow.transformations}
    if isinstance(request, int):
        if isinstance(request, bool) or request < 1:
            raise ReconfigurationError(f"cannot rescale job {flow.name!r} to parallelism "
                                       f"{request!r}: it must be an int >= 1")
        wanted = {uid: min(request, t.max_parallelism or request) for uid, t in uids.items()}
    else:
        unknown = sorted(set(request) - set(uids))
        if unknown:
            raise ReconfigurationError(f"cannot rescale job {flow.name!r}: no operator "
                                       f"{unknown}; its operators: {sorted(uids)}")
        for uid, p in request.items():
            if not isinstance(p, int) or isinstance(p, bool) or p < 1:
                raise ReconfigurationError(f"cannot rescale operator {uid!r} to parallelism "
                                           f"{p!r}: it must be an int >= 1")
        wanted = {**current, **request}
    new = dict(current)
    new.update(wanted)
    try:
        validate(flow.transformations, flow.parallelism, flow.max_parallelism, new)
    except ConfigurationError as exc:
        raise ReconfigurationError(f"cannot rescale job {flow.name!r}: {exc}") from exc
    # a loop's tail runs at its head's parallelism (tail instance i feeds head instance i)
    for t in flow.transformations:
        if t.loop_head is not None:
            new[t.resolved_uid] = new[t.loop_head.resolved_uid]
    changed = tuple(
        Reconfiguration("rescale", uid, parallelism=new[uid],
                        previous_parallelism=current[uid])
        for uid in uids if new[uid] != current[uid])
    return RescalePlan(new, changed)


class SwitchingRunner(Protocol):
    """What the switch at the barrier uses of the job's runner
    (:class:`~reactive.runtime.job_runner.JobRunner`)."""

    name: str
    flow: LogicalGraph
    metrics: JobMetrics
    tasks: list[StreamTask]
    parallelism: dict[str, int]
    updates: list[tuple[int, FunctionUpdate | OperatorChange]]
    rescale_phases: list[dict[str, float]]
    rescale_started: list[float]
    switch_at_barrier: bool
    attempt: RunningAttempt | None
    tap_sinks: Callable[[list[StreamTask]], None]


@dataclass(eq=False)
class RunningAttempt:
    """What a rescale that switches at its barrier needs of the running attempt: where its
    tasks run and how they are wired (the new execution graph joins the same task group,
    environment and checkpoint coordinator)."""

    env: TaskEnvironment
    backend: StateBackend
    create_task: Callable[..., asyncio.Task[None]]
    sources: list[StreamTask]
    sources_left: set[int]
    handles: dict[int, asyncio.Task[None]]


async def outcome_of(awaitable: Awaitable[CompletedCheckpoint]
                     ) -> CompletedCheckpoint | BaseException:
    """The checkpoint, or the exception awaiting it raised (a cancellation propagates)."""
    try:
        return await awaitable
    except Exception as exc:
        return exc


def handover_refused(flow: LogicalGraph, config: CheckpointConfig | None,
                     state_transfer: StateTransfer) -> str | None:
    """Why a rescale of ``flow`` cannot hand its state over in memory, known before the
    barrier is sent (None: the barrier's captures decide)."""
    if state_transfer == "checkpoint":
        return "state_transfer='checkpoint' asks for a restore"
    if config is not None and config.unaligned:
        return "unaligned checkpoints keep in-flight records in the checkpoint"
    loops = [t.name for t in flow.transformations if t.loop_head is not None]
    if loops:
        return f"iteration {loops[0]!r} keeps its loop's log in the checkpoint"
    return None


def switch_waits(runner: SwitchingRunner, config: CheckpointConfig | None) -> str | None:
    """Why a rescale handed over in memory starts its new tasks only once its
    checkpoint completed and committed, instead of at its barrier (None: at the
    barrier), for a job checkpointing with ``config``."""
    if not runner.switch_at_barrier:
        return "switch_at_barrier is off"
    if config is not None and config.mode == "synchronous":
        return "synchronous snapshots"
    if runner.attempt is None:
        return "the attempt is not running"
    for t in runner.flow.transformations:
        sink = t.sink
        if isinstance(sink, TwoPhaseCommitSink) and not sink.overlapping_instances:
            return (f"sink {t.resolved_uid!r} ({type(sink).__name__}) cannot start new "
                    "instances while the old ones hold pre-committed transactions")
    return None


def switch_at_barrier(runner: SwitchingRunner, coordinator: CheckpointCoordinator,
                      plan: RescalePlan, handover: StateHandOver, rescaled: dict[str, int],
                      waited: float,
                      checkpoint: asyncio.Future[CompletedCheckpoint | BaseException],
                      what: str) -> None:
    """Every old task took its snapshot for the rescale's checkpoint: start the new
    execution graph in the running attempt, on the state handed over, while the old
    snapshots write (Megaphone's and Rhino's live migration, in one process by
    reference; the old snapshots keep their copy-on-write through the new instances,
    :meth:`~reactive.state.backend.KeyedStateBackend.take_over`).

    The old tasks stay, reading nothing (their sources are quiesced), until the
    checkpoint completed and they committed their pre-committed transactions (the
    coordinator tells them with the new tasks: :meth:`CheckpointCoordinator.retire`);
    then they end. If it fails instead, the attempt fails: the new tasks ran on state
    that no completed checkpoint holds, and their output is uncommitted.

    Raises:
        RestoreError: a new instance could not take its share over (the attempt fails).
    """
    attempt = runner.attempt
    assert attempt is not None
    flow = runner.flow
    t0 = time.perf_counter()
    old = runner.tasks
    graph = ExecutionGraph(
        flow.transformations, flow.parallelism, flow.max_parallelism, flow.batch_size,
        flow.channel_capacity, attempt.env, attempt.backend, rescaled,
    )
    t1 = time.perf_counter()
    graph.take_over(handover, at_barrier=True)
    updates = [u for _, u in runner.updates]
    tasks = graph.tasks
    for task in tasks:
        apply_updates(task.operators, updates, opened=False)
    t2 = time.perf_counter()
    coordinator.retire(old, checkpoint_id=coordinator.next_id - 1)
    coordinator.attach(tasks, graph.operator_infos())
    runner.tasks = tasks
    runner.parallelism = dict(plan.parallelism)
    runner.tap_sinks(tasks)
    runner.metrics.attach(tasks)
    attempt.sources[:] = [t for t in tasks if t.source is not None]
    attempt.sources_left.clear()
    attempt.sources_left.update(id(t) for t in tasks
                                if t.source is not None or t.is_iteration_head)
    old_handles = [attempt.handles.pop(id(t)) for t in old if id(t) in attempt.handles]
    for task in tasks:
        attempt.handles[id(task)] = attempt.create_task(task.run(), name=task.task_id)
    started = time.perf_counter()
    runner.rescale_phases.append({"barrier": waited, "prepare": t1 - t0,
                                  "hand-over": t2 - t1, "start": started - t2})
    runner.rescale_started.append(started)
    attempt.create_task(_retire(runner, coordinator, old, old_handles, checkpoint, what),
                        name="rescale: old tasks")


async def _retire(runner: SwitchingRunner, coordinator: CheckpointCoordinator,
                  old: list[StreamTask], handles: list[asyncio.Task[None]],
                  checkpoint: asyncio.Future[CompletedCheckpoint | BaseException],
                  what: str) -> None:
    """After a switch at the barrier: once the rescale's checkpoint completed and
    every task committed, end the old tasks (closing their operators); if it failed,
    fail the attempt (see :meth:`_switch_at_barrier`)."""
    outcome = await asyncio.shield(checkpoint)
    if not isinstance(outcome, CompletedCheckpoint):
        raise ReconfigurationError(
            f"rescale of job {runner.name!r} ({what}): the checkpoint carrying it failed "
            f"after the new tasks started ({outcome}); restarting from the last "
            "completed checkpoint") from outcome
    for handle in handles:
        handle.cancel()
    if handles:
        await asyncio.wait(handles)
    coordinator.retired(old)
