"""The running job's reconfigurations (Carbone 2018 (PhD thesis), section 4.5.5: changes
carried by a checkpoint's barrier): a new version of an operator's function, window queries
added to and removed from a shared window aggregation, and a new parallelism.

:class:`JobReconfiguration` holds the methods of :class:`~reactive.runtime.job.Job` that
send them; the mechanisms are in :mod:`.reconfiguration`, :mod:`.window_queries` and
:mod:`.rescale`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Literal

from ..checkpoint.contract import Reconfiguration
from ..errors import CheckpointError, ReconfigurationError
from .handover import StateTransfer
from .reconfiguration import FunctionUpdate, check_update, function_name
from .source_lifecycle import read_accepted_input
from .window_queries import WindowQueryChange, send_change

if TYPE_CHECKING:
    from ..checkpoint.coordinator import CheckpointCoordinator
    from ..checkpoint.metadata import CompletedCheckpoint
    from ..graph import LogicalGraph
    from .job_runner import JobOptions, JobRunner

__all__ = ["JobReconfiguration"]

log = logging.getLogger(__name__)


class JobReconfiguration:
    """The reconfiguration methods of a job handle (a mixin of
    :class:`~reactive.runtime.job.Job`, which provides the attributes declared here)."""

    name: str
    flow: LogicalGraph
    options: JobOptions
    _runner: JobRunner

    async def _wait_running(self) -> CheckpointCoordinator:
        raise NotImplementedError

    async def _coordinator_for(self, uid: str, action: str,
                               needs_checkpoints: str) -> CheckpointCoordinator:
        """The running attempt's coordinator, to send a change of operator ``uid`` with its
        next barrier, once the input accepted before the call was read.

        Raises:
            ReconfigurationError: without checkpointing (``needs_checkpoints`` says why it
                needs them), no operator ``uid``, or the job is not running.
        """
        if self.options.checkpoints is None:
            raise ReconfigurationError(
                f"{needs_checkpoints} (pass checkpoints=CheckpointConfig(...))")
        uids = sorted(t.resolved_uid for t in self.flow.transformations)
        if uid not in uids:
            raise ReconfigurationError(f"job {self.name!r} has no operator {uid!r}; its "
                                       f"operators: {uids}")
        await read_accepted_input(self.flow.transformations)
        try:
            return await self._wait_running()
        except CheckpointError as exc:
            raise ReconfigurationError(f"cannot {action} {uid!r}: {exc}") from exc

    async def update(self, uid: str, function: Any) -> CompletedCheckpoint:
        """Replace operator ``uid``'s function by a new version while the job runs
        (reconfiguration carried by the epoch marker: Carbone 2018 (PhD thesis), section
        4.5.5).

        First the new version is checked against the running one: each version's ``open``
        runs against a probe context that records the state it asks for (and touches no
        state); a state both use must keep its kind and its serializer's type. Then a
        checkpoint is triggered whose barrier carries the new version: each instance of
        the operator switches at that barrier's snapshot instant, after the synchronous part
        of its snapshot (the old version is closed, the new one opened with the same runtime
        context, so keyed state, operator state and timers carry over). Records before the
        barrier saw the old version, records after it the new one; like :meth:`checkpoint`,
        every record a :class:`~reactive.PushSource` accepted before the call is before it.
        The checkpoint's metadata records the update (``metadata.reconfigurations``), and a
        restart that restores it or a later checkpoint of this run runs the new version; a
        restore of an earlier one runs the old version.

        Args:
            uid: the operator's uid (a map, filter, flat_map, reduce or process operator).
            function: the new version: a callable, or a ``ProcessFunction`` for process.

        Returns:
            the completed checkpoint that carried the update.

        Raises:
            IncompatibleUpdateError: before anything was sent: the operator cannot be
                updated, or the new version's state differs in kind or serializer (the
                message names the state); the job runs the old version unchanged.
            ReconfigurationError: without checkpointing, no operator ``uid``, the job is not
                running, or the checkpoint carrying the update failed (its reason is the
                ``__cause__``): the attempt is then failed, so the restart strategy restores
                the last completed checkpoint, which runs the old version (with no restart
                left, the job fails).
        """
        coordinator = await self._coordinator_for(
            uid, "update operator", "job.update needs checkpointing: the update travels with "
            "a checkpoint's barrier")
        tasks = self._runner.tasks
        running = [op for task in tasks for op in task.operators if op.uid == uid]
        if not running:
            raise ReconfigurationError(f"cannot update operator {uid!r}: job {self.name!r} "
                                       "has no running instance of it")
        check_update(running[0], function)
        update = FunctionUpdate(uid, function, function_name(function))
        try:
            completed = await coordinator.checkpoint(
                updates=(update,),
                reconfigurations=(Reconfiguration("update", uid, update.name),))
        except CheckpointError as exc:
            error = ReconfigurationError(
                f"update of operator {uid!r} to {update.name} failed: the checkpoint carrying "
                f"it did not complete ({exc}); the job returns to the previous version "
                "(restart from the last completed checkpoint)")
            if self._runner.tasks is tasks:
                # instances that switched already must not commit output of the new
                # version under an epoch no completed checkpoint records
                self._runner.fail_attempt(error)
            raise error from exc
        self._runner.updates.append((completed.checkpoint_id, update))
        log.info("operator %r updated to %s at checkpoint %d", uid, update.name,
                 completed.checkpoint_id)
        return completed

    async def add_window_query(self, uid: str, assigner: Any,
                               name: str | None = None) -> WindowQueryChange:
        """Add a window query to the shared window aggregation ``uid``
        (``KeyedStream.windows([...])``) while the job runs (Cutty's queries added at
        runtime, Carbone 2018 (PhD thesis), section 5.5), carried by a checkpoint's barrier
        as :meth:`update` is; see :mod:`reactive.runtime.window_queries`.

        Args:
            uid: the window operator's uid.
            assigner: a tumbling or sliding event-time window definition.
            name: the query's name (default: its id); the program's queries are named by
                their index (``"0"``, ``"1"``...).

        Returns:
            the change applied: ``query`` is the id its results carry as
            ``WindowResult.query``.

        Raises:
            IncompatibleUpdateError: refused before anything was sent, with the reason; the
                job runs on unchanged.
            ReconfigurationError: as :meth:`update`.
        """
        return await self._change_window_queries(uid, "add", name, assigner)

    async def remove_window_query(self, uid: str, name: str) -> WindowQueryChange:
        """Remove window query ``name`` of the shared window aggregation ``uid`` while the
        job runs: it emits no window after the barrier that carries the change.

        Raises:
            IncompatibleUpdateError: no such query, or its last one (nothing was sent).
            ReconfigurationError: as :meth:`update`.
        """
        return await self._change_window_queries(uid, "remove", name)

    async def _change_window_queries(self, uid: str, action: Literal["add", "remove"],
                                     name: str | None, assigner: Any = None
                                     ) -> WindowQueryChange:
        coordinator = await self._coordinator_for(
            uid, "change operator", "window queries change with a checkpoint's barrier")
        return await send_change(self._runner, coordinator, uid, action, name, assigner)

    @property
    def parallelism(self) -> dict[str, int]:
        """The parallelism each operator runs at, by uid: the running attempt's (after
        ``rescale``, the new one; after a ``resume``, the one the restored checkpoint
        recorded, once the attempt started), else the program's."""
        return dict(self._runner.parallelism)

    async def rescale(self, parallelism: int | dict[str, int], *,
                      state_transfer: StateTransfer = "auto") -> CompletedCheckpoint:
        """Change the parallelism of the running job, without a stop (Carbone 2018 (PhD
        thesis), sections 4.5.5 and 4.2; see ``docs/reconfiguration.md``).

        A checkpoint is triggered whose barrier carries the plan; each source stops reading
        right after it injected the barrier, and once the checkpoint completed and every
        task committed its side effects, the job runs on in this process at the new
        parallelism (keyed state and timers by key groups, operator state round robin,
        union or broadcast, sources from their positions). On the heap backend the new
        instances take over the state the old ones handed over in memory at the barrier
        (key groups by reference: nothing is read from the checkpoint; the rescale's
        checkpoint id is then in ``metrics.handed_over``); else they restore the checkpoint
        (in ``metrics.restored_checkpoints``). Exactly once for state and committed output;
        this handle, its results iterators and metrics carry on. The
        checkpoint's metadata records the change (``reconfigurations`` of kind
        ``"rescale"``, and ``rescaled``: a restart or a ``resume`` restores the rescaled job).

        Args:
            parallelism: one parallelism for every operator (an operator that supports less,
                a non-parallel source say, gets its bound), or ``{uid: parallelism}``.
            state_transfer: ``"auto"`` hands the state over in memory where every operator
                instance can (a heap backend, no processing-time timer pending, aligned
                checkpoints, no iteration), else restores the checkpoint; ``"checkpoint"``
                always restores the checkpoint.

        Returns:
            the completed checkpoint that carried the rescale, once the rescaled job runs.

        Raises:
            ReconfigurationError: without checkpointing, an unknown uid or a parallelism the
                job cannot take (nothing was sent); the job is not running; or the checkpoint
                carrying it failed or the job failed meanwhile (the reason is the
                ``__cause__``): the job then runs from its last completed checkpoint, at the
                parallelism that checkpoint recorded.
        """
        if self.options.checkpoints is None:
            raise ReconfigurationError(
                "job.rescale needs checkpointing: the rescale travels with a checkpoint's "
                "barrier (pass checkpoints=CheckpointConfig(...))")
        await read_accepted_input(self.flow.transformations)
        try:
            coordinator = await self._wait_running()
        except CheckpointError as exc:
            raise ReconfigurationError(f"cannot rescale: {exc}") from exc
        return await self._runner.rescale(coordinator, parallelism, state_transfer)
