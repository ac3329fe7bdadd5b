"""The checkpoint barrier: what the coordinator injects at the sources and the channels
carry between the records of two epochs (Carbone et al., "Lightweight Asynchronous Snapshots
for Distributed Dataflows", 2015, section 3; Flink's ``CheckpointBarrier``).

It is defined with the checkpoints, not with the tasks and channels that carry it
(:mod:`reactive.runtime.events` re-exports it among the other channel events), so the
coordinator makes barriers without depending on the runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["CheckpointBarrier"]


@dataclass(frozen=True, slots=True)
class CheckpointBarrier:
    """Barrier ``checkpoint_id``: separates the records of epoch n from epoch n+1 (ABS).

    Attributes:
        checkpoint_id: the checkpoint's id, increasing per job.
        timestamp: trigger time (seconds since the epoch).
        kind: ``"checkpoint"`` or ``"savepoint"``.
        unaligned: an unaligned checkpoint's barrier (FLIP-76): it overtakes the records
            queued in the channels (see ``reactive.runtime.unaligned``).
        updates: the reconfiguration it carries (Carbone 2018 (PhD thesis), section
            4.5.5): :class:`~reactive.runtime.reconfiguration.FunctionUpdate` s each
            instance of their operator applies at its snapshot instant; empty for none.
    """

    checkpoint_id: int
    timestamp: float
    kind: Literal["checkpoint", "savepoint"] = "checkpoint"
    unaligned: bool = False
    updates: tuple[Any, ...] = ()
