"""The heap keyed state backend of one operator instance, and its factory.

:class:`HeapKeyedStateBackend` keeps keyed state in Python dicts, one per (state, key group)
(:mod:`.state`); it finds the current key's key group, takes snapshots with copy-on-write per
key (:mod:`.snapshot`), full or incremental (:mod:`.changelog`), and restores the key groups
of its range from any snapshot handle that a key-group reader is registered for: its own
``heap-v1``/``heap-v2`` files (:mod:`.format`), and those of other backends (RocksDB) through
:func:`reactive.state.key_group_stream.read_key_groups`, so a job moves between backends
through any completed checkpoint or savepoint, at any parallelism (rescaling, Carbone
2018 (PhD thesis), section 4.2).

``set_current_key`` is the hottest function of the system: one dict hit in the key ->
key-group-index memo. The memo doubles as the dirty set: each checkpoint swaps in a fresh
one. While a snapshot's asynchronous part runs, the backend's ``set_current_key`` is an
instance attribute bound to a watching variant that also reports the key to the snapshot
(copy-on-write); the operators fetch ``backend.set_current_key`` per batch, and
asynchronous parts only run between batches, so the normal path pays nothing. Since a
checkpoint's memo is fresh, a key's first ``set_current_key`` after the barrier misses it:
the watching variant reports the key on that miss, and a hit costs what it costs without a
snapshot (a savepoint keeps the memo, and its snapshot keeps a memo of the keys it saw).
Incremental checkpoints write only the dirty keys; full ones also serialize only those, and
copy the rest of their self-contained file from the previous checkpoint's
(:mod:`.snapshot`), so the loop's work per checkpoint follows the changes, not the state's
size.

Keys are stored as the Python objects themselves; only their key group comes from their
bytes (:mod:`reactive.key_encoding`, or the ``key_by`` key serializer), which handles record
as ``key_encoding``. A value that cannot be serialized fails the snapshot with
:class:`~reactive.errors.StateSerializationError` naming the state and the key.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from reactive.errors import (
    ConfigurationError,
    RestoreError,
    StateAccessError,
    UnsupportedKeyError,
)
from reactive.key_encoding import (
    check_key_encoding,
    decode_key,
    encode_key,
    key_encoding_name,
    unhashable_key_error,
)
from reactive.keygroups import KeyGroupRange, key_group_of_bytes
from reactive.serialization import Serializer
from reactive.state.api import State, ValueState
from reactive.state.backend import (
    KeyedStateBackend,
    KeyedStateSnapshot,
    KeyGroupsInMemory,
    SnapshotContext,
    StateBackend,
)
from reactive.state.descriptors import StateDescriptor, ValueStateDescriptor
from reactive.state.key_group_stream import (
    KeyGroupStream,
    find_key_group_reader,
    read_key_groups,
)
from reactive.state.ttl import _Ttl, backend_descriptor, ttl_state
from reactive.state.ttl_clock import TtlClock
from reactive.state.ttl_config import StateTtlConfig

from .changelog import ChangeLog, SnapshotPlan, limits
from .fork_snapshot import ForkedSnapshot, fork_snapshot, fork_supported
from .format import BACKEND, is_heap_handle, iter_heap_key_groups
from .snapshot import HeapSnapshot
from .state import Table, create_state, descriptor_serializer
from .ttl_filter import TtlFilter
from .ttl_state import HeapTtlValueState, HeapTtlValueStateOnRead

__all__ = ["HeapKeyGroups", "HeapKeyedStateBackend", "HeapStateBackend", "SnapshotStrategy"]

log = logging.getLogger(__name__)

#: how the heap backend writes a snapshot's asynchronous part
SnapshotStrategy = Literal["paced", "fork"]

_KEY_CACHE_SIZE = 200_000  # keys whose key group is memoized per memo generation
#: keys whose key group is remembered across memo generations (the first ones seen): the
#: memo rolls at every checkpoint, and a key not set current in the last interval would
#: otherwise be encoded and hashed again (W1: 375 k of 6 M records); bounded, since state of
#: many millions of keys would double its memory for it
_KNOWN_KEYS = 1_000_000


@dataclass(frozen=True, eq=False)
class HeapKeyGroups:
    """A heap instance's key groups handed over in memory at a rescale
    (:meth:`HeapKeyedStateBackend.hand_over`).

    Attributes:
        key_group_range: the key groups of the instance that handed them over.
        tables: its tables by state name (``maps[kg - key_group_range.start]``).
        snapshots: its snapshots whose asynchronous part was still to write these key
            groups at the hand-over: the instances taking them over keep their
            copy-on-write (a key set current there is shown to them first).
    """

    key_group_range: KeyGroupRange
    tables: dict[str, Table]
    snapshots: tuple[HeapSnapshot, ...] = ()


class HeapKeyedStateBackend(KeyedStateBackend):
    """Keyed state of one operator instance in dicts per key group.

    Args:
        key_group_range: the key groups this instance owns.
        max_parallelism: the job's number of key groups.
        operator_uid: the operator's uid, named in errors (None: unnamed).
        incremental: checkpoints write only the keys changed since the last completed
            checkpoint, under the job's ``shared/`` folder (else each checkpoint is one
            self-contained file); savepoints are always self-contained.
        max_deltas: deltas after which a key group is written in full again (see
            :class:`~.changelog.ChangeLog`; full checkpoints carry the chains over too);
            None: the mode's default (:func:`~.changelog.limits`).
        delta_ratio: delta bytes relative to a key group's full blob after which it is
            written in full again; None: the mode's default.
        snapshot_share: the share of the event loop thread a snapshot's asynchronous part
            takes while the tasks are busy (None: :data:`.snapshot.SHARE`).
        snapshot: ``"paced"`` (copy-on-write per key, serialized on the loop thread at its
            share) or ``"fork"`` (written by a forked child process, :mod:`.fork_snapshot`;
            the caller checked :func:`.fork_snapshot.fork_supported`).
        rewrite_expired: write a key group in full again when its earlier blobs may hold
            an expired time-to-live entry (see :class:`HeapStateBackend`).
    """

    def __init__(self, key_group_range: KeyGroupRange, max_parallelism: int, *,
                 operator_uid: str | None = None, incremental: bool = False,
                 max_deltas: int | None = None, delta_ratio: float | None = None,
                 snapshot_share: float | None = None,
                 snapshot: SnapshotStrategy = "paced", rewrite_expired: bool = False) -> None:
        self.key_group_range = key_group_range
        self.rewrite_expired = rewrite_expired
        self.max_parallelism = max_parallelism
        self.operator_uid = operator_uid
        self.incremental = incremental
        self.snapshot_share = snapshot_share
        self._key_serializer: Serializer | None = None
        self._encode_key: Callable[[Any], bytes] = encode_key
        self._start = key_group_range.start
        self._n = len(key_group_range)
        # key -> index of its key group in this instance's range (bounded memo): exactly the
        # keys set current since the last checkpoint (or roll of the memo)
        self._idx_cache: dict[Any, int] = {}
        # the memo generation before (looked up on a miss before hashing the key)
        self._prev_cache: dict[Any, int] = {}
        # key -> index for the first _KNOWN_KEYS keys hashed (never rolled)
        self._known: dict[Any, int] = {}
        # keys added to _idx_cache per key-group index (how much of a key group is dirty)
        self._counts = [0] * self._n
        self._tables: dict[str, Table] = {}
        # TTL state name -> its clock's time: what a snapshot's synchronous part reads to
        # leave expired entries out (:mod:`.ttl_filter`)
        self._ttl_now: dict[str, tuple[Callable[[], float], float]] = {}
        # TTL state name -> its state, whose floor (a lower bound of the table's expiries)
        # spares a snapshot the search for expired entries while its TTL time is before it
        self._ttl_states: dict[str, _Ttl] = {}
        self.current_key: Any = None
        self._idx = self._n  # the _NoKey sentinel until a key is set
        max_deltas, delta_ratio = limits(incremental, max_deltas, delta_ratio)
        self._log = ChangeLog(self._n, self._start, max_deltas=max_deltas,
                              delta_ratio=delta_ratio, dirty_limit=5 * _KEY_CACHE_SIZE)
        # snapshots whose asynchronous part still needs to see the keys set current
        self._watching: list[HeapSnapshot] = []
        # snapshots of the instances this one took key groups over from, still being
        # written: (snapshot, its index of this instance's key-group index 0, first and
        # last index of this instance's range it covers); see take_over
        self._inherited: list[tuple[HeapSnapshot, int, int, int]] = []
        self._fork = snapshot == "fork"
        # forked snapshots whose child may still run (killed by dispose)
        self._children: list[ForkedSnapshot] = []

    # ------------------------------------------------------------------ keys
    def set_key_serializer(self, serializer: Serializer | None) -> None:
        """Compute key groups from ``serializer.serialize(key)`` instead of the canonical key
        encoding (``key_by(selector, key_serializer=...)``); call before any key is set or
        state restored. None restores the canonical encoding."""
        self._key_serializer = serializer
        self._encode_key = encode_key if serializer is None else serializer.serialize
        # new dicts, not cleared ones: snapshots may still read the old generations
        self._idx_cache = {}
        self._prev_cache = {}
        self._known = {}
        self._counts = [0] * self._n
        self._log.reset()

    def set_current_key(self, key: Any) -> None:
        """Scope state calls to ``key``.

        Raises:
            UnsupportedKeyError: if ``key`` is not hashable, or has no canonical encoding
                and no key serializer was set (naming the operator).
            StateAccessError: if ``key`` belongs to another instance's key groups.
        """
        # hot path: one dict hit for a known key; hashing and the range check only on a miss
        try:
            idx = self._idx_cache.get(key)
        except TypeError:
            raise unhashable_key_error(key, self.operator_uid) from None
        if idx is None:
            idx = self._index_of(key)
        self.current_key = key
        self._idx = idx

    def _set_current_key_watching(self, key: Any) -> None:
        """:meth:`set_current_key` while snapshots are being written: each snapshot that has
        not written ``key``'s key group yet sees the key first (copy-on-write). A snapshot
        taken with a fresh memo sees it on the memo's miss (see :meth:`_watching_misses`),
        a savepoint (no fresh memo) when the key is not in its seen-keys memo."""
        try:
            found = self._idx_cache.get(key)
        except TypeError:
            raise unhashable_key_error(key, self.operator_uid) from None
        missed = found is None
        idx = self._index_of(key) if found is None else found
        for snap in self._watching:
            if missed if snap.fresh_memo else key not in snap.seen:
                snap.touch(key, idx)  # touch decides what to capture
        if missed and self._inherited:
            self._touch_inherited(key, idx)
        self.current_key = key
        self._idx = idx

    def _touch_inherited(self, key: Any, idx: int) -> None:
        """Show ``key`` (of key-group index ``idx``) to the snapshots of the instances
        whose key groups this one took over while they were written: the memo of this
        instance started empty at the take-over, so a key's first ``set_current_key`` here
        misses it, before any change of its state (copy-on-write across the hand-over)."""
        ended = False
        for snap, delta, lo, hi in self._inherited:
            if snap.ended:
                ended = True
            elif lo <= idx <= hi:
                snap.touch(key, idx + delta)
        if ended:
            self._inherited = [i for i in self._inherited if not i[0].ended]
            self._watch()

    def _watching_misses(self, snap: HeapSnapshot) -> Callable[[Any], None]:
        """:meth:`set_current_key` for the usual case of one checkpoint in flight: the
        snapshot sees a key on the memo's miss only. Its synchronous part swapped in a fresh
        memo (holding only the current key, which it touched), and a key enters the memo
        only through that miss (or a later roll of a full memo, after which it misses
        again), so a key found in the memo was touched since the barrier. A hit, every
        record but a key's first since the barrier, pays nothing over the normal path."""
        touch = snap.touch
        index_of = self._index_of

        def set_current_key(key: Any) -> None:
            try:
                idx = self._idx_cache.get(key)
            except TypeError:
                raise unhashable_key_error(key, self.operator_uid) from None
            if idx is None:
                idx = index_of(key)
                touch(key, idx)
            self.current_key = key
            self._idx = idx

        return set_current_key

    def _watch(self) -> None:
        # shadows the class's method while snapshots are written (see the module docstring)
        watching = self._watching
        if self._inherited:
            self.set_current_key = self._set_current_key_watching  # type: ignore[method-assign]
        elif not watching:
            if "set_current_key" in self.__dict__:
                del self.set_current_key
        elif len(watching) == 1 and watching[0].fresh_memo:
            self.set_current_key = self._watching_misses(watching[0])  # type: ignore[method-assign,assignment]
        else:
            self.set_current_key = self._set_current_key_watching  # type: ignore[method-assign]

    def _index_of(self, key: Any) -> int:
        """The memo miss: the key group index from the long-lived memo of the first keys,
        the previous generation, or the key's bytes, then memoized (rolling a full memo into
        the changelog when incremental)."""
        idx = self._known.get(key)
        if idx is None:
            idx = self._prev_cache.get(key)
        if idx is None:
            try:
                data = self._encode_key(key)
            except UnsupportedKeyError as exc:
                raise exc.for_operator(self.operator_uid) from None
            idx = key_group_of_bytes(data, self.max_parallelism) - self._start
            if not 0 <= idx < self._n:
                raise StateAccessError(
                    f"key {key!r} belongs to key group {idx + self._start}, outside this "
                    f"instance's range {self.key_group_range.to_list()}: is the key selector "
                    "deterministic?"
                )
            if len(self._known) < _KNOWN_KEYS:
                self._known[key] = idx
        cache = self._idx_cache
        if len(cache) >= _KEY_CACHE_SIZE:
            self._log.roll(cache, self._counts)  # its keys stay dirty
            self._prev_cache = cache
            self._counts = [0] * self._n
            cache = self._idx_cache = {}
        cache[key] = idx
        self._counts[idx] += 1
        return idx

    # ------------------------------------------------------------------ states
    def _table(self, name: str) -> Table:
        table = self._tables.get(name)
        if table is None:
            table = self._tables[name] = Table(self._n)
        return table

    def get_state(self, descriptor: StateDescriptor) -> State:
        table = self._table(descriptor.name)
        if table.descriptor is not None and table.descriptor.kind != descriptor.kind:
            raise StateAccessError(
                f"state {descriptor.name!r} is registered as {table.descriptor.kind} state, "
                f"requested as {descriptor.kind}"
            )
        if table.serialized:
            ser = descriptor_serializer(descriptor)
            if ser is not None:
                for d in table.maps[: self._n]:
                    for k, v in d.items():
                        d[k] = ser.deserialize(v)
            table.serialized = False
        table.descriptor = descriptor
        tracked = self._ttl_states.get(descriptor.name)
        if tracked is not None:
            tracked.floor = -math.inf  # written by another state object: bound unknown
        return create_state(self, table, descriptor)

    def get_ttl_state(self, descriptor: StateDescriptor, config: StateTtlConfig,
                      clock: TtlClock) -> State | None:
        # a value state reads its table directly (HeapTtlValueState); the other kinds get
        # the runtime's decorators, whose per-access cost their collections dominate. The
        # clock is kept either way: snapshots leave out what expired by its time
        stored = backend_descriptor(descriptor, config)
        inner = self.get_state(stored)
        self._ttl_now[stored.name] = (clock.now, config.ttl)
        table = self._tables[stored.name]
        state: State
        if not isinstance(descriptor, ValueStateDescriptor):
            state = ttl_state(descriptor, config, inner, clock.now)
        else:
            assert isinstance(inner, ValueState)
            cls = HeapTtlValueStateOnRead if config.update_type == "on_read_and_write" \
                else HeapTtlValueState
            state = cls(inner, self, table, descriptor.default, config, clock)
        assert isinstance(state, _Ttl)
        if not any(table.maps[: self._n]):
            # the table holds nothing: every expiry in it from now on is one the state
            # writes, which lower its floor (a write in the running batch stores the
            # batch's expiry, which the clock lowered it to at the freeze)
            batch = getattr(state, "_batch_expires", None)
            state.floor = math.inf if batch is None else batch
        self._ttl_states[stored.name] = state
        return state

    def keys(self, state_name: str) -> Iterator[Any]:
        table = self._tables.get(state_name)
        if table is None:
            return iter(())
        return iter([k for d in table.maps[: self._n] for k in d])

    def approximate_entries(self) -> int:
        # exact: the key groups' dicts know their sizes (O(key groups x states))
        return sum(len(d) for t in self._tables.values() for d in t.maps[: self._n])

    def keys_in_key_group(self, state_name: str, key_group: int) -> list[Any]:
        table = self._tables.get(state_name)
        if table is None or not self._start <= key_group < self._start + self._n:
            return []
        return list(table.maps[key_group - self._start])

    # ------------------------------------------------------------------ snapshots
    def snapshot(self, ctx: SnapshotContext) -> KeyedStateSnapshot:
        """Synchronous part: plan the snapshot in O(number of key groups) and start watching
        the keys set current (see :mod:`.snapshot`).

        Checkpoints (not savepoints, which are written in full) close the dirty-key interval
        (a fresh memo); incremental ones create the checkpoint's directory, which tells
        checkpoint storage a checkpoint is in flight before any shared file of it exists (as
        RocksDB's snapshots do).
        """
        incremental = self.incremental and not ctx.savepoint
        garbage: Any = None
        if not ctx.savepoint:
            memo, counts = self._idx_cache, self._counts
            # the generation dropped here may be large: the asynchronous part frees it
            garbage = self._prev_cache
            self._prev_cache = memo
            self._idx_cache = {}
            self._counts = [0] * self._n
            if self._idx < self._n:
                # the current key may still be changed without a set_current_key
                self._idx_cache[self.current_key] = self._idx
                self._counts[self._idx] += 1
            sizes = [0] * self._n
            for table in self._tables.values():
                for i, d in enumerate(table.maps[: self._n]):
                    sizes[i] += len(d)
            plan = self._log.close(ctx.checkpoint_id, memo, counts, sizes)
            if incremental:
                ctx.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        else:
            plan = SnapshotPlan(None)
        ttl = self._ttl_filter()
        if ttl and self.rewrite_expired and plan.full is not None and plan.base is not None:
            # a key group whose blobs may hold an expired TTL entry is written again in
            # full, without it, rather than carried over or chained onto
            plan.full.update(i for i, chain in enumerate(plan.base)
                             if chain.expires and i not in plan.full and ttl.due(chain.expires))
        snap = HeapSnapshot(ctx, plan, tables=self._tables, start=self._start, n=self._n,
                            key_encoding=key_encoding_name(self._key_serializer),
                            incremental=incremental, release=self._release,
                            on_written=None if ctx.savepoint else self._log.written,
                            on_failed=self._log.reset, share=self.snapshot_share,
                            garbage=garbage, fresh_memo=not ctx.savepoint,
                            ttl=ttl)
        if self._fork:
            # the child's image is the state at the barrier: nothing to watch
            forked = fork_snapshot(snap)
            snap._garbage = None  # the child has its own copy of the old memo
            self._children = [c for c in self._children if not c.ended]
            self._children.append(forked)
            return forked
        if self._idx < self._n:
            snap.touch(self.current_key, self._idx)
        self._watching.append(snap)
        self._watch()
        return snap

    def _release(self, snap: HeapSnapshot) -> None:
        if snap in self._watching:
            self._watching.remove(snap)
            self._watch()

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed: incremental snapshots build on it from now
        on (never on one that was not confirmed)."""
        self._log.complete(checkpoint_id)

    # ------------------------------------------------------------------ restore
    def restore(self, handles: list[dict[str, Any]], job_dir: Path) -> None:
        """Load the key groups of this instance's range from ``handles``: heap snapshots,
        or any backend's whose key-group reader is registered (RocksDB: only the key range
        of this instance's key groups is read).

        Raises:
            RestoreError: for a handle no reader is registered for, of another heap format,
                with another key encoding, or unreadable.
        """
        ser = self._key_serializer
        decoder = decode_key if ser is None else ser.deserialize
        # the next snapshot is written in full (the restored chains may live elsewhere)
        self._log.reset()
        for handle in handles:
            check_key_encoding(handle, ser, self.operator_uid)
            backend = handle.get("backend")
            if is_heap_handle(handle):
                stream = iter_heap_key_groups(handle, job_dir, self.key_group_range)
            elif backend != BACKEND and find_key_group_reader(str(backend)) is not None:
                stream = read_key_groups(handle, job_dir, key_group_range=self.key_group_range,
                                         key_decoder=decoder)
            else:
                raise RestoreError(
                    f"cannot restore a {backend!r} snapshot ({handle.get('format')}) "
                    "into the heap backend"
                )
            self._install(stream)

    def hand_over(self) -> HeapKeyGroups | None:
        """This instance's tables, to be adopted by reference by the instances after a
        rescale (:meth:`take_over`); None when a table still holds a custom serializer's
        bytes of a restore no descriptor claimed (those are read from the checkpoint)."""
        if any(t.serialized for t in self._tables.values()):
            return None
        return HeapKeyGroups(self.key_group_range, dict(self._tables),
                             tuple(s for s in self._watching if not s.ended))

    def take_over(self, parts: Sequence[KeyGroupsInMemory]) -> None:
        """Adopt the dicts of this instance's key groups from the old instances' tables: a
        key group's dict moves as one object (no copy, no serialization), timers with it
        (they are tables too). The next checkpoint writes every key group in full, as after
        a restore. Snapshots of the old instances still being written keep their
        copy-on-write through this instance (:meth:`_touch_inherited`): it may take over
        and run while they write.

        Raises:
            RestoreError: a part is not a heap backend's.
        """
        start, end = self._start, self._start + self._n - 1
        for part in parts:
            if not isinstance(part, HeapKeyGroups):
                raise RestoreError(
                    f"operator {self.operator_uid!r}: the heap backend cannot take over "
                    f"{type(part).__name__} key groups in memory")
            lo = max(start, part.key_group_range.start)
            hi = min(end, part.key_group_range.end)
            old = part.key_group_range.start
            for name, table in part.tables.items():
                mine = self._table(name)
                if mine.descriptor is None:
                    mine.descriptor = table.descriptor
                tracked = self._ttl_states.get(name)
                if tracked is not None:
                    tracked.floor = -math.inf  # adopted expiries: bound unknown
                for kg in range(lo, hi + 1):
                    mine.maps[kg - start] = table.maps[kg - old]
            if lo <= hi:
                self._inherited.extend((snap, start - old, lo - start, hi - start)
                                       for snap in part.snapshots if not snap.ended)
        self._log.reset()
        if self._inherited:
            self._watch()

    def _install(self, stream: KeyGroupStream) -> None:
        with stream:
            for kg, serialized, states in stream:
                idx = kg - self._start
                for name, d in states.items():
                    table = self._table(name)
                    if name in serialized:
                        ser = descriptor_serializer(table.descriptor)
                        if ser is not None:
                            d = {k: ser.deserialize(v) for k, v in d.items()}
                        else:
                            table.serialized = True
                    tracked = self._ttl_states.get(name)
                    if tracked is not None:
                        tracked.floor = -math.inf  # restored expiries: bound unknown
                    live = table.maps[idx]
                    if live:
                        live.update(d)
                    else:
                        # the stream's dicts are fresh: adopt rather than copy (nothing
                        # holds the empty one: state objects index table.maps per call)
                        table.maps[idx] = d

    def _ttl_filter(self) -> TtlFilter:
        """The TTL time of every bound TTL state, read now (a snapshot's synchronous part)."""
        times: dict[str, tuple[str, float, float]] = {}
        for name, (now, ttl) in self._ttl_now.items():
            table = self._tables.get(name)
            if table is not None and table.descriptor is not None and not table.serialized:
                times[name] = (table.descriptor.kind, now(), ttl)
        return TtlFilter(times, {name: state.floor for name, state in self._ttl_states.items()})

    def dispose(self) -> None:
        self._inherited.clear()
        for snap in list(self._watching):
            snap.discard()
        for child in self._children:
            child.discard()
        self._children.clear()
        self._tables.clear()
        self._ttl_now.clear()
        self._ttl_states.clear()


class HeapStateBackend(StateBackend):
    """Keyed state in Python dicts; asynchronous snapshots with copy-on-write per key, full
    or incremental (see :mod:`reactive.backends.heap`).

    State must fit in memory. Values returned by ``value()``/``get()`` are the stored
    objects: mutate them only through the state API (or after reading them in the same
    ``process_element`` call), never between records. A restored value is a copy: two
    references to one object inside a value may come back as two equal objects (as with
    Flink's serializers; cycles are kept).

    Args:
        incremental: each checkpoint writes only the keys changed since the last completed
            one (and tombstones for deleted keys), in files under the job's ``shared/``
            folder that later checkpoints reference (like RocksDB's incremental
            checkpoints: a checkpoint directory alone is then not self-contained; savepoints
            always are). ``False`` (the default) writes every key group in each
            checkpoint's own file.
        max_deltas: a key group is written in full again after between
            ``max_deltas / 2`` and ``max_deltas`` deltas (staggered per key group), which
            bounds the chain a restore replays (None: 32 incremental, 8 full).
        delta_ratio: ... or when its deltas' bytes, with the delta about to be written,
            would exceed between half and all of ``delta_ratio`` times its full blob's (a
            restore reads at most about ``1 + delta_ratio`` times the state's bytes; None:
            1.0 incremental, 0.4 full). Full checkpoints keep such chains too, inside
            their own file, whose size and restore time they bound: they serialize only
            the changed keys and the key groups due for materialization, and copy the
            rest from the previous checkpoint's file in a worker thread.
        snapshot_share: the share (0 < share <= 1) of the event loop thread a snapshot's
            asynchronous part takes while the tasks are busy (default
            :data:`.snapshot.SHARE`, 0.15): a saturated task keeps about ``1 - share`` of
            its rate during it, and the part takes about ``1 / share`` times its
            serialization time (an idle loop runs it at full speed).
        snapshot: how the asynchronous part runs. ``"paced"`` (the default): on the event
            loop thread, at ``snapshot_share`` of it, with copy-on-write per key.
            ``"fork"``: in a child process forked at the barrier (Redis' ``BGSAVE``), which
            writes the same files on another core while the tasks keep the whole loop
            (:mod:`.fork_snapshot`); it costs memory instead: the pages the tasks write
            while a child runs, and the pages the child reads, are copied, up to about the
            state's size per child. Where ``fork()`` is unavailable or unsafe (not Linux or
            macOS, a free-threaded build) it falls back to ``"paced"`` with a log line.
        rewrite_expired: what a checkpoint does with a key group whose earlier blobs (carried
            over by a full checkpoint, referred to by an incremental one) may hold a
            time-to-live entry expired by the checkpoint's TTL time. False (the default):
            keep them; the entry goes from the files once the incremental cleanup or an
            access removes it (the next checkpoint writes its tombstone) or its key group is
            written in full again, and a restore never returns it. True: write such a key
            group in full again, without the expired entries, so no checkpoint holds one;
            with keys expiring all the time (an open key space) that is nearly every key
            group at every checkpoint: the work of a checkpoint follows the state's size
            instead of its changes.

    Raises:
        ConfigurationError: if ``max_deltas < 1``, ``delta_ratio <= 0``,
            ``snapshot_share`` is not in (0, 1] or ``snapshot`` is not a strategy.
    """

    name = BACKEND

    def __init__(self, incremental: bool = False, max_deltas: int | None = None,
                 delta_ratio: float | None = None,
                 snapshot_share: float | None = None,
                 snapshot: SnapshotStrategy = "paced", rewrite_expired: bool = False) -> None:
        if (max_deltas is not None and max_deltas < 1) or \
                (delta_ratio is not None and not delta_ratio > 0):
            raise ConfigurationError("max_deltas must be >= 1 and delta_ratio > 0")
        if snapshot_share is not None and not 0 < snapshot_share <= 1:
            raise ConfigurationError(f"snapshot_share must be in (0, 1], got {snapshot_share}")
        if snapshot not in ("paced", "fork"):
            raise ConfigurationError(
                f"snapshot must be 'paced' or 'fork', got {snapshot!r}")
        if snapshot == "fork":
            why = fork_supported()
            if why is not None:
                log.warning("heap snapshots are paced on the event loop instead of forked: %s",
                            why)
                snapshot = "paced"
        self.incremental = incremental
        self.max_deltas = max_deltas
        self.delta_ratio = delta_ratio
        self.snapshot_share = snapshot_share
        self.snapshot: SnapshotStrategy = snapshot
        self.rewrite_expired = rewrite_expired

    def create_keyed_backend(
        self,
        *,
        job_name: str,
        operator_uid: str,
        subtask: int,
        key_group_range: KeyGroupRange,
        max_parallelism: int,
    ) -> KeyedStateBackend:
        return HeapKeyedStateBackend(key_group_range, max_parallelism, operator_uid=operator_uid,
                                     incremental=self.incremental, max_deltas=self.max_deltas,
                                     delta_ratio=self.delta_ratio,
                                     snapshot_share=self.snapshot_share,
                                     snapshot=self.snapshot,
                                     rewrite_expired=self.rewrite_expired)
