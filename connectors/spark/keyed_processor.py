"""A keyed operator of a dataflow as a Spark ``StatefulProcessor``: the embedded runtime's
own operator (``key_by(...).process(...)``, ``reduce``, event-time and count windows) run
by ``groupBy(key).transformWithState`` with state and timers in Spark's state store.

Per micro-batch and key, Spark hands over the key's rows; the processor sets the key,
gives the operator the batch's watermark as its event time, runs ``process_batch`` on the
records (in source order) and returns the outputs, after the per-record steps between the
operator and the sink, as the sink's rows. After the input rows, Spark fires the timers the
watermark passed (``handleExpiredTimer``), which call the operator's ``on_timer`` /
window firing. Source: Spark's arbitrary stateful processing v2 (SPARK-45939,
``TransformWithStateExec``), Flink's ``KeyedProcessOperator`` for what the operator sees.
"""

from __future__ import annotations

import copy
import cProfile
import os
import pickle
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pyspark.sql import Row
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

from reactive.key_encoding import decode_key
from reactive.runtime.operators import StreamOperator
from reactive.runtime.operators.process import ProcessOperator
from reactive.time.clock import ProcessingClock
from reactive.time.timers import Fire

from .record_chain import SinkEncoder, run_steps
from .state_adapter import SparkKeyedStateBackend, SparkTimerService
from .translation import KeyedStep, QueryPlan, RecordStep, SinkStep

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["KEYED_INPUT_SCHEMA", "PROFILE_ENV", "KeyedOperatorProcessor", "keyed_from",
           "records_to_keyed", "watermark_seconds"]

KEYED_INPUT_SCHEMA = "record binary, ts timestamp, seq bigint, key binary"
"""The keyed input rows the source's reader makes (:func:`records_to_keyed`)."""

PROFILE_ENV = "REACTIVE_SPARK_PROFILE"
"""An environment variable naming a directory: when set (in the driver's environment, which
Spark's local-mode Python workers inherit), each keyed processor runs under ``cProfile``
from ``init`` to ``close`` and writes its statistics there (``keyed-<pid>-*.prof``, one file per
processor instance, which is one per Spark task)."""


def _first(pair: tuple[Any, Any]) -> Any:
    return pair[0]


def watermark_seconds(millis: int) -> float:
    """Spark's watermark (ms; 0 before the first one) as the runtime's event time (seconds;
    -inf before the first watermark)."""
    return float("-inf") if millis <= 0 else millis / 1000.0


class KeyedOperatorProcessor(StatefulProcessor):
    """Runs one keyed operator of a dataflow inside ``transformWithState`` (Row mode).

    Args:
        step: the keyed operator and its key selector.
        after_key: the per-record steps between the operator and the sink.
        sink: the sink, whose rows the processor returns.
    """

    def __init__(self, step: KeyedStep, after_key: list[RecordStep], sink: SinkStep) -> None:
        self.step = step
        self.after_key = after_key
        self.sink = sink

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Create the operator, its Spark-backed state and timers, and open it (its
        functions' ``open()`` define their state here, where Spark wants it defined)."""
        directory = os.environ.get(PROFILE_ENV)
        self._profile: cProfile.Profile | None = None
        if directory:
            self._profile_dir = directory
            self._profile = cProfile.Profile()
            self._profile.enable()
        step = self.step
        self.encoder = SinkEncoder(self.sink)
        op: StreamOperator = copy.deepcopy(step.operator)
        self.op = op
        self.backend = SparkKeyedStateBackend(handle)
        op.setup(0, 1, step.max_parallelism, self.backend)
        self.timers: SparkTimerService | None = None

        def spark_timers(owner: StreamOperator, clock: ProcessingClock, on_event_time: Fire,
                         on_processing_time: Fire) -> SparkTimerService:
            # the operator's timers live in Spark's state store; Spark fires them
            self.timers = SparkTimerService(handle, clock, on_event_time)
            return self.timers

        op.timer_service_factory = spark_timers
        op.open()

    def _key(self, key: tuple[Any, ...]) -> Any:
        data = key[0]
        ks = self.step.key_serializer
        return ks.deserialize(data) if ks is not None else decode_key(data)

    def _emit(self, outputs: list[Any]) -> Iterator[Row]:
        encode = self.encoder.row
        make = Row(*self.encoder.names)
        steps = self.after_key
        for o in outputs:
            if steps:
                for r, _ in run_steps(steps, o, None):
                    yield make(*encode(r))
            else:
                yield make(*encode(o))

    def _set_watermark(self, timer_values: TimerValues) -> None:
        if self.timers is not None:
            self.timers.watermark = watermark_seconds(timer_values.getCurrentWatermarkInMs())

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Any:
        """The key's records of this micro-batch, in source order, through the operator."""
        self._set_watermark(timerValues)
        # the end-of-input marker comes alone, with a null key and record. Rows are tuples
        # in the column order of keyed_from's select ("key", "record", "seq"); unpacking
        # them skips Row's per-field lookup by name (a Python call per field)
        received = [(seq, data) for _, data, seq in rows if data is not None]
        if not received:
            return iter(())
        received.sort(key=_first)
        records = [pickle.loads(data) for _, data in received]
        self._begin(key)
        outputs = self.op.process_batch(records)
        self._flush()
        return self._emit(outputs)

    def _begin(self, key: Any) -> None:
        self.backend.set_current_key(self._key(key))
        self.backend.reset()
        if self.timers is not None:
            self.timers.reset()

    def _flush(self) -> None:
        """Write the key's state and timers back to Spark, once per call (see
        :class:`~.state_adapter.SparkKeyedStateBackend`)."""
        self.backend.flush()
        if self.timers is not None:
            self.timers.flush()

    def handleExpiredTimer(self, key: Any, timerValues: TimerValues,
                           expiredTimerInfo: ExpiredTimerInfo) -> Any:
        """A Spark timer of ``key`` expired: fire the operator's timers registered for it."""
        self._set_watermark(timerValues)
        self._begin(key)
        assert self.timers is not None
        outputs = self.timers.fire(expiredTimerInfo.getExpiryTimeInMs())
        self._flush()
        return self._emit(outputs)

    def close(self) -> None:
        """Close the operator's functions."""
        op = getattr(self, "op", None)
        if op is not None and isinstance(op, ProcessOperator):
            op.fn.close()
        profile = getattr(self, "_profile", None)
        if profile is not None:
            profile.disable()
            os.makedirs(self._profile_dir, exist_ok=True)
            # one file per processor instance (a worker process runs one per task)
            path = tempfile.mkstemp(prefix=f"keyed-{os.getpid()}-", suffix=".prof",
                                    dir=self._profile_dir)
            os.close(path[0])
            profile.dump_stats(path[1])


def keyed_from(pre: DataFrame, plan: QueryPlan, encoder: Any,
               watermarked: bool = False) -> DataFrame:
    """The sink's rows of a keyed operator run in Python (``transformWithState``), from its
    input rows ``record, ts, seq, key`` (the records pickled, their event time and the
    canonical bytes of their key; the end-of-input marker with a null record and key).
    ``watermarked``: ``pre`` already carries its watermarks (a union's inputs, one each)."""
    assert plan.keyed is not None and plan.sink is not None
    delay = plan.watermark_delay or 0.0
    if watermarked:
        processor = KeyedOperatorProcessor(plan.keyed, plan.after_key, plan.sink)
        return pre.select("key", "record", "seq").groupBy("key").transformWithState(
            processor, encoder.spark_schema(), "Append", "EventTime")
    keyed = (pre
             # the marker's event time passes the watermark beyond every timer; the
             # records' event time is dropped before the operator, which judges lateness
             # itself, as embedded (Spark would drop late rows before it). The marker
             # reaches the operator (with a null key, skipped there): a filter here would
             # be pushed below the watermark, which would then never see it
             .withWatermark("ts", f"{int(delay * 1000)} milliseconds")
             .select("key", "record", "seq"))
    processor = KeyedOperatorProcessor(plan.keyed, plan.after_key, plan.sink)
    return keyed.groupBy("key").transformWithState(
        processor, encoder.spark_schema(), "Append", "EventTime")


def records_to_keyed(plan: QueryPlan) -> Any:
    """The source reader's chain before the keyed operator: source records
    (:data:`~.record_chain.Chunk` s) through the steps, pickled, with their event time and
    the canonical bytes of their key (Arrow batches of :data:`KEYED_INPUT_SCHEMA`)."""
    steps = plan.before_key
    assert plan.keyed is not None
    key_of = plan.keyed.key_selector
    key_serializer = plan.keyed.key_serializer
    name, uid = plan.keyed.name, plan.keyed.uid

    def run(chunks: Any) -> Any:
        import datetime
        import pickle

        import pyarrow as pa

        from reactive.errors import UserFunctionError
        from reactive.key_encoding import encode_key

        from .record_chain import END_OF_INPUT, run_steps

        schema = pa.schema([("record", pa.binary()), ("ts", pa.timestamp("us", tz="UTC")),
                            ("seq", pa.int64()), ("key", pa.binary())])
        utc = datetime.UTC
        encode = key_serializer.serialize if key_serializer is not None else encode_key
        dumps, proto = pickle.dumps, pickle.HIGHEST_PROTOCOL
        for records, tss, seqs in chunks:
            out_r: list[Any] = []
            out_t: list[Any] = []
            out_s: list[int] = []
            out_k: list[bytes | None] = []
            for record, ts, seq in zip(records, tss, seqs, strict=True):
                if record is END_OF_INPUT:
                    out_r.append(None)
                    out_t.append(ts)
                    out_s.append(seq)
                    out_k.append(None)
                    continue
                for r, t in run_steps(steps, record, None, f"record {seq}"):
                    try:
                        k = encode(key_of(r))
                    except Exception as exc:
                        raise UserFunctionError(name, uid, 0, 1, r, exc,
                                                f"record {seq}") from exc
                    out_r.append(dumps(r, protocol=proto))
                    out_t.append(None if t is None else
                                 datetime.datetime.fromtimestamp(t, utc))
                    out_s.append(seq)
                    out_k.append(k)
            yield pa.RecordBatch.from_arrays(
                [pa.array(out_r, pa.binary()), pa.array(out_t, schema.field("ts").type),
                 pa.array(out_s, pa.int64()), pa.array(out_k, pa.binary())], schema=schema)

    return run
