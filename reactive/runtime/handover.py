"""The in-memory hand-over of state at a rescale (``job.rescale``): the instances after the
switch adopt the old instances' key groups as live objects instead of reading the rescale
checkpoint's files (in one process a key group moves by reference, the hand-over that
Megaphone (Hoffmann et al., VLDB 2019) and Rhino (Del Monte et al., SIGMOD 2020) approach
with live migration between processes).

At the rescale barrier's snapshot instant every operator instance of the old execution graph
is captured (:meth:`StateHandOver.capture`): its keyed backend's key groups by reference
(:meth:`~reactive.state.backend.KeyedStateBackend.hand_over`; timers are keyed state, so
they move with them) and its operator state as the bytes the checkpoint's synchronous part
serialized. After the barrier the old graph changes no state: the sources read nothing
more, so no record follows the barrier, and a capture refuses an instance whose
processing-time timers could still fire. When the rescale checkpoint completed and committed,
the new graph takes the captures over (:func:`take_over`): each new keyed instance adopts the
key groups of its range, operator state is redistributed as a restore redistributes it
(:func:`~reactive.checkpoint.state_assignment_operation.redistribute_operator_state`: round
robin, union, broadcast). The checkpoint stays the fallback for every failure after the
switch, and for any rescale the hand-over cannot carry (:attr:`StateHandOver.refused`): a
backend without in-memory hand-over (RocksDB), processing-time timers pending, unaligned
checkpoints (their in-flight records are in the checkpoint) or an iteration (its loop log).
"""

from __future__ import annotations

import asyncio
import pickle
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ..checkpoint.state_assignment_operation import redistribute_operator_state
from ..errors import RestoreError
from ..two_phase_commit import TwoPhaseCommitSink, without_pending
from .operators.sink import SinkOperator

if TYPE_CHECKING:
    from ..keygroups import KeyGroupRange
    from ..state.backend import KeyedStateBackend, KeyGroupsInMemory
    from .operators import StreamOperator

__all__ = ["StateHandOver", "StateTransfer", "take_over"]

#: how a rescale gives the state to the new instances: ``"auto"`` hands it over in memory
#: where every instance can (else restores the rescale checkpoint), ``"checkpoint"`` always
#: restores the checkpoint
StateTransfer = Literal["auto", "checkpoint"]


@dataclass(frozen=True, slots=True)
class _Captured:
    keyed: KeyGroupsInMemory | None
    operator_state: bytes | None


@dataclass(eq=False)
class StateHandOver:
    """The old instances' state captured at a rescale barrier's snapshot instant.

    Attributes:
        refused: why the rescale restores its checkpoint instead (None: nothing refused
            so far); set by the first instance that cannot be handed over.
        parallelism: the old parallelism of each captured operator, by uid.
        expected: the number of operator instances the old graph runs (0: unknown).
        settled: set once ``expected`` instances were captured, or one refused: every
            task of the old graph took its snapshot's synchronous part, so the new
            instances may start while the asynchronous parts write.
    """

    refused: str | None = None
    parallelism: dict[str, int] = field(default_factory=dict)
    expected: int = 0
    settled: asyncio.Event = field(default_factory=asyncio.Event)
    _instances: dict[tuple[str, int], _Captured] = field(default_factory=dict)

    def capture(self, op: StreamOperator, operator_state: bytes | None) -> None:
        """At the task's snapshot instant: keep the state of operator instance ``op``.

        Args:
            op: the operator instance (its snapshot's synchronous part just ran).
            operator_state: its operator state as the snapshot serialized it (None: empty).
        """
        if self.refused is not None:
            return
        self._capture(op, operator_state)
        if self.refused is not None or (self.expected and len(self._instances) >= self.expected):
            self.settled.set()

    def _capture(self, op: StreamOperator, operator_state: bytes | None) -> None:
        keyed = None
        backend = op.keyed_backend
        if backend is not None:
            timers = getattr(op, "timers", None)
            pending = getattr(timers, "num_processing_time_timers", None)
            if timers is not None and (pending is None or pending()):
                self.refused = (f"operator {op.uid!r} has processing-time timers, which may "
                                "fire after the barrier")
                return
            keyed = backend.hand_over()
            if keyed is None:
                self.refused = (f"the keyed state backend of operator {op.uid!r} "
                                f"({type(backend).__name__}) cannot hand its key groups over "
                                "in memory")
                return
        self._instances[(op.uid, op.subtask)] = _Captured(keyed, operator_state)
        self.parallelism[op.uid] = op.parallelism

    def refusal(self, instances: int) -> str | None:
        """Why the captures cannot be taken over (None: they can), given the number of
        operator instances the old graph ran."""
        if self.refused is None and len(self._instances) != instances:
            return (f"{len(self._instances)} of {instances} operator instances were captured "
                    "at the barrier")
        return self.refused

    def keyed_parts(self, uid: str, key_group_range: KeyGroupRange) -> list[KeyGroupsInMemory]:
        """The captured key groups of operator ``uid`` that intersect ``key_group_range``."""
        out = []
        for (u, _), captured in self._instances.items():
            part = captured.keyed
            if u == uid and part is not None:
                r = part.key_group_range
                if r.start <= key_group_range.end and key_group_range.start <= r.end:
                    out.append(part)
        return out

    def operator_states(self, uid: str) -> list[dict[str, tuple[str, list[Any]]]]:
        """The captured operator state of each old instance of ``uid``, by subtask index
        (read from the bytes the snapshot serialized: the values at the barrier)."""
        out: list[dict[str, tuple[str, list[Any]]]] = []
        for subtask in range(self.parallelism.get(uid, 0)):
            captured = self._instances.get((uid, subtask))
            blob = captured.operator_state if captured is not None else None
            out.append(pickle.loads(blob) if blob is not None else {})
        return out

    def release(self) -> None:
        """Drop the captures once taken over (the old tables would keep dicts alive that the
        new instances replace)."""
        self._instances.clear()


def take_over(handover: StateHandOver,
              instances: list[tuple[StreamOperator, KeyedStateBackend | None, int, int,
                                    KeyGroupRange | None]],
              at_barrier: bool = False) -> None:
    """Give the new instances the captured state, before any task runs.

    Args:
        handover: the captures of the old instances.
        instances: each new operator instance as ``(operator, keyed backend, subtask,
            parallelism, key-group range)``.
        at_barrier: the new instances start before the rescale's checkpoint completed
            (the old ones still write their snapshots): a two-phase-commit sink's new
            instances get its state without the pre-committed transactions, which the old
            instances commit once the checkpoint completes.

    Raises:
        RestoreError: naming the operator and instance, when a backend cannot adopt the
            parts (the job fails: the rescale checkpoint restores it).
    """
    old_states: dict[str, list[dict[str, tuple[str, list[Any]]]]] = {}
    for op, backend, subtask, parallelism, kgr in instances:
        try:
            if backend is not None and kgr is not None:
                backend.take_over(handover.keyed_parts(op.uid, kgr))
            if op.uid not in old_states:
                old_states[op.uid] = handover.operator_states(op.uid)
            states = redistribute_operator_state(old_states[op.uid], subtask, parallelism)
            if at_barrier and isinstance(op, SinkOperator) and \
                    isinstance(op.sink, TwoPhaseCommitSink) and SinkOperator.STATE in states:
                mode, entries = states[SinkOperator.STATE]
                states = {**states, SinkOperator.STATE: (mode, without_pending(entries))}
            if states:
                op.operator_state.restore(states)
        except Exception as exc:
            raise RestoreError(f"operator {op.uid!r}, subtask {subtask}: taking over the "
                               f"state handed over at the rescale failed: "
                               f"{type(exc).__name__}: {exc}") from exc
    handover.release()
