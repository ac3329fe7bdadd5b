"""Keyed state and timers backed by Spark's state store: what a keyed operator sees through
``ctx.get_state(descriptor)`` and its timer service when it runs inside Spark's
``transformWithState`` (PySpark 4's ``StatefulProcessorHandle``).

Each descriptor becomes one Spark state variable of the grouping key, named as the
descriptor, holding bytes written by the descriptor's serializer (pickle by default):

- value state -> Spark ``ValueState`` (``value binary``);
- list state -> Spark ``ListState`` of chunks (``chunk binary``): ``add``/``add_all``
  append one chunk, the serialized list of the elements added, so the descriptor's
  serializer still sees a list and an append does not rewrite the list;
- map state -> Spark ``MapState`` keyed by the user key's canonical encoding
  (:mod:`reactive.key_encoding`, so ``1`` and ``1.0`` are one entry as in a dict; pickle
  for other user keys), each entry holding the pickled user key (given back as it was, a
  ``TimeWindow`` stays one) and the value's bytes;
- reducing state -> Spark ``ValueState`` holding the folded value.

Timers (Flink's ``InternalTimerService`` with namespaces) become Spark event-time timers of
the grouping key at the timestamp in milliseconds (rounded up, so a timer fires once the
watermark reaches its timestamp); the ``(timestamp, namespace)`` pairs registered at one
millisecond are kept in a map state, because a Spark timer has no namespace.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from reactive.errors import StateAccessError
from reactive.key_encoding import encode_key
from reactive.serialization import PickleSerializer, Serializer
from reactive.state.api import ListState, MapState, ReducingState, State, ValueState
from reactive.state.backend import KeyedStateBackend, KeyedStateSnapshot, SnapshotContext
from reactive.state.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)

__all__ = ["TIMERS_STATE", "SparkKeyedStateBackend", "SparkTimerService", "timer_millis"]

TIMERS_STATE = "_reactive_timers"
"""The map state of the ``(timestamp, namespace)`` pairs of each timer millisecond."""

_PICKLE = PickleSerializer()
_BYTES = "value binary"


def _serializer(descriptor: StateDescriptor) -> Serializer:
    s = getattr(descriptor, "serializer", None)
    return s if s is not None else _PICKLE


_ABSENT: Any = object()  # a cached entry known to be absent (cleared or removed)


class _Cached:
    """A state whose Spark variable is read at most once and written at most once per
    grouping key and call of the stateful processor: reads go to Spark the first time, then
    to the cache; writes stay in the cache until :meth:`flush` (a write-back cache, so a
    key's records of a micro-batch cost one read and one write, not one round trip to
    Spark's state server per access)."""

    def flush(self) -> None:
        """Write what changed to Spark (inside the processor's call for this key)."""

    def reset(self) -> None:
        """Forget the cache (the next key's state is another)."""


class _SparkValueState(ValueState, _Cached):
    _value: Any
    _loaded: bool
    _dirty: bool

    def __init__(self, state: Any, descriptor: ValueStateDescriptor) -> None:
        self._state = state
        self._default = descriptor.default
        self._ser = _serializer(descriptor)
        self.reset()

    def _load(self) -> Any:
        if not self._loaded:
            row = self._state.get()
            self._value = _ABSENT if row is None else self._ser.deserialize(row[0])
            self._loaded = True
        return self._value

    def value(self) -> Any:
        v = self._load()
        return self._default if v is _ABSENT else v

    def update(self, value: Any) -> None:
        self._value, self._loaded, self._dirty = value, True, True

    def clear(self) -> None:
        self._value, self._loaded, self._dirty = _ABSENT, True, True

    def flush(self) -> None:
        if self._dirty:
            if self._value is _ABSENT:
                self._state.clear()
            else:
                self._state.update((self._ser.serialize(self._value),))
            self._dirty = False

    def reset(self) -> None:
        self._value = _ABSENT
        self._loaded = self._dirty = False


class _SparkListState(ListState, _Cached):
    _base: list[Any] | None
    _appended: list[Any]
    _replaced: bool

    def __init__(self, state: Any, descriptor: ListStateDescriptor) -> None:
        self._state = state
        self._ser = _serializer(descriptor)
        self.reset()

    def get(self) -> list[Any]:
        if self._base is None:
            base: list[Any] = []
            if self._state.exists():
                for (chunk,) in self._state.get():
                    base.extend(self._ser.deserialize(chunk))
            self._base = base
        return [*self._base, *self._appended]

    def add(self, value: Any) -> None:
        self._appended.append(value)

    def add_all(self, values: Iterable[Any]) -> None:
        self._appended.extend(values)

    def update(self, values: Iterable[Any]) -> None:
        self._base, self._appended, self._replaced = list(values), [], True

    def clear(self) -> None:
        self.update(())

    def flush(self) -> None:
        if self._replaced:
            values = [*(self._base or ()), *self._appended]
            if values:
                self._state.put([(self._ser.serialize(values),)])
            else:
                self._state.clear()
        elif self._appended:  # one chunk for the appends of this call
            self._state.appendValue((self._ser.serialize(self._appended),))
        if self._base is not None:
            self._base = [*self._base, *self._appended]
        self._appended, self._replaced = [], False

    def reset(self) -> None:
        self._base = None
        self._appended = []
        self._replaced = False


def _user_key(user_key: Any) -> bytes:
    """The identity of a map state's user key: its canonical encoding, else its pickle."""
    try:
        return b"k" + encode_key(user_key)
    except Exception:  # a type without a canonical encoding: identity by its pickle
        return b"p" + pickle.dumps(user_key, protocol=pickle.HIGHEST_PROTOCOL)


class _SparkMapState(MapState, _Cached):
    """Entries read once and written once per call; the first ``items()`` reads every
    entry, and the cache answers from then on."""

    _cache: dict[bytes, tuple[Any, Any]]
    _dirty: set[bytes]
    _cleared: bool
    _complete: bool  # every entry of the key is in the cache

    def __init__(self, state: Any, descriptor: MapStateDescriptor) -> None:
        self._state = state
        self._ser = _serializer(descriptor)
        self.reset()

    def _entry(self, user_key: Any) -> tuple[bytes, Any]:
        uid = _user_key(user_key)
        found = self._cache.get(uid)
        if found is None:
            row = None if self._complete else self._state.getValue((uid,))
            found = (user_key, _ABSENT if row is None else self._ser.deserialize(row[1]))
            self._cache[uid] = found
        return uid, found[1]

    def get(self, user_key: Any, default: Any = None) -> Any:
        value = self._entry(user_key)[1]
        return default if value is _ABSENT else value

    def put(self, user_key: Any, value: Any) -> None:
        uid = _user_key(user_key)
        self._cache[uid] = (user_key, value)
        self._dirty.add(uid)

    def remove(self, user_key: Any) -> None:
        uid = _user_key(user_key)
        self._cache[uid] = (user_key, _ABSENT)
        self._dirty.add(uid)

    def contains(self, user_key: Any) -> bool:
        return self._entry(user_key)[1] is not _ABSENT

    def items(self) -> Iterator[tuple[Any, Any]]:
        if not self._complete:  # read every entry once; the cache is the map from now on
            if self._state.exists():
                ser = self._ser
                for k, v in self._state.iterator():
                    if k[0] not in self._cache:
                        self._cache[k[0]] = (pickle.loads(v[0]), ser.deserialize(v[1]))
            self._complete = True
        # a snapshot: callers may change the map while iterating
        return iter([(uk, v) for uk, v in self._cache.values() if v is not _ABSENT])

    def clear(self) -> None:
        self._cache.clear()
        self._dirty.clear()
        self._cleared = self._complete = True

    def flush(self) -> None:
        if self._cleared:
            self._state.clear()
        for uid in self._dirty:
            user_key, value = self._cache[uid]
            if value is _ABSENT:
                if not self._cleared:
                    self._state.removeKey((uid,))
            else:
                self._state.updateValue(
                    (uid,), (pickle.dumps(user_key, protocol=pickle.HIGHEST_PROTOCOL),
                             self._ser.serialize(value)))
        if self._cleared:  # every entry not cached is gone: keep the cache as the truth
            self._cache = {uid: e for uid, e in self._cache.items() if e[1] is not _ABSENT}
        self._dirty = set()
        self._cleared = False

    def reset(self) -> None:
        self._cache = {}
        self._dirty = set()
        self._cleared = self._complete = False


class _SparkReducingState(ReducingState, _Cached):
    def __init__(self, state: Any, descriptor: ReducingStateDescriptor) -> None:
        self._fn = descriptor.reduce_fn
        self._value = _SparkValueState(state, ValueStateDescriptor(
            descriptor.name, serializer=_serializer(descriptor)))

    def get(self) -> Any:
        v = self._value._load()
        return None if v is _ABSENT else v

    def add(self, value: Any) -> None:
        acc = self._value._load()
        self._value.update(value if acc is _ABSENT else self._fn(acc, value))

    def clear(self) -> None:
        self._value.clear()

    def flush(self) -> None:
        self._value.flush()

    def reset(self) -> None:
        self._value.reset()


class SparkKeyedStateBackend(KeyedStateBackend):
    """The keyed state of one operator inside Spark's ``transformWithState``: state objects
    over the ``StatefulProcessorHandle`` (Spark scopes them to the grouping key it is
    processing, which is the key this backend is told).

    Args:
        handle: the ``StatefulProcessorHandle`` given to ``StatefulProcessor.init``.
    """

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self._states: dict[str, State] = {}
        self._kinds: dict[str, str] = {}
        self._current_key: Any = None

    @property
    def current_key(self) -> Any:
        """The key being processed."""
        return self._current_key

    def set_current_key(self, key: Any) -> None:
        """Spark sets the grouping key itself; this keeps it for ``ctx.current_key``."""
        self._current_key = key

    def reset(self) -> None:
        """Forget the cached state: called when the processor starts a call (for another
        key, or for the same key in another micro-batch, which may be a retry)."""
        for state in self._states.values():
            state.reset()  # type: ignore[attr-defined]

    def flush(self) -> None:
        """Write the current key's changed state to Spark: called by the stateful
        processor before it returns from a call for that key (Spark scopes state access
        to the grouping key of the call)."""
        for state in self._states.values():
            state.flush()  # type: ignore[attr-defined]

    def get_state(self, descriptor: StateDescriptor) -> State:
        """The state ``descriptor`` names (created in Spark on first use; functions create
        their state in ``open()``, which runs in ``StatefulProcessor.init``, where Spark
        wants state variables defined).

        Raises:
            StateAccessError: for a state kind without a Spark counterpart, or a name used
                with two kinds.
        """
        name = descriptor.name
        found = self._states.get(name)
        if found is not None:
            if self._kinds[name] != descriptor.kind:
                raise StateAccessError(f"state {name!r} is used as {descriptor.kind} and as "
                                       f"{self._kinds[name]}")
            return found
        h = self.handle
        state: State
        if isinstance(descriptor, ValueStateDescriptor):
            state = _SparkValueState(h.getValueState(name, _BYTES), descriptor)
        elif isinstance(descriptor, ListStateDescriptor):
            state = _SparkListState(h.getListState(name, "chunk binary"), descriptor)
        elif isinstance(descriptor, MapStateDescriptor):
            state = _SparkMapState(h.getMapState(name, "key binary", "k binary, v binary"),
                                   descriptor)
        elif isinstance(descriptor, ReducingStateDescriptor):
            state = _SparkReducingState(h.getValueState(name, _BYTES), descriptor)
        else:
            raise StateAccessError(f"state {name!r} of kind {descriptor.kind!r} has no Spark "
                                   "state counterpart (value, list, map and reducing do)")
        self._kinds[name] = descriptor.kind
        self._states[name] = state
        return state

    def keys(self, state_name: str) -> Iterator[Any]:
        """Not available: Spark's state store is read per grouping key."""
        raise StateAccessError("iterating over every key's state is not available inside "
                               "Spark's transformWithState (state is read per key)")

    def snapshot(self, ctx: SnapshotContext) -> KeyedStateSnapshot:
        """Not used: Spark checkpoints its state store with each micro-batch."""
        raise StateAccessError("Spark checkpoints the state of transformWithState itself")

    def restore(self, handles: list[dict[str, Any]], job_dir: Path) -> None:
        """Not used: Spark restores its state store from the checkpoint location."""
        raise StateAccessError("Spark restores the state of transformWithState itself")


def timer_millis(timestamp: float) -> int:
    """A timer's Spark expiry time: ``timestamp`` seconds in milliseconds, rounded up (so it
    fires once the watermark, a whole number of milliseconds, reaches ``timestamp``), and at
    least 1: Spark's watermark starts at 0, where the runtime's starts at -inf, so a timer
    at or before the epoch waits for the first real watermark.

    Raises:
        StateAccessError: for a timestamp that is not finite.
    """
    if not math.isfinite(timestamp):
        raise StateAccessError(f"timer at {timestamp}: Spark timers need a finite time")
    return max(1, math.ceil(timestamp * 1000.0))


Fire = Callable[[float, Any], list[Any]]


class SparkTimerService:
    """The timer service of a keyed operator inside ``transformWithState`` (the parts of
    ``reactive.time.timers.InternalTimerService`` operators use), over Spark's event-time
    timers of the grouping key.

    Args:
        handle: the ``StatefulProcessorHandle``.
        clock: the processing-time clock (``current_processing_time``).
        on_event_time: ``fire(timestamp, namespace) -> outputs`` of an event-time timer.

    Attributes:
        watermark: the operator's event time (seconds; -inf before the first watermark).
    """

    def __init__(self, handle: Any, clock: Any, on_event_time: Fire) -> None:
        self.handle = handle
        self.clock = clock
        self.on_event_time = on_event_time
        self.watermark = float("-inf")
        self._timers = handle.getMapState(TIMERS_STATE, "millis bigint", "timers binary")
        # the current key's timer rows read or changed in this call (a write-back cache,
        # as for the state; see flush and reset)
        self._cache: dict[int, list[tuple[float, Any]]] = {}
        self._dirty: set[int] = set()

    def _pending(self, millis: int) -> list[tuple[float, Any]]:
        found = self._cache.get(millis)
        if found is None:
            row = self._timers.getValue((millis,))
            found = self._cache[millis] = [] if row is None else list(pickle.loads(row[0]))
        return found

    def _store(self, millis: int, pending: list[tuple[float, Any]]) -> None:
        self._cache[millis] = pending
        self._dirty.add(millis)

    def flush(self) -> None:
        """Write the current key's changed timer rows to Spark (inside the call)."""
        for millis in self._dirty:
            pending = self._cache[millis]
            if pending:
                self._timers.updateValue((millis,), (pickle.dumps(pending),))
            else:
                self._timers.removeKey((millis,))
        self._dirty = set()

    def reset(self) -> None:
        """Forget the cached timer rows (the next call is for another key)."""
        self._cache = {}
        self._dirty = set()

    def register_event_time_timer(self, timestamp: float, namespace: Any = None, *,
                                  new: bool = False) -> None:
        """Fire ``on_event_time(timestamp, namespace)`` for the current key once the
        watermark is >= ``timestamp`` (no effect when that timer exists). ``new`` is the
        runtime timer service's hint that no such timer exists (the window operator passes
        it); here the timer row is read anyway, so it changes nothing."""
        millis = timer_millis(timestamp)
        pending = self._pending(millis)
        if (timestamp, namespace) in pending:
            return
        if not pending:
            self.handle.registerTimer(millis)
        self._store(millis, [*pending, (timestamp, namespace)])

    def delete_event_time_timer(self, timestamp: float, namespace: Any = None) -> None:
        """Cancel a timer of the current key (no error when absent)."""
        millis = timer_millis(timestamp)
        pending = self._pending(millis)
        if (timestamp, namespace) not in pending:
            return
        pending = [p for p in pending if p != (timestamp, namespace)]
        self._store(millis, pending)
        if not pending:
            self.handle.deleteTimer(millis)

    def register_processing_time_timer(self, timestamp: float, namespace: Any = None) -> None:
        """Not translated: the operator runs in Spark's event-time mode.

        Raises:
            StateAccessError: always.
        """
        raise StateAccessError(
            "processing-time timers are not translated to Spark: the keyed operator runs in "
            "Spark's event-time mode (a Spark stateful operator has one time mode); use "
            "event-time timers, or run the program embedded")

    def delete_processing_time_timer(self, timestamp: float, namespace: Any = None) -> None:
        """No processing-time timers exist here: nothing to delete."""

    def fire(self, millis: int) -> list[Any]:
        """Spark's timer at ``millis`` expired for the current key: fire the timers
        registered for it, in registration order; returns their outputs."""
        pending = self._pending(millis)
        self._store(millis, [])
        out: list[Any] = []
        for timestamp, namespace in pending:
            out.extend(self.on_event_time(timestamp, namespace))
        return out

    def advance_watermark(self, watermark: float) -> list[Any]:
        """Event time advanced to ``watermark``: recorded only, Spark fires the due timers
        itself (``handleExpiredTimer`` calls :meth:`fire`)."""
        self.watermark = watermark
        return []

    def fire_processing_timers(self) -> list[Any]:
        """None are kept (see :meth:`register_processing_time_timer`)."""
        return []

    def restore(self) -> None:
        """Spark restores its timers itself."""

    def close(self) -> None:
        """Nothing to release."""
