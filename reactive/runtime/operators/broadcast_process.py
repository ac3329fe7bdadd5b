"""Broadcast process operators: a stream connected with a broadcast stream, whose records
update broadcast state that every instance holds a copy of (Flink's broadcast state pattern:
``CoBroadcastWithNonKeyedOperator`` and ``CoBroadcastWithKeyedOperator``).

The first input is the non-broadcast stream (one instance per record, keyed or not); the
second is the broadcast stream, whose channels reach every instance. Broadcast state is
operator state (``reactive.state.broadcast_state``): snapshotted by every instance, restored
at any parallelism.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from ...functions import RuntimeContext
from ...state.backend import KeyedStateBackend
from ...state.broadcast_state import BroadcastStateStore
from ...state.descriptors import MapStateDescriptor
from ...time.clock import ProcessingClock
from ...two_input_functions import BroadcastProcessFunction, BroadcastRuntimeContext
from .base import StreamOperator
from .process import ProcessOperator, TimedKeyedProcessOperator
from .record_calls import call_per_record
from .two_input import TwoInputOperator

__all__ = ["BroadcastProcessOperator", "KeyedBroadcastProcessOperator"]


class _BroadcastStates(StreamOperator):
    """The broadcast plumbing both operators share: two contexts (read-only for the
    non-broadcast input and timers, writable for the broadcast input) over one store,
    declared at ``open`` (after a restore) and snapshotted with the operator."""

    descriptors: list[MapStateDescriptor]
    broadcast_store: BroadcastStateStore
    broadcast_ctx: BroadcastRuntimeContext

    def setup(self, subtask: int, parallelism: int, max_parallelism: int,
              keyed_backend: KeyedStateBackend | None) -> None:
        super().setup(subtask, parallelism, max_parallelism, keyed_backend)
        store = BroadcastStateStore(self.operator_state, subtask, parallelism)
        self.broadcast_store = store
        args = (self.name, self.uid, subtask, parallelism, max_parallelism, keyed_backend,
                self.operator_state)
        read_only = BroadcastRuntimeContext(*args)
        read_only._bind_broadcast(store, writable=False)
        writable = BroadcastRuntimeContext(*args)
        writable._bind_broadcast(store, writable=True)
        writable.keyed_states = read_only.keyed_states
        self.ctx = cast(RuntimeContext, read_only)  # what every operator's ctx is typed as
        self.broadcast_ctx = writable

    def open(self) -> None:
        self.broadcast_store.declare(self.descriptors)
        super().open()

    def snapshot_state(self, checkpoint_id: int) -> Any:
        self.broadcast_store.snapshot()
        return super().snapshot_state(checkpoint_id)


class BroadcastProcessOperator(_BroadcastStates, TwoInputOperator, ProcessOperator):
    """``stream.connect(broadcast_stream).process(BroadcastProcessFunction)``.

    Args:
        name, uid: operator identity.
        fn: the ``BroadcastProcessFunction``.
        descriptors: the broadcast states (``MapStateDescriptor`` s given to ``broadcast``).
    """

    def __init__(self, name: str, uid: str, fn: BroadcastProcessFunction,
                 descriptors: list[MapStateDescriptor]) -> None:
        ProcessOperator.__init__(self, name, uid, fn)  # type: ignore[arg-type]
        self.descriptors = descriptors

    per_record_methods = ("process_element", "process_broadcast_element")

    def process_batch(self, batch: list[Any]) -> list[Any]:
        return call_per_record(self, self.fn.process_element,
                               self.conventions["process_element"], batch, self.ctx,
                               "process_element", side=0)

    def process_batch2(self, batch: list[Any]) -> list[Any]:
        return call_per_record(self, self.fn.process_broadcast_element,
                               self.conventions["process_broadcast_element"], batch,
                               self.broadcast_ctx, "process_broadcast_element", side=1)


class KeyedBroadcastProcessOperator(_BroadcastStates, TwoInputOperator,
                                    TimedKeyedProcessOperator):
    """``keyed.connect(broadcast_stream).process(KeyedBroadcastProcessFunction)``: keyed
    state and timers for the keyed input, broadcast state for both.

    Args:
        name, uid: operator identity.
        fn: the ``KeyedBroadcastProcessFunction``.
        key_selector: record -> key of the keyed input.
        descriptors: the broadcast states.
        clock: processing-time clock.
    """

    def __init__(self, name: str, uid: str, fn: BroadcastProcessFunction,
                 key_selector: Callable[[Any], Any], descriptors: list[MapStateDescriptor],
                 clock: ProcessingClock) -> None:
        TimedKeyedProcessOperator.__init__(self, name, uid, fn,  # type: ignore[arg-type]
                                           key_selector, clock)
        self.descriptors = descriptors

    per_record_methods = ("process_element", "process_broadcast_element")

    def process_batch(self, batch: list[Any]) -> list[Any]:
        return call_per_record(self, self.fn.process_element,
                               self.conventions["process_element"], batch, self.ctx,
                               "process_element", self.key_selector, side=0)

    def process_batch2(self, batch: list[Any]) -> list[Any]:
        return call_per_record(self, self.fn.process_broadcast_element,
                               self.conventions["process_broadcast_element"], batch,
                               self.broadcast_ctx, "process_broadcast_element", side=1)
