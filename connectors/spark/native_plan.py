"""Native plans: a keyed event-time window aggregated by built-in aggregations
(:class:`~reactive.windowing.aggregates.Aggregates`) run as Spark SQL,
``withWatermark(ts).groupBy(window(ts), key).agg(count, sum, avg, min, max, min_by, max_by)``,
with its state in Spark's state store and no Python per record in the aggregation.

The query: the source's reader runs the per-record steps before ``key_by`` on the records
it reads (Python, as in every plan; :mod:`.stream_source`'s first chain), which also
gives each record its event time, the canonical bytes of its key and the aggregated fields
as typed columns; Spark aggregates them
natively, in append mode, and emits each window once the watermark passes its end; a last
``mapInArrow`` turns the window rows into the ``WindowResult`` records the steps after the
window and the sink receive. The end-of-input marker (:mod:`.record_chain`) moves the
watermark past every window, so the last windows are emitted as embedded.

Late records, as embedded (``end <= watermark``, Flink's rule with no allowed lateness): the
embedded watermark before a record is the largest timestamp of the records before it minus
the bound. Spark drops a window row whose end is at or before its watermark, which is that
value over the micro-batches before the current one; the first chain drops the
records late against the records before them in the same micro-batch (it reads the
micro-batch's one partition in source order). Together: exactly the embedded rule, for
timestamps in whole milliseconds (Spark's watermark unit). Spark's watermark starts at the
epoch where the embedded one starts at -inf, so the event times Spark sees are shifted by a
whole number of windows, about 317 years (:func:`time_shift`), and shifted back after the
aggregation: records from the year 1653 on are never late against that first watermark.

With ``SparkRunner(read_partitions=N)`` a micro-batch is read in N parts, each judged alone
(as an embedded job whose timestamps are assigned by N parallel instances): a record late
only against an earlier part's records of its micro-batch is kept. Input whose disorder
stays within the bound gives the same results either way. A CSV file source is read in as
many parts as the dataflow's parallelism unless ``read_partitions`` says otherwise.

What runs natively (:func:`native_window`, else the plan keeps the Python operator in
``transformWithState``, with the reason logged): a tumbling event-time window (Spark cannot
drop one window of a sliding record, as embedded does for a record late for some of its
windows only), the default trigger, no evictor, no allowed lateness, no late-data output, the
window's timestamps those of the ``assign_timestamps`` before ``key_by``. Sums of floats
are added in another order than embedded (Spark adds partial sums per micro-batch and
partition), so they can differ in the last bits; sums of integer-valued floats, ints,
counts, minimums, maximums, first and last values are equal.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reactive.windowing.aggregates import Aggregates, BuiltinAggregate

from .translation import QueryPlan

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["NativeWindow", "native_aggregate", "native_columns", "native_row_fields",
           "native_window"]


@dataclass(frozen=True)
class NativeWindow:
    """A tumbling event-time window aggregated by built-in aggregations.

    Attributes:
        size, offset: the windows ``[offset + k*size, offset + (k+1)*size)`` (seconds).
        aggregations: the built-in aggregations, in result order.
        delay: the watermark's bound (seconds).
    """

    size: float
    offset: float
    aggregations: tuple[BuiltinAggregate, ...]
    delay: float


def native_window(plan: QueryPlan) -> tuple[NativeWindow | None, str]:
    """The native form of ``plan``'s keyed operator, or None and why not.

    Args:
        plan: a translated query plan.

    Returns:
        ``(window, "")`` when it runs as Spark SQL, else ``(None, reason)``.
    """
    from reactive.windowing.assigners import TumblingEventTimeWindows
    from reactive.windowing.triggers import EventTimeTrigger
    from reactive.windowing.window_operator import WindowOperator

    step = plan.keyed
    if step is None or step.kind != "window":
        return None, "no window operator"
    op = step.operator
    if type(op) is not WindowOperator:
        return None, f"{type(op).__name__} (shared or count windows) runs in Python"
    if not isinstance(op.agg, Aggregates):
        return None, ("the window's aggregate is a user function; built-in aggregations "
                      "(reactive.windowing.aggregates.Aggregates) run natively")
    if type(op.assigner) is not TumblingEventTimeWindows:
        return None, f"{type(op.assigner).__name__}: only tumbling event-time windows"
    if type(op.trigger) is not EventTimeTrigger or op.evictor is not None or op.discarding:
        return None, "a custom trigger, an evictor or discarding firing"
    if op.lateness != 0:
        return None, "allowed lateness (late firings update an emitted window)"
    if op.late_output():
        return None, "a late-data output"
    timestamps = [s for s in plan.before_key if s.kind == "timestamps"]
    if plan.watermark_delay is None or len(timestamps) != 1 \
            or op.timestamp_fn is not timestamps[0].fn:
        return None, "the window's timestamps are not those of assign_timestamps"
    assigner = op.assigner
    return NativeWindow(float(assigner.size), float(assigner.offset),
                        op.agg.aggregations, float(plan.watermark_delay)), ""


def time_shift(window: NativeWindow) -> int:
    """Microseconds added to every event time Spark sees: a whole number of windows (so
    each record's window is the same one shifted), at least 10**16 us (about 317 years)."""
    size = round(window.size * 1_000_000)
    return -(-10**16 // size) * size


def native_row_fields(window: NativeWindow) -> list[tuple[str, Any]]:
    """The columns of the rows a native window's aggregation reads, as ``(name,
    pyarrow type)``: ``key`` (the key's canonical bytes), ``ts`` (the shifted event time,
    :func:`time_shift`), ``seq`` and ``sub`` (the source position and the output's rank
    among that record's outputs: the order of ``first`` and ``last``) and one value column
    ``v<i>`` per aggregation."""
    import pyarrow as pa

    return [("key", pa.binary()), ("ts", pa.timestamp("us", tz="UTC")), ("seq", pa.int64()),
            ("sub", pa.int32()),
            *[(f"v{i}", pa.int64() if a.dtype == "int" else pa.float64())
              for i, a in enumerate(window.aggregations)]]


def _spark_type(dtype: str) -> str:
    return "bigint" if dtype == "int" else "double"


def _duration(seconds: float) -> str:
    return f"{round(seconds * 1_000_000)} microseconds"


def _aggregate(i: int, a: BuiltinAggregate) -> Column:
    from pyspark.sql import functions as F

    v = F.col(f"v{i}")
    order = F.when(v.isNotNull(), F.struct("seq", "sub"))
    column = {
        "count": F.count(F.lit(1)) if a.field is None else F.count(v),
        "sum": F.sum(v), "mean": F.avg(v), "min": F.min(v), "max": F.max(v),
        "first": F.min_by(v, order), "last": F.max_by(v, order),
    }[a.kind]
    return column.alias(f"a{i}")


def native_columns(plan: QueryPlan, window: NativeWindow) -> tuple[Any, str]:
    """The first chain of a native window plan, run by the source's reader: the records'
    :data:`~.record_chain.Chunk` s through the steps before ``key_by`` to the rows the
    aggregation reads (:func:`native_row_fields`).

    Args:
        plan: the plan (its keyed step is the window).
        window: its native form (:func:`native_window`).

    Returns:
        ``(function, Spark DDL schema of its rows)`` for
        :func:`~.stream_source.source_options`'s ``then`` and ``schema``.
    """
    values = ", ".join(f"v{i} {_spark_type(a.dtype)}"
                       for i, a in enumerate(window.aggregations))
    return (_records_to_columns(plan, window),
            f"key binary, ts timestamp, seq bigint, sub int, {values}")


def native_aggregate(rows: DataFrame, plan: QueryPlan, window: NativeWindow,
                     encoder: Any) -> DataFrame:
    """The aggregation of a native window plan, from the rows its first chain
    makes (``key, ts, seq, sub, v0, v1, ...``: :func:`native_row_fields`), to the sink's
    rows.

    Args:
        rows: the streaming DataFrame of those rows.
        plan: the plan (its keyed step is the window).
        window: its native form (:func:`native_window`).
        encoder: the sink's :class:`~.record_chain.SinkEncoder`.

    Returns:
        the DataFrame of the sink's rows, in append mode.
    """
    from pyspark.sql import functions as F

    delay_ms = round(window.delay * 1000)
    grouped = (rows.withWatermark("ts", f"{delay_ms} milliseconds")
               .groupBy(F.window("ts", _duration(window.size), _duration(window.size),
                                 _duration(window.offset)).alias("w"), "key")
               .agg(*[_aggregate(i, a) for i, a in enumerate(window.aggregations)]))
    shift = time_shift(window)
    results = grouped.select("key", (F.unix_micros(F.col("w.start")) - shift).alias("start"),
                             (F.unix_micros(F.col("w.end")) - shift).alias("end"),
                             *[f"a{i}" for i in range(len(window.aggregations))])
    return results.mapInArrow(_windows_to_sink(plan, encoder), encoder.spark_schema())


def _records_to_columns(plan: QueryPlan, window: NativeWindow) -> Any:
    """The chain before the aggregation: source records (:data:`~.record_chain.Chunk` s)
    through the steps, as ``key, ts, seq, sub`` and one typed column per aggregated field; records late
    against the records before them in the micro-batch are dropped here (see the module
    docstring)."""
    steps = plan.before_key
    assert plan.keyed is not None
    key_of = plan.keyed.key_selector
    key_serializer = plan.keyed.key_serializer
    name, uid = plan.keyed.name, plan.keyed.uid
    extractors = [a.extractor() for a in window.aggregations]
    types = [a.dtype for a in window.aggregations]
    size, offset, delay = window.size, window.offset, window.delay
    shift = time_shift(window)
    fans_out = any(s.kind == "flat_map" for s in steps)  # a record may give several rows

    def run(chunks: Any) -> Any:
        import pyarrow as pa

        from reactive.errors import UserFunctionError
        from reactive.key_encoding import encode_key

        from .record_chain import END_OF_INPUT, END_OF_INPUT_TIME, run_chunk

        end_micros = int(END_OF_INPUT_TIME.timestamp() * 1_000_000)
        ts_type = pa.timestamp("us", tz="UTC")
        value_types = [pa.int64() if t == "int" else pa.float64() for t in types]
        names = ["key", "ts", "seq", "sub", *[f"v{i}" for i in range(len(types))]]
        # encode_key gives equal keys identical bytes, so each distinct key is encoded once
        # per task; a custom serializer is called for every record, as embedded
        keys_of = (_cached_keys(key_of, encode_key) if key_serializer is None
                   else _each_key(key_of, key_serializer.serialize))
        watermark = float("-inf")  # of the records before, in this micro-batch
        for records, _, batch_seqs in chunks:
            # the end-of-input marker is the reader's last row
            marker = batch_seqs[-1] if records and records[-1] is END_OF_INPUT else None
            if marker is not None:
                records, batch_seqs = records[:-1], batch_seqs[:-1]
            outs, times, seqs = run_chunk(steps, records, batch_seqs)
            tss: list[float] = times if times is not None else []
            if outs and times is None:  # translation puts assign_timestamps before key_by
                raise UserFunctionError(name, uid, 0, 1, outs[0],
                                        ValueError("a record without an event time"),
                                        f"record {seqs[0]}")
            # late: its window ended at or before the watermark (no lateness)
            late: list[bool] = []
            for t in tss:
                late.append(t - (t - offset) % size + size <= watermark)
                if t - delay > watermark:
                    watermark = t - delay
            if any(late):
                keep = [not x for x in late]
                outs = list(itertools.compress(outs, keep))
                tss = list(itertools.compress(tss, keep))
                seqs = list(itertools.compress(seqs, keep))
            index = [0]  # the output being keyed or read, for errors
            try:
                keys: list[bytes | None] = keys_of(outs, index)
                cols = [[None] * len(outs) if get is None else _values(get, outs, index)
                        for get in extractors]
            except Exception as exc:
                i = index[0]
                raise UserFunctionError(name, uid, 0, 1, outs[i], exc,
                                        f"record {seqs[i]}") from exc
            micros = [round(t * 1_000_000) + shift for t in tss]
            subs = _ranks(seqs) if fans_out else [0] * len(seqs)
            if marker is not None:
                keys.append(None)
                micros.append(end_micros)
                seqs.append(marker)
                subs.append(0)
                for c in cols:
                    c.append(None)
            if not seqs:
                continue
            yield pa.RecordBatch.from_arrays(
                [pa.array(keys, pa.binary()), pa.array(micros, pa.int64()).cast(ts_type),
                 pa.array(seqs, pa.int64()), pa.array(subs, pa.int32()),
                 *[pa.array(c, t) for c, t in zip(cols, value_types, strict=True)]],
                names=names)

    return run


#: distinct keys whose encoding a read task keeps (beyond, keys are encoded every time)
_KEY_CACHE = 1 << 16


def _cached_keys(key_of: Any, encode: Any) -> Any:
    """``(records, index) -> key bytes of each``, each distinct key encoded once (for an
    encoding that gives equal keys identical bytes); ``index[0]`` is the record at hand."""
    encoded: dict[Any, bytes] = {}

    def keys(records: list[Any], index: list[int]) -> list[bytes | None]:
        out: list[bytes | None] = []
        append = out.append
        for i, r in enumerate(records):
            index[0] = i
            k = key_of(r)
            try:
                data = encoded.get(k)
            except TypeError:  # unhashable: the encoder says why it cannot be a key
                append(encode(k))
                continue
            if data is None:
                data = encode(k)
                if len(encoded) < _KEY_CACHE:
                    encoded[k] = data
            append(data)
        return out

    return keys


def _each_key(key_of: Any, encode: Any) -> Any:
    """As :func:`_cached_keys`, every key encoded (a user's key serializer)."""

    def keys(records: list[Any], index: list[int]) -> list[bytes | None]:
        out: list[bytes | None] = []
        for i, r in enumerate(records):
            index[0] = i
            out.append(encode(key_of(r)))
        return out

    return keys


def _values(get: Any, records: list[Any], index: list[int]) -> list[Any]:
    """``get`` of each record; ``index[0]`` is the record at hand when it raises."""
    out: list[Any] = []
    append = out.append
    try:
        for r in records:
            append(get(r))
    except Exception:
        index[0] = len(out)
        raise
    return out


def _ranks(seqs: list[int | None]) -> list[int]:
    """Each output's rank among its source record's outputs (consecutive equal
    positions)."""
    out: list[int] = []
    before, rank = None, 0
    for s in seqs:
        rank = rank + 1 if s == before else 0
        out.append(rank)
        before = s
    return out


def _windows_to_sink(plan: QueryPlan, encoder: Any) -> Any:
    """The ``mapInArrow`` function after the aggregation: window rows as ``WindowResult``
    records, through the steps after the window, to the sink's rows."""
    steps = plan.after_key
    assert plan.keyed is not None
    key_serializer = plan.keyed.key_serializer

    def run(batches: Any) -> Any:
        from reactive.key_encoding import decode_key
        from reactive.windowing.functions import WindowResult

        from .record_chain import run_chunk

        decode = key_serializer.deserialize if key_serializer is not None else decode_key
        if key_serializer is None:  # decode_key's keys are immutable: one object per key
            decode = functools.lru_cache(maxsize=_KEY_CACHE)(decode_key)
        row = encoder.row
        for batch in batches:
            columns = [c.to_pylist() for c in batch.columns]
            keys, starts, ends, values = columns[0], columns[1], columns[2], columns[3:]
            tuples = zip(*values, strict=True) if values else itertools.repeat((), len(keys))
            results = [WindowResult(decode(data), start / 1_000_000, end / 1_000_000, value)
                       for data, start, end, value
                       in zip(keys, starts, ends, tuples, strict=True)
                       # a null key: the end-of-input marker's window
                       if data is not None]
            outs, _, _ = run_chunk(steps, results, [None] * len(results))
            if outs:
                yield encoder.batch(list(map(row, outs)))

    return run

