"""User function interfaces (Flink's ``ProcessFunction`` / ``KeyedProcessFunction``).

Plain callables serve ``map``, ``filter``, ``flat_map`` and ``reduce``; subclass these for
state and lifecycle. ``process_element`` returns an iterable of outputs (a generator with
``yield`` is the usual form) or None for no output.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from enum import Enum
from typing import TYPE_CHECKING, Any, Generic, overload

from typing_extensions import TypeVar

from .errors import StateAccessError
from .state.api import (
    AccumulatorState,
    AggregatingState,
    ListState,
    MapState,
    ReducingState,
    State,
    ValueState,
)
from .state.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from .state.operator_state import OperatorListState, RedistributionMode
from .state.ttl import IncrementalCleanup, backend_descriptor, ttl_config, ttl_state
from .state.ttl_clock import TtlClock
from .state.ttl_config import StateTtlConfig
from .time.clock import SystemClock

if TYPE_CHECKING:
    from .state.backend import KeyedStateBackend
    from .state.operator_state import OperatorStateStore
    from .time.timers import TimerService

__all__ = ["KeyedProcessFunction", "ProcessFunction", "RuntimeContext", "TimeDomain"]

# Any by default (PEP 696): a plain ``ProcessFunction`` subclass takes and emits anything
T = TypeVar("T", default=Any)
K = TypeVar("K", default=Any)
V = TypeVar("V", default=Any)
IN = TypeVar("IN", default=Any)
OUT = TypeVar("OUT", default=Any)


class TimeDomain(Enum):
    """The time a firing timer belongs to (Flink's ``TimeDomain``)."""

    EVENT_TIME = "event_time"
    """The timer fired because the watermark reached it."""
    PROCESSING_TIME = "processing_time"
    """The timer fired because the processing-time clock reached it."""


class RuntimeContext:
    """What a function sees of its operator instance; passed to ``open`` and to
    ``process_element``.

    Attributes:
        operator_name: the operator's name.
        uid: the operator's stable id.
        subtask_index: this instance's index, ``0 <= subtask_index < parallelism``.
        parallelism: the operator's parallelism.
        max_parallelism: the job's number of key groups.
    """

    def __init__(
        self,
        operator_name: str,
        uid: str,
        subtask_index: int,
        parallelism: int,
        max_parallelism: int,
        keyed_backend: KeyedStateBackend | None,
        operator_state: OperatorStateStore,
    ) -> None:
        self.operator_name = operator_name
        self.uid = uid
        self.subtask_index = subtask_index
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism
        self._keyed = keyed_backend
        self._operator_state = operator_state
        self._timer_service: TimerService | None = None
        # the timer being fired, set by the operator around on_timer
        self._firing: tuple[float, TimeDomain] | None = None
        # the keyed states the operator's functions use, by name (for state queries)
        self.keyed_states: dict[str, State] = {}
        #: sweeps the expired entries of its TTL states' keys (created with the first one),
        #: advanced by the operator after each batch of records and each timer
        self.ttl_cleanup: IncrementalCleanup | None = None
        #: the wall clock of its TTL states (at most one), frozen by the operator around each
        #: batch of records
        self.ttl_clocks: list[TtlClock] = []

    @property
    def timer_service(self) -> TimerService:
        """Timers of the current key (``key_by(...).process(...)`` only; see ``on_timer``).

        Raises:
            StateAccessError: outside a keyed process function.
        """
        if self._timer_service is None:
            raise StateAccessError(
                f"operator {self.operator_name!r} has no timer service: timers need "
                "key_by(...).process(KeyedProcessFunction)"
            )
        return self._timer_service

    def timestamp(self) -> float:
        """In ``on_timer``: the firing timer's timestamp (seconds, event or processing
        time; Flink's ``OnTimerContext.timestamp()``).

        Raises:
            StateAccessError: outside ``on_timer`` (a record's event time is the
                ``timestamp_fn`` given to ``assign_timestamps``, applied to the record).
        """
        return self._timer("timestamp")[0]

    def time_domain(self) -> TimeDomain:
        """In ``on_timer``: whether an event-time or a processing-time timer is firing
        (Flink's ``OnTimerContext.timeDomain()``).

        Raises:
            StateAccessError: outside ``on_timer``.
        """
        return self._timer("time_domain")[1]

    def _timer(self, method: str) -> tuple[float, TimeDomain]:
        if self._firing is None:
            raise StateAccessError(
                f"operator {self.operator_name!r}: ctx.{method}() is only defined in on_timer "
                "(the firing timer's); a record's event time is timestamp_fn(record)"
            )
        return self._firing

    @property
    def current_key(self) -> Any:
        """The key of the record being processed (keyed operators only)."""
        if self._keyed is None:
            raise StateAccessError(f"operator {self.operator_name!r} is not keyed: no current key")
        return self._keyed.current_key

    @overload
    def get_state(self, descriptor: ValueStateDescriptor[T]) -> ValueState[T]: ...

    @overload
    def get_state(self, descriptor: ListStateDescriptor[T]) -> ListState[T]: ...

    @overload
    def get_state(self, descriptor: MapStateDescriptor[K, V]) -> MapState[K, V]: ...

    @overload
    def get_state(self, descriptor: ReducingStateDescriptor[T]) -> ReducingState[T]: ...

    @overload
    def get_state(self, descriptor: AggregatingStateDescriptor[IN, Any, OUT]
                  ) -> AggregatingState[IN, OUT]: ...

    @overload
    def get_state(self, descriptor: StateDescriptor) -> State: ...

    def get_state(self, descriptor: StateDescriptor) -> State:
        """Return the keyed state described by ``descriptor``, scoped to the current key:
        a ``ValueState[T]`` for a ``ValueStateDescriptor[T]``, a ``MapState[K, V]`` for a
        ``MapStateDescriptor[K, V]``, and so on (Flink's ``getState`` / ``getListState``
        ...).

        Raises:
            StateAccessError: when the operator is not after a ``key_by``.
        """
        if self._keyed is None:
            raise StateAccessError(
                f"operator {self.operator_name!r} is not keyed: call key_by(...) before it to "
                "use keyed state, or use get_operator_state"
            )
        if isinstance(descriptor, AggregatingStateDescriptor):
            # stored, snapshotted and queried as the value state of its accumulators
            accumulators = self.get_state(descriptor.accumulator_descriptor())
            return AccumulatorState(accumulators, descriptor.aggregate_function)
        config = ttl_config(descriptor)
        if config is None:
            state: State = self._keyed.get_state(descriptor)
        else:
            if self.ttl_cleanup is None:
                # a backend may sweep its own way (RocksDB: its store from a cursor); a
                # backend of the bare protocol gets the key-group walk
                make = getattr(self._keyed, "ttl_cleanup", None)
                self.ttl_cleanup = IncrementalCleanup(self._keyed) if make is None else make()
            clock = self._ttl_clock(config)
            native = self._keyed.get_ttl_state(descriptor, config, clock)
            if native is not None:
                self.ttl_cleanup.register(descriptor.name, native)
                state = native
            else:
                inner = self._keyed.get_state(backend_descriptor(descriptor, config))
                state = ttl_state(descriptor, config, inner, clock.now, self.ttl_cleanup)
        self.keyed_states[descriptor.name] = state
        return state

    def _ttl_clock(self, config: StateTtlConfig) -> TtlClock:
        """The clock of a TTL state of ``config``: the wall clock's is shared by the
        operator's TTL states and frozen by the operator for each batch of records
        (:attr:`ttl_clocks`, :mod:`reactive.state.ttl_clock`); other time sources are read
        at every access.

        Raises:
            StateAccessError: for event-time TTL outside a keyed process function.
        """
        read = self._ttl_time(config)
        if read is not time.time:
            # a watermark (constant within a batch) or a given clock (a test's manual
            # clock may move with each record): read at every access, as given
            return TtlClock(read)
        if self.ttl_clocks:
            return self.ttl_clocks[0]
        clock = TtlClock(read)
        self.ttl_clocks.append(clock)
        return clock

    def _ttl_time(self, config: StateTtlConfig) -> Callable[[], float]:
        """What a TTL state reads the time from (see :mod:`reactive.state.ttl`).

        Raises:
            StateAccessError: for event-time TTL outside a keyed process function (no
                watermark to read).
        """
        if config.time_characteristic == "event_time":
            if self._timer_service is None:
                raise StateAccessError(
                    f"operator {self.operator_name!r}: event-time ttl reads the watermark of "
                    "a keyed process function (key_by(...).process(...)); use processing time "
                    "here")
            return self._timer_service.current_watermark
        if config.clock is not None:
            return config.clock.now
        # the operator's processing-time clock (a test's manual one) where it has one; the
        # system clock's time.time bound directly (read once per batch, see TtlClock)
        clock = self._timer_service.clock if self._timer_service is not None else None
        if clock is None or type(clock) is SystemClock:
            return time.time
        return clock.now

    def get_operator_state(self, name: str, mode: RedistributionMode = "split") -> OperatorListState:
        """Return this instance's operator list state ``name`` (restored after recovery)."""
        return self._operator_state.get_list_state(name, mode)


class ProcessFunction(Generic[IN, OUT]):
    """A function over a (non-keyed) stream with lifecycle hooks: takes records of type
    ``IN``, emits records of type ``OUT``."""

    def open(self, ctx: RuntimeContext) -> None:
        """Called once per instance before the first record (and after each restore)."""

    def process_element(self, value: IN, ctx: RuntimeContext) -> Iterable[OUT] | None:
        """Process one record; return (or yield) the outputs.

        Or declare a third parameter, ``process_element(self, value, ctx, out)``: ``out`` is
        a list to ``out.append(x)`` the outputs to, and the method returns None (Flink's
        ``Collector``). It saves building a list or a generator per record, the cheapest
        way out of a per-record function (``bench/w1.py``); a function that takes ``out``
        and returns outputs fails the job, one that takes it and yields is refused before
        the first record. The same holds for :meth:`KeyedProcessFunction.on_timer` and the
        per-record methods of the two-input functions.
        """
        raise NotImplementedError

    def close(self) -> None:
        """Called once when the instance stops."""


class KeyedProcessFunction(ProcessFunction[IN, OUT], Generic[K, IN, OUT]):
    """A function over a keyed stream of keys ``K`` and records ``IN``, emitting ``OUT``
    (Flink's ``KeyedProcessFunction<K, I, O>``): ``ctx.get_state`` is scoped to
    ``ctx.current_key``.

    ``ctx.timer_service`` registers event-time and processing-time timers for the current
    key; they are keyed state (checkpointed, restored, rescaled) and call :meth:`on_timer`.
    """

    def on_timer(self, timestamp: float, ctx: RuntimeContext) -> Iterable[OUT] | None:
        """A timer of ``ctx.current_key`` fired at ``timestamp`` (seconds); return (or
        yield) the outputs. Event-time timers fire once the watermark is >= ``timestamp``
        (Flink's ``KeyedProcessFunction.onTimer``); ``ctx.time_domain()`` tells an
        event-time timer from a processing-time one, ``ctx.timestamp()`` is ``timestamp``.
        Like ``process_element``, it may take an ``out`` list to append to instead."""
        return None
