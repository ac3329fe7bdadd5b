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

On the heap backend the next attempt reads nothing from the checkpoint: every instance's
state was captured at the barrier's snapshot instant and the new instances take it over by
reference (:mod:`.handover`); the checkpoint is restored instead where the hand-over refuses
(another backend, processing-time timers pending, unaligned checkpoints, an iteration) or
when ``state_transfer="checkpoint"`` asks for it.

If the checkpoint fails, the quiesced tasks resume and the job runs on at the parallelism
it had (the last completed checkpoint's configuration).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..checkpoint.contract import Reconfiguration
from ..errors import ConfigurationError, ReconfigurationError
from .execution_graph import validate
from .handover import StateHandOver
from .reconfiguration import RescalePlan

if TYPE_CHECKING:
    from ..graph import LogicalGraph

__all__ = ["RescaleSwitch", "plan_rescale"]


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
