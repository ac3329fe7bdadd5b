"""User function interfaces of two-input operators: co-process functions over connected
streams, broadcast process functions, and the process function of an interval join (Flink's
``CoProcessFunction``, ``KeyedCoProcessFunction``, ``BroadcastProcessFunction``,
``KeyedBroadcastProcessFunction`` and ``ProcessJoinFunction``; n-ary operators in Carbone
2018 (PhD thesis), section 3.3.1.1).

Like ``process_element`` of a :class:`~reactive.functions.ProcessFunction`, every method here
yields its outputs, or returns None or a list of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from .errors import StateAccessError
from .functions import RuntimeContext
from .state.api import State
from .state.broadcast_state import BroadcastStateStore, ReadOnlyBroadcastState
from .state.descriptors import MapStateDescriptor, StateDescriptor

__all__ = [
    "BroadcastProcessFunction",
    "BroadcastRuntimeContext",
    "CoProcessFunction",
    "JoinContext",
    "KeyedBroadcastProcessFunction",
    "KeyedCoProcessFunction",
    "ProcessJoinFunction",
]


class BroadcastRuntimeContext(RuntimeContext):
    """What a broadcast process function sees: a :class:`~reactive.functions.RuntimeContext`
    plus the broadcast states (Flink's ``ReadOnlyContext`` and ``Context`` of
    ``KeyedBroadcastProcessFunction``).

    An operator gives its function two of these: a read-only one for ``process_element``
    and ``on_timer`` and a writable one for ``process_broadcast_element``.
    """

    def _bind_broadcast(self, store: BroadcastStateStore, writable: bool) -> None:
        self._broadcast = store
        self._writable = writable

    def get_broadcast_state(self, descriptor: MapStateDescriptor) -> ReadOnlyBroadcastState:
        """The broadcast state of ``descriptor`` (one of those given to ``broadcast(...)``):
        writable in ``process_broadcast_element``, read-only elsewhere.

        Raises:
            StateAccessError: for a descriptor the broadcast stream was not built with.
        """
        return self._broadcast.get(descriptor, self._writable)

    def apply_to_keyed_state(self, descriptor: StateDescriptor,
                             fn: Callable[[Any, State], None]) -> None:
        """Call ``fn(key, state)`` for every key of this instance that has a value in the
        keyed state of ``descriptor`` (Flink's ``Context.applyToKeyedState``), with the
        state scoped to that key. Only in ``process_broadcast_element`` of a keyed
        broadcast process function.

        Raises:
            StateAccessError: on a non-keyed stream, or outside ``process_broadcast_element``.
        """
        backend = self._keyed
        if backend is None or not self._writable:
            raise StateAccessError(
                f"operator {self.operator_name!r}: apply_to_keyed_state is for "
                "process_broadcast_element of a KeyedBroadcastProcessFunction")
        state = backend.get_state(descriptor)
        previous = backend.current_key
        try:
            for key in list(backend.keys(descriptor.name)):
                backend.set_current_key(key)
                fn(key, state)
        finally:
            if previous is not None:
                backend.set_current_key(previous)


class CoProcessFunction:
    """A function over two connected streams (``a.connect(b).process(fn)``).

    Records of the first stream call :meth:`process_element1`, those of the second
    :meth:`process_element2`, one at a time, in the order the operator instance receives
    them: the two inputs interleave as they arrive, so a function that must not depend on
    that order keeps what it needs in state (or waits for the watermark with timers, on
    keyed streams). Both see the same operator state (``ctx.get_operator_state``). Each
    method may take an ``out`` list to append its outputs to, as
    :meth:`~reactive.functions.ProcessFunction.process_element` may.
    """

    def open(self, ctx: RuntimeContext) -> None:
        """Called once per instance before the first record (and after each restore)."""

    def process_element1(self, value: Any, ctx: RuntimeContext) -> Iterable[Any] | None:
        """Process one record of the first input; return (or yield) the outputs."""
        raise NotImplementedError

    def process_element2(self, value: Any, ctx: RuntimeContext) -> Iterable[Any] | None:
        """Process one record of the second input; return (or yield) the outputs."""
        raise NotImplementedError

    def close(self) -> None:
        """Called once when the instance stops."""


class KeyedCoProcessFunction(CoProcessFunction):
    """A co-process function over two streams keyed alike
    (``a.key_by(f).connect(b.key_by(g)).process(fn)``): records of both inputs with equal
    keys reach the same instance, and ``ctx.get_state`` is scoped to ``ctx.current_key``,
    whichever input the record came from, so both inputs share the state of a key.
    ``ctx.timer_service`` sets timers that call :meth:`on_timer`.
    """

    def on_timer(self, timestamp: float, ctx: RuntimeContext) -> Iterable[Any] | None:
        """A timer of ``ctx.current_key`` fired at ``timestamp`` (seconds); return (or
        yield) the outputs."""
        return None


class BroadcastProcessFunction:
    """A function over a stream connected with a broadcast stream
    (``events.connect(rules.broadcast(descriptor)).process(fn)``, Flink's broadcast state
    pattern).

    Every instance receives every record of the broadcast stream in
    :meth:`process_broadcast_element`, which may change the broadcast state
    (``ctx.get_broadcast_state(descriptor)``); records of the other stream reach one
    instance each, in :meth:`process_element`, which may only read it. So every instance
    holds the same broadcast state, provided :meth:`process_broadcast_element` is
    deterministic; with a broadcast stream of parallelism > 1, instances may see the
    records of different upstream instances in different orders (as in Flink), so make
    updates commutative or give the broadcast stream parallelism 1.
    """

    def open(self, ctx: BroadcastRuntimeContext) -> None:
        """Called once per instance before the first record (and after each restore)."""

    def process_element(self, value: Any, ctx: BroadcastRuntimeContext) -> Iterable[Any] | None:
        """Process one record of the non-broadcast input (read-only broadcast state)."""
        raise NotImplementedError

    def process_broadcast_element(self, value: Any, ctx: BroadcastRuntimeContext
                                  ) -> Iterable[Any] | None:
        """Process one record of the broadcast input (read-write broadcast state)."""
        raise NotImplementedError

    def close(self) -> None:
        """Called once when the instance stops."""


class KeyedBroadcastProcessFunction(BroadcastProcessFunction):
    """A broadcast process function whose non-broadcast input is keyed
    (``events.key_by(f).connect(rules.broadcast(descriptor)).process(fn)``).

    :meth:`process_element` sees keyed state and timers of ``ctx.current_key``;
    :meth:`process_broadcast_element` has no current key, but may visit the keyed state of
    every key of the instance with ``ctx.apply_to_keyed_state(descriptor, fn)``.
    """

    def on_timer(self, timestamp: float, ctx: BroadcastRuntimeContext
                 ) -> Iterable[Any] | None:
        """A timer of ``ctx.current_key`` fired at ``timestamp`` (seconds); return (or
        yield) the outputs (read-only broadcast state)."""
        return None


class JoinContext:
    """What a :class:`ProcessJoinFunction` sees of a joined pair.

    Attributes:
        left_timestamp: event time of the left record (seconds).
        right_timestamp: event time of the right record (seconds).
        current_key: the key both records share.
    """

    __slots__ = ("current_key", "left_timestamp", "right_timestamp")

    def __init__(self) -> None:
        self.left_timestamp = 0.0
        self.right_timestamp = 0.0
        self.current_key: Any = None

    @property
    def timestamp(self) -> float:
        """The event time of the joined result: the larger of the two (Flink's rule)."""
        return max(self.left_timestamp, self.right_timestamp)


class ProcessJoinFunction:
    """The function of an interval join: called once per joined pair (Flink's
    ``ProcessJoinFunction``)."""

    def open(self, ctx: RuntimeContext) -> None:
        """Called once per instance before the first record (and after each restore)."""

    def process_element(self, left: Any, right: Any, ctx: JoinContext) -> Iterable[Any] | None:
        """Join one pair whose timestamps lie within the bounds; return (or yield) the
        outputs."""
        raise NotImplementedError

    def close(self) -> None:
        """Called once when the instance stops."""
