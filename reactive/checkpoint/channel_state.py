"""The channel state of unaligned checkpoints: a task's in-flight input records, stored with
its snapshot and handed out again on restore (Flink's ``ChannelStateWriter`` and the
channel-state part of ``StateAssignmentOperation``, FLIP-76).

A task's in-flight records are stored under its head operator's uid, in one file per
subtask (``"channel_state"`` next to ``"keyed_state"`` and ``"operator_state"``), as a list
of :class:`InFlightEntry`: one input batch each, serialized when the task took it, with the
input it came on and how the edge distributes records. On restore, instance ``i`` of
parallelism ``p`` replays (in the order they were stored, per old instance):

- a ``key_by`` edge's records whose key group ``i`` owns (``kg * p // max_parallelism``),
  whichever old instance stored them (Flink redistributes keyed in-flight data by key
  group, like keyed state);
- a forward or rebalance edge's records stored by old instances ``s`` with ``s % p == i``
  (each record once);
- a broadcast edge's records stored by old instance ``i % p_old`` (every instance gets each
  broadcast record once).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..errors import RestoreError
from .durable_files import resolve_under

if TYPE_CHECKING:
    from .contract import OperatorState

__all__ = ["InFlightEntry", "assign_in_flight", "read_channel_states", "serialize_channel_state"]

#: the format name in a channel-state handle
FORMAT = "channel-state-v1"


@dataclass(frozen=True, slots=True)
class InFlightEntry:
    """One in-flight input batch of an unaligned checkpoint.

    Attributes:
        side: the input of a two-input operator it came on (0 or 1).
        mode: how its edge distributes records: ``"keyed"``, ``"split"`` (forward and
            rebalance) or ``"broadcast"``.
        records: the batch, pickled when the task took it.
        key_groups: for ``"keyed"``, each record's key group (same order); else None.
    """

    side: int
    mode: Literal["keyed", "split", "broadcast"]
    records: bytes
    key_groups: list[int] | None


def serialize_channel_state(entries: list[InFlightEntry]) -> bytes:
    """The bytes of a channel-state file."""
    return pickle.dumps([(e.side, e.mode, e.records, e.key_groups) for e in entries],
                        protocol=pickle.HIGHEST_PROTOCOL)


def read_channel_states(job_dir: Path, operator: OperatorState) -> list[list[InFlightEntry]]:
    """Read the channel state of every old instance of an operator, by instance index.

    Args:
        job_dir: the directory the handles' paths are relative to.
        operator: the operator's state in the checkpoint.

    Raises:
        RestoreError: naming the file that cannot be read.
        CorruptCheckpointError: a path that leads outside ``job_dir``.
    """
    out: list[list[InFlightEntry]] = []
    for _, sub in operator.by_index():
        handle = sub.channel_state
        if handle is None:
            out.append([])
            continue
        path = resolve_under(job_dir, handle.files[0].path)
        try:
            raw = pickle.loads(path.read_bytes())
        except (OSError, pickle.UnpicklingError, EOFError) as exc:
            raise RestoreError(f"cannot read the in-flight records {path}: {exc}") from exc
        out.append([InFlightEntry(side, mode, records, kgs) for side, mode, records, kgs in raw])
    return out


def assign_in_flight(old: list[list[InFlightEntry]], subtask: int, parallelism: int,
                     max_parallelism: int) -> list[tuple[int, list[Any]]]:
    """The in-flight batches instance ``subtask`` of ``parallelism`` replays.

    Args:
        old: every old instance's entries (:func:`read_channel_states`).

    Returns:
        ``(side, records)`` pairs in replay order.
    """
    p_old = len(old)
    out: list[tuple[int, list[Any]]] = []
    for s, entries in enumerate(old):
        for e in entries:
            if e.mode == "keyed":
                assert e.key_groups is not None
                records = pickle.loads(e.records)
                mine = [r for r, kg in zip(records, e.key_groups, strict=True)
                        if kg * parallelism // max_parallelism == subtask]
                if mine:
                    out.append((e.side, mine))
            elif (e.mode == "broadcast" and s == subtask % p_old) or (
                    e.mode == "split" and s % parallelism == subtask):
                out.append((e.side, pickle.loads(e.records)))
    return out
