"""Two-input operators over connected streams: co-map, co-flat-map, co-process and keyed
co-process (Flink's ``CoStreamMap``, ``CoStreamFlatMap``, ``CoProcessOperator`` and
``KeyedCoProcessOperator``; n-ary operators in Carbone 2018 (PhD thesis), section 3.3.1.1).

A two-input operator is the head of its task's chain. The task reads both inputs' channels
through one input gate, so barrier alignment covers the channels of both inputs as for any
task with several input channels (a checkpoint holds, for each input, exactly the effects of
its records before the barrier) and the watermark is the minimum over all channels. Batches
of the first input go to ``process_batch``, those of the second to ``process_batch2``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ...time.clock import ProcessingClock
from ...two_input_functions import CoProcessFunction
from .base import StreamOperator
from .per_record import flat_map_records, map_records
from .process import ProcessOperator, TimedKeyedProcessOperator
from .record_calls import call_per_record

__all__ = [
    "CoFlatMapOperator",
    "CoMapOperator",
    "CoProcessOperator",
    "KeyedCoProcessOperator",
    "TwoInputOperator",
]


class TwoInputOperator(StreamOperator):
    """Base of operators with two inputs: ``process_batch`` takes the first input's
    batches, :meth:`process_batch2` the second's."""

    def process_batch2(self, batch: list[Any]) -> list[Any]:
        """Process a batch of the second input; return the output batch."""
        raise NotImplementedError


class CoMapOperator(TwoInputOperator):
    """``a.connect(b).map(fn1, fn2)``: one output per record of either input."""

    def __init__(self, name: str, uid: str, fn1: Callable[[Any], Any],
                 fn2: Callable[[Any], Any]) -> None:
        super().__init__(name, uid)
        self.fns = (fn1, fn2)

    def _map(self, batch: list[Any], side: int) -> list[Any]:
        return map_records(self, self.fns[side], batch, f"input {side + 1} (map{side + 1})")

    def process_batch(self, batch: list[Any]) -> list[Any]:
        return self._map(batch, 0)

    def process_batch2(self, batch: list[Any]) -> list[Any]:
        return self._map(batch, 1)


class CoFlatMapOperator(TwoInputOperator):
    """``a.connect(b).flat_map(fn1, fn2)``: zero or more outputs per record (the items of
    the iterable the function returns, or none for None)."""

    def __init__(self, name: str, uid: str, fn1: Callable[[Any], Iterable[Any] | None],
                 fn2: Callable[[Any], Iterable[Any] | None]) -> None:
        super().__init__(name, uid)
        self.fns = (fn1, fn2)

    def _flat_map(self, batch: list[Any], side: int) -> list[Any]:
        return flat_map_records(self, self.fns[side], batch,
                                f"input {side + 1} (flat_map{side + 1})",
                                f"the flat_map function {side + 1}")

    def process_batch(self, batch: list[Any]) -> list[Any]:
        return self._flat_map(batch, 0)

    def process_batch2(self, batch: list[Any]) -> list[Any]:
        return self._flat_map(batch, 1)


class CoProcessOperator(TwoInputOperator, ProcessOperator):
    """``a.connect(b).process(CoProcessFunction)`` on non-keyed streams (operator state
    only)."""

    def __init__(self, name: str, uid: str, fn: CoProcessFunction) -> None:
        ProcessOperator.__init__(self, name, uid, fn)  # type: ignore[arg-type]

    per_record_methods = ("process_element1", "process_element2")

    def process_batch(self, batch: list[Any]) -> list[Any]:
        return call_per_record(self, self.fn.process_element1,
                               self.conventions["process_element1"], batch, self.ctx,
                               "process_element1", side=0)

    def process_batch2(self, batch: list[Any]) -> list[Any]:
        return call_per_record(self, self.fn.process_element2,
                               self.conventions["process_element2"], batch, self.ctx,
                               "process_element2", side=1)


class KeyedCoProcessOperator(TwoInputOperator, TimedKeyedProcessOperator):
    """``a.key_by(f).connect(b.key_by(g)).process(KeyedCoProcessFunction)``: the state and
    timers of a key are shared by both inputs' records with that key.

    Args:
        name, uid: operator identity.
        fn: the ``KeyedCoProcessFunction``.
        key_selector1, key_selector2: record -> key, per input.
        clock: processing-time clock.
    """

    def __init__(self, name: str, uid: str, fn: CoProcessFunction,
                 key_selector1: Callable[[Any], Any], key_selector2: Callable[[Any], Any],
                 clock: ProcessingClock) -> None:
        TimedKeyedProcessOperator.__init__(self, name, uid, fn,  # type: ignore[arg-type]
                                           key_selector1, clock)
        self.key_selector2 = key_selector2

    per_record_methods = ("process_element1", "process_element2")

    def process_batch(self, batch: list[Any]) -> list[Any]:
        return call_per_record(self, self.fn.process_element1,
                               self.conventions["process_element1"], batch, self.ctx,
                               "process_element1", self.key_selector, side=0)

    def process_batch2(self, batch: list[Any]) -> list[Any]:
        return call_per_record(self, self.fn.process_element2,
                               self.conventions["process_element2"], batch, self.ctx,
                               "process_element2", self.key_selector2, side=1)

