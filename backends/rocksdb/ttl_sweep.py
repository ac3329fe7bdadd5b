"""The sweep of the RocksDB store's expired time-to-live entries (Flink's incremental
cleanup, over the store instead of the heap; the semantics: :mod:`.ttl`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from rocksdict import WriteBatch

from reactive.state.ttl import IncrementalCleanup, _Ttl

from .generations import step_budget
from .keys import KEY_GROUP_BYTES, PREFIX_BYTES, key_group_bounds
from .state import StateTable, WriteBackCache
from .ttl import DROP, dropped_count, live_value

__all__ = ["RocksDBTtlSweep", "successor"]


def successor(prefix: bytes) -> bytes:
    """The smallest key after every key starting with ``prefix`` (``prefix`` is not all
    0xff: a key group below 65535's or a state id's)."""
    n = int.from_bytes(prefix, "big") + 1
    return n.to_bytes(len(prefix), "big")


class RocksDBTtlSweep(IncrementalCleanup):
    """Flink's incremental cleanup over the RocksDB store (see the module): the records an
    operator processes earn checks of stored entries (``rate`` per record, adapted as in
    :class:`~reactive.state.ttl.IncrementalCleanup`), done from a cursor over the instance's
    key range in steps of at most :attr:`STEP_ENTRIES` entries and
    :data:`.generations.STEP_SECONDS`.

    A pass walks each run of one state's entries in one key group (a *prefix*) only up to
    the last key the run held when the sweep entered it (the heap's cleanup reads a key
    group's keys as a stable copy the same way): keys inserted later into a run the sweep is
    in are left to the next pass. Keys named in increasing order (``user-000123``: ids
    handed out in time order) are all inserted past the cursor; without that bound a sweep
    slower than the inserts would walk the newest, live keys for ever and never reach the
    expired old ones at the start of the range.

    Args:
        backend: the instance's RocksDB keyed backend.
        decode_key: returns the backend's current decoder of stored key bytes.

    Attributes:
        swept: entries this sweep removed (deleted from RocksDB, or purged from the cache).
        passes: complete passes over the key range.
    """

    #: stored entries checked per step at most (Flink's ``cleanupSize``)
    STEP_ENTRIES = 1_000
    #: checks owed past which the rest is forgiven (a step waits while a generation is
    #: pending; what it could not do then is not done all at once afterwards)
    MAX_CREDIT = 4 * STEP_ENTRIES

    def __init__(self, backend: Any, decode_key: Callable[[], Callable[[bytes], Any]]) -> None:
        super().__init__(backend)
        self._decode_key = decode_key
        self._cursor: bytes | None = None
        # the prefix the cursor is in, and its last key when the sweep entered it
        self._prefix: bytes | None = None
        self._prefix_end = b""
        self.swept = 0
        self.passes = 0

    def step(self) -> None:
        """Check the entries the processed records earned (the whole part of the credit,
        at most :attr:`STEP_ENTRIES`), from the cursor on."""
        if not self._states:
            return
        b = cast(WriteBackCache, self.backend)
        if b._gens.pending:
            self._credit = min(self._credit, self.MAX_CREDIT)
            return
        budget = min(int(self._credit), self.STEP_ENTRIES)
        self._credit = min(self._credit - budget, self.MAX_CREDIT)
        if budget > 0:
            self._sweep(b, budget)

    def _sweep(self, b: WriteBackCache, budget: int) -> None:
        tables = b._tables
        by_sid: dict[bytes, tuple[StateTable, _Ttl, float]] = {}
        for name, state in self._states:
            table = tables.get(name)
            if table is not None and table.kind is not None:
                by_sid[table.sid] = (table, state, state._now())
        if not by_sid:
            return
        kgr = self.backend.key_group_range
        lower, upper = key_group_bounds(kgr.start, kgr.end)
        decode = self._decode_key()
        memo = b._kgb_memo
        clock, step, every = step_budget()
        deadline = clock() + step
        it = b._db.iter()
        it.seek(self._cursor if self._cursor is not None else lower)
        wb: WriteBatch | None = None
        cached: list[tuple[_Ttl, Any, float]] = []
        checked = found = work = 0
        wrapped = False
        while work < budget:
            k = cast(bytes, it.key()) if it.valid() else None
            if k is None or (upper is not None and k >= upper):
                self.passes += 1
                if wrapped:
                    break  # the whole range holds less than the budget
                wrapped = True
                self._prefix = None  # a new pass: each prefix's end is read again
                it.seek(lower)
                continue
            work += 1
            spec = by_sid.get(k[KEY_GROUP_BYTES:PREFIX_BYTES])
            if spec is None:  # another state's entries: skip them at once
                it.seek(successor(k[:PREFIX_BYTES]))
                continue
            prefix = k[:PREFIX_BYTES]
            if prefix != self._prefix:
                self._prefix = prefix
                self._prefix_end = self._last_key(b, prefix)
            elif k > self._prefix_end:  # inserted after the sweep entered the prefix
                self._prefix = None
                it.seek(successor(prefix))
                continue
            table, state, now = spec
            checked += 1
            key = decode(k[PREFIX_BYTES:])
            if key in table.cache:  # (the dirty keys are cached too)
                cached.append((state, key, now))
            else:
                value = table.loads(cast(bytes, it.value()))
                live = live_value(table.kind or "value", value, now)
                if live is not value:
                    n = dropped_count(table.kind or "value", value, live)
                    state.expired += n
                    self.swept += n
                    found += 1
                    if wb is None:
                        wb = WriteBatch(raw_mode=True)
                    if table.staged:
                        table.staged.pop(key, None)  # RocksDB gets a newer value
                    if live is DROP:
                        wb.delete(k)
                        memo.pop(key, None)
                    else:
                        wb.put(k, table.dumps(live))
            it.next()
            if not work % every and clock() >= deadline:
                break
        self._cursor = cast(bytes, it.key()) if it.valid() else None
        del it
        if wb is not None:
            b._db.write(wb)
        if cached:
            found += self._purge_cached(b, cached)
        if checked:
            self._found = 0.9 * self._found + 0.1 * min(1.0, found / checked)
            self.rate = min(self.MAX_RATE, max(self.MIN_RATE, 2 * self.MAX_RATE * self._found))

    @staticmethod
    def _last_key(b: WriteBackCache, prefix: bytes) -> bytes:
        """The last stored key starting with ``prefix`` (which has one: the cursor's)."""
        it = b._db.iter()
        it.seek_for_prev(successor(prefix))
        return cast(bytes, it.key())

    def _purge_cached(self, b: WriteBackCache, cached: list[tuple[_Ttl, Any, float]]) -> int:
        """Purge the cached keys the step met through their states (the cache holds their
        newest value); the key that was current is set back. Returns how many had expired
        entries."""
        backend = self.backend
        current = backend.current_key
        found = 0
        try:
            for state, key, now in cached:
                backend.set_current_key(key)
                before = state.expired
                state.purge(now)
                if state.expired != before:
                    found += 1
                    self.swept += state.expired - before
        finally:
            if current is not None:
                backend.set_current_key(current)
            else:
                backend.current_key = None
                b._kgb = None
        return found
