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
from typing import Any

from ...state.backend import KeyedStateBackend
from ...state.broadcast_state import BroadcastStateStore
from ...state.descriptors import MapStateDescriptor
from ...time.clock import ProcessingClock
from ...two_input_functions import BroadcastProcessFunction, BroadcastRuntimeContext
from .process import ProcessOperator, TimedKeyedProcessOperator
from .two_input import TwoInputOperator, call_per_record

__all__ = ["BroadcastProcessOperator", "KeyedBroadcastProcessOperator"]


class _BroadcastStates:
    """The broadcast plumbing both operators share: two contexts (read-only for the
    non-broadcast input and timers, writable for the broadcast input) over one store."""

    descriptors: list[MapStateDescriptor]
    broadcast_store: BroadcastStateStore
    broadcast_ctx: BroadcastRuntimeContext

    def _bind_contexts(self, op: Any, subtask: int, parallelism: int, max_parallelism: int,
                       keyed_backend: KeyedStateBackend | None) -> None:
        store = BroadcastStateStore(op.operator_state, subtask, parallelism)
        self.broadcast_store = store
        args = (op.name, op.uid, subtask, parallelism, max_parallelism, keyed_backend,
                op.operator_state)
        read_only = BroadcastRuntimeContext(*args)
        read_only._bind_broadcast(store, writable=False)
        writable = BroadcastRuntimeContext(*args)
        writable._bind_broadcast(store, writable=True)
        writable.keyed_states = read_only.keyed_states
        op.ctx = read_only
        self.broadcast_ctx = writable


class BroadcastProcessOperator(TwoInputOperator, ProcessOperator, _BroadcastStates):
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

    def setup(self, subtask: int, parallelism: int, max_parallelism: int,
              keyed_backend: KeyedStateBackend | None) -> None:
        super().setup(subtask, parallelism, max_parallelism, keyed_backend)
        self._bind_contexts(self, subtask, parallelism, max_parallelism, keyed_backend)

    def open(self) -> None:
        self.broadcast_store.declare(self.descriptors)
        super().open()

    def process_batch(self, batch: list[Any]) -> list[Any]:
        return call_per_record(self, self.fn.process_element, batch, self.ctx,
                               "process_element", 0)

    def process_batch2(self, batch: list[Any]) -> list[Any]:
        return call_per_record(self, self.fn.process_broadcast_element, batch,
                               self.broadcast_ctx, "process_broadcast_element", 1)

    def snapshot_state(self, checkpoint_id: int) -> None:
        self.broadcast_store.snapshot()


class KeyedBroadcastProcessOperator(TwoInputOperator, TimedKeyedProcessOperator,
                                    _BroadcastStates):
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

    def setup(self, subtask: int, parallelism: int, max_parallelism: int,
              keyed_backend: KeyedStateBackend | None) -> None:
        super().setup(subtask, parallelism, max_parallelism, keyed_backend)
        self._bind_contexts(self, subtask, parallelism, max_parallelism, keyed_backend)

    def open(self) -> None:
        self.broadcast_store.declare(self.descriptors)
        super().open()

    def process_batch(self, batch: list[Any]) -> list[Any]:
        return call_per_record(self, self.fn.process_element, batch, self.ctx,
                               "process_element", 0, self.key_selector)

    def process_batch2(self, batch: list[Any]) -> list[Any]:
        return call_per_record(self, self.fn.process_broadcast_element, batch,
                               self.broadcast_ctx, "process_broadcast_element", 1)

    def snapshot_state(self, checkpoint_id: int) -> None:
        self.broadcast_store.snapshot()
        super().snapshot_state(checkpoint_id)
