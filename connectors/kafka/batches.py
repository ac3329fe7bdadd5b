"""The Kafka source's columnar mode: the records of one fetch of one partition decoded into
one ``pyarrow.RecordBatch`` of a declared schema (the value's columns, then metadata
columns), with the records whose value does not decode set aside as dead letters (or
failing the job) with their partition and offset.

Values decode as JSON objects (``pyarrow.json``, one parse for the whole fetch: the values
joined by newlines, read against the value schema) or through a user decoder
``list[bytes | None] -> RecordBatch | Table`` (one row per value, in order). When a parse
fails or does not return one row per value, the fetch is bisected to find the bad records
(as the CSV source's columnar mode finds bad rows), so a fetch of good records costs one
parse and ``b`` bad ones cost ``O(b log n)`` parses.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from typing import Any

from reactive.errors import ConfigurationError, ReactiveError

from .records import KafkaDeadLetter

__all__ = ["METADATA_COLUMNS", "BatchDecoder", "KafkaBatchDecoder", "batch_schema"]

BatchDecoder = Callable[[list[bytes | None]], Any]
"""A user decoder of a fetch's values: ``list[bytes | None] -> pyarrow.RecordBatch`` (or
``Table``) of the value schema, one row per value, in order; it raises for a bad value."""

METADATA_COLUMNS = ("topic", "key", "partition", "offset", "timestamp")
"""The metadata a columnar Kafka source can add as columns (named as here)."""


def _metadata_types(pa: Any) -> dict[str, Any]:
    return {"topic": pa.string(), "key": pa.binary(), "partition": pa.int32(),
            "offset": pa.int64(), "timestamp": pa.timestamp("ms", tz="UTC")}


def batch_schema(value_schema: Any, metadata_columns: Sequence[str]) -> Any:
    """The schema of a columnar Kafka source's batches: ``value_schema``'s fields, then the
    ``metadata_columns`` (``topic`` string, ``key`` binary, ``partition`` int32, ``offset``
    int64, ``timestamp`` timestamp[ms, UTC]: Kafka's record timestamp).

    Raises:
        ConfigurationError: for a value schema that is no ``pyarrow.Schema``, an unknown
            metadata column, or one whose name a value column already has.
    """
    from reactive.extras import require

    pa = require("pyarrow", "columnar", "the Kafka source's columnar mode")
    if not isinstance(value_schema, pa.Schema):
        raise ConfigurationError("Kafka source: columnar=True needs value_schema, the "
                                 "pyarrow.Schema of the decoded values, got "
                                 f"{type(value_schema).__name__}")
    types = _metadata_types(pa)
    fields = list(value_schema)
    for name in metadata_columns:
        if name not in types:
            raise ConfigurationError(f"Kafka source: unknown metadata column {name!r}: use "
                                     f"some of {list(METADATA_COLUMNS)}")
        if value_schema.get_field_index(name) >= 0:
            raise ConfigurationError(
                f"Kafka source: the value schema has a column {name!r}, which the metadata "
                f"column of that name would shadow; leave {name!r} out of metadata_columns")
        fields.append(pa.field(name, types[name]))
    return pa.schema(fields)


class KafkaBatchDecoder:
    """Decodes the records of one fetch of one partition into a record batch.

    Args:
        value_schema: the ``pyarrow.Schema`` of the decoded values.
        metadata_columns: the metadata columns to add, in order (:data:`METADATA_COLUMNS`).
        decoder: a user decoder (:data:`BatchDecoder`), or None for JSON objects (fields the
            schema does not name are ignored, missing ones are null; a null value, a
            tombstone, is a row of nulls).
        dead_letters: set bad records aside as :class:`KafkaDeadLetter` s (True) or raise.
        operator: the source's name, for schema errors.

    Attributes:
        schema: the schema of the batches (:func:`batch_schema`).
    """

    def __init__(self, value_schema: Any, metadata_columns: Sequence[str],
                 decoder: BatchDecoder | None, dead_letters: bool,
                 operator: str = "kafka") -> None:
        self.schema = batch_schema(value_schema, metadata_columns)
        self.value_schema = value_schema
        self.metadata_columns = list(metadata_columns)
        self.decoder = decoder
        self.dead_letters = dead_letters
        self.operator = operator
        import pyarrow as pa

        self._pa = pa
        if decoder is None:
            import pyarrow.json as pj

            self._pj = pj
            self._parse_options = pj.ParseOptions(
                explicit_schema=value_schema, unexpected_field_behavior="ignore",
                newlines_in_values=True)
            # values without a newline of their own: pyarrow's faster line splitting
            self._line_options = pj.ParseOptions(
                explicit_schema=value_schema, unexpected_field_behavior="ignore",
                newlines_in_values=False)

    # ------------------------------------------------------------------ values
    def _decode_json(self, values: list[bytes | None]) -> Any:
        data = b"\n".join(b"{}" if v is None else v for v in values)
        if not data.strip():  # pyarrow reads no row from blank input
            raise ValueError("no JSON object")
        # one block for the whole fetch: an object never spans blocks
        options = self._pj.ReadOptions(use_threads=False, block_size=len(data) + 1)
        lines = data.count(b"\n") == len(values) - 1
        table = self._pj.read_json(
            io.BytesIO(data), read_options=options,
            parse_options=self._line_options if lines else self._parse_options)
        # a field the schema names but no row had comes back in the schema's type; the
        # columns come in the schema's order
        return table.select(self.value_schema.names)

    def _decode(self, values: list[bytes | None]) -> Any:
        """The values as a table of the value schema, one row per value.

        Raises:
            ValueError: when the values do not give one row each (a bad value among them).
            Exception: whatever the parse or the user decoder raised.
        """
        if self.decoder is None:
            out = self._decode_json(values)
        else:
            out = self.decoder(values)
            if isinstance(out, self._pa.RecordBatch):
                out = self._pa.Table.from_batches([out])
        if out.num_rows != len(values):
            raise ValueError(f"{len(values)} values decoded to {out.num_rows} rows")
        return out

    def _isolate(self, values: list[bytes | None], first: int,
                 good: list[Any], bad: list[tuple[int, str]]) -> None:
        """Decode ``values`` (starting at index ``first`` of the fetch), halving around the
        bad ones: good tables go to ``good`` in order, bad indices with reasons to ``bad``."""
        try:
            good.append(self._decode(values))
            return
        except ReactiveError:
            raise
        except Exception as exc:
            if len(values) == 1:
                bad.append((first, f"{type(exc).__name__}: {exc}"))
                return
        half = len(values) // 2
        self._isolate(values[:half], first, good, bad)
        self._isolate(values[half:], first + half, good, bad)

    # ------------------------------------------------------------------ batches
    def decode(self, topic: str, partition: int, records: list[Any]) -> list[Any]:
        """One record batch of :attr:`schema` for the fetched ``records`` of a partition
        (those that decode; carrying the position ``topic/partition@first offset``), then
        a :class:`KafkaDeadLetter` per record that does not.

        Args:
            topic: the partition's topic.
            partition: the partition.
            records: aiokafka ``ConsumerRecord`` s, in offset order (at least one).

        Returns:
            ``[batch, dead letter, ...]`` (no batch when no record decodes).

        Raises:
            ValueError: for a record that does not decode, without dead letters (naming the
                topic, partition, offset and the reason).
            SchemaMismatchError: when a user decoder returns another schema (naming the
                source, the column and the fetch's position).
        """
        from reactive.columnar.schema import check_batch, with_position

        pa = self._pa
        values = [r.value for r in records]
        good: list[Any] = []
        bad: list[tuple[int, str]] = []
        self._isolate(values, 0, good, bad)
        if bad and not self.dead_letters:
            index, reason = bad[0]
            r = records[index]
            raise ValueError(
                f"Kafka source: the record at {topic} partition {partition} offset "
                f"{r.offset} does not decode ({reason}); key={r.key!r:.80} "
                f"value={r.value!r:.200}; read with errors='dead_letter' to route such "
                "records to a dead-letter output")
        position = f"{topic}/{partition}@{records[0].offset}"
        out: list[Any] = []
        if bad:
            skip = {i for i, _ in bad}
            kept = [r for i, r in enumerate(records) if i not in skip]
        else:
            kept = records
        if kept:
            table = good[0] if len(good) == 1 else pa.concat_tables(good)
            columns = [c.combine_chunks() if c.num_chunks != 1 else c.chunk(0)
                       for c in table.columns]
            if not table.schema.equals(self.value_schema, check_metadata=False):
                # a user decoder's output: name the column that differs and the fetch
                check_batch(with_position(pa.RecordBatch.from_arrays(
                    columns, names=table.column_names), position), self.value_schema,
                    self.operator)
            columns.extend(self._metadata(name, topic, partition, kept)
                           for name in self.metadata_columns)
            batch = with_position(pa.RecordBatch.from_arrays(columns, schema=self.schema),
                                  position)
            out.append(batch)
        for index, reason in bad:
            r = records[index]
            out.append(KafkaDeadLetter(topic, partition, r.offset, r.timestamp / 1000.0,
                                       r.key, r.value, reason))
        return out

    def _metadata(self, name: str, topic: str, partition: int, records: list[Any]) -> Any:
        pa = self._pa
        n = len(records)
        if name == "offset":
            return pa.array([r.offset for r in records], pa.int64())
        if name == "timestamp":
            return pa.array([r.timestamp for r in records], pa.int64()).cast(
                self.schema.field("timestamp").type)
        if name == "key":
            return pa.array([r.key for r in records], pa.binary())
        if name == "partition":
            return pa.repeat(pa.scalar(partition, pa.int32()), n)
        return pa.repeat(pa.scalar(topic, pa.string()), n)
