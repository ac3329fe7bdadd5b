"""Event-time joins as Spark stream-stream inner joins: the interval join
(``a.key_by(f).interval_join(b.key_by(g)).between(lower, upper).process(fn)``) and the window
join (``a.join(b).where(f).equal_to(g).window(assigner).apply(fn)``), with Spark's state
store holding each input's rows and Spark's watermarks cleaning it up.

The query: each input's source is read with its per-record steps run by the reader (Python,
as in every plan; :mod:`.stream_source`'s first chain), which also gives each record its
event time (seconds, exact, and as a Spark timestamp), the canonical bytes of its key and,
for the window join, one row per window of the record (the embedded assigner's windows,
start and end). Each input gets ``withWatermark`` from its ``assign_timestamps`` bound; the
query's watermark is their minimum (``multipleWatermarkPolicy=min``), as the embedded join's
is the minimum of its inputs'. Spark joins them on the key (and, for the window join, the
window) with a time-range condition on the timestamps (``r.ts BETWEEN l.ts + lower AND
l.ts + upper``; the window's size either way for the window join), which is what lets Spark
drop a row from its state once the watermark says no partner can still come (Spark's
"Inner Joins with optional Watermarking": watermark delays plus event-time range
conditions). A last ``mapInArrow`` checks each pair's exact bounds on the float event times
(Spark's timestamps are microseconds, and its range condition is widened by a millisecond
so that rounding never loses a pair) and runs the user's join function per pair in Python,
then the per-record steps after the join and the sink's encoding.

What equals the embedded run, row for row: every pair whose event times satisfy the join,
for input whose disorder stays within each ``assign_timestamps`` bound (no late rows); the
order of the results differs (the sink's rows are compared as a multiset). What differs,
and how the translation deals with it:

- Late rows (behind the watermark by more than the bound): embedded, a late row joins
  nothing (it goes to ``late_data()`` or is counted). Spark drops late input rows with a
  watermark of earlier micro-batches (it lags one micro-batch behind the watermark that
  cleans the state), so a late row may still join partners left in Spark's state. A
  join with ``late_data()`` is refused (Spark has no late output). So that no row within
  the bound is ever dropped, Spark's watermark delay is the bound rounded up to whole
  milliseconds plus one (Spark drops rows at or behind its watermark, embedded only rows
  strictly behind).
- Outer joins: the dataflow's joins are inner joins, as Spark's translation is; Spark's
  outer stream-stream joins emit their unmatched rows only as the watermark passes, which
  nothing here uses.
- The join function is arbitrary Python: it runs per matched pair after Spark's native
  join, never inside it. A ``ProcessJoinFunction`` gets its ``JoinContext`` (both
  timestamps, the key); one with ``open()`` is refused (no runtime context on Spark).

Spark's watermark starts at the epoch, so the event times Spark sees are shifted by
:data:`TIME_SHIFT_US` (about 317 years): records from the year 1653 on are never behind
Spark's first watermark. The shift changes no pair (the exact check uses the unshifted
times).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from .translation import Branch, JoinStep, RecordStep, SourceStep

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from .record_chain import SinkEncoder

__all__ = ["TIME_SHIFT_US", "join_frame", "spark_delay_ms"]

#: microseconds added to every event time Spark sees (see the module docstring)
TIME_SHIFT_US = 10**16
#: the widening of Spark's time-range condition, in microseconds (rounding margin)
_MARGIN_US = 1000
_SIDE_SCHEMA = "record binary, t double, ts timestamp, key binary"
_WINDOW_SCHEMA = _SIDE_SCHEMA + ", wstart double, wend double"
_COLUMNS = ("record", "t", "ts", "key")


def spark_delay_ms(bound: float) -> int:
    """The watermark delay Spark gets for an ``assign_timestamps`` bound (seconds): whole
    milliseconds, one more than the bound rounded up, so that a row the embedded watermark
    keeps (``t >= max - bound``) is never at or behind Spark's (which drops ``t <=
    watermark``)."""
    return math.ceil(bound * 1000) + 1


def join_frame(read: Callable[[SourceStep, Any, str], DataFrame], step: JoinStep,
               after: list[RecordStep], encoder: SinkEncoder) -> DataFrame:
    """The sink's rows of a join query.

    Args:
        read: ``read(source, then, schema)``: the source read with ``then`` as its first
            chain of steps, a streaming DataFrame of ``schema``.
        step: the translated join.
        after: the per-record steps between the join and the sink.
        encoder: the sink's row encoding.

    Returns:
        a streaming DataFrame of the sink's schema.
    """
    from pyspark.sql import functions as F

    op: Any = step.operator
    window = step.kind == "window_join"
    assigner = op.assigner if window else None
    frames = []
    for i, (prefix, branch) in enumerate(zip(("l_", "r_"), step.inputs, strict=True)):
        chain = _side_rows(branch, step.key_selectors[i], step.key_serializers[i], assigner,
                           step.name, step.uid)
        frame = read(branch.source, chain, _WINDOW_SCHEMA if window else _SIDE_SCHEMA)
        assert branch.watermark_delay is not None
        frame = frame.withWatermark(
            "ts", f"{spark_delay_ms(branch.watermark_delay)} milliseconds")
        names = [*_COLUMNS, *(("wstart", "wend") if window else ())]
        frames.append(frame.select(*[F.col(n).alias(prefix + n) for n in names]))
    if window:
        # two records of one window lie less than its size apart
        hi_us = round(float(op.assigner.size) * 1_000_000)
        lo_us = -hi_us
        on = "l_key = r_key AND l_wstart = r_wstart AND l_wend = r_wend AND "
    else:
        lo_us = math.floor(op.lower * 1_000_000)
        hi_us = math.ceil(op.upper * 1_000_000)
        on = "l_key = r_key AND "
    condition = (f"{on}r_ts >= l_ts + INTERVAL '{lo_us - _MARGIN_US}' MICROSECOND AND "
                 f"r_ts <= l_ts + INTERVAL '{hi_us + _MARGIN_US}' MICROSECOND")
    joined = frames[0].join(frames[1], F.expr(condition), "inner")
    pairs = joined.select("l_record", "l_t", "r_record", "r_t")
    return pairs.mapInArrow(_pairs_to_sink(step, after, encoder), encoder.spark_schema())


def _side_rows(branch: Branch, key_of: Callable[[Any], Any], key_serializer: Any,
               assigner: Any, name: str, uid: str) -> Any:
    """The reader's chain of one input: source records (:data:`~.record_chain.Chunk` s)
    through its steps, pickled, with their event time (exact and as a shifted Spark
    timestamp), the canonical bytes of their key and, for a window join, one row per
    window (``assigner``'s) of the record."""
    steps = branch.steps

    def run(chunks: Any) -> Iterator[Any]:
        import pickle

        import pyarrow as pa

        from reactive.errors import UserFunctionError
        from reactive.key_encoding import encode_key

        from .record_chain import END_OF_INPUT, run_steps

        encode = key_serializer.serialize if key_serializer is not None else encode_key
        dumps, proto = pickle.dumps, pickle.HIGHEST_PROTOCOL
        ts_type = pa.timestamp("us", tz="UTC")
        for records, _, seqs in chunks:
            out_r: list[bytes] = []
            out_t: list[float] = []
            out_k: list[bytes] = []
            starts: list[float] = []
            ends: list[float] = []
            for record, seq in zip(records, seqs, strict=True):
                if record is END_OF_INPUT:  # an inner join emits each pair at once
                    continue
                for r, t in run_steps(steps, record, None, f"record {seq}"):
                    assert t is not None  # the translation asks for assign_timestamps
                    try:
                        k = encode(key_of(r))
                        windows = assigner.assign_windows(t) if assigner is not None else (None,)
                    except Exception as exc:
                        raise UserFunctionError(name, uid, 0, 1, r, exc,
                                                f"record {seq}") from exc
                    payload = dumps(r, protocol=proto)
                    for w in windows:
                        out_r.append(payload)
                        out_t.append(t)
                        out_k.append(k)
                        if w is not None:
                            starts.append(float(w.start))
                            ends.append(float(w.end))
            shifted = [round(t * 1_000_000) + TIME_SHIFT_US for t in out_t]
            arrays = [pa.array(out_r, pa.binary()), pa.array(out_t, pa.float64()),
                      pa.array(shifted, pa.int64()).cast(ts_type), pa.array(out_k, pa.binary())]
            names = list(_COLUMNS)
            if assigner is not None:
                arrays += [pa.array(starts, pa.float64()), pa.array(ends, pa.float64())]
                names += ["wstart", "wend"]
            yield pa.RecordBatch.from_arrays(arrays, names=names)

    return run


def _pairs_to_sink(step: JoinStep, after: list[RecordStep], encoder: SinkEncoder) -> Any:
    """The ``mapInArrow`` function after Spark's join: each matched pair checked against the
    exact bounds (float seconds, as embedded), the join function run on it, its outputs
    through the steps after the join to the sink's rows."""
    op: Any = step.operator
    fn = op.fn
    window = step.kind == "window_join"
    bounds = None if window else (op.lower, op.upper, op.lower_inclusive, op.upper_inclusive)
    key_of = step.key_selectors[0]
    name, uid = step.name, step.uid

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pickle

        from reactive.errors import UserFunctionError
        from reactive.runtime.operators.base import GENERATOR, checked_outputs
        from reactive.two_input_functions import JoinContext, ProcessJoinFunction

        from .record_chain import _subtask, run_steps

        process = fn.process_element if isinstance(fn, ProcessJoinFunction) else None
        ctx = JoinContext()
        loads = pickle.loads
        row = encoder.row
        try:
            for batch in batches:
                rows: list[tuple[Any, ...]] = []
                columns = batch.to_pydict()
                for lb, lt, rb, rt in zip(columns["l_record"], columns["l_t"],
                                          columns["r_record"], columns["r_t"], strict=True):
                    if bounds is not None and not _within(rt - lt, *bounds):
                        continue
                    left, right = loads(lb), loads(rb)
                    try:
                        if process is None:
                            outs: Any = (fn(left, right),)
                        else:
                            ctx.current_key = key_of(left)
                            ctx.left_timestamp, ctx.right_timestamp = lt, rt
                            res = process(left, right, ctx)
                            outs = () if res is None else (
                                res if type(res) is list or type(res) is GENERATOR
                                else checked_outputs(res, "process_element"))
                            outs = list(outs)
                    except Exception as exc:
                        raise UserFunctionError(name, uid, _subtask(), 1, (left, right),
                                                exc) from exc
                    for out in outs:
                        rows.extend(row(r) for r, _ in run_steps(after, out, None))
                if rows:
                    yield encoder.batch(rows)
        finally:
            if process is not None:
                fn.close()

    return run


def _within(delta: float, lower: float, upper: float, lower_inclusive: bool,
            upper_inclusive: bool) -> bool:
    """Whether ``right time - left time`` lies within the interval join's bounds (the
    embedded operator's rule)."""
    if delta < lower or delta > upper:
        return False
    if delta == lower and not lower_inclusive:
        return False
    return not (delta == upper and not upper_inclusive)
