"""The heap backend's changelog bookkeeping: which keys changed since the last completed
checkpoint, each key group's chain of blobs, and when a key group is materialized again.

Flink's changelog state backend (FLIP-158) and the SDG paper's dirty state (section 5): an
incremental snapshot writes, per key group, only the keys changed since the *base*, the last
checkpoint this instance was told completed, and refers to the base's blobs for the rest; a
full (self-contained) one serializes the same deltas and copies the base's blobs into its
own file.

- *Dirty keys*: the backend's key -> key-group-index memo doubles as the dirty set. At each
  snapshot the backend swaps in a fresh memo (O(1)), so a memo holds exactly the keys set
  current since the snapshot before; a memo that fills up is *rolled* into the open interval
  and a fresh one started. An interval that holds more than ``dirty_limit`` keys collapses
  into the indexes of its key groups (those key groups are then written in full), so memory
  stays bounded whatever the input.
- *Intervals*: the keys of every snapshot since the base are kept until a checkpoint
  completes (:meth:`ChangeLog.complete`): a delta never builds on a checkpoint that was
  aborted or failed, and the changes of an aborted one reach the next delta.
- *Chains*: per key group, the blobs a restore replays (a full blob, then deltas). A snapshot
  is *pending* from the end of its asynchronous part until its checkpoint completes; it then
  becomes the base.
- *Materialization*: a key group is written in full again when more than
  :data:`DIRTY_FULL` of its keys changed since the base (a delta costs several times a full
  blob per key, to write and to replay), or when its chain has too many deltas
  (``max_deltas``) or their bytes outgrow its full blob (``delta_ratio``), each threshold
  scaled by a per-key-group factor in [0.5, 1) so that key groups filled at the same time do
  not all materialize in the same checkpoint. The bytes test counts the delta this
  snapshot is about to add too (its changed keys times the key group's bytes per entry times
  :data:`DELTA_COST`), so the chain stays within its bound after the snapshot, not only
  before it. A restore then reads at most ``max_deltas`` deltas per key group, and about
  ``1 + delta_ratio`` times the state's bytes.
- *Limits per mode* (:func:`limits`): incremental checkpoints trade a longer chain (a
  restore reads up to twice the state's bytes) for writing little; a full checkpoint's file
  is the chain, so its size and its restore follow the chain's bytes: full mode bounds it
  more tightly (:data:`FULL_LIMITS`), which costs more materializations, all of them still
  driven by changed keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DELTA_COST",
    "DIRTY_FULL",
    "FULL_LIMITS",
    "INCREMENTAL_LIMITS",
    "ChangeLog",
    "Entry",
    "GroupChain",
    "SnapshotPlan",
    "jitter",
    "limits",
]

#: the fraction of a key group's keys changed since the base above which it is written in
#: full rather than as a delta
DIRTY_FULL = 0.2
#: bytes of a key's entry in a delta relative to its entry in a full blob (the ``"k"``
#: frame names each key twice: 1.5 measured for short string keys and small ints; close to
#: 1 for larger values), used to predict the size of the delta a snapshot is about to write
DELTA_COST = 1.5
#: (max_deltas, delta_ratio) of incremental checkpoints: a restore reads at most about twice
#: the state's bytes, and a checkpoint writes little more than its changed keys
INCREMENTAL_LIMITS = (32, 1.0)
#: (max_deltas, delta_ratio) of full checkpoints: the file holds the chains, so their bytes
#: bound the file's size and restore time (a key group's chain cycles between 1 and
#: ``1 + 0.4 * jitter`` times its full blob, staggered: the file is about 1.15x the state's,
#: 1.3x at most); a key group is materialized about every ``0.3 / (DELTA_COST * changed
#: fraction)`` checkpoints, so the bytes serialized per checkpoint stay proportional to the
#: changed keys (a 1 % change costs about 6.5 % of the state's bytes, not all of them)
FULL_LIMITS = (8, 0.4)


def limits(incremental: bool, max_deltas: int | None = None,
           delta_ratio: float | None = None) -> tuple[int, float]:
    """The (max_deltas, delta_ratio) of a mode, each defaulting to the mode's
    (:data:`INCREMENTAL_LIMITS` or :data:`FULL_LIMITS`) when None."""
    default = INCREMENTAL_LIMITS if incremental else FULL_LIMITS
    return (default[0] if max_deltas is None else max_deltas,
            default[1] if delta_ratio is None else delta_ratio)

#: one blob of a chain: (file ref ``{"path", "size", "sha256"}``, offset, length (bytes), kind)
Entry = tuple[dict[str, Any], int, int, str]


@dataclass(frozen=True, slots=True)
class GroupChain:
    """The blobs of one key group, in replay order (immutable: snapshots share them).

    Attributes:
        entries: the blobs; empty for an empty key group.
        full_bytes: the size of the leading full blob (0: the chain starts from empty).
        delta_bytes: the total size of the deltas after it.
        deltas: how many deltas follow the full blob.
        expires: per TTL state, the earliest expiry (seconds) of the entries the blobs
            hold (a lower bound): once it passed, they may hold an expired entry.
        ttl_bound: per TTL state, a lower bound (seconds) of the expiry of every entry the
            key group's table holds until the next snapshot: a snapshot at an earlier TTL
            time need not look for expired entries there (:class:`.ttl_filter.TtlFilter`).
    """

    entries: tuple[Entry, ...] = ()
    full_bytes: int = 0
    delta_bytes: int = 0
    deltas: int = 0
    expires: tuple[tuple[str, float], ...] = ()
    ttl_bound: tuple[tuple[str, float], ...] = ()

    def with_delta(self, entry: Entry, expires: tuple[tuple[str, float], ...] = (),
                   ttl_bound: tuple[tuple[str, float], ...] = ()) -> GroupChain:
        """This chain followed by the delta ``entry`` holding TTL entries ``expires``,
        the table's bound now ``ttl_bound``."""
        earliest = dict(self.expires)
        for name, t in expires:
            earliest[name] = min(t, earliest.get(name, t))
        return GroupChain((*self.entries, entry), self.full_bytes,
                          self.delta_bytes + entry[2], self.deltas + 1,
                          tuple(earliest.items()), ttl_bound)

    @staticmethod
    def full(entry: Entry | None, expires: tuple[tuple[str, float], ...] = (),
             ttl_bound: tuple[tuple[str, float], ...] = ()) -> GroupChain:
        """The chain of a key group just written in full (None: it is empty) holding TTL
        entries ``expires``, the table's bound ``ttl_bound``."""
        if entry is None:
            return EMPTY if not ttl_bound else GroupChain(ttl_bound=ttl_bound)
        return GroupChain((entry,), entry[2], 0, 0, expires, ttl_bound)


EMPTY = GroupChain()


def jitter(key_group: int) -> float:
    """The factor in [0.5, 1) that scales ``key_group``'s materialization thresholds
    (the golden-ratio sequence: evenly spread over consecutive key groups)."""
    return 0.5 + 0.5 * ((key_group * 0.6180339887498949) % 1.0)


@dataclass
class SnapshotPlan:
    """What one snapshot writes, decided in its synchronous part.

    Attributes:
        full: indexes of the key groups written in full; None: every key group (no base).
        dirty: key -> key-group index maps whose keys are the keys changed since the base
            (read only: they are closed memo generations).
        base: the base's chains per key-group index (None: no base, every group is full).
    """

    full: set[int] | None
    dirty: list[dict[Any, int]] = field(default_factory=list)
    base: list[GroupChain] | None = None


@dataclass
class _Interval:
    """The keys set current between two snapshots (memo generations), or the key groups
    they collapsed into."""

    checkpoint_id: int = -1
    gens: list[dict[Any, int]] = field(default_factory=list)
    groups: set[int] = field(default_factory=set)
    size: int = 0
    counts: list[int] | None = None  # keys per key-group index, summed over generations


class ChangeLog:
    """Dirty keys, chains and materialization of one heap backend instance.

    Args:
        n: the number of key groups of the instance's range.
        start: its first key group.
        max_deltas: deltas after which a key group is materialized (scaled by
            :func:`jitter`, so between ``max_deltas / 2`` and ``max_deltas``).
        delta_ratio: delta bytes, relative to the full blob's, after which a key group is
            materialized (scaled by :func:`jitter`).
        dirty_limit: dirty keys an interval keeps before collapsing into key groups.

    Raises:
        ValueError: if ``max_deltas < 1``, ``delta_ratio <= 0`` or ``dirty_limit < 1``.
    """

    def __init__(self, n: int, start: int, *, max_deltas: int = 32, delta_ratio: float = 1.0,
                 dirty_limit: int = 1_000_000) -> None:
        if max_deltas < 1 or not delta_ratio > 0 or dirty_limit < 1:
            raise ValueError("max_deltas and dirty_limit must be >= 1, delta_ratio > 0")
        self.n = n
        self.start = start
        self.max_deltas = max_deltas
        self.delta_ratio = delta_ratio
        self.dirty_limit = dirty_limit
        self._open = _Interval()
        self._closed: list[_Interval] = []
        self._base: list[GroupChain] | None = None
        self._pending: dict[int, list[GroupChain]] = {}

    @property
    def base(self) -> list[GroupChain] | None:
        """The chains of the last completed checkpoint (None: the next snapshot is full)."""
        return self._base

    def _count(self, iv: _Interval, counts: list[int] | None) -> None:
        if counts is not None:
            iv.counts = counts if iv.counts is None else \
                [a + b for a, b in zip(iv.counts, counts, strict=True)]

    def roll(self, memo: dict[Any, int], counts: list[int] | None = None) -> None:
        """Keep a full memo generation as dirty keys of the open interval (the backend
        starts a fresh memo); ``counts``: its keys per key-group index."""
        iv = self._open
        self._count(iv, counts)
        iv.gens.append(memo)
        iv.size += len(memo)
        if iv.size > self.dirty_limit:
            for gen in iv.gens:
                iv.groups.update(gen.values())
            iv.gens = []
            iv.size = 0

    def close(self, checkpoint_id: int, memo: dict[Any, int], counts: list[int] | None = None,
              sizes: list[int] | None = None) -> SnapshotPlan:
        """Synchronous part of snapshot ``checkpoint_id``: end the open interval with the
        current memo generation and plan the snapshot; O(number of key groups).

        Args:
            checkpoint_id: the checkpoint.
            memo: the current memo generation (its keys are dirty).
            counts: its keys per key-group index (None: unknown).
            sizes: the entries of each key group now (None: unknown); with ``counts``, a
                key group with more than :data:`DIRTY_FULL` of it dirty is written in full.

        Returns:
            the plan: full key groups (materialization and collapsed intervals), dirty keys
            since the base, the base's chains.
        """
        iv = self._open
        # no collapse here: it walks every dirty key, too slow for the synchronous part (the
        # interval overshoots the limit by at most one memo generation)
        self._count(iv, counts)
        iv.gens.append(memo)
        iv.size += len(memo)
        iv.checkpoint_id = checkpoint_id
        self._closed.append(iv)
        self._open = _Interval()
        base = self._base
        if base is None:
            return SnapshotPlan(None)
        full: set[int] = set()
        dirty: list[dict[Any, int]] = []
        changed: list[int] | None = [0] * self.n
        for closed in self._closed:
            full |= closed.groups
            dirty += closed.gens
            if closed.counts is None or changed is None:
                changed = None
            else:
                changed = [a + b for a, b in zip(changed, closed.counts, strict=True)]
        if changed is not None and sizes is not None:
            full.update(i for i, (c, size) in enumerate(zip(changed, sizes, strict=True))
                        if c > DIRTY_FULL * size)
        max_deltas, ratio, start = self.max_deltas, self.delta_ratio, self.start
        grow = changed if changed is not None and sizes is not None else None
        for idx, chain in enumerate(base):
            if idx in full or not chain.entries:
                continue
            # the delta this snapshot adds, predicted from the key group's bytes per entry
            delta = 0.0
            if grow is not None and grow[idx]:
                assert sizes is not None
                delta = DELTA_COST * grow[idx] * chain.full_bytes / max(1, sizes[idx])
            if chain.deltas or delta:
                j = jitter(start + idx)
                if chain.deltas >= max_deltas * j or \
                        chain.delta_bytes + delta > ratio * j * chain.full_bytes:
                    full.add(idx)
        return SnapshotPlan(full, dirty, base)

    def written(self, checkpoint_id: int, chains: list[GroupChain]) -> None:
        """The asynchronous part of incremental snapshot ``checkpoint_id`` wrote ``chains``
        (they become the base if the checkpoint completes)."""
        self._pending[checkpoint_id] = chains

    def complete(self, checkpoint_id: int) -> bool:
        """Checkpoint ``checkpoint_id`` completed: its chains become the base, and the
        dirty keys and pending chains up to it are dropped.

        Returns:
            whether this instance wrote an incremental snapshot for it (else, e.g. for a
            savepoint, nothing changes).
        """
        chains = self._pending.pop(checkpoint_id, None)
        if chains is None:
            return False
        self._base = chains
        for cid in [c for c in self._pending if c < checkpoint_id]:
            del self._pending[cid]
        self._closed = [iv for iv in self._closed if iv.checkpoint_id > checkpoint_id]
        return True

    def reset(self) -> None:
        """Forget the base and every dirty key (after a restore, or when keys map to key
        groups differently): the next snapshot is written in full."""
        self._open = _Interval()
        self._closed = []
        self._base = None
        self._pending.clear()
