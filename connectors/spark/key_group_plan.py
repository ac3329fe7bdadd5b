"""A keyed per-record operator run grouped by key group: Spark calls Python once per key
group and micro-batch (``groupBy(key group).transformWithStateInPandas``), not once per
key, and the key group's state travels as one value.

The source's reader computes each record's key group as the embedded runtime does
(``murmur3(key bytes) mod max_parallelism``, :func:`reactive.keygroups.key_group_of_bytes`)
and packs each key group's records into one row (:mod:`.key_group_rows`), so Spark moves a
few rows per key group and micro-batch, not one per record; the processor's output for a
JSON-lines sink is one value of the group's lines. Per micro-batch and key group, the
processor reads the group's state once (one value: every
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
import cProfile
import json
import os
import tempfile
from collections.abc import Iterator
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

from .key_group_rows import (
    KEY_GROUP_SCHEMA,
    MARKER_KEY_GROUP,
    key_group_records,
    unpack_records,
)
from .key_group_state import KeyGroupStateBackend
from .keyed_processor import PROFILE_ENV, watermark_seconds
from .record_chain import SinkEncoder, run_steps
from .translation import KeyedStep, QueryPlan, RecordStep, SinkStep

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["KEY_GROUP_SCHEMA", "KEY_GROUP_SHAPE", "KeyGroupProcessor", "key_group_frame",
           "key_group_records", "key_group_refusal"]

KEY_GROUP_SHAPE = "key groups (transformWithStateInPandas)"
"""The plan shape's name in ``SparkJob.shapes``."""

_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
"""The sink encoder's JSON settings (:class:`~.record_chain.SinkEncoder`)."""

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


def _start_profile() -> cProfile.Profile | None:
    """A running profiler when :data:`~.keyed_processor.PROFILE_ENV` names a directory."""
    if not os.environ.get(PROFILE_ENV):
        return None
    profile = cProfile.Profile()
    profile.enable()
    return profile


def _stop_profile(profile: cProfile.Profile | None) -> None:
    """Write ``profile``'s statistics to ``<PROFILE_ENV>/key-groups-<pid>-*.prof``."""
    if profile is None:
        return
    profile.disable()
    directory = os.environ[PROFILE_ENV]
    os.makedirs(directory, exist_ok=True)
    fd, path = tempfile.mkstemp(prefix=f"key-groups-{os.getpid()}-", suffix=".prof",
                                dir=directory)
    os.close(fd)
    profile.dump_stats(path)


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
        self._profile = _start_profile()
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
        import pandas as pd

        if key[0] == MARKER_KEY_GROUP:  # the end-of-input marker (a null value), alone in
            return iter(())  # its group, moved the watermark and touches no state
        frames = list(rows)
        frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
        records = unpack_records(frame["records"].to_numpy(), frame["seq"].to_numpy())
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
        steps = self.after_key
        if steps:
            outputs = [r for o in outputs for r, _ in run_steps(steps, o, None)]
        if not outputs:
            return iter(())
        if self.encoder.spark_format == "text":
            import pandas as pd

            # the lines as one value: Spark's text sink ends each value with a newline, so
            # the file holds the same lines, written without a row (and its conversions
            # through pandas, Arrow and the JVM) per line; a JSON line has no raw newline
            return iter([pd.DataFrame({"value": ["\n".join(self._json_lines(outputs))]})])
        encode = self.encoder.row
        return iter([self.encoder.batch([encode(o) for o in outputs]).to_pandas()])

    def _json_lines(self, outputs: list[Any]) -> list[str]:
        """The JSON lines of ``outputs``, as the sink encoder writes them: through the C
        encoder ``json.JSONEncoder.encode`` makes on every call (``iterencode`` with
        ``_one_shot``), made once here; on any error, record by record through the sink
        encoder, whose error names the sink and the record."""
        from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]

        if c_make_encoder is not None:
            enc = c_make_encoder({}, _JSON.default, encode_basestring, None, ":", ",", False,
                                 False, True)
            try:
                return ["".join(enc(o, 0)) for o in outputs]
            except (TypeError, ValueError, RecursionError):
                pass
        encode = self.encoder.row
        return [encode(o)[0] for o in outputs]

    def close(self) -> None:
        """Close the operator's functions."""
        op = getattr(self, "op", None)
        if isinstance(op, ProcessOperator):
            op.fn.close()
        _stop_profile(getattr(self, "_profile", None))


def key_group_frame(pre: DataFrame, plan: QueryPlan, encoder: SinkEncoder) -> DataFrame:
    """The sink's rows of ``plan``'s keyed operator grouped by key group, from the reader's
    rows ``pre`` (:data:`KEY_GROUP_SCHEMA`)."""
    assert plan.keyed is not None and plan.sink is not None
    delay = plan.watermark_delay or 0.0
    # as in keyed_processor.keyed_from: the watermark comes from the records' event time
    # (the marker's passes every record's), which is dropped before the operator so Spark
    # drops no late row before the operator judges it
    keyed = (pre.withWatermark("ts", f"{int(delay * 1000)} milliseconds")
             .select("kg", "records", "seq"))
    processor = KeyGroupProcessor(plan.keyed, plan.after_key, plan.sink)
    return keyed.groupBy("kg").transformWithStateInPandas(
        processor, encoder.spark_schema(), "Append", "EventTime")
