"""State time-to-live: keyed state whose entries expire by themselves (Flink's
``StateTtlConfig`` and its TTL state decorators, ``TtlValueState``, ``TtlListState``,
``TtlMapState``, ``TtlReducingState``).

A descriptor given ``ttl=`` (seconds, or a :class:`StateTtlConfig`) makes ``ctx.get_state``
return a decorator over the backend's state: the backend stores each value (a value state's
value, a list's element, a map's entry, a reducing state's accumulator) as a pair
``(value, expires_at)``, ``expires_at`` being the time of its last write (or access, with
``update_type="on_read_and_write"``) plus the TTL. The pairs are ordinary state values, so
the expiry timestamps travel in every snapshot, on every backend, through savepoints, restores
at another parallelism and restores into another backend: a restore never resurrects an
expired value, nor expires a value earlier than the run without the failure would have (with
processing time, expiry is wall-clock time, which a restart does not reset; with event time,
the watermark, which a restore brings back no further than the checkpoint's).

An expired entry is never returned (``visibility="never_return_expired"``, the default), or
returned one last time (``"return_expired_if_not_cleaned_up"``); either way the access that
finds it expired removes it (cleanup on access).

Time: ``time_characteristic="processing_time"`` reads the configured clock, else the
operator's processing-time clock where it has a timer service, else the system's wall clock;
``"event_time"`` reads the operator's current watermark (a keyed process function's
``ctx.timer_service.current_watermark()``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import msgpack

from ..errors import ConfigurationError
from ..serialization import Serializer
from .api import ListState, MapState, ReducingState, State, ValueState
from .backend import KeyedStateBackend
from .descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from .ttl_config import (
    StateTtlConfig,
    TtlTimeCharacteristic,
    TtlUpdateType,
    TtlVisibility,
)

__all__ = [
    "IncrementalCleanup",
    "StateTtlConfig",
    "TtlListState",
    "TtlMapState",
    "TtlReducingState",
    "TtlTimeCharacteristic",
    "TtlUpdateType",
    "TtlValueState",
    "TtlVisibility",
    "backend_descriptor",
    "ttl_config",
    "ttl_state",
]

def ttl_config(descriptor: StateDescriptor) -> StateTtlConfig | None:
    """The descriptor's TTL as a :class:`StateTtlConfig` (None: no TTL).

    Raises:
        ConfigurationError: if the descriptor's ``ttl`` is neither seconds nor a config.
    """
    ttl = getattr(descriptor, "ttl", None)
    if ttl is None or isinstance(ttl, StateTtlConfig):
        return ttl
    if isinstance(ttl, int | float) and not isinstance(ttl, bool):
        return StateTtlConfig(float(ttl))
    raise ConfigurationError(f"state {descriptor.name!r}: ttl must be seconds or a "
                             f"StateTtlConfig, got {ttl!r}")


_MISSING = object()


# ---------------------------------------------------------------- the backend's descriptor
class _PairSerializer:
    """Stores ``(value, expires_at)`` as msgpack ``[user bytes, expires_at]``: the user's
    serializer sees only its own values."""

    def __init__(self, inner: Serializer) -> None:
        self.inner = inner

    def serialize(self, value: Any) -> bytes:
        v, expires = value
        return msgpack.packb([self.inner.serialize(v), expires])  # type: ignore[no-any-return]

    def deserialize(self, data: bytes) -> Any:
        blob, expires = msgpack.unpackb(data)
        return (self.inner.deserialize(blob), expires)


class _ListPairSerializer:
    """Stores a list of ``(element, expires_at)`` as msgpack ``[user bytes of the elements,
    [expires_at, ...]]`` (the user's list serializer sees a plain list)."""

    def __init__(self, inner: Serializer) -> None:
        self.inner = inner

    def serialize(self, value: Any) -> bytes:
        return msgpack.packb(  # type: ignore[no-any-return]
            [self.inner.serialize([e for e, _ in value]), [t for _, t in value]])

    def deserialize(self, data: bytes) -> Any:
        blob, times = msgpack.unpackb(data)
        elements = self.inner.deserialize(blob)
        return list(zip(elements, times, strict=True))


def backend_descriptor(descriptor: StateDescriptor, config: StateTtlConfig) -> StateDescriptor:
    """The descriptor the backend stores a TTL state under: the same name and kind, values
    wrapped as ``(value, expires_at)`` (the serializer and reduce function adapted).

    Raises:
        ConfigurationError: for a map state with a custom serializer (its serializer takes
            the whole map, whose entries expire one by one), or a kind without TTL.
    """
    serializer = getattr(descriptor, "serializer", None)
    if isinstance(descriptor, ValueStateDescriptor):
        return dataclasses.replace(
            descriptor, default=None, ttl=None,
            serializer=None if serializer is None else _PairSerializer(serializer))
    if isinstance(descriptor, ListStateDescriptor):
        return dataclasses.replace(
            descriptor, ttl=None,
            serializer=None if serializer is None else _ListPairSerializer(serializer))
    if isinstance(descriptor, MapStateDescriptor):
        if serializer is not None:
            raise ConfigurationError(
                f"map state {descriptor.name!r}: ttl with a custom serializer is not "
                "supported (the serializer takes the whole map, whose entries expire one by "
                "one); drop the serializer or keep the expiry in the values yourself")
        return dataclasses.replace(descriptor, ttl=None)
    if isinstance(descriptor, ReducingStateDescriptor):
        fn = descriptor.reduce_fn

        def reduce_pairs(acc: Any, new: Any) -> Any:
            # the accumulator was checked for expiry before the add (TtlReducingState.add)
            return (fn(acc[0], new[0]), new[1])

        return dataclasses.replace(
            descriptor, reduce_fn=reduce_pairs, ttl=None,
            serializer=None if serializer is None else _PairSerializer(serializer))
    raise ConfigurationError(f"state {descriptor.name!r}: {descriptor.kind} state has no ttl")


# ---------------------------------------------------------------- the decorators
class _Ttl:
    """What every TTL decorator shares: the clock, the expiry rules, the count of entries
    it removed, the incremental cleanup it is registered with (:class:`IncrementalCleanup`),
    and a lower bound of the expiries it wrote.

    Attributes:
        expired: entries this state removed because they had expired (on access or in a
            sweep).
        floor: a lower bound (seconds) of every expiry in the state's table, lowered by
            each expiry the state writes: ``-inf`` (the default: nothing known, e.g. restored
            entries) until a backend that knows the table held nothing sets ``+inf``, and
            again when something else writes the table (a restore). A snapshot whose TTL
            time is before it need not look for expired entries of the state.
    """

    __slots__ = ("_cleanup", "_now", "_refresh", "_return_expired", "_ttl", "expired",
                 "floor")

    def __init__(self, config: StateTtlConfig, now: Callable[[], float]) -> None:
        self._ttl = config.ttl
        self._now = now
        self._refresh = config.update_type == "on_read_and_write"
        self._return_expired = config.visibility == "return_expired_if_not_cleaned_up"
        self._cleanup: IncrementalCleanup | None = None
        self.expired = 0
        self.floor = -math.inf

    def _expires(self) -> float:
        """The expiry of a write now (lowering :attr:`floor`)."""
        return self._at(self._now())

    def _at(self, now: float) -> float:
        """The expiry of a write at ``now`` (lowering :attr:`floor`)."""
        expires = now + self._ttl
        if expires < self.floor:
            self.floor = expires
        return expires

    def purge(self, now: float) -> None:
        """Remove the current key's expired entries (a sweep's step; refreshes nothing)."""
        raise NotImplementedError


class TtlValueState(_Ttl, ValueState):
    """A value state whose value expires (Flink's ``TtlValueState``)."""

    __slots__ = ("_default", "_inner")

    def __init__(self, inner: ValueState, default: Any, config: StateTtlConfig,
                 now: Callable[[], float]) -> None:
        super().__init__(config, now)
        self._inner = inner
        self._default = default

    def value(self) -> Any:
        pair = self._inner.value()
        if pair is None:
            return self._default
        v, expires = pair
        now = self._now()
        if expires <= now:
            self._inner.clear()
            self.expired += 1
            return v if self._return_expired else self._default
        if self._refresh:
            self._inner.update((v, self._at(now)))
        return v

    def update(self, value: Any) -> None:
        self._inner.update((value, self._expires()))

    def clear(self) -> None:
        self._inner.clear()

    def purge(self, now: float) -> None:
        pair = self._inner.value()
        if pair is not None and pair[1] <= now:
            self._inner.clear()
            self.expired += 1


class TtlListState(_Ttl, ListState):
    """A list state whose elements expire one by one (Flink's ``TtlListState``)."""

    __slots__ = ("_inner",)

    def __init__(self, inner: ListState, config: StateTtlConfig,
                 now: Callable[[], float]) -> None:
        super().__init__(config, now)
        self._inner = inner

    def get(self) -> list[Any]:
        pairs = self._inner.get()
        if not pairs:
            return []
        now = self._now()
        live = [p for p in pairs if p[1] > now]
        if len(live) == len(pairs):
            if self._refresh:
                expires = self._at(now)
                self._inner.update([(v, expires) for v, _ in pairs])
            return [v for v, _ in pairs]
        # cleanup on access: the expired elements go now
        self.expired += len(pairs) - len(live)
        if self._refresh:
            expires = self._at(now)
            live = [(v, expires) for v, _ in live]
        if live:
            self._inner.update(live)
        else:
            self._inner.clear()
        return [v for v, _ in (pairs if self._return_expired else live)]

    def add(self, value: Any) -> None:
        self._inner.add((value, self._expires()))

    def add_all(self, values: Iterable[Any]) -> None:
        expires = self._expires()
        self._inner.add_all([(v, expires) for v in values])

    def update(self, values: Iterable[Any]) -> None:
        expires = self._expires()
        pairs = [(v, expires) for v in values]
        if pairs:
            self._inner.update(pairs)
        else:
            self._inner.clear()

    def clear(self) -> None:
        self._inner.clear()

    def purge(self, now: float) -> None:
        pairs = self._inner.get()
        if not pairs:
            return
        live = [p for p in pairs if p[1] > now]
        if len(live) < len(pairs):
            self.expired += len(pairs) - len(live)
            if live:
                self._inner.update(live)
            else:
                self._inner.clear()


class TtlMapState(_Ttl, MapState):
    """A map state whose entries expire one by one (Flink's ``TtlMapState``)."""

    __slots__ = ("_inner",)

    def __init__(self, inner: MapState, config: StateTtlConfig,
                 now: Callable[[], float]) -> None:
        super().__init__(config, now)
        self._inner = inner

    def get(self, user_key: Any, default: Any = None) -> Any:
        pair = self._inner.get(user_key, _MISSING)
        if pair is _MISSING:
            return default
        v, expires = pair
        now = self._now()
        if expires <= now:
            self._inner.remove(user_key)
            self.expired += 1
            return v if self._return_expired else default
        if self._refresh:
            self._inner.put(user_key, (v, self._at(now)))
        return v

    def put(self, user_key: Any, value: Any) -> None:
        self._inner.put(user_key, (value, self._expires()))

    def remove(self, user_key: Any) -> None:
        self._inner.remove(user_key)

    def contains(self, user_key: Any) -> bool:
        pair = self._inner.get(user_key, _MISSING)
        if pair is _MISSING:
            return False
        if pair[1] <= self._now():
            self._inner.remove(user_key)
            self.expired += 1
            return self._return_expired
        return True

    def items(self) -> Iterator[tuple[Any, Any]]:
        now = self._now()
        out: list[tuple[Any, Any]] = []
        expired: list[Any] = []
        for uk, (v, expires) in list(self._inner.items()):
            if expires <= now:
                expired.append(uk)
                if self._return_expired:
                    out.append((uk, v))
            else:
                out.append((uk, v))
        for uk in expired:
            self._inner.remove(uk)
        self.expired += len(expired)
        if self._refresh:
            expires = self._at(now)
            for uk, v in out:
                if uk not in expired:
                    self._inner.put(uk, (v, expires))
        return iter(out)

    def clear(self) -> None:
        self._inner.clear()

    def purge(self, now: float) -> None:
        expired = [uk for uk, (_, expires) in list(self._inner.items()) if expires <= now]
        for uk in expired:
            self._inner.remove(uk)
        self.expired += len(expired)


class TtlReducingState(_Ttl, ReducingState):
    """A reducing state whose accumulator expires (Flink's ``TtlReducingState``): an add
    after expiry starts a new fold."""

    __slots__ = ("_inner",)

    def __init__(self, inner: ReducingState, config: StateTtlConfig,
                 now: Callable[[], float]) -> None:
        super().__init__(config, now)
        self._inner = inner

    def get(self) -> Any:
        pair = self._inner.get()
        if pair is None:
            return None
        v, expires = pair
        now = self._now()
        if expires <= now:
            self._inner.clear()
            self.expired += 1
            return v if self._return_expired else None
        if self._refresh:
            self._inner.clear()
            self._inner.add((v, self._at(now)))
        return v

    def add(self, value: Any) -> None:
        pair = self._inner.get()
        if pair is not None and pair[1] <= self._now():
            self._inner.clear()  # the expired accumulator does not take part in the fold
            self.expired += 1
        self._inner.add((value, self._expires()))

    def clear(self) -> None:
        self._inner.clear()

    def purge(self, now: float) -> None:
        pair = self._inner.get()
        if pair is not None and pair[1] <= now:
            self._inner.clear()
            self.expired += 1


#: :func:`live_value`'s answer for a key left with no live entry
DROP: Any = object()


def live_value(kind: str, value: Any, now: float) -> Any:
    """``value`` (a TTL state's stored value of ``kind``) without its entries due at
    ``now``: the value itself when nothing in it expired, a new list or dict when some did,
    and :data:`DROP` when nothing is left.

    Args:
        kind: the state's kind (``"value"``, ``"reducing"``, ``"list"``, ``"map"``).
        value: a ``(value, expires_at)`` pair, a list of them, or a dict of them.
        now: the TTL time (seconds, in the state's clock): a snapshot's or a sweep's.
    """
    if kind == "list":
        live = [p for p in value if p[1] > now]
        if len(live) == len(value):
            return value
        return live if live else DROP
    if kind == "map":
        entries = {uk: p for uk, p in value.items() if p[1] > now}
        if len(entries) == len(value):
            return value
        return entries if entries else DROP
    return value if value[1] > now else DROP


class IncrementalCleanup:
    """Removes expired entries of keys nobody reads again (Flink's incremental cleanup of
    heap TTL state): after each batch of records (and each timer) the operator processed,
    the next few keys of its TTL states are checked and the expired entries removed.

    A pass walks one state's keys key group by key group of the instance's range (each key
    group's keys read once, as a stable copy: ``keys_in_key_group``), then the next state's.
    A state that can check keys without making them current (``expired_keys(index, keys,
    now)``, the heap backend's value state) is asked which are due, and only those are set
    current and purged; for the others each checked key is set current and purged. The key
    that was current is set back, so a record or timer still sees its own key. The work is
    proportional to the records processed (an idle operator sweeps nothing) and its rate
    follows what the recent steps found (a moving average of the expired share of the keys
    they checked): ``rate`` keys checked per record, between :data:`MIN_RATE` (nothing
    expired: a long-lived key set costs almost nothing) and :data:`MAX_RATE` (nearly
    everything expired: an ever-growing key space, whose new keys must be checked faster
    than they arrive for the state to stay flat). A step runs once the credit reaches
    :data:`STEP_KEYS` keys: a step's fixed cost (the backend's current key saved and set
    back, the rate's update) is then paid once per that many keys, not once per batch (a
    batch of ~60 records earned four keys at the minimum rate, and the step cost more than
    checking them). The moving average falls while a pass walks a run of live keys, so the
    rate has a second floor that follows the key space's growth: twice the expired keys per
    record the last whole pass found (in a steady state as many keys expire as arrive, so a
    pass then checks keys twice as fast as new ones come and the state stays within about
    twice the live keys; a pass that lags finds the keys that expired meanwhile, which
    raises the floor).

    Args:
        backend: the operator's keyed state backend.
    """

    MIN_RATE = 1 / 16
    MAX_RATE = 4.0
    STEP_KEYS = 32

    def __init__(self, backend: KeyedStateBackend) -> None:
        self.backend = backend
        self.rate = self.MIN_RATE
        self._states: list[tuple[str, _Ttl]] = []
        self._turn = -1  # the state whose keys the current pass walks
        self._key_group = 0  # the next key group of the pass
        self._pending: list[Any] = []
        self._found = 0.0  # moving average of the expired share of the keys checked
        self._credit = 0.0  # keys owed to the sweep (fractions carried between steps)
        self._floor = self.MIN_RATE  # from the last whole pass's expired keys per record
        self._pass_records = 0  # records processed since the current pass started
        self._pass_found = 0  # expired keys the current pass found

    def register(self, name: str, state: State) -> None:
        """Sweep ``state`` (stored under ``name``) too.

        Raises:
            TypeError: if ``state`` is not a TTL state (a decorator of this module or a
                backend's subclass of one).
        """
        if not isinstance(state, _Ttl):
            raise TypeError(f"state {name!r} is not a TTL state: {type(state).__name__}")
        self._states = [(n, s) for n, s in self._states if n != name] + [(name, state)]
        state._cleanup = self

    def advance(self, n: int) -> None:
        """``n`` records (or timers) were processed with the current key set: check the
        keys they earned (``n * rate``, fractions carried over), in steps of at least
        :data:`STEP_KEYS` keys."""
        self._credit += n * self.rate
        self._pass_records += n
        if self._credit >= self.STEP_KEYS:
            self.step()

    def _refill(self) -> bool:
        """Read the next key group's keys into the pending list (starting the next pass
        after the range's last key group); False when every state is empty."""
        kgs = self.backend.key_group_range
        for _ in range(len(self._states) * len(kgs) + 1):
            if self._turn < 0 or self._key_group > kgs.end:
                if self._turn == len(self._states) - 1 and self._pass_records:
                    # a whole pass over every state ended: its expired keys per record
                    self._floor = min(self.MAX_RATE,
                                      2 * self._pass_found / self._pass_records)
                if self._turn < 0 or self._turn == len(self._states) - 1:
                    self._pass_records = self._pass_found = 0
                self._turn = (self._turn + 1) % len(self._states)
                self._key_group = kgs.start
            name, _ = self._states[self._turn]
            kg = self._key_group
            self._key_group += 1
            self._pending = self.backend.keys_in_key_group(name, kg)
            if self._pending:
                self._pending.reverse()  # popped from the end: in the key group's order
                return True
        return False

    def step(self) -> None:
        """Check the keys the processed records earned (the whole part of the credit)."""
        if not self._states:
            return
        budget = int(self._credit)
        self._credit -= budget
        backend = self.backend
        start = backend.key_group_range.start
        current = backend.current_key
        moved = False
        checked = found = 0
        try:
            while budget > 0 and (self._pending or self._refill()):
                _, state = self._states[self._turn]
                pending = self._pending
                chunk = pending[-budget:]
                del pending[-budget:]
                budget -= len(chunk)
                checked += len(chunk)
                now = state._now()
                scan = getattr(state, "expired_keys", None)
                # the pending keys are all of the key group the pass read last
                due = chunk if scan is None else scan(self._key_group - 1 - start, chunk, now)
                before = state.expired
                for key in due:
                    backend.set_current_key(key)
                    moved = True
                    state.purge(now)
                found += state.expired - before
        finally:
            if moved:
                backend.set_current_key(current)
        self._pass_found += found
        if checked:
            self._found = 0.9 * self._found + 0.1 * min(1.0, found / checked)
            self.rate = min(self.MAX_RATE, max(self.MIN_RATE, self._floor,
                                               2 * self.MAX_RATE * self._found))


def ttl_state(descriptor: StateDescriptor, config: StateTtlConfig, inner: State,
              now: Callable[[], float], cleanup: IncrementalCleanup | None = None) -> State:
    """The TTL decorator of ``descriptor``'s kind over the backend's state ``inner`` (stored
    under :func:`backend_descriptor`), reading the time from ``now``; registered with the
    operator's ``cleanup`` (None: expired entries go only when accessed)."""
    state: _Ttl
    if isinstance(descriptor, ValueStateDescriptor):
        assert isinstance(inner, ValueState)
        state = TtlValueState(inner, descriptor.default, config, now)
    elif isinstance(descriptor, ListStateDescriptor):
        assert isinstance(inner, ListState)
        state = TtlListState(inner, config, now)
    elif isinstance(descriptor, MapStateDescriptor):
        assert isinstance(inner, MapState)
        state = TtlMapState(inner, config, now)
    else:
        assert isinstance(descriptor, ReducingStateDescriptor)
        assert isinstance(inner, ReducingState)
        state = TtlReducingState(inner, config, now)
    if cleanup is not None:
        cleanup.register(descriptor.name, state)
    assert isinstance(state, State)
    return state
