"""A keyed per-record operator run grouped by key group: Spark calls Python once per key
group and micro-batch (``groupBy(key group).transformWithStateInPandas``), not once per
key, and the key group's state travels as one value.

The source's reader computes each record's key group as the embedded runtime does
(``murmur3(key bytes) mod max_parallelism``, :func:`reactive.keygroups.key_group_of_bytes`).
Per micro-batch and key group, the processor reads the group's state once (one value: every
key's state, :class:`~.key_group_state.KeyGroupStateBackend`), runs the operator's
``process_batch`` over the group's records in source order (each record sets its own key, as
in an embedded task), and writes the state back once: three round trips to Spark's state
server per key group (a ``get``, an ``update``, the call itself), where the per-key shape
(:mod:`.keyed_processor`) makes about three per key. Spark's state store, checkpointed with
each micro-batch, keeps the state exactly once through a restart.

It runs operators whose state is keyed state only: ``key_by(...).process(fn)`` with a
function that has no ``on_timer`` of its own, and ``reduce``. A function with ``on_timer``,
windows (their timers fire them) and a keyed operator after a union keep the per-key shape
(:func:`key_group_refusal` says why). Such an operator's timers could never call anything
embedded: the base ``on_timer`` emits nothing, so timers registered here are not kept.
Source: Flink's key groups (Carbone et al., "State Management in Apache Flink", VLDB 2017,
section 3.2); Spark's ``transformWithStateInPandas`` (SPARK-49744).
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from pyspark.sql.streaming.stateful_processor import (
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

from reactive.functions import KeyedProcessFunction
from reactive.runtime.operators import (
    ProcessOperator,
    ReduceOperator,
    StreamOperator,
    TimedKeyedProcessOperator,
)
from reactive.time.clock import ProcessingClock
from reactive.time.timers import Fire

from .key_group_state import KeyGroupStateBackend
from .keyed_processor import watermark_seconds
from .record_chain import SinkEncoder, run_steps
from .translation import KeyedStep, QueryPlan, RecordStep, SinkStep

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["KEY_GROUP_SCHEMA", "KEY_GROUP_SHAPE", "KeyGroupProcessor", "key_group_frame",
           "key_group_refusal", "with_key_groups"]

KEY_GROUP_SHAPE = "key groups (transformWithStateInPandas)"
"""The plan shape's name in ``SparkJob.shapes``."""

KEY_GROUP_SCHEMA = "record binary, ts timestamp, seq bigint, key binary, kg int"
"""The reader's rows: the keyed input rows (pickled record, event time, source position,
key bytes) and the key group (null for the end-of-input marker)."""

STATE_NAME = "key_group_state"
"""The Spark value state holding a key group's state (:meth:`KeyGroupStateBackend.dump`)."""


def key_group_refusal(plan: QueryPlan) -> str | None:
    """Why the keyed operator of ``plan`` cannot run grouped by key group, or None when it
    can (see the module docstring)."""
    step = plan.keyed
    if step is None:
        return "the plan has no keyed operator"
    if plan.branches:
        return "its input is a union (a watermark per input: the per-key shape)"
    op = step.operator
    if type(op) is ReduceOperator:
        return None
    if type(op) is not TimedKeyedProcessOperator:
        return f"a {step.kind} operator registers timers (the per-key shape fires them)"
    on_timer = getattr(op.fn, "on_timer", None)
    if on_timer is not None and getattr(on_timer, "__func__", None) is not \
            KeyedProcessFunction.on_timer:
        return "its function has on_timer (the per-key shape fires timers)"
    return None


class _WatermarkOnly:
    """The timer service of a function without ``on_timer`` (the invariant of this shape):
    ``current_watermark()`` is the micro-batch's watermark; a timer it registers would
    fire the base ``on_timer``, which emits nothing, so none is kept."""

    def __init__(self, clock: ProcessingClock) -> None:
        self.clock = clock
        self.watermark = float("-inf")

    def register_event_time_timer(self, timestamp: float, namespace: Any = None, *,
                                  new: bool = False) -> None:
        """Nothing to keep (see the class docstring)."""

    def register_processing_time_timer(self, timestamp: float, namespace: Any = None) -> None:
        """Nothing to keep (see the class docstring)."""

    def delete_event_time_timer(self, timestamp: float, namespace: Any = None) -> None:
        """No timer is kept: nothing to delete."""

    def delete_processing_time_timer(self, timestamp: float, namespace: Any = None) -> None:
        """No timer is kept: nothing to delete."""

    def advance_watermark(self, watermark: float) -> list[Any]:
        """Record the event time; no timer fires."""
        self.watermark = watermark
        return []

    def fire_processing_timers(self) -> list[Any]:
        """None are kept."""
        return []

    def restore(self) -> None:
        """Nothing to restore."""

    def close(self) -> None:
        """Nothing to release."""


class KeyGroupProcessor(StatefulProcessor):
    """Runs one keyed operator inside ``transformWithStateInPandas``, grouped by key group.

    Args:
        step: the keyed operator (one :func:`key_group_refusal` accepts).
        after_key: the per-record steps between the operator and the sink.
        sink: the sink, whose rows the processor returns.
    """

    def __init__(self, step: KeyedStep, after_key: list[RecordStep], sink: SinkStep) -> None:
        self.step = step
        self.after_key = after_key
        self.sink = sink

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Create the operator over a key group's state and open it."""
        self.encoder = SinkEncoder(self.sink)
        op: StreamOperator = copy.deepcopy(self.step.operator)
        self.op = op
        self.backend = KeyGroupStateBackend(self.step.max_parallelism)
        op.setup(0, 1, self.step.max_parallelism, self.backend)
        self.timers: _WatermarkOnly | None = None

        def timers(owner: StreamOperator, clock: ProcessingClock, on_event_time: Fire,
                   on_processing_time: Fire) -> _WatermarkOnly:
            self.timers = _WatermarkOnly(clock)
            return self.timers

        op.timer_service_factory = timers
        op.open()
        self.state = handle.getValueState(STATE_NAME, "state binary")

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Any:
        """The key group's records of this micro-batch through the operator, in source
        order; returns the sink's rows (pandas DataFrames)."""
        import numpy as np
        import pandas as pd

        frames = list(rows)
        frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
        # the end-of-input marker (a null record, in the null key group; pandas gives that
        # group's key as NaN, not None) moved the watermark and touches no state
        frame = frame[frame["record"].notna()]
        if frame.empty:
            return iter(())
        # a stable sort: a record's flat_map outputs share its position, in their order
        order = np.argsort(frame["seq"].to_numpy(), kind="stable")
        loads = pickle.loads
        records = [loads(d) for d in frame["record"].to_numpy()[order]]
        if self.timers is not None:
            self.timers.watermark = watermark_seconds(timerValues.getCurrentWatermarkInMs())
        stored = self.state.get()
        self.backend.load(None if stored is None else stored[0])
        outputs = self.op.process_batch(records)
        data = self.backend.dump()
        if data is None:
            self.state.clear()
        else:
            self.state.update((data,))
        return self._emit(outputs)

    def _emit(self, outputs: list[Any]) -> Iterator[Any]:
        if not outputs:
            return iter(())
        encode = self.encoder.row
        steps = self.after_key
        if steps:
            rows = [encode(r) for o in outputs for r, _ in run_steps(steps, o, None)]
        else:
            rows = [encode(o) for o in outputs]
        if not rows:
            return iter(())
        if self.encoder.spark_format == "text":  # one string column: no Arrow detour
            import pandas as pd

            return iter([pd.DataFrame({"value": [r[0] for r in rows]})])
        return iter([self.encoder.batch(rows).to_pandas()])

    def close(self) -> None:
        """Close the operator's functions."""
        op = getattr(self, "op", None)
        if isinstance(op, ProcessOperator):
            op.fn.close()


def with_key_groups(chain: Callable[[Any], Any], max_parallelism: int) -> Callable[[Any], Any]:
    """The reader's chain ``chain`` (Arrow batches of ``record, ts, seq, key``) with each
    row's key group appended as column ``kg`` (null where the key is: the end-of-input
    marker)."""

    def run(chunks: Any) -> Any:
        import pyarrow as pa

        from reactive.keygroups import key_group_of_bytes

        for batch in chain(chunks):
            groups = [None if k is None else key_group_of_bytes(k, max_parallelism)
                      for k in batch.column(3).to_pylist()]
            yield batch.append_column("kg", pa.array(groups, pa.int32()))

    return run


def key_group_frame(pre: DataFrame, plan: QueryPlan, encoder: SinkEncoder) -> DataFrame:
    """The sink's rows of ``plan``'s keyed operator grouped by key group, from the reader's
    rows ``pre`` (:data:`KEY_GROUP_SCHEMA`)."""
    assert plan.keyed is not None and plan.sink is not None
    delay = plan.watermark_delay or 0.0
    # as in keyed_processor.keyed_from: the watermark comes from the records' event time
    # (the marker's passes every record's), which is dropped before the operator so Spark
    # drops no late row before the operator judges it
    keyed = (pre.withWatermark("ts", f"{int(delay * 1000)} milliseconds")
             .select("kg", "record", "seq"))
    processor = KeyGroupProcessor(plan.keyed, plan.after_key, plan.sink)
    return keyed.groupBy("kg").transformWithStateInPandas(
        processor, encoder.spark_schema(), "Append", "EventTime")
