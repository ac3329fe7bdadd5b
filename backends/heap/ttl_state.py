"""The heap backend's own value state with time-to-live: the fast path of
:meth:`reactive.state.backend.KeyedStateBackend.get_ttl_state`.

:class:`reactive.state.ttl.TtlValueState` over a heap value state costs three Python calls
per access (the decorator, the backend's state, the clock); this subclass reads and writes
the key group's dict itself and reads the batch's frozen time (:mod:`reactive.state.ttl_clock`),
so a TTL value costs one call per access like a value without TTL. It stores what the
decorator stores (``(value, expires_at)`` in the table of
:func:`reactive.state.ttl.backend_descriptor`), so snapshots are the same with or without it.
"""

from __future__ import annotations

from typing import Any

from reactive.state.api import ValueState
from reactive.state.ttl import TtlValueState
from reactive.state.ttl_clock import TtlClock
from reactive.state.ttl_config import StateTtlConfig

from .state import KeyScope, Table

__all__ = ["HeapTtlValueState"]


class HeapTtlValueState(TtlValueState):
    """A TTL value state reading the heap table directly (Flink's ``TtlValueState`` over
    its heap backend's ``HeapValueState``, the two layers merged into one).

    Args:
        inner: the heap value state of the backend descriptor (kept for ``clear``, which
            also drops the key from the backend's key memo).
        backend: the backend whose current key the state is scoped to.
        table: the table ``inner`` reads.
        default: the user's default value.
        config: the TTL.
        clock: the time the TTL is measured in.
    """

    __slots__ = ("_at", "_b", "_clock", "_expires_at", "_maps")

    def __init__(self, inner: ValueState, backend: KeyScope, table: Table, default: Any,
                 config: StateTtlConfig, clock: TtlClock) -> None:
        super().__init__(inner, default, config, clock.now)
        self._b = backend
        self._maps = table.maps
        self._clock = clock
        # the expiry of a write at the frozen time ``_at``: computed once per batch, one
        # float shared by the batch's writes (an addition per write allocates a float)
        self._at: float | None = None
        self._expires_at = 0.0

    def value(self) -> Any:
        b = self._b
        pair = self._maps[b._idx].get(b.current_key)
        if pair is None:
            return self._default
        now = self._clock.frozen
        if now is None:
            now = self._clock.read()
        if pair[1] <= now:
            self._inner.clear()
            self.expired += 1
            return pair[0] if self._return_expired else self._default
        if self._refresh:
            self._maps[b._idx][b.current_key] = (pair[0], now + self._ttl)
        return pair[0]

    def update(self, value: Any) -> None:
        cleanup = self._cleanup
        if cleanup is not None:
            cleanup.countdown -= 1
            if cleanup.countdown <= 0:
                cleanup.tick()
        now = self._clock.frozen
        if now is None:
            expires = self._clock.read() + self._ttl
        elif now is self._at:
            expires = self._expires_at
        else:
            self._at = now
            expires = self._expires_at = now + self._ttl
        b = self._b
        self._maps[b._idx][b.current_key] = (value, expires)
