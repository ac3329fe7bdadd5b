"""Per-record functions and sink rows inside Spark's Python workers: a chain of ``map`` /
``filter`` / ``flat_map`` / ``assign_timestamps`` steps run over a batch of records, and the
records a sink receives turned into the rows of Spark's file sink.

The source's reader runs the first chain of steps itself, on the records it has just read
(:func:`row_chunks`; no pickling, no extra pass through the JVM). Between the later stages
of a query a record travels as its pickle in a ``record binary`` column
(any Python object, as in the embedded runtime), beside ``seq`` (its source position, for
the order of a key's records), ``ts`` (its event time) and ``key`` (the canonical bytes of
its key). A row whose ``record`` is null is the source's end-of-input marker: it passes
every step untouched and carries the maximal event time, so the watermark moves past every
timer once the input is consumed (the final watermark of Flink's bounded streams, FLIP-147).
"""

from __future__ import annotations

import datetime
import itertools
import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from reactive.errors import UserFunctionError
from reactive.runtime.operators.base import refuse_text

from .translation import RecordStep, SinkStep

__all__ = ["END_OF_INPUT", "END_OF_INPUT_TIME", "Chunk", "SinkEncoder", "row_chunks",
           "run_chunk", "run_steps"]

END_OF_INPUT_TIME = datetime.datetime(9999, 12, 31, tzinfo=datetime.UTC)
"""The event time of the end-of-input marker: past any record's."""


class _EndOfInput:
    """The type of :data:`END_OF_INPUT`."""

    def __repr__(self) -> str:
        return "END_OF_INPUT"


END_OF_INPUT = _EndOfInput()
"""The end-of-input marker among the records a source's reader hands its first chain of
steps (any record, None included, is data; a pickled batch has a null ``record``)."""

#: records, their event times (None, or :data:`END_OF_INPUT_TIME` for the marker) and
#: source positions, as three lists of equal length
Chunk = tuple[list[Any], list[Any], list[int]]

_CHUNK_ROWS = 8192


def row_chunks(rows: Iterator[tuple[Any, Any, int]], size: int = _CHUNK_ROWS
               ) -> Iterator[Chunk]:
    """``(record, ts, seq)`` rows as :data:`Chunk` s of at most ``size`` rows (the unit of
    an Arrow batch a first chain of steps emits)."""
    while chunk := list(itertools.islice(rows, size)):
        records, tss, seqs = zip(*chunk, strict=True)
        yield list(records), list(tss), list(seqs)


class ChunkedRead:
    """``read`` for a stream reader whose partitions it reads as :data:`Chunk` s
    (``_chunks``): handed to the first chain of steps (``then``) when the plan has one, else
    as ``(record, ts, seq)`` rows to ``emit`` (the data source's Arrow record batches).
    Listed before ``DataSourceStreamReader`` among a reader's bases."""

    emit: Callable[[Iterator[tuple[Any, ...]]], Iterator[Any]]
    then: Callable[[Iterator[Chunk]], Iterator[Any]] | None

    def _chunks(self, partition: Any) -> Iterator[Chunk]:
        raise NotImplementedError

    def read(self, partition: Any) -> Iterator[Any]:
        if self.then is not None:
            return self.then(self._chunks(partition))
        return self.emit(self._rows(partition))

    def _rows(self, partition: Any) -> Iterator[tuple[Any, ...]]:
        for records, tss, seqs in self._chunks(partition):
            yield from zip(records, tss, seqs, strict=True)


def _subtask() -> int:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx.partitionId() if ctx is not None else 0


def run_steps(steps: list[RecordStep], record: Any, ts: float | None,
              position: Any = None) -> Iterator[tuple[Any, float | None]]:
    """Run ``steps`` on one record; yields ``(output, event time)`` pairs.

    Args:
        steps: the chain (``map``, ``filter``, ``flat_map``, ``timestamps``).
        record: the input record.
        ts: its event time in seconds (None before ``assign_timestamps``).
        position: where the record came from (the source position), for errors.

    Raises:
        UserFunctionError: naming the operator, the record and its position, when a user
            function raises or a flat_map returns something other than an iterable (or a
            string or bytes, which would be taken apart into characters).
    """
    pending: list[tuple[int, Any, float | None]] = [(0, record, ts)]
    n = len(steps)
    while pending:
        i, r, t = pending.pop()
        while i < n:
            step = steps[i]
            try:
                if step.kind == "map":
                    r = step.fn(r)
                elif step.kind == "filter":
                    if not step.fn(r):
                        break
                elif step.kind == "timestamps":
                    t = float(step.fn(r))
                else:  # flat_map: the outputs continue from the next step, in order
                    outs = step.fn(r)
                    refuse_text(outs, "the flat_map function")  # as the runtime does
                    outs = [] if outs is None else list(outs)
                    pending.extend((i + 1, o, t) for o in reversed(outs))
                    break
            except Exception as exc:
                raise UserFunctionError(step.name, step.uid, _subtask(), 1, r, exc,
                                        position) from exc
            i += 1
        else:
            yield r, t


def run_chunk(steps: list[RecordStep], records: Sequence[Any], seqs: Sequence[int | None]
              ) -> tuple[list[Any], list[float] | None, list[int | None]]:
    """Run ``steps`` over a chunk of source records, one step at a time over the whole
    chunk (a loop per step, not a generator per record: what :func:`run_steps` does per
    record, several times cheaper for the short chains before a keyed operator or a sink).

    The outputs are those of :func:`run_steps` on each record in turn, in the same order;
    the user functions are called step by step (each step over the chunk, then the next),
    so functions with side effects shared across steps see another interleaving than
    record by record.

    Args:
        steps: the chain (``map``, ``filter``, ``flat_map``, ``timestamps``).
        records: the source records (no end-of-input marker).
        seqs: their source positions, as many (None: not known, as for a window's
            results).

    Returns:
        ``(outputs, event times, positions)``: the event times (seconds) are None when no
        ``timestamps`` step ran; each output's position is its source record's.

    Raises:
        UserFunctionError: as :func:`run_steps`, for the first record (in chunk order)
            whose function raised in the first step that failed.
    """
    out: list[Any] = list(records)
    positions: list[int | None] = list(seqs)
    tss: list[float] | None = None
    for step in steps:
        if step.kind == "flat_map":
            out, positions, tss = _flat_map_chunk(step, out, positions, tss)
            continue
        values = _call_each(step, out, positions)
        if step.kind == "map":
            out = values
        elif step.kind == "filter":
            if not all(values):
                out = list(itertools.compress(out, values))
                positions = list(itertools.compress(positions, values))
                if tss is not None:
                    tss = list(itertools.compress(tss, values))
        else:  # timestamps
            try:
                tss = list(map(float, values))
            except (TypeError, ValueError):
                tss = _call_each(step, values, positions, out, float)
    return out, tss, positions


def _where(position: int | None) -> str | None:
    return None if position is None else f"record {position}"


def _call_each(step: RecordStep, inputs: list[Any], positions: list[int | None],
               records: list[Any] | None = None, fn: Callable[[Any], Any] | None = None
               ) -> list[Any]:
    """``fn`` (default: the step's function) of each input, in order; a raise names the
    step, the record (``records[i]``, default the input) and its source position."""
    call = step.fn if fn is None else fn
    values: list[Any] = []
    append = values.append
    try:
        for r in inputs:
            append(call(r))
    except Exception as exc:
        i = len(values)
        record = inputs[i] if records is None else records[i]
        raise UserFunctionError(step.name, step.uid, _subtask(), 1, record, exc,
                                _where(positions[i])) from exc
    return values


def _flat_map_chunk(step: RecordStep, records: list[Any], positions: list[int | None],
                    tss: list[float] | None
                    ) -> tuple[list[Any], list[int | None], list[float] | None]:
    """A ``flat_map`` over a chunk: every output of each record, in order, with the
    record's position and event time."""
    out: list[Any] = []
    out_positions: list[int | None] = []
    out_tss: list[float] | None = None if tss is None else []
    fn = step.fn
    for i, r in enumerate(records):
        try:
            outs = fn(r)
            refuse_text(outs, "the flat_map function")  # as the runtime does
            outs = [] if outs is None else list(outs)
        except Exception as exc:
            raise UserFunctionError(step.name, step.uid, _subtask(), 1, r, exc,
                                    _where(positions[i])) from exc
        out.extend(outs)
        out_positions.extend([positions[i]] * len(outs))
        if out_tss is not None and tss is not None:
            out_tss.extend([tss[i]] * len(outs))
    return out, out_positions, out_tss


class SinkEncoder:
    """The rows of Spark's file sink for the records a committing file sink receives.

    JSON lines become one ``value`` string column written with Spark's text format (the
    same compact JSON the embedded sink writes); parquet records (dicts by column name,
    tuples by position, or a scalar for a one-column schema) become the sink's columns.

    Args:
        sink: the sink step.
    """

    def __init__(self, sink: SinkStep) -> None:
        self.sink = sink
        if sink.format == "jsonl":
            self.names = ["value"]
            self.spark_format = "text"
        else:
            self.names = list(sink.schema.names)
            self.spark_format = "parquet"
        self._dumps: Callable[[Any], str] = json.JSONEncoder(
            separators=(",", ":"), ensure_ascii=False).encode

    def spark_schema(self) -> Any:
        """The rows' Spark ``StructType``."""
        from pyspark.sql.pandas.types import from_arrow_schema
        from pyspark.sql.types import StringType, StructField, StructType

        if self.sink.format == "jsonl":
            return StructType([StructField("value", StringType(), True)])
        return from_arrow_schema(self.sink.schema)

    def arrow_schema(self) -> Any:
        """The rows' ``pyarrow.Schema``."""
        import pyarrow as pa

        if self.sink.format == "jsonl":
            return pa.schema([("value", pa.string())])
        return self.sink.schema

    def row(self, record: Any) -> tuple[Any, ...]:
        """One record as a row (a tuple in column order).

        Raises:
            UserFunctionError: naming the sink and the record, when it cannot be encoded
                (a value JSON cannot write, a record of the wrong shape).
        """
        try:
            if self.sink.format == "jsonl":
                return (self._dumps(record),)
            if isinstance(record, dict):
                return tuple(map(record.get, self.names))
            if isinstance(record, tuple | list):
                if len(record) != len(self.names):
                    raise ValueError(f"a record of {len(record)} fields for the "
                                     f"{len(self.names)} columns {self.names}")
                return tuple(record)
            if len(self.names) != 1:
                raise ValueError(f"a scalar record for the {len(self.names)} columns "
                                 f"{self.names}")
            return (record,)
        except (TypeError, ValueError) as exc:
            raise UserFunctionError(self.sink.name, self.sink.uid, _subtask(), 1, record,
                                    exc) from exc

    def batch(self, rows: list[tuple[Any, ...]]) -> Any:
        """Rows as a ``pyarrow.RecordBatch`` of the sink's schema.

        Raises:
            UserFunctionError: naming the sink and the first row that does not fit.
        """
        import pyarrow as pa

        schema = self.arrow_schema()
        try:
            arrays = [pa.array([r[i] for r in rows], type=f.type)
                      for i, f in enumerate(schema)]
            return pa.RecordBatch.from_arrays(arrays, schema=schema)
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
            bad = _first_bad_row(rows, schema)
            raise UserFunctionError(self.sink.name, self.sink.uid, _subtask(), 1, bad,
                                    ValueError(f"does not fit the schema {schema}: {exc}")
                                    ) from exc


def _first_bad_row(rows: list[tuple[Any, ...]], schema: Any) -> Any:
    import pyarrow as pa

    for r in rows:
        try:
            for v, f in zip(r, schema, strict=True):
                pa.array([v], type=f.type)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            return r
    return rows[0] if rows else None
