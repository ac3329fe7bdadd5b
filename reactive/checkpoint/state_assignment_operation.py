"""Assigning a completed checkpoint's state to the instances of a new execution
(Flink's ``StateAssignmentOperation``).

Keyed state follows key groups: an instance receives the handles of every old instance
whose key-group range intersects its own, and its backend loads only its key groups (so the
same code restores at the same or another parallelism). Operator state is redistributed by
its declared mode: ``split`` (same parallelism: unchanged; else all entries dealt round robin)
or ``union`` (every instance gets all entries). Source: Carbone 2018 (PhD thesis), section 4.2.
The in-flight records of an unaligned checkpoint are handed out by key group too
(:mod:`.channel_state`).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any

from ..errors import RestoreError
from ..keygroups import KeyGroupRange
from .channel_state import InFlightEntry, assign_in_flight, read_channel_states
from .contract import KeyedStateHandle
from .metadata import CompletedCheckpoint

__all__ = ["StateAssignmentOperation", "SubtaskRestore", "redistribute_operator_state"]


@dataclass
class SubtaskRestore:
    """What one operator instance restores."""

    keyed_handles: list[KeyedStateHandle] = field(default_factory=list)
    operator_state: dict[str, tuple[str, list[Any]]] = field(default_factory=dict)


class StateAssignmentOperation:
    """The state of a completed checkpoint, ready to be handed out per operator instance.

    Args:
        checkpoint: the checkpoint or savepoint to restore.
        max_parallelism: the program's; must equal the checkpoint's.
        uids: the program's operator uids.
        allow_non_restored_state: accept state of operators the program no longer has.

    Raises:
        RestoreError: on a max-parallelism mismatch, or state of unknown operators.
    """

    def __init__(self, checkpoint: CompletedCheckpoint, max_parallelism: int, uids: set[str],
                 allow_non_restored_state: bool = False) -> None:
        self.checkpoint = checkpoint
        meta = checkpoint.metadata
        if meta.max_parallelism != max_parallelism:
            raise RestoreError(
                f"checkpoint {checkpoint.path} was taken with max_parallelism "
                f"{meta.max_parallelism}, the program has {max_parallelism}: key groups "
                "would not line up; keep max_parallelism fixed for the life of the state"
            )
        unknown = sorted(set(meta.operators) - uids)
        if unknown and not allow_non_restored_state:
            raise RestoreError(
                f"checkpoint {checkpoint.path} holds state of operators {unknown} that the "
                "program does not have (was a uid changed?); pass "
                "allow_non_restored_state=True to drop it"
            )
        self._opstate_cache: dict[str, list[dict[str, tuple[str, list[Any]]]]] = {}
        self._channel_state_cache: dict[str, list[list[InFlightEntry]]] = {}
        self.max_parallelism = max_parallelism

    def has_in_flight(self, uid: str) -> bool:
        """Whether operator ``uid``'s instances stored in-flight records (an unaligned
        checkpoint, with records queued in front of them)."""
        op = self.checkpoint.metadata.operators.get(uid)
        return op is not None and any(sub.channel_state is not None
                                      for sub in op.subtasks.values())

    def in_flight_for(self, uid: str, subtask: int, parallelism: int) -> list[tuple[int, list[Any]]]:
        """The in-flight input batches instance ``subtask`` of ``parallelism`` of the task
        headed by operator ``uid`` replays before any new input, as ``(side, records)``.

        Raises:
            RestoreError: a channel-state file cannot be read.
        """
        if not self.has_in_flight(uid):
            return []
        if uid not in self._channel_state_cache:
            self._channel_state_cache[uid] = read_channel_states(
                self.checkpoint.job_dir, self.checkpoint.metadata.operators[uid])
        return assign_in_flight(self._channel_state_cache[uid], subtask, parallelism,
                                self.max_parallelism)

    def _old_operator_states(self, uid: str) -> list[dict[str, tuple[str, list[Any]]]]:
        if uid not in self._opstate_cache:
            out: list[dict[str, tuple[str, list[Any]]]] = []
            for _, sub in self.checkpoint.metadata.operators[uid].by_index():
                handle = sub.operator_state
                if handle is None:
                    out.append({})
                    continue
                path = self.checkpoint.job_dir / handle.files[0].path
                try:
                    out.append(pickle.loads(path.read_bytes()))
                except (OSError, pickle.UnpicklingError, EOFError) as exc:
                    raise RestoreError(f"cannot read operator state {path}: {exc}") from exc
            self._opstate_cache[uid] = out
        return self._opstate_cache[uid]

    def for_subtask(self, uid: str, subtask: int, parallelism: int,
                    key_group_range: KeyGroupRange | None) -> SubtaskRestore:
        """Return the state instance ``subtask`` of ``parallelism`` of operator ``uid``
        restores (empty when the checkpoint has none for it)."""
        op = self.checkpoint.metadata.operators.get(uid)
        out = SubtaskRestore()
        if op is None:
            return out
        if key_group_range is not None:
            for sub in op.subtasks.values():
                handle, kgr = sub.keyed_state, sub.key_group_range
                if handle is not None and kgr is not None and \
                        kgr.start <= key_group_range.end and key_group_range.start <= kgr.end:
                    out.keyed_handles.append(handle)
        out.operator_state = redistribute_operator_state(
            self._old_operator_states(uid), subtask, parallelism)
        return out


def redistribute_operator_state(old: list[dict[str, tuple[str, list[Any]]]], subtask: int,
                                parallelism: int) -> dict[str, tuple[str, list[Any]]]:
    """The operator state instance ``subtask`` of ``parallelism`` receives from the old
    instances' states (Carbone 2018 (PhD thesis), section 4.2): a ``union`` list gives every
    instance all entries; a ``split`` list keeps each instance's entries at the same
    parallelism, else deals all entries round robin.

    Args:
        old: ``{name: (mode, entries)}`` of each old instance, by old subtask index.
        subtask: the new instance's index.
        parallelism: the new parallelism.

    Returns:
        ``{name: (mode, entries)}`` for the new instance.
    """
    out: dict[str, tuple[str, list[Any]]] = {}
    same = len(old) == parallelism
    names = {name for states in old for name in states}
    for name in sorted(names):
        modes = {states[name][0] for states in old if name in states}
        mode = "union" if "union" in modes else "split"
        if mode == "union":
            entries = [e for states in old if name in states for e in states[name][1]]
        elif same:
            entries = list(old[subtask].get(name, (mode, []))[1])
        else:
            everything = [e for states in old if name in states for e in states[name][1]]
            entries = everything[subtask::parallelism]
        out[name] = (mode, entries)
    return out
