"""The heap backend's asynchronous snapshots with copy-on-write per key, full or incremental.

- *synchronous part* (the backend's ``snapshot``): O(number of key groups): plan which key
  groups are written in full and which as deltas (:mod:`.changelog`), note the states that
  exist, capture the current key;
- *asynchronous part* (:meth:`HeapSnapshot.write`): serialize the key groups in ascending
  order on the event loop thread, in pieces of about :data:`PIECE` seconds, and hand the
  bytes to a worker thread that writes, hashes and syncs them (:mod:`.file_writer`). A key
  group's dict is pickled live in one C call when it is small enough for a piece (nothing
  can change it during the call), else copied (``dict(d)``) and pickled in chunks; frames
  are pickled without the memo (:func:`.format.encode_frame`, several times faster on
  large groups). A delta holds the current values of the keys changed since the base, and
  a tombstone for those that have none (:mod:`.format`, ``heap-v2``);
- *pacing*: between pieces the snapshot stays away from the loop until the tasks had
  ``(1 - share) / share`` times the piece (:class:`.pacing.LoopShare`, RocksDB's rate
  limiter for background work in CPU time), so a saturated task keeps about ``1 - share``
  of its rate while a snapshot is written. Serializing needs the GIL in any thread, so
  bounding its share is the lever, not moving it off the loop. The price: on a saturated
  loop a snapshot takes about ``1 / share`` times its serialization time (at the default
  0.15 and 0.3-0.5 us per entry of scattered small objects, ~2-3 s per million entries
  serialized in full); a snapshot still running after :data:`PATIENCE` seconds doubles its
  share each :data:`PATIENCE` seconds, so large ones (the first, or after a load of new
  keys) still end within a few intervals; an idle loop runs it at full speed; an abort
  (:meth:`HeapSnapshot.discard`) or a cancellation stops it at the next piece. Full
  checkpoints serialize only the changed keys and copy the rest of the state from the
  previous checkpoint's file in the writer thread (no GIL held while copying), so their
  work on the loop follows the changes, like incremental ones;
- *copy-on-write per key*: while the asynchronous part runs, the backend reports every key
  set current (:meth:`HeapSnapshot.touch`); the first time a key whose key group is not
  written yet is touched, the snapshot captures that key's values in every state (immutable
  scalars by reference, anything else pickled, custom serializers' bytes), O(1) per touch.
  The writer uses a captured value instead of the live one, so the snapshot holds exactly
  the state as of the barrier, even though values are mutated in place later;
- *the freeze* (before serializing, paced like it): the walk that sorts the changed keys
  by key group captures those whose values are immutable scalars, and the dicts of the key
  groups written in full are copied (``dict(d)``) while their values are immutable; the
  key groups so taken need no copy-on-write (:attr:`HeapSnapshot.next_idx` passes them),
  and once all are, the backend stops watching. A record then pays copy-on-write only
  while the snapshot prepares, not while it serializes, and the capture work is the
  snapshot's paced work instead of a cost on the records. A key group with another value
  (a list, a dict: it could change in place) stays under copy-on-write per key;
- *time-to-live*: an entry of a TTL state expired by the synchronous part's TTL time is not
  written (Flink's cleanup in full snapshot, :mod:`.ttl_filter`); a key group whose earlier
  blobs may hold one (:attr:`.changelog.GroupChain.expires`) is written in full again.

The per-entry analogue of Flink's ``CopyOnWriteStateTable`` (Carbone 2018 (PhD thesis),
section 4.5.1): the task never serializes a whole key group inline. A state mutation follows
a ``set_current_key`` of its key, but for the barrier's current key (the synchronous part's).
"""

from __future__ import annotations

import pickle
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from functools import partial
from itertools import chain as concat
from itertools import groupby
from operator import itemgetter
from pathlib import Path
from typing import Any

from reactive.errors import StateSerializationError
from reactive.serialization import Serializer
from reactive.state.backend import KeyedStateSnapshot, SnapshotContext, file_name_component

from .changelog import Entry, GroupChain, SnapshotPlan
from .file_writer import SnapshotFileWriter, SnapshotOutput
from .format import DELTA, FULL, encode_frame, heap_v2_handle
from .pacing import LoopShare
from .state import Table, descriptor_serializer
from .ttl_filter import DROP, TtlFilter

__all__ = ["FREEZE_MAX", "PATIENCE", "PIECE", "SHARE", "Frozen", "HeapSnapshot",
           "capture_entries"]

#: seconds of serialization on the event loop between two yields to the tasks
PIECE = 0.001
#: the default share of the loop thread a snapshot takes while the tasks are busy
SHARE = 0.15
#: seconds after which a snapshot still running doubles its share (each time again)
PATIENCE = 1.0
_MIN_CHUNK, _MAX_CHUNK = 64, 1 << 17  # entries pickled in one piece (adapted to PIECE)
# a key group's dict is pickled live in one call (one pass over its objects: each pass costs
# a cache miss per entry, more than the pickling itself) when that call is expected to take
# at most _LIVE_SECONDS (at the per-entry time measured so far) and it has at most _LIVE_MAX
# entries; larger ones are copied and pickled in chunks of half a piece: one call holds the
# loop, and a 5 M-key state's key groups (39 k entries, ~15 ms each) would miss the
# application's 10 ms latency target
_LIVE_MAX = 1 << 16
_LIVE_SECONDS = 0.004
_PER_ENTRY = 5e-7  # seconds per entry assumed before any measurement (scattered objects)
# values that nothing can change in place: a capture keeps a reference
_IMMUTABLE = frozenset({int, float, str, bytes, bool, type(None), complex})
_SCALAR_OR_TUPLE = _IMMUTABLE | {tuple}
_MISSING = object()
# changed keys sorted by key group, or captured, in one C-level step (~1 ms: one piece)
_WALK_CHUNK = 4096
# keys :attr:`HeapSnapshot.seen` holds at most (~20 MB): bounds a long snapshot's memory
_SEEN_MAX = 1 << 18
#: entries the freeze captures or copies at most (~50-100 MB; the values are shared): key
#: groups beyond stay under copy-on-write per key
FREEZE_MAX = 1 << 20


class Frozen:
    """A captured value that may be mutated in place later: its pickle."""

    __slots__ = ("blob",)

    def __init__(self, blob: bytes) -> None:
        self.blob = blob


def _serializer(table: Table) -> Serializer | None:
    """The serializer to apply to ``table``'s values (None: stored as they are)."""
    return None if table.serialized else descriptor_serializer(table.descriptor)


def _serialize(ser: Serializer, value: Any, operator: str, name: str, key: Any) -> bytes:
    try:
        return ser.serialize(value)
    except Exception as exc:
        raise StateSerializationError(operator, name, key, exc) from exc


def _all_immutable(values: Collection[Any]) -> bool:
    """Whether nothing can change ``values`` in place: immutable scalars, or tuples of them
    (the ``(value, expires_at)`` pairs of state with a time-to-live)."""
    types = set(map(type, values))
    if _IMMUTABLE.issuperset(types):
        return True
    if not _SCALAR_OR_TUPLE.issuperset(types):
        return False
    if len(types) == 1:
        # tuples only (a TTL table's pairs): their items' types in one C-level pass, not a
        # Python-level check per tuple (a pass per checkpoint over the whole table)
        return _IMMUTABLE.issuperset(map(type, concat.from_iterable(values)))
    scalars = _IMMUTABLE.issuperset
    return all(scalars(map(type, v)) for v in values if type(v) is tuple)


def capture_entries(tables: Iterable[tuple[str, Table]], idx: int, key: Any,
                    operator: str) -> dict[str, Any]:
    """Return ``key``'s values in key group index ``idx`` as they are now, safe from later
    in-place changes: ``{state name: value}`` (custom serializer bytes for states with a
    serializer, a :class:`Frozen` pickle for mutable values); states without the key are
    left out.

    Raises:
        StateSerializationError: if a value cannot be serialized (naming ``operator``, the
            state and the key).
    """
    out: dict[str, Any] = {}
    for name, table in tables:
        value = table.maps[idx].get(key, _MISSING)
        if value is _MISSING:
            continue
        # _serializer(table) inlined: a capture is on the data path
        ser = None if table.serialized else getattr(table.descriptor, "serializer", None)
        if ser is not None:
            value = _serialize(ser, value, operator, name, key)
        elif type(value) not in _IMMUTABLE and (
                type(value) is not tuple or not _IMMUTABLE.issuperset(map(type, value))):
            try:
                value = Frozen(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
            except Exception as exc:
                raise StateSerializationError(operator, name, key, exc) from exc
        out[name] = value
    return out


def _thaw(value: Any) -> Any:
    return pickle.loads(value.blob) if type(value) is Frozen else value


def _dict_entries(name: str, d: dict[Any, Any]) -> Iterator[tuple[str, Any, Any]]:
    return ((name, k, v) for k, v in d.items())


def _pair_entries(name: str, keys: list[Any], values: list[Any]
                  ) -> Iterator[tuple[str, Any, Any]]:
    return ((name, k, v) for k, v in zip(keys, values, strict=True))


def _states_entries(states: dict[str, dict[Any, Any]]) -> Iterator[tuple[str, Any, Any]]:
    return ((name, k, v) for name, d in states.items() for k, v in d.items())


def _frame(frame: tuple[Any, ...], entries: Callable[[], Iterable[tuple[str, Any, Any]]],
           operator: str, memo: bool = False) -> bytes:
    """Encode ``frame``; when pickle refuses it, name the first entry
    ``(state, key, value)`` of ``entries()`` that fails on its own."""
    try:
        return encode_frame(frame, memo)
    except Exception as exc:
        # the fast path pickles whole chunks at C speed; only now look entry by entry
        for name, key, value in entries():
            try:
                pickle.dumps((key, value), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as inner:
                raise StateSerializationError(operator, name, key, inner) from exc
        raise


class HeapSnapshot(KeyedStateSnapshot):
    """One snapshot between its synchronous part and the end of its asynchronous part.

    Args:
        ctx: where to write.
        plan: full key groups, dirty keys and the base's chains (:mod:`.changelog`); a
            plan without base writes every key group in full.
        tables: the backend's live states by name (those present now are the snapshot's).
        start: the first key group of the instance's range.
        n: the number of key groups of the range.
        key_encoding: the handle's ``key_encoding``.
        incremental: write under ``shared/`` and chain onto the plan's base's files (else
            one self-contained file in the checkpoint's directory: full snapshots, which
            copy the base's bytes of unchanged key groups into it, and savepoints).
        release: called (possibly more than once) when the snapshot needs no more touches.
        on_failed: called when a self-contained snapshot with a base fails with
            :class:`OSError` (e.g. the base's file is gone: the next one must not copy it).
        on_written: called with (checkpoint id, chains per key-group index) when an
            incremental snapshot is written.
        share: the share of the loop thread the asynchronous part takes while the tasks
            are busy (see :class:`.pacing.LoopShare`); None: :data:`SHARE`.
        garbage: an object the backend no longer needs whose freeing may take long (a
            memo generation): dropped in the asynchronous part, not the synchronous one.
        fresh_memo: the backend swapped in a fresh key memo at this snapshot's synchronous
            part (checkpoints, not savepoints): it reports a key on its first memo miss
            since then, and :attr:`seen` is not consulted.
        ttl: the TTL times read in the synchronous part: expired TTL entries are not written
            (:mod:`.ttl_filter`); None: every entry is written.

    Attributes:
        next_idx: key groups below this index are written: touches of them are ignored.
        captured: key group index -> key -> the key's captured entries (None: unchanged
            since the snapshot's base); a key in it needs no :meth:`touch` any more.
        seen: the keys :meth:`touch` was called with (it clears itself at
            :data:`_SEEN_MAX` keys): for a snapshot without a fresh memo (a savepoint),
            one dict lookup per record tells the backend's watching ``set_current_key``
            that a key needs no :meth:`touch`.
        failure: set when a capture met a value that cannot be serialized.
        ended: the asynchronous part ended (written, failed or discarded): no more
            touches are needed.
        pacer: the asynchronous part's pacing (its ``busy`` and ``paused`` seconds tell
            how long it serialized and how long it let the tasks run).
        serialized_bytes: bytes the asynchronous part serialized (the file's bytes not
            copied from the previous checkpoint's file), once :meth:`write` returned.
    """

    def __init__(self, ctx: SnapshotContext, plan: SnapshotPlan, *,
                 tables: Mapping[str, Table], start: int, n: int, key_encoding: str,
                 incremental: bool, release: Callable[[HeapSnapshot], None],
                 on_written: Callable[[int, list[GroupChain]], None] | None = None,
                 on_failed: Callable[[], None] | None = None,
                 share: float | None = None, garbage: Any = None,
                 fresh_memo: bool = False, ttl: TtlFilter | None = None) -> None:
        self.ctx = ctx
        self.plan = plan
        self.tables = list(tables.items())
        self.start = start
        self.n = n
        self.key_encoding = key_encoding
        self.incremental = incremental
        self._release = release
        self._on_written = on_written
        self._on_failed = on_failed
        self._garbage = garbage
        self.fresh_memo = fresh_memo
        self.ttl = TtlFilter({}) if ttl is None else ttl
        self._sers = {name: ser for name, t in self.tables  # a TTL capture's serializer
                      if name in self.ttl.times and (ser := _serializer(t)) is not None}
        self.next_idx = 0
        self.failure: StateSerializationError | None = None
        self.ended = False
        self._discarded = False
        self.captured: dict[int, dict[Any, dict[str, Any] | None]] = {}
        self.seen: dict[Any, None] = {}
        # key group index -> state name -> the dict of a key group written in full, copied
        # by the freeze
        self._frozen: dict[int, dict[str, dict[Any, Any]]] = {}
        # delta key groups with a changed key that _dirty_by_group could not capture
        self._uncaptured: set[int] = set()
        self._budget = FREEZE_MAX  # entries the freeze may still capture or copy
        self._chunk = 1 << 14
        self._per_entry = _PER_ENTRY  # measured seconds per entry pickled
        self.pacer = LoopShare(SHARE if share is None else share, PIECE, patience=PATIENCE)
        self.serialized_bytes = 0

    # ------------------------------------------------------------------ copy-on-write
    def touch(self, key: Any, idx: int) -> None:
        """The task sets ``key`` (of key group index ``idx``, not yet written) current and
        may change its state: capture its values first if the snapshot needs them.

        Called about once per key and snapshot (on the key's first memo miss since the
        barrier, or, without a fresh memo, when it is not in :attr:`seen`; again after a
        roll of the memo or a clearing of :attr:`seen`: idempotent), and for a key of a key
        group already written (nothing to capture)."""
        if not self.fresh_memo:
            seen = self.seen
            if len(seen) >= _SEEN_MAX:
                seen.clear()  # keys seen again are touched again: idempotent
            seen[key] = None
        if idx < self.next_idx:
            return
        cap = self.captured.get(idx)
        if cap is None:
            cap = self.captured[idx] = {}
        elif key in cap:
            return
        full = self.plan.full
        needed = full is None or idx in full
        if not needed:
            for gen in self.plan.dirty:  # a loop, not any(): no generator per touch
                if key in gen:
                    needed = True
                    break
        if needed:
            try:
                cap[key] = capture_entries(self.tables, idx, key, self.ctx.operator_uid)
            except StateSerializationError as exc:
                # copy-on-write runs on the data path: the snapshot fails, not the record
                if self.failure is None:
                    self.failure = exc
                cap[key] = {}
        else:
            cap[key] = None  # unchanged since the base: not in this snapshot

    # ------------------------------------------------------------------ writing
    def _check(self) -> None:
        if self.failure is not None:
            raise self.failure
        if self._discarded:
            raise OSError(f"snapshot {self.ctx.checkpoint_id} was discarded (the backend was "
                          "disposed while its asynchronous part ran)")

    async def _tick(self, out: SnapshotOutput) -> None:
        """Once a piece of :data:`PIECE` seconds is used up, let the tasks run for their
        share (:class:`.pacing.LoopShare`) and check that the snapshot still goes on."""
        pacer = self.pacer
        if pacer.due():
            pacer.piece = PIECE  # read at run time: tests shrink the pieces
            await out.writer.drain()
            await pacer.pause()
            self._check()

    def _adapt(self, seconds: float, entries: int) -> None:
        """Size the next chunks to fill about half a piece, from one chunk's timing."""
        if entries:
            per_entry = self._per_entry = max(seconds, 1e-7) / entries
            self._chunk = max(_MIN_CHUNK, min(_MAX_CHUNK, int(PIECE / 2 / per_entry)))

    def _serialized_names(self) -> list[str]:
        return [name for name, t in self.tables
                if t.serialized or descriptor_serializer(t.descriptor) is not None]

    def _overrides(self, idx: int, keys: list[Any]) -> tuple[list[Any], dict[str, Any]]:
        """The ``"k"`` frame's keys and states for ``keys`` of key group index ``idx``:
        captured values where a capture exists, else the live ones."""
        cap = self.captured.get(idx)
        op = self.ctx.operator_uid
        states: dict[str, dict[Any, Any]] = {}
        live = keys if not cap else [k for k in keys if cap.get(k) is None]
        frozen = self._frozen.get(idx)
        for name, t in self.tables:
            d = t.maps[idx] if frozen is None else frozen.get(name)
            if not d:
                continue
            ser = _serializer(t)
            # comprehensions: the per-key work of a delta stays in C-level loops; an
            # expired TTL entry is left out (a listed key without a value: a tombstone)
            values = self.ttl.entries(name, {k: d[k] for k in live if k in d})
            if ser is not None:
                values = {k: _serialize(ser, v, op, name, k) for k, v in values.items()}
            if values:
                states[name] = values
        if cap and len(live) < len(keys):
            for key in keys:
                entries = cap.get(key)
                if entries is not None:
                    for name, value in entries.items():
                        value = self.ttl.value(name, _thaw(value), self._sers.get(name))
                        if value is not DROP:
                            states.setdefault(name, {})[key] = value
        return keys, states

    def _keys_frame(self, keys: list[Any], states: dict[str, dict[Any, Any]]) -> bytes:
        return _frame(("k", keys, states), partial(_states_entries, states),
                      self.ctx.operator_uid, memo=True)

    async def _write_full(self, idx: int, out: SnapshotOutput) -> Entry | None:
        """Write key group index ``idx`` in full; None when it is empty."""
        op = self.ctx.operator_uid
        header = (FULL, self._serialized_names())
        begun = False
        frozen = self._frozen.get(idx)
        for name, table in self.tables:
            d = self.ttl.entries(name, table.maps[idx] if frozen is None else frozen.get(name, {}))
            if not d:
                continue
            if not begun:
                out.begin(header)
                begun = True
            ser = _serializer(table)
            if ser is None and len(d) <= _LIVE_MAX and \
                    len(d) * self._per_entry <= _LIVE_SECONDS:
                # the live dict in one C call: nothing runs in between to change it, and
                # the captures below replace what changed since the barrier
                t0 = time.perf_counter()
                out.add(_frame(("p", name, d), partial(_dict_entries, name, d), op))
                self._per_entry = max(time.perf_counter() - t0, 1e-7) / len(d)
                await self._tick(out)
                continue
            copy = dict(d)  # at C speed; the values it shares are protected by the captures
            keys = list(copy)
            i = 0
            while i < len(keys):
                t0 = time.perf_counter()
                ks = keys[i:i + self._chunk]
                i += len(ks)
                vs = list(map(copy.__getitem__, ks)) if ser is None else \
                    [_serialize(ser, copy[k], op, name, k) for k in ks]
                out.add(_frame(("pk", name, ks, vs),
                               partial(_pair_entries, name, ks, vs), op))
                self._adapt(time.perf_counter() - t0, len(ks))
                await self._tick(out)
        cap = self.captured.get(idx)
        if cap:
            keys, states = self._overrides(idx, [k for k, e in cap.items() if e is not None])
            if keys:
                if not begun:
                    out.begin(header)
                    begun = True
                out.add(self._keys_frame(keys, states))
        return out.end(FULL) if begun else None

    async def _write_delta(self, idx: int, keys: list[Any], out: SnapshotOutput) -> Entry:
        """Write the changes of ``keys`` (key group index ``idx``) since the base."""
        out.begin((DELTA, self._serialized_names()))
        i = 0
        while i < len(keys):
            t0 = time.perf_counter()
            chunk = keys[i:i + self._chunk]
            i += len(chunk)
            out.add(self._keys_frame(*self._overrides(idx, chunk)))
            self._adapt(time.perf_counter() - t0, len(chunk))
            await self._tick(out)
        return out.end(DELTA)

    async def _freeze(self, out: SnapshotOutput) -> None:
        """Pass the key groups, in ascending order, whose written entries can no longer
        change: a delta group whose changed keys :meth:`_dirty_by_group` captured, and a
        group written in full whose dict, copied (``dict(d)``, one C-level call per state),
        holds only immutable scalars (:data:`_IMMUTABLE`) or tuples of them. A passed group needs no
        copy-on-write (:attr:`next_idx`); once every group is passed the backend stops
        watching, and the records no longer pay a check per ``set_current_key`` while the
        snapshot is serialized at its paced share.

        Stops at the first group holding another value (its entries could change in place;
        it and the groups after it stay under copy-on-write per key) or after
        :data:`FREEZE_MAX` copied entries; does nothing while a restored state is not bound
        to its descriptor yet. Keys captured before their group was passed keep
        their captures, which the writer applies over the copy. Paced like the writing
        (:attr:`pacer`).
        """
        if any(table.serialized for _, table in self.tables):
            # a restored state not bound to its descriptor yet holds its serializer's bytes;
            # binding it (``get_state``) decodes them in place and the writer then serializes
            # what it reads: a copy taken before would be serialized twice. (Only a restore
            # marks a state serialized, before any snapshot: checking once is enough.)
            return
        full = self.plan.full
        budget = self._budget
        for idx in range(self.next_idx, self.n):
            if full is None or idx in full:
                group: dict[str, dict[Any, Any]] = {}
                for name, table in self.tables:
                    d = table.maps[idx]
                    if not d:
                        continue
                    copy = dict(d)
                    budget -= len(copy)
                    if budget < 0 or not _all_immutable(copy.values()):
                        return
                    group[name] = copy
                self._frozen[idx] = group
            elif idx in self._uncaptured:
                return
            self.next_idx = idx + 1
            await self._tick(out)

    async def _dirty_by_group(self, out: SnapshotOutput) -> dict[int, list[Any]]:
        """The dirty keys of the key groups written as deltas, per key-group index.

        Sorts them by key group in C-level steps (a chunk of :data:`_WALK_CHUNK` keys per
        piece), then takes each delta group's changed values out of the records' reach with
        comprehensions per state, :data:`_WALK_CHUNK` keys each (:attr:`_frozen`: the
        values as they are now; a key not touched since the barrier still holds its value
        of the barrier, and a touched one keeps its capture, which :meth:`_overrides`
        applies over them) when they are all immutable scalars and no state has a custom
        serializer (nor is a restored state not bound to its descriptor yet, see
        :meth:`_freeze`); the key groups left with an uncaptured key go to
        :attr:`_uncaptured`. So the copy-on-write of the changed keys is paced work of the
        snapshot, not a cost on the records. At most :data:`FREEZE_MAX` keys are taken so
        (with the copies of the freeze)."""
        full = self.plan.full
        if full is None or len(full) >= self.n:
            return {}  # every key group is written in full: no delta needs its keys
        plain = [(name, t.maps) for name, t in self.tables]
        if any(t.serialized or _serializer(t) is not None for _, t in self.tables):
            plain = []  # values to serialize, or bytes a binding may decode: per touch
        # closed generations (nobody changes them); a key dirty in several of them has one
        # key group: one entry. The usual case is one generation: listed as it is, not
        # copied into a merged dict first
        gens = self.plan.dirty
        if len(gens) == 1:
            items = list(gens[0].items())
        else:
            merged: dict[Any, int] = {}
            for gen in gens:
                merged.update(gen)
                await self._tick(out)
            items = list(merged.items())
            del merged
        by: dict[int, list[Any]] = {}
        first, key_of = itemgetter(1), itemgetter(0)
        for i in range(0, len(items), _WALK_CHUNK):
            chunk = items[i:i + _WALK_CHUNK]
            chunk.sort(key=first)
            for idx, run in groupby(chunk, first):
                if idx not in full:
                    keys = by.get(idx)
                    if keys is None:
                        by[idx] = list(map(key_of, run))
                    else:
                        keys.extend(map(key_of, run))
            await self._tick(out)
        del items
        uncaptured = self._uncaptured
        budget = self._budget
        for idx in sorted(by):
            if not plain or budget <= 0:
                uncaptured.add(idx)
                continue
            keys = by[idx]
            group: dict[str, dict[Any, Any]] = {}
            for name, maps in plain:
                d = maps[idx]
                values: dict[Any, Any] = {}
                # a delta group may hold 20 % of a large key group (DIRTY_FULL): in steps
                for i in range(0, len(keys), _WALK_CHUNK):
                    # a key absent from the state is a tombstone: left out
                    part = {k: d[k] for k in keys[i:i + _WALK_CHUNK] if k in d}
                    if not _all_immutable(part.values()):
                        break
                    values.update(part)
                    await self._tick(out)
                else:
                    if values:
                        group[name] = values
                    continue
                uncaptured.add(idx)  # could change in place: copy-on-write per key
                break
            else:
                self._frozen[idx] = group
                budget -= len(keys)
        self._budget = budget
        return by

    def _carry(self, chain: GroupChain, out: SnapshotOutput) -> GroupChain:
        """Copy ``chain``'s blobs from the base's file into this snapshot's (by the writer
        thread, no serialization): the same chain, in this file."""
        moved: list[Entry] = []
        for ref, offset, length, kind in chain.entries:
            moved.append((out.ref, out.offset, length, kind))
            out.copy(self.ctx.job_dir / ref["path"], offset, length)
        return GroupChain(tuple(moved), chain.full_bytes, chain.delta_bytes, chain.deltas,
                          chain.expires, chain.ttl_bound)

    def _path(self) -> Path:
        ctx = self.ctx
        if not self.incremental:
            return ctx.exclusive_path(".heap")
        uid = file_name_component(ctx.operator_uid)
        return ctx.shared_dir / uid / \
            f"{uid}-{ctx.subtask}-{ctx.checkpoint_id}-{uuid.uuid4().hex[:8]}.heap"

    async def write(self) -> dict[str, Any]:
        """Asynchronous part: write the snapshot file and return the ``heap-v2`` handle.

        Raises:
            StateSerializationError: if a value or key cannot be serialized (naming the
                operator, the state and the key).
            OSError: if the file cannot be written, or the snapshot was discarded.
        """
        ctx = self.ctx
        path = self._path()
        ref: dict[str, Any] = {"path": ctx.relative(path)}
        writer = SnapshotFileWriter(path)
        out = SnapshotOutput(writer, ref)
        base = self.plan.base
        full = self.plan.full
        chains: list[GroupChain] = []
        try:
            self._check()
            self.pacer.start()
            self._garbage = None
            dirty = await self._dirty_by_group(out)
            await self._freeze(out)
            frozen_below = self.next_idx
            if frozen_below >= self.n:
                self._release(self)  # nothing left to copy on write
            for idx in range(self.n):
                if idx >= frozen_below:
                    self.next_idx = idx
                self.ttl.group(() if base is None else base[idx].ttl_bound,
                               full is None or idx in full)
                if full is None or idx in full:
                    entry = await self._write_full(idx, out)
                    chains.append(GroupChain.full(entry, *self.ttl.take_earliest()))
                else:
                    assert base is not None
                    keys = dirty.pop(idx, None)
                    chain = base[idx] if self.incremental else self._carry(base[idx], out)
                    if keys is not None:
                        entry = await self._write_delta(idx, keys, out)
                        chain = chain.with_delta(entry, *self.ttl.take_earliest())
                    chains.append(chain)
                self._check()
                # written: later touches of this key group need no capture
                self.next_idx = max(self.next_idx, idx + 1)
                self.captured.pop(idx, None)
                self._frozen.pop(idx, None)
                await self._tick(out)
            self._release(self)
            self._check()
            out.flush()
            self.serialized_bytes = out.serialized
            if writer.size:  # else nothing changed: no file was started
                ref["size"], ref["sha256"] = await writer.close()
        except BaseException as exc:
            await writer.discard()
            if isinstance(exc, OSError) and self._on_failed is not None and \
                    not self.incremental and base is not None:
                self._on_failed()
            raise
        finally:
            self.ended = True
            self._release(self)
            self.captured.clear()
            self.seen.clear()
            self._frozen.clear()
        if self._on_written is not None:
            self._on_written(ctx.checkpoint_id, chains)
        return self._handle(chains, ref if writer.size else None)

    def _handle(self, chains: list[GroupChain], written: dict[str, Any] | None
                ) -> dict[str, Any]:
        files: list[dict[str, Any]] = []
        index_of: dict[str, int] = {}
        key_groups: dict[str, list[list[Any]]] = {}
        for idx, chain in enumerate(chains):
            if not chain.entries:
                continue
            entries = []
            for ref, offset, length, kind in chain.entries:
                i = index_of.get(ref["path"])
                if i is None:
                    i = index_of[ref["path"]] = len(files)
                    files.append({"path": ref["path"], "size": ref["size"],
                                  "sha256": ref["sha256"]})
                entries.append([i, offset, length, kind])
            key_groups[str(self.start + idx)] = entries
        if not self.incremental:
            handle = heap_v2_handle(mode="full", files=files, shared=[], reused=[],
                                    key_groups=key_groups, key_encoding=self.key_encoding)
        else:
            mine = None if written is None else written["path"]
            handle = heap_v2_handle(
                mode="incremental", files=files, shared=[dict(r) for r in files],
                reused=[dict(r) for r in files if r["path"] != mine],
                key_groups=key_groups, key_encoding=self.key_encoding)
        if self.ttl:
            # the expired TTL entries left out (a metric: CheckpointStats.operators)
            handle["ttl_dropped"] = self.ttl.dropped
        return handle

    def discard(self) -> None:
        """Release the captures (the checkpoint was aborted); a running :meth:`write`
        fails at its next piece."""
        self._discarded = True
        self.ended = True
        self._release(self)
        self.captured.clear()
        self._frozen.clear()
        self._garbage = None
