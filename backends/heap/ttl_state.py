"""The heap backend's own value state with time-to-live: the fast path of
:meth:`reactive.state.backend.KeyedStateBackend.get_ttl_state`.

:class:`reactive.state.ttl.TtlValueState` over a heap value state costs three Python calls
per access (the decorator, the backend's state, the clock); this subclass reads and writes
the key group's dict itself and compares with the batch's frozen time, which its clock hands
it once per batch (:mod:`reactive.state.ttl_clock`), so a TTL value costs one call per
access like a value without TTL. It stores what the decorator stores (``(value, expires_at)``
in the table of :func:`reactive.state.ttl.backend_descriptor`), so snapshots are the same
with or without it.
"""

from __future__ import annotations

import math
from typing import Any

from reactive.state.api import ValueState
from reactive.state.ttl import TtlValueState
from reactive.state.ttl_clock import TtlClock
from reactive.state.ttl_config import StateTtlConfig

from .state import KeyScope, Table

__all__ = ["HeapTtlValueState", "HeapTtlValueStateOnRead"]


class HeapTtlValueState(TtlValueState):
    """A TTL value state reading the heap table directly (Flink's ``TtlValueState`` over
    its heap backend's ``HeapValueState``, the two layers merged into one).

    Its fast paths are a read of a live value and a write inside a batch (the clock frozen);
    a value due for expiry (or every access outside a batch, where the frozen time is
    ``+inf``) takes the decorator's path, which reads the clock.

    Args:
        inner: the heap value state of the backend descriptor (kept for ``clear``, which
            also drops the key from the backend's key memo).
        backend: the backend whose current key the state is scoped to.
        table: the table ``inner`` reads.
        default: the user's default value.
        config: the TTL.
        clock: the time the TTL is measured in.
    """

    __slots__ = ("_absent", "_b", "_batch_expires", "_batch_now", "_maps")

    def __init__(self, inner: ValueState, backend: KeyScope, table: Table, default: Any,
                 config: StateTtlConfig, clock: TtlClock) -> None:
        super().__init__(inner, default, config, clock.now)
        self._b = backend
        self._maps = table.maps
        # what a read of an absent key unpacks: the default, never due (so a read inside a
        # batch returns it without a second test; outside one, +inf > +inf is false and the
        # decorator's path answers the default too)
        self._absent = (default, math.inf)
        self._batch_now = math.inf
        self._batch_expires: float | None = None
        clock.subscribe(self)

    def value(self) -> Any:
        b = self._b
        v, expires = self._maps[b._idx].get(b.current_key, self._absent)
        if expires > self._batch_now:
            return v
        # due, or outside a batch: decide with the clock read now (the decorator's path,
        # called through the class: no ``super()`` cell on the fast path)
        return TtlValueState.value(self)

    def update(self, value: Any) -> None:
        expires = self._batch_expires
        if expires is None:
            expires = self._expires()
        b = self._b
        self._maps[b._idx][b.current_key] = (value, expires)

    def expired_keys(self, index: int, keys: list[Any], now: float) -> list[Any]:
        """Those of ``keys`` (all of the key group at ``index`` in the instance's range)
        whose value is due at ``now``, read from the table without setting a current key:
        the incremental cleanup's check, which then sets only these current to clear them.
        """
        d = self._maps[index]
        return [k for k in keys if (p := d.get(k)) is not None and p[1] <= now]


class HeapTtlValueStateOnRead(HeapTtlValueState):
    """:class:`HeapTtlValueState` with ``update_type="on_read_and_write"``: a read restarts
    the value's time to live. A live value read inside a batch is written back with the
    batch's expiry here (what the decorator's path writes, without reading the clock);
    the rest takes the decorator's path."""

    __slots__ = ()

    def value(self) -> Any:
        b = self._b
        d = self._maps[b._idx]
        key = b.current_key
        pair = d.get(key)
        if pair is not None and pair[1] > self._batch_now:
            v = pair[0]
            d[key] = (v, self._batch_expires)  # not None: the clock is frozen
            return v
        return TtlValueState.value(self)
