"""The fluent API of columnar streams: record batches with a declared schema.

```python
flow = Dataflow("counts")
(flow.from_arrow(table, batch_size=65_536)          # a ColumnarStream
     .filter(pc.field("word") != "")
     .key_by("word")
     .agg(count=("word", "count"))                  # a running count per row
     .to_records()                                  # back to a per-record Stream
     .sink(results))
```

A :class:`ColumnarStream` is to record batches what a :class:`~reactive.dataflow.Stream`
is to records: its elements are ``pyarrow.RecordBatch`` es of :attr:`ColumnarStream.schema`,
its operators run once per record batch, and they run in the same tasks, channels, barriers
and watermarks as any stream (a record batch is one element of a channel batch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from ..errors import ConfigurationError
from ..graph import Edge, GraphBuilder, Transformation
from ..state.ttl_config import StateTtlConfig
from .operators import (
    ColumnarFilterOperator,
    MapBatchesOperator,
    ProjectOperator,
    ToRecordsOperator,
)
from .partitioning import ColumnKeySelector
from .schema import pa, pc

if TYPE_CHECKING:
    from ..sinks import Sink
    from ..windowing.assigners import WindowAssigner
    from .window_stream import ColumnarWindowedStream

StreamOf = Callable[[Transformation], Any]
"""Makes the per-record stream (``reactive.dataflow.Stream``) of a transformation: the
dataflow module passes it in, so this module does not import it (no import circle)."""

__all__ = ["ColumnarStream", "KeyedColumnarStream"]


class ColumnarStream:
    """A stream of ``pyarrow.RecordBatch`` es with a declared schema.

    Args:
        flow: the dataflow being built.
        transformation: the operator producing the stream.
        schema: the ``pyarrow.Schema`` of every batch.
        stream_of: transformation -> its per-record ``Stream`` (``to_records``, ``sink``).
        primary: the stateful operator whose name, uid and parallelism this stream's
            configuration sets, when the stream is the output of an operator after it
            (a window's results).
    """

    def __init__(self, flow: GraphBuilder, transformation: Transformation, schema: Any,
                 stream_of: StreamOf, primary: Transformation | None = None) -> None:
        self.flow = flow
        self.transformation = transformation
        self.schema = schema
        self.stream_of = stream_of
        self.primary = primary
        # a columnar source's own transformation, whose non-batch records are dead letters
        self.dead_letter_input: Transformation | None = None
        # each record batch is a channel batch of its own: the channels' bounds then pace
        # the producer and barriers pass between record batches (a channel batch of up to
        # the dataflow's batch_size record batches would hold a source's whole input)
        transformation.batch_size = 1

    def _then(self, kind: str, name: str | None, factory: Callable[[Transformation], Any],
              schema: Any, edge: Edge | None = None) -> ColumnarStream:
        t = self.flow._add(kind, name, factory, [edge or Edge(self.transformation, "forward")])
        return ColumnarStream(self.flow, t, schema, self.stream_of)

    # configuration of the last operator
    def name(self, name: str) -> ColumnarStream:
        """Set the operator's display name."""
        (self.primary or self.transformation).name = name
        return self

    def uid(self, uid: str) -> ColumnarStream:
        """Set the operator's stable id (its snapshots are keyed by it)."""
        if self.primary is not None:
            self.primary.uid = uid
            self.transformation.uid = f"{uid}/results"
        else:
            self.transformation.uid = uid
        return self

    def set_parallelism(self, parallelism: int) -> ColumnarStream:
        """Set the operator's parallelism.

        Raises:
            ConfigurationError: if < 1, or above what the operator supports.
        """
        self.as_stream().set_parallelism(parallelism)
        if self.primary is not None:
            self.primary.parallelism = parallelism
        return self

    def as_stream(self) -> Any:
        """This stream as a plain :class:`~reactive.dataflow.Stream` whose records are the
        record batches (for operators without a columnar form)."""
        return self.stream_of(self.transformation)

    # transformations
    def filter(self, expression: Any, name: str | None = None) -> ColumnarStream:
        """Keep the rows where ``expression`` (a boolean ``pyarrow.compute.Expression``,
        e.g. ``pc.field("delay") > 0``) is true; null counts as false.

        Raises:
            ConfigurationError: if ``expression`` is not an Expression.
        """
        if not isinstance(expression, pc.Expression):
            raise ConfigurationError(
                f"filter takes a pyarrow.compute.Expression, got {type(expression).__name__} "
                "(use map_batches for a Python function over a batch)")
        # a boolean column alone: filter by it as a mask (no expression to evaluate)
        mask = next((f.name for f in self.schema if pa.types.is_boolean(f.type)
                     and expression.equals(pc.field(f.name))), None)
        return self._then("columnar_filter", name,
                          lambda t: ColumnarFilterOperator(t.name, t.resolved_uid, expression,
                                                           mask),
                          self.schema)

    def select(self, *columns: str, name: str | None = None, **expressions: Any
               ) -> ColumnarStream:
        """Project: keep ``columns`` by name and add ``name=expression`` columns computed by
        ``pyarrow.compute`` expressions (``select("word", n=pc.field("n") * 2)``).

        Raises:
            ConfigurationError: for an unknown column, or when nothing is selected.
        """
        for c in columns:
            if self.schema.get_field_index(c) < 0:
                raise ConfigurationError(f"select: no column {c!r} in {self.schema.names}")
        if not columns and not expressions:
            raise ConfigurationError("select: name at least one column or expression")
        names = list(columns) + list(expressions)
        exprs = None
        if expressions:
            exprs = [pc.field(c) for c in columns] + list(expressions.values())
        schema = _projected_schema(self.schema, names, exprs)
        return self._then("columnar_select", name,
                          lambda t: ProjectOperator(t.name, t.resolved_uid, names, exprs), schema)

    def map_batches(self, fn: Callable[[Any], Any], schema: Any = None,
                    name: str | None = None) -> ColumnarStream:
        """``fn(record_batch) -> record_batch``, once per batch (vectorized user code: numpy,
        pyarrow.compute ...). Every result must have ``schema`` (default: this stream's); a
        result that does not fails the job naming the operator, the column and the source
        position.
        """
        out_schema = self.schema if schema is None else schema
        return self._then("map_batches", name,
                          lambda t: MapBatchesOperator(t.name, t.resolved_uid, fn, out_schema),
                          out_schema)

    def assign_timestamps(self, column: str, max_out_of_orderness: float = 0.0,
                          idleness: float | None = None, name: str | None = None
                          ) -> ColumnarStream:
        """Event time from ``column`` and watermarks with bounded out-of-orderness (the
        per-record ``Stream.assign_timestamps`` over a column): each instance emits ``max
        timestamp - max_out_of_orderness``, and cuts a batch before a row behind the
        watermark of the rows before it, so rows are late exactly as with one watermark per
        row.

        Args:
            column: the timestamp column: seconds (an integer or floating column) or an
                Arrow ``timestamp``.
            max_out_of_orderness: tolerated disorder (seconds, >= 0).
            idleness: seconds without rows after which the instance is idle (None: never).

        Raises:
            ConfigurationError: for an unknown or non-time column, a negative delay or a
                non-positive idleness.
        """
        from .watermarks import ColumnarTimestampsOperator

        if self.schema.get_field_index(column) < 0:
            raise ConfigurationError(f"assign_timestamps: no column {column!r} in "
                                     f"{self.schema.names}")
        t = self.schema.field(column).type
        if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_timestamp(t)):
            raise ConfigurationError(f"assign_timestamps: column {column!r} is {t}: give "
                                     "seconds (a number) or an Arrow timestamp")
        flow = self.flow
        # validate now, not when the job starts
        ColumnarTimestampsOperator("", "", column, max_out_of_orderness, idleness,
                                   flow.processing_clock)
        return self._then("assign_timestamps", name,
                          lambda t: ColumnarTimestampsOperator(
                              t.name, t.resolved_uid, column, max_out_of_orderness,
                              idleness, flow.processing_clock), self.schema)

    def key_by(self, *columns: str) -> KeyedColumnarStream:
        """Partition by the values of ``columns``: a row lands in the key group (and the
        instance) its key has through the per-record ``Stream.key_by`` (the key is the
        column's value, or the tuple of the values for several columns).

        Raises:
            ConfigurationError: for no column or an unknown one.
        """
        if not columns:
            raise ConfigurationError("key_by: name at least one key column")
        for c in columns:
            if self.schema.get_field_index(c) < 0:
                raise ConfigurationError(f"key_by: no column {c!r} in {self.schema.names}")
        return KeyedColumnarStream(self, list(columns))

    def dead_letters(self, name: str | None = None) -> Any:
        """The records a columnar source emitted beside its batches (a per-record
        ``Stream``): the ``InvalidRow`` s of ``CsvFileSource(..., columnar=True,
        errors="dead_letter")``, with their byte offsets.

        Raises:
            ConfigurationError: on a stream that is not a columnar source's.
        """
        from .source import SourceOutput

        source = self.dead_letter_input
        if source is None:
            raise ConfigurationError("dead_letters() applies to the stream of "
                                     "Dataflow.columnar_source(...)")
        t = self.flow._add("columnar_source_dead_letters", name or f"{source.name}-dead-letters",
                           lambda t: SourceOutput(t.name, t.resolved_uid, batches=False),
                           [Edge(source, "forward")])
        return self.stream_of(t)

    def to_records(self, name: str | None = None) -> Any:
        """A per-record ``Stream`` of the rows, each a ``dict`` (column -> value)."""
        t = self.flow._add("to_records", name,
                           lambda t: ToRecordsOperator(t.name, t.resolved_uid),
                           [Edge(self.transformation, "forward")])
        return self.stream_of(t)

    def sink(self, sink: Sink | Callable[[Any], Any], name: str | None = None) -> Any:
        """Send the record batches to a sink (its writer receives lists of record
        batches)."""
        return self.as_stream().sink(sink, name)


class KeyedColumnarStream:
    """A columnar stream partitioned by key columns (after ``key_by``)."""

    def __init__(self, stream: ColumnarStream, columns: list[str]) -> None:
        self.stream = stream
        self.columns = columns

    def _edge(self) -> Edge:
        return Edge(self.stream.transformation, "hash", ColumnKeySelector(self.columns))

    def window(self, assigner: WindowAssigner, timestamp: str) -> ColumnarWindowedStream:
        """Cut the keyed stream into event-time windows over the ``timestamp`` column:
        ``TumblingEventTimeWindows.of(size)``, ``SlidingEventTimeWindows.of(size, slide)``
        or ``EventTimeSessionWindows.with_gap(gap)`` (seconds); end it with ``.agg(...)``
        (see :mod:`.window_stream`). Watermarks come from ``assign_timestamps`` upstream.

        Raises:
            ConfigurationError: for another assigner, or an unknown or non-time column.
        """
        from .window_stream import ColumnarWindowedStream

        return ColumnarWindowedStream(self, assigner, timestamp)

    def agg(self, emit: Literal["changelog", "final"] = "changelog",
            name: str | None = None, ttl: float | StateTtlConfig | None = None,
            **aggregates: tuple[str, Any]) -> ColumnarStream:
        """Keyed aggregation over the batches: ``agg(count=("word", "count"),
        total=("amount", "sum"))``, with ``count``, ``sum``, ``mean``, ``min``, ``max``,
        ``first``, ``last`` (nulls skipped, as SQL's aggregates), or a user-defined
        :class:`~reactive.columnar.user_aggregates.VectorizedAggregateFunction` in place of
        the function's name (in changelog mode it is updated once per row).

        Args:
            emit: ``"changelog"``: one output row per input row, the key columns and each
                aggregate's value including that row (a running count); ``"final"``: one
                row per key at the end of the input.
            name: the operator's display name.
            ttl: the keys' time to live (Flink's ``StateTtlConfig``): seconds, or a
                :class:`~reactive.state.ttl_config.StateTtlConfig` (``clock``: a manual one
                in tests). A key not written for ``ttl`` seconds of processing time is
                expired: seen again, it starts from a fresh accumulator; it is left out of
                snapshots and of the final output. Every row of a record batch is written
                at the batch's time (the clock is read once per batch). On RocksDB each
                stored row carries its key's last-write time, and expired rows are deleted
                from the store as batches go by (an incremental sweep).
            aggregates: ``output_column=(input_column, function)``, the function a name or
                a ``VectorizedAggregateFunction``.

        Returns:
            The columnar stream of the key columns and the aggregates.

        Raises:
            ConfigurationError: for an unknown function or column, no aggregate, or a ttl
                with event time or ``visibility="return_expired_if_not_cleaned_up"`` (an
                aggregation folds every row into its key's value, so a returned expired
                value would be counted on).
        """
        from .aggregate_operator import ColumnarAggregateOperator
        from .aggregates import parse_aggregates

        schema = self.stream.schema
        specs = parse_aggregates(schema, aggregates)
        if emit not in ("changelog", "final"):
            raise ConfigurationError(f"emit must be 'changelog' or 'final', got {emit!r}")
        out_schema = pa.schema([schema.field(c) for c in self.columns]
                               + [s.output_field() for s in specs])
        columns = self.columns
        config = _agg_ttl(ttl)
        return self.stream._then(
            "columnar_agg", name,
            lambda t: ColumnarAggregateOperator(t.name, t.resolved_uid, columns, specs, emit,
                                                out_schema, config),
            out_schema, edge=self._edge())


def _agg_ttl(ttl: float | StateTtlConfig | None) -> StateTtlConfig | None:
    """The time to live of a columnar aggregation, checked (see ``agg``).

    Raises:
        ConfigurationError: for a bad ttl or an option the aggregation cannot keep.
    """
    if ttl is None:
        return None
    config = ttl if isinstance(ttl, StateTtlConfig) else StateTtlConfig(ttl)
    if config.time_characteristic != "processing_time":
        raise ConfigurationError(
            "agg(ttl=...): a columnar aggregation's time to live is processing time; "
            f"got time_characteristic={config.time_characteristic!r}")
    if config.visibility != "never_return_expired":
        raise ConfigurationError(
            "agg(ttl=...): a columnar aggregation never returns an expired value (a key "
            "seen again starts from a fresh accumulator); got "
            f"visibility={config.visibility!r}")
    return config


def _projected_schema(schema: Any, names: list[str], exprs: list[Any] | None) -> Any:
    """The schema a projection produces (evaluated on an empty batch of ``schema``)."""
    empty = pa.RecordBatch.from_pylist([], schema=schema)
    return ProjectOperator("select", "select", names, exprs)._project(empty).schema \
        .remove_metadata()
