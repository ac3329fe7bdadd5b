"""The RocksDB backend's own value state with time-to-live: the fast path of
:meth:`reactive.state.backend.KeyedStateBackend.get_ttl_state`.

:class:`reactive.state.ttl.TtlValueState` over the backend's value state costs four Python
calls per write (the decorator, the expiry, the clock, the backend's state) and three per
read; this subclass reads the write-back cache itself and compares with the batch's frozen
time, which its clock hands it once per batch (:mod:`reactive.state.ttl_clock`), and writes
the batch's expiry through the backend's state in one call. It stores what the decorator
stores (``(value, expires_at)`` in the table of
:func:`reactive.state.ttl.backend_descriptor`), so snapshots and the sweep are the same with
or without it.
"""

from __future__ import annotations

import math
from typing import Any

from reactive.state.api import ValueState
from reactive.state.ttl import TtlValueState
from reactive.state.ttl_clock import TtlClock
from reactive.state.ttl_config import StateTtlConfig

from .generations import ABSENT, MISS
from .state import StateTable, WriteBackCache

__all__ = ["RocksDBTtlValueState", "RocksDBTtlValueStateOnRead"]


class RocksDBTtlValueState(TtlValueState):
    """A TTL value state reading the write-back cache directly (Flink's ``TtlValueState``
    over its RocksDB value state, the read merged into one call).

    Its fast paths are a read of a live value and a write inside a batch (the clock
    frozen); a value due for expiry, an absent key, and every access outside a batch (where
    the frozen time is ``+inf``) take the decorator's path, which reads the clock.

    Args:
        inner: the backend's value state of the backend descriptor (its writes keep the
            cache's dirty set and write batches).
        backend: the write-back cache whose current key the state is scoped to.
        table: the table ``inner`` reads.
        default: the user's default value.
        config: the TTL.
        clock: the time the TTL is measured in.
    """

    __slots__ = ("_b", "_batch_expires", "_batch_now", "_store", "_t")

    def __init__(self, inner: ValueState, backend: WriteBackCache, table: StateTable,
                 default: Any, config: StateTtlConfig, clock: TtlClock) -> None:
        super().__init__(inner, default, config, clock.now)
        self._b = backend
        self._t = table
        self._store = inner.update
        self._batch_now = math.inf
        self._batch_expires: float | None = None
        clock.subscribe(self)

    def _pair(self) -> Any:
        """The current key's stored pair, or ``ABSENT``."""
        key = self._b.current_key
        # table.cache, not a reference kept here: a snapshot swaps in a new dict
        v = self._t.cache.get(key, MISS)
        return self._b._load(self._t, key) if v is MISS else v

    def value(self) -> Any:
        key = self._b.current_key
        pair = self._t.cache.get(key, MISS)
        if pair is MISS:
            pair = self._b._load(self._t, key)
        if pair is not ABSENT and pair[1] > self._batch_now:
            return pair[0]
        # absent, due, or outside a batch: the decorator's path (a cache hit now)
        return TtlValueState.value(self)

    def update(self, value: Any) -> None:
        expires = self._batch_expires
        if expires is None:
            expires = self._expires()
        self._store((value, expires))


class RocksDBTtlValueStateOnRead(RocksDBTtlValueState):
    """:class:`RocksDBTtlValueState` with ``update_type="on_read_and_write"``: a live value
    read inside a batch is written back with the batch's expiry (what the decorator's path
    writes, without reading the clock); the rest takes the decorator's path."""

    __slots__ = ()

    def value(self) -> Any:
        pair = self._pair()
        if pair is not ABSENT and pair[1] > self._batch_now:
            v = pair[0]
            self._store((v, self._batch_expires))  # not None: the clock is frozen
            return v
        return TtlValueState.value(self)
