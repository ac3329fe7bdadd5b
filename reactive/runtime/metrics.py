"""Job metrics: records in/out per operator, the latest checkpoints' statistics and running
totals over all of them."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..checkpoint.stats import CheckpointHistory, CheckpointStats, CheckpointTotals

if TYPE_CHECKING:
    from .task import StreamTask

__all__ = ["JobMetrics"]


@dataclass
class JobMetrics:
    """Live figures of a job (summed over all instances and all attempts).

    Attributes:
        checkpoints: statistics of the latest triggered checkpoints, oldest first (the
            last ``CheckpointConfig.history``, 10 by default; :attr:`totals` counts all).
        restarts: how many times the job restarted after a failure.
        restored_checkpoints: the checkpoint id each attempt restored (attempts that started
            fresh are not listed).
        handed_over: the checkpoint id of each rescale whose new instances took over the
            state the old ones handed over in memory at its barrier (no restore: the id is
            not in ``restored_checkpoints``).
        max_channel_length: the largest number of items seen queued in any channel.
    """

    checkpoints: CheckpointHistory = field(default_factory=CheckpointHistory)
    restarts: int = 0
    restored_checkpoints: list[int] = field(default_factory=list)
    handed_over: list[int] = field(default_factory=list)
    _carried: dict[str, list[int]] = field(default_factory=dict)  # by operator uid
    _expired_carried: dict[str, int] = field(default_factory=dict)  # by operator uid
    _names: dict[str, str] = field(default_factory=dict)  # operator uid -> name
    _tasks: list[StreamTask] = field(default_factory=list)
    _channel_capacity: int = 0
    _max_channel_length: int = 0

    def attach(self, tasks: list[StreamTask]) -> None:
        """Track a new attempt's tasks (the previous attempt's counts are kept)."""
        self._fold()
        self._tasks = tasks

    def _fold(self) -> None:
        for uid, (n_in, n_out) in self._live().items():
            acc = self._carried.setdefault(uid, [0, 0])
            acc[0] += n_in
            acc[1] += n_out
        for uid, n in self._expired_live().items():
            self._expired_carried[uid] = self._expired_carried.get(uid, 0) + n
        for task in self._tasks:
            for ch in task.gate.channels:
                self._max_channel_length = max(self._max_channel_length, ch.max_seen)
        self._tasks = []

    def _expired_live(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for task in self._tasks:
            for op in task.operators:
                ctx = getattr(op, "ctx", None)  # set by setup(); absent on never-set-up ones
                if ctx is None:
                    continue
                n = sum(getattr(s, "expired", 0) for s in ctx.keyed_states.values())
                if n:
                    out[op.uid] = out.get(op.uid, 0) + n
        return out

    def keyed_state(self) -> dict[str, dict[str, int]]:
        """The keyed state of each operator, sampled now (counting keys reads every key of
        the running attempt's state: a diagnostic, not a per-record figure).

        Returns:
            ``{operator uid: {"keys": n, "expired": n}}``: ``keys``, the keys that have a
            value in the operator's largest state (summed over its instances; 0 between
            attempts); ``expired``, the entries its TTL states removed because they had
            expired, on access or in a cleanup sweep (over all attempts; an attempt's
            count since its restore: a restart replays what the failed attempt expired).
        """
        out: dict[str, dict[str, int]] = {}
        for task in self._tasks:
            for op in task.operators:
                backend = op.keyed_backend
                ctx = getattr(op, "ctx", None)
                if backend is None or ctx is None:
                    continue
                keys = max((sum(1 for _ in backend.keys(name)) for name in ctx.keyed_states),
                           default=0)
                acc = out.setdefault(op.uid, {"keys": 0, "expired": 0})
                acc["keys"] += keys
        for uid, n in self._expired_carried.items():
            out.setdefault(uid, {"keys": 0, "expired": 0})["expired"] += n
        for uid, n in self._expired_live().items():
            out.setdefault(uid, {"keys": 0, "expired": 0})["expired"] += n
        return out

    def operator_state(self) -> dict[str, dict[str, int]]:
        """The keyed state of each operator, cheap enough to read at every metrics scrape
        (no pass over the keys, unlike :meth:`keyed_state`).

        Returns:
            ``{operator uid: {"entries", "expired", "state_bytes", "ttl_dropped"}}``:
            ``entries``, the entries (a key's value in one state) its instances hold now,
            as their backends estimate them without a pass (RocksDB: its key estimate plus
            the cached entries not yet written; 0 where a backend does not know);
            ``expired``, the entries its TTL states removed on access or in a sweep (as in
            :meth:`keyed_state`); ``state_bytes``, the bytes of every file its keyed state
            needs in the latest completed checkpoint (shared files included);
            ``ttl_dropped``, the TTL entries that checkpoint left out because they had
            expired by its TTL time.
        """
        out: dict[str, dict[str, int]] = {}

        def of(uid: str) -> dict[str, int]:
            return out.setdefault(uid, {"entries": 0, "expired": 0, "state_bytes": 0,
                                        "ttl_dropped": 0})

        for task in self._tasks:
            for op in task.operators:
                backend = op.keyed_backend
                if backend is not None:
                    of(op.uid)["entries"] += backend.approximate_entries() or 0
        for carried in (self._expired_carried, self._expired_live()):
            for uid, n in carried.items():
                of(uid)["expired"] += n
        done = self.completed_checkpoints
        if done:
            for uid, figures in done[-1].operators.items():
                acc = of(uid)
                acc["state_bytes"] = figures.get("state_bytes", 0)
                acc["ttl_dropped"] = figures.get("ttl_dropped", 0)
        return out

    def _live(self) -> dict[str, tuple[int, int]]:
        # by uid: two operators may share a name (two .map() steps), never a uid
        out: dict[str, list[int]] = {}
        for task in self._tasks:
            for op in task.operators:
                self._names[op.uid] = op.name
                acc = out.setdefault(op.uid, [0, 0])
                acc[0] += op.records_in
                acc[1] += op.records_out
        return {k: (v[0], v[1]) for k, v in out.items()}

    @property
    def operators(self) -> dict[str, dict[str, int]]:
        """``{operator uid: {"records_in": n, "records_out": n}}`` (summed over instances
        and attempts; :attr:`operator_names` names them)."""
        out = {k: {"records_in": v[0], "records_out": v[1]} for k, v in self._carried.items()}
        for uid, (n_in, n_out) in self._live().items():
            acc = out.setdefault(uid, {"records_in": 0, "records_out": 0})
            acc["records_in"] += n_in
            acc["records_out"] += n_out
        return out

    @property
    def operator_names(self) -> dict[str, str]:
        """``{operator uid: operator name}`` of the operators that ran."""
        for task in self._tasks:
            for op in task.operators:
                self._names[op.uid] = op.name
        return dict(self._names)

    def by_name(self) -> dict[str, dict[str, int]]:
        """:attr:`operators` summed per operator name (operators that share a name, such as
        two ``.map()`` steps without names, add up)."""
        names = self.operator_names
        out: dict[str, dict[str, int]] = {}
        for uid, counts in self.operators.items():
            acc = out.setdefault(names.get(uid, uid), {"records_in": 0, "records_out": 0})
            acc["records_in"] += counts["records_in"]
            acc["records_out"] += counts["records_out"]
        return out

    @property
    def max_channel_length(self) -> int:
        """The longest any channel's queue has been (items), over all attempts."""
        live = [ch.max_seen for t in self._tasks for ch in t.gate.channels]
        return max([self._max_channel_length, *live])

    def channel_fill(self) -> dict[str, tuple[int, int]]:
        """The current attempt's channels, sampled now (not tracked per record).

        Returns:
            ``{channel name: (queued items, capacity)}``; channels of the same name (two
            edges between the same pair of instances) are summed. Empty between attempts.
        """
        out: dict[str, tuple[int, int]] = {}
        for task in self._tasks:
            for ch in task.gate.channels:
                queued, capacity = out.get(ch.name, (0, 0))
                out[ch.name] = (queued + len(ch), capacity + ch.capacity)
        return out

    @property
    def completed_checkpoints(self) -> list[CheckpointStats]:
        """The completed checkpoints' statistics, of those the history keeps."""
        return [c for c in self.checkpoints if c.status == "completed"]

    @property
    def totals(self) -> CheckpointTotals:
        """Counts and sums over every checkpoint and savepoint triggered (a copy)."""
        return self.checkpoints.totals()

    def summary(self) -> dict[str, Any]:
        """Counts over all checkpoints, and medians of the costs (seconds, bytes) of the
        completed ones the history keeps."""
        totals = self.totals
        done = self.completed_checkpoints
        if not totals.completed or not done:
            return {"checkpoints": totals.completed}
        return {
            "checkpoints": totals.completed,
            "aborted": totals.aborted,
            "median_alignment": statistics.median(c.alignment for c in done),
            "median_sync": statistics.median(c.sync for c in done),
            "max_sync": totals.max_sync,
            "median_async": statistics.median(c.async_ for c in done),
            "median_duration": statistics.median(c.duration for c in done),
            "median_size": statistics.median(c.size for c in done),
        }
