"""Expanding the logical graph into tasks and channels (Flink's ``StreamingJobGraphGenerator``
and ``ExecutionGraph`` in one step).

Operators connected by a forward edge with equal parallelism, where the producer has exactly
one consumer, are *chained* into one task. Every other edge becomes channels: point-wise for
forward edges, all-to-all for rebalance, broadcast and key-group (``key_by``) edges.

Building the graph does no file work. Restoring a checkpoint into it (:meth:`ExecutionGraph.restore`)
reads and unpickles snapshot files, so it runs one operator instance at a time in a worker
thread: the event loop, which the application may share, keeps running. No task runs yet, so
nothing else touches an instance's backend or operator state while its thread fills them.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from ..checkpoint.coordinator import OperatorInfo
from ..checkpoint.off_loop import in_thread
from ..checkpoint.state_assignment_operation import StateAssignmentOperation
from ..errors import ConfigurationError, RestoreError
from ..graph import Edge, Transformation
from ..key_encoding import bind_key_serializer
from ..keygroups import KeyGroupRange, key_group_range_for_operator
from ..state.backend import KeyedStateBackend, StateBackend
from .channel import Channel, InputGate
from .handover import StateHandOver, take_over
from .iteration_head import IterationHeadTask, LoopQuiescence
from .operators import StreamOperator
from .partitioner import (
    BroadcastPartitioner,
    ForwardPartitioner,
    KeyGroupPartitioner,
    Partitioner,
    RebalancePartitioner,
    VectorizedKeySelector,
)
from .record_writer import RecordWriter
from .task import StreamTask, TaskEnvironment
from .task_mailbox import TaskMailbox

__all__ = ["ExecutionGraph", "parallelism_of", "validate"]


@dataclass(frozen=True)
class _InstanceRestore:
    """Where one operator instance's restored state goes."""

    operator: StreamOperator
    keyed_backend: KeyedStateBackend | None
    subtask: int
    parallelism: int
    key_group_range: KeyGroupRange | None


@dataclass
class _Chain:
    transformations: list[Transformation]
    parallelism: int

    @property
    def head(self) -> Transformation:
        return self.transformations[0]

    @property
    def tail(self) -> Transformation:
        return self.transformations[-1]

    @property
    def name(self) -> str:
        return " -> ".join(t.name for t in self.transformations)


def _parallelism(t: Transformation, default: int,
                 overrides: Mapping[str, int] | None = None) -> int:
    if overrides:
        p = overrides.get(t.resolved_uid)
        if p is not None:
            return p
    return t.parallelism if t.parallelism is not None else default


def validate(transformations: list[Transformation], default_parallelism: int,
             max_parallelism: int, overrides: Mapping[str, int] | None = None) -> None:
    """Refuse an invalid program before anything runs.

    Args:
        overrides: parallelism by uid in place of the program's (a rescaled job).

    Raises:
        ConfigurationError: no source or no sink, duplicate uid, a parallelism above the max
            parallelism or above what an operator supports.
    """
    if not any(t.kind == "source" for t in transformations):
        raise ConfigurationError("the dataflow has no source")
    if not any(t.kind == "sink" for t in transformations):
        raise ConfigurationError("the dataflow has no sink: add .sink(...) to see its output")
    seen: dict[str, Transformation] = {}
    for t in transformations:
        uid = t.resolved_uid
        if uid in seen:
            raise ConfigurationError(
                f"duplicate uid {uid!r} (operators {seen[uid].name!r} and {t.name!r}); "
                "every operator needs its own uid"
            )
        seen[uid] = t
        p = _parallelism(t, default_parallelism, overrides)
        if p > max_parallelism:
            raise ConfigurationError(
                f"operator {t.name!r} has parallelism {p} > max_parallelism {max_parallelism}"
            )
        if t.max_parallelism is not None and p > t.max_parallelism:
            raise ConfigurationError(
                f"operator {t.name!r} supports parallelism <= {t.max_parallelism}, got {p}"
            )


def _parallelisms(transformations: list[Transformation], default_parallelism: int,
                  overrides: Mapping[str, int] | None = None) -> dict[int, int]:
    """Each transformation's parallelism, by id; a loop's tail gets its head's (tail
    instance i feeds head instance i)."""
    par = {t.id: _parallelism(t, default_parallelism, overrides) for t in transformations}
    for t in transformations:
        if t.loop_head is not None:
            par[t.id] = par[t.loop_head.id]
    return par


def parallelism_of(transformations: list[Transformation], default_parallelism: int,
                   overrides: Mapping[str, int] | None = None) -> dict[str, int]:
    """Each operator's parallelism, by uid (``overrides`` in place of the program's)."""
    par = _parallelisms(transformations, default_parallelism, overrides)
    return {t.resolved_uid: par[t.id] for t in transformations}


def _chain(transformations: list[Transformation],
           par: dict[int, int]) -> tuple[list[_Chain], dict[int, _Chain]]:
    """Chain operators: a transformation joins its input's chain when the edge is forward,
    the parallelisms are equal and it is that input's only consumer. Returns the chains in
    construction order and each transformation's chain, by id."""
    consumers: dict[int, list[tuple[Transformation, Edge]]] = {t.id: [] for t in transformations}
    for t in transformations:
        for e in t.inputs:
            consumers[e.upstream.id].append((t, e))
    chain_of: dict[int, _Chain] = {}
    chains: list[_Chain] = []
    for t in transformations:
        if len(t.inputs) == 1:
            e = t.inputs[0]
            up = e.upstream
            # an iteration head runs alone in its task: the operators after it must
            # snapshot when the barrier passes them, the head when it comes back
            if (e.partitioning == "forward" and par[up.id] == par[t.id]
                    and len(consumers[up.id]) == 1 and chain_of[up.id].tail is up
                    and t.kind != "iteration_head" and up.kind != "iteration_head"):
                chain = chain_of[up.id]
                chain.transformations.append(t)
                chain_of[t.id] = chain
                continue
        chain = _Chain([t], par[t.id])
        chains.append(chain)
        chain_of[t.id] = chain
    return chains, chain_of


def _task_names(chains: list[_Chain]) -> dict[int, str]:
    """Task names by ``id(chain)``. They identify tasks (checkpoint acknowledgements,
    statistics, logs): two chains with the same display name (two sources called
    "collection") get their head's uid, which is unique, added."""
    names = [c.name for c in chains]
    return {id(c): c.name if names.count(c.name) == 1
            else f"{c.name} [{c.head.resolved_uid}]" for c in chains}


class ExecutionGraph:
    """Tasks and channels of one job attempt.

    Build it, then (to start from a checkpoint) ``await graph.restore(assignment)`` before
    any task runs.

    Args:
        transformations: the logical graph, in construction (topological) order.
        default_parallelism, max_parallelism, batch_size, channel_capacity: dataflow settings.
        env: shared by all tasks.
        state_backend: creates each keyed operator's backend.
        overrides: parallelism by uid in place of the program's (a rescaled job,
            ``job.rescale``).
    """

    def __init__(
        self,
        transformations: list[Transformation],
        default_parallelism: int,
        max_parallelism: int,
        batch_size: int,
        channel_capacity: int,
        env: TaskEnvironment,
        state_backend: StateBackend,
        overrides: Mapping[str, int] | None = None,
    ) -> None:
        validate(transformations, default_parallelism, max_parallelism, overrides)
        self.max_parallelism = max_parallelism
        self.parallelism = _parallelisms(transformations, default_parallelism, overrides)
        self.operator_transformations = transformations
        chains, chain_of = _chain(transformations, self.parallelism)
        # channels: inputs[chain head id][subtask] -> channels, writers[tail id][subtask]
        inputs: dict[int, list[list[Channel]]] = {
            c.head.id: [[] for _ in range(c.parallelism)] for c in chains
        }
        writers: dict[int, list[list[RecordWriter]]] = {
            c.tail.id: [[] for _ in range(c.parallelism)] for c in chains
        }
        for c in chains:
            self._connect_inputs(c, inputs, writers, batch_size, channel_capacity)
        quiescence = self._connect_feedback(chain_of, inputs, writers, batch_size)
        self.tasks: list[StreamTask] = []
        self.channels: list[Channel] = []
        self._instances: list[_InstanceRestore] = []
        task_names = _task_names(chains)
        for c in chains:
            for i in range(c.parallelism):
                operators = [self._create_operator(t, i, c.parallelism, env, state_backend)
                             for t in c.transformations]
                gate = InputGate(inputs[c.head.id][i], TaskMailbox())
                self.channels.extend(gate.channels)
                task_name = task_names[id(c)]
                if c.head.kind == "iteration_head":
                    self.tasks.append(IterationHeadTask(
                        env, task_name, i, c.parallelism, operators, gate,
                        writers[c.tail.id][i], quiescence=quiescence[c.head.id]))
                else:
                    self.tasks.append(StreamTask(env, task_name, i, c.parallelism,
                                                 operators, gate, writers[c.tail.id][i]))

    def _connect_inputs(self, c: _Chain, inputs: dict[int, list[list[Channel]]],
                        writers: dict[int, list[list[RecordWriter]]], batch_size: int,
                        channel_capacity: int) -> None:
        """The channels of chain ``c``'s input edges: point-wise for forward edges,
        all-to-all for the others; each producer instance gets a record writer per edge."""
        par = self.parallelism
        for e in c.head.inputs:
            up, p_up, p_down = e.upstream, par[e.upstream.id], c.parallelism
            kind = e.partitioning
            if kind == "forward" and p_up != p_down:
                kind = "rebalance"
            for i in range(p_up):
                targets = [i] if kind == "forward" else list(range(p_down))
                channels = []
                for j in targets:
                    ch = Channel(channel_capacity, f"{up.name}#{i}->{c.head.name}#{j}",
                                 e.side)
                    inputs[c.head.id][j].append(ch)
                    channels.append(ch)
                partitioner = self._partitioner(e, kind, i, p_down, c.head)
                # what an unaligned checkpoint's in-flight records need to be handed
                # out again at another parallelism
                for ch in channels:
                    ch.broadcast = kind == "broadcast"
                    if isinstance(partitioner, KeyGroupPartitioner):
                        ch.key_group_of = partitioner.key_group_of
                writers[up.id][i].append(
                    RecordWriter(partitioner, channels, up.batch_size or batch_size))

    def _partitioner(self, e: Edge, kind: str, producer: int, p_down: int,
                     consumer: Transformation) -> Partitioner:
        """The partitioner of producer instance ``producer`` on edge ``e`` (``kind`` is
        the edge's partitioning, forward turned rebalance between unequal parallelisms)."""
        if kind == "forward":
            return ForwardPartitioner(1)
        if kind == "rebalance":
            return RebalancePartitioner(p_down, start=producer)
        if kind == "broadcast":
            return BroadcastPartitioner(p_down)
        assert e.key_selector is not None
        if isinstance(e.key_selector, VectorizedKeySelector):  # the columnar key_by
            return e.key_selector.create_partitioner(p_down, self.max_parallelism,
                                                     consumer.resolved_uid)
        return KeyGroupPartitioner(p_down, e.key_selector, self.max_parallelism,
                                   key_serializer=e.key_serializer,
                                   operator=consumer.resolved_uid)

    def _connect_feedback(self, chain_of: dict[int, _Chain],
                          inputs: dict[int, list[list[Channel]]],
                          writers: dict[int, list[list[RecordWriter]]],
                          batch_size: int) -> dict[int, LoopQuiescence]:
        """The feedback channels of iterations: tail instance i -> head instance i,
        unbounded (a bounded channel in a cycle can deadlock), last in the head's gate.
        Returns each loop head's quiescence detection, by the head's id."""
        par = self.parallelism
        quiescence: dict[int, LoopQuiescence] = {}
        for t in self.operator_transformations:
            head = t.loop_head
            if head is None:
                continue
            quiescence[head.id] = LoopQuiescence(par[head.id])
            for i in range(par[head.id]):
                ch = Channel(sys.maxsize, f"{t.name}#{i}->{head.name}#{i} (feedback)")
                inputs[head.id][i].append(ch)
                writers[chain_of[t.id].tail.id][i].append(
                    RecordWriter(ForwardPartitioner(1), [ch], batch_size))
        return quiescence

    def _create_operator(self, t: Transformation, subtask: int, parallelism: int,
                         env: TaskEnvironment, state_backend: StateBackend) -> StreamOperator:
        """Instance ``subtask`` of ``t``'s operator, set up with its keyed state backend
        (for a keyed operator) and remembered for :meth:`restore`."""
        max_parallelism = self.max_parallelism
        op = t.factory()
        keyed_backend = None
        kgr = None
        if op.keyed:
            kgr = key_group_range_for_operator(subtask, parallelism, max_parallelism)
            backend = op.keyed_state_backend(state_backend)
            keyed_backend = backend.create_keyed_backend(
                job_name=env.job_name, operator_uid=op.uid, subtask=subtask,
                key_group_range=kgr, max_parallelism=max_parallelism,
            )
            # the backend computes key groups from the same bytes as the partitioner
            key_serializer = next((e.key_serializer for e in t.inputs
                                   if e.key_serializer is not None), None)
            if key_serializer is not None:
                bind_key_serializer(keyed_backend, key_serializer, op.uid)
        op.setup(subtask, parallelism, max_parallelism, keyed_backend)
        self._instances.append(
            _InstanceRestore(op, keyed_backend, subtask, parallelism, kgr))
        return op

    def operator_infos(self) -> list[OperatorInfo]:
        """What the checkpoint metadata records of each operator besides its state: uid,
        name, parallelism, and whether its instances are keyed."""
        keyed = {inst.operator.uid for inst in self._instances if inst.operator.keyed}
        return [OperatorInfo(t.resolved_uid, t.name, self.parallelism[t.id],
                             t.resolved_uid in keyed)
                for t in self.operator_transformations]

    async def restore(self, assignment: StateAssignmentOperation) -> None:
        """Install a checkpoint's state into every operator instance, before the tasks run.

        Each instance is restored in a worker thread (its operator-state file and its keyed
        snapshots are read and unpickled there), one instance after the other, so the event
        loop keeps running; pickle holds the GIL, but the interpreter hands it to the loop
        every switch interval (5 ms). So ``KeyedStateBackend.restore`` runs in a worker
        thread of the loop's default executor while every other hook of the backend runs
        on the loop's thread (the state-backend SPI says so).

        Raises:
            RestoreError: naming the operator, the instance, the phase and the checkpoint,
                for any error of the restore (a snapshot the backend cannot read, an
                unreadable operator-state file, a backend that fails in a worker thread);
                the original error is its ``__cause__``. The job fails with it at once: a
                restart would restore the same checkpoint the same way.
            OSError: an error of the file system (perhaps transient: a restart retries it),
                of the same errno, its message naming the operator and the phase.
        """
        with_state = assignment.checkpoint.metadata.operators
        try:
            for instance in self._instances:
                if instance.operator.uid in with_state:  # else there is nothing to read
                    await in_thread(_restore_instance, assignment, instance)
        except BaseException:
            self._dispose_keyed_backends()
            raise
        for task in self.tasks:
            head = task.operators[0].uid
            if task.source is None and assignment.has_in_flight(head):
                task.restored_in_flight = await in_thread(
                    assignment.in_flight_for, head, task.subtask, task.parallelism)

    def take_over(self, handover: StateHandOver, at_barrier: bool = False) -> None:
        """Give every operator instance the state the old instances handed over at a
        rescale's snapshot instant (:mod:`.handover`), in place of :meth:`restore`: keyed
        state by reference, on the loop's thread, before the tasks run (``at_barrier``:
        see :func:`~.handover.take_over`).

        Raises:
            RestoreError: an instance could not adopt its share (naming it); the keyed
                backends are released.
        """
        try:
            take_over(handover, [(i.operator, i.keyed_backend, i.subtask, i.parallelism,
                                  i.key_group_range) for i in self._instances], at_barrier)
        except BaseException:
            self._dispose_keyed_backends()
            raise

    def _dispose_keyed_backends(self) -> None:
        """Release every instance's keyed backend after a failed restore or take-over: no
        task will run to close its operators (a restart builds new backends); on the loop's
        thread, like every hook but restore."""
        for instance in self._instances:
            if instance.keyed_backend is not None:
                with contextlib.suppress(Exception):
                    instance.keyed_backend.dispose()


def _restore_instance(assignment: StateAssignmentOperation, instance: _InstanceRestore) -> None:
    """Blocking: read and install one operator instance's share of the checkpoint.

    Raises:
        RestoreError: with the operator, subtask, phase and checkpoint id set.
        OSError: of the errno raised, saying where.
    """
    op = instance.operator
    phase = "state assignment"
    try:
        r = assignment.for_subtask(op.uid, instance.subtask, instance.parallelism,
                                   instance.key_group_range)
        if instance.keyed_backend is not None and r.keyed_handles:
            phase = "keyed state"
            # the plug-in boundary: a backend reads its handles as the JSON it wrote
            instance.keyed_backend.restore([h.to_json() for h in r.keyed_handles],
                                           assignment.checkpoint.job_dir)
        if r.operator_state:
            phase = "operator state"
            op.operator_state.restore(r.operator_state)
    except Exception as exc:
        raise _restore_failure(exc, assignment, instance, phase) from exc


def _restore_failure(exc: Exception, assignment: StateAssignmentOperation,
                     instance: _InstanceRestore, phase: str) -> Exception:
    """The error a failed restore of ``instance`` raises: ``exc`` with where it happened."""
    op = instance.operator
    checkpoint_id = assignment.checkpoint.checkpoint_id
    where = (f"operator {op.name!r} (uid {op.uid!r}, subtask {instance.subtask}/"
             f"{instance.parallelism}) failed to restore its {phase} from checkpoint "
             f"{checkpoint_id}")
    if isinstance(exc, OSError):
        # the file system's errors may pass (a full disk, a network mount): a restart
        # retries them, so the error keeps its type (OSError picks the subclass of the
        # errno) and says where it happened
        if exc.errno is None:
            return OSError(f"{where}: {exc}")
        return OSError(exc.errno, f"{where}: {exc.strerror}", exc.filename)
    if isinstance(exc, RestoreError) and exc.operator is not None:
        return exc
    hint = ""
    if phase == "keyed state" and not isinstance(exc, RestoreError):
        hint = (" (KeyedStateBackend.restore runs in a worker thread, every other hook on "
                "the event loop's thread: a backend's connections and handles must be "
                "usable from both)")
    return RestoreError(f"{where}: {type(exc).__name__}: {exc}{hint}", operator=op.uid,
                        subtask=instance.subtask, phase=phase, checkpoint_id=checkpoint_id)
