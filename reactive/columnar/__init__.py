"""Columnar (vectorized) execution: streams of Arrow record batches with a declared schema,
vectorized filter / projection / ``map_batches``, a vectorized ``key_by`` exchange that
agrees with the per-record one, and keyed aggregation with columnar state snapshotted per
key group (the ``columnar`` extra: pyarrow and numpy).

Entry points: ``Dataflow.from_arrow(table, batch_size=...)``, ``Stream.to_columnar(schema)``,
and the methods of :class:`ColumnarStream` (``assign_timestamps(column)``, ``key_by(*columns)
.agg(...)``, ``key_by(...).window(assigner, timestamp=column).agg(...)``).
"""

from .max_rows import MaxRows
from .schema import SchemaMismatchError
from .source import ArrowSource
from .stream import ColumnarStream, KeyedColumnarStream
from .user_aggregates import VectorizedAggregateFunction
from .window_stream import ColumnarWindowedStream

__all__ = ["ArrowSource", "ColumnarStream", "ColumnarWindowedStream", "KeyedColumnarStream",
           "MaxRows", "SchemaMismatchError", "VectorizedAggregateFunction"]
