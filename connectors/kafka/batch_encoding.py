"""The Kafka sink's vectorized encoding: a ``pyarrow.RecordBatch`` turned into one Kafka
message value (and key) per row in a few calls per batch, byte for byte what the sink's
per-row path (``RecordBatch.to_pylist()``, then ``orjson.dumps`` per row) writes, so a
columnar stream and a per-record stream of the same rows put the same bytes into Kafka and
the columnar Kafka source (:mod:`.batches`, ``pyarrow.json`` against a schema) reads them
back into the same table.

JSON values are written by Polars' NDJSON writer (``DataFrame.write_ndjson``, Rust, no Python
object per row) when Polars is installed and every column has a type whose Polars text equals
orjson's: integers, float64, bool, strings, null, and timestamps of whole seconds (naive or
UTC), formatted first by Polars' ``strftime`` as orjson writes a ``datetime`` with no
microseconds. Any other batch is encoded by orjson in one call over the batch's rows (a JSON
array whose ``},{`` separators become the message boundaries when there are exactly
``rows - 1`` of them), and row by row when a string holds ``},{``.

CSV values (the sink's ``value_serializer="csv"``, record batches only: a CSV line has no
column names, so its types come from the batch's schema) are ``pyarrow.csv.write_csv``'s
lines of the batch, split at the line ends; the columnar source reads them back with a
``value_decoder`` over ``pyarrow.csv.read_csv`` and the same schema (see
``docs/kafka-sink-batches.md``).
"""

from __future__ import annotations

import io
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["encode_csv_values", "encode_json_values", "encode_keys", "is_record_batch",
           "json_values_by_polars"]


def _polars() -> Any:
    """Polars if installed (an optional accelerator, never required)."""
    try:
        import polars
    except ImportError:
        return None
    return polars


def _timestamp_formats(schema: Any) -> dict[str, str] | None:
    """The ``strftime`` format of each timestamp column, orjson's text of a ``datetime``
    without microseconds; None when a column has a type whose Polars NDJSON text may differ
    from orjson's (float32 prints shorter, sub-second timestamps, dates, decimals, nested
    types ...)."""
    import pyarrow as pa

    t = pa.types
    formats: dict[str, str] = {}
    for field in schema:
        typ = field.type
        if (t.is_integer(typ) or t.is_float64(typ) or t.is_boolean(typ) or t.is_null(typ)
                or t.is_string(typ) or t.is_large_string(typ)):
            continue
        if t.is_timestamp(typ) and typ.unit == "s" and typ.tz in (None, "UTC", "+00:00"):
            # orjson: 'YYYY-MM-DDTHH:MM:SS', then '+00:00' for an aware datetime at UTC
            formats[field.name] = "%Y-%m-%dT%H:%M:%S" + ("" if typ.tz is None else "+00:00")
            continue
        return None
    return formats


def json_values_by_polars(batch: Any) -> list[bytes] | None:
    """The rows of ``batch`` as compact JSON objects by Polars' NDJSON writer, or None when
    Polars is not installed or a column's type is not one it writes as orjson does."""
    pl = _polars()
    if pl is None or batch.num_rows == 0:
        return None
    formats = _timestamp_formats(batch.schema)
    if formats is None or len(set(batch.schema.names)) != batch.num_columns:
        return None
    frame = pl.from_arrow(batch)
    if formats:  # Polars' strftime (pyarrow.compute.strftime is ~70x slower here)
        frame = frame.with_columns(pl.col(name).dt.strftime(fmt)
                                   for name, fmt in formats.items())
    buffer = io.BytesIO()
    frame.write_ndjson(buffer)
    # JSON escapes a newline inside a string: each '\n' ends one row's object
    lines = buffer.getvalue().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines if len(lines) == batch.num_rows else None


def _json_values_by_orjson(rows: list[Any]) -> list[bytes]:
    from reactive.extras import require

    dumps = require("orjson", "kafka", "JSON records of Kafka").dumps
    if not rows:
        return []
    text: bytes = dumps(rows)
    # orjson writes a list as '[' + ','.join(items) + ']' (compact, no spaces)
    if text.count(b"},{") == len(rows) - 1:
        return text[1:-1].replace(b"},{", b"}\n{").split(b"\n")
    return list(map(dumps, rows))


def encode_json_values(batch: Any) -> list[bytes]:
    """Each row of ``batch`` (a ``pyarrow.RecordBatch``) as the bytes of one compact JSON
    object ``{"column": value, ...}``, equal to ``orjson.dumps(row)`` for ``row`` in
    ``batch.to_pylist()``.

    Raises:
        TypeError: (orjson's) for a value orjson cannot write (a decimal, a nanosecond
            timestamp that to_pylist turns into ``pandas.Timestamp`` ...).
    """
    lines = json_values_by_polars(batch)
    if lines is not None:
        return lines
    return _json_values_by_orjson(batch.to_pylist())


def _csv_text(batch: Any) -> bytes:
    import pyarrow.csv as pacsv

    buffer = io.BytesIO()
    pacsv.write_csv(batch, buffer, pacsv.WriteOptions(include_header=False))
    return buffer.getvalue()


def encode_csv_values(batch: Any) -> list[bytes]:
    """Each row of ``batch`` as one CSV line without its line end (``pyarrow.csv.write_csv``,
    no header; strings quoted, a null empty and unquoted, bools ``true``/``false``,
    timestamps ``YYYY-MM-DD HH:MM:SS[.fraction]`` in the column's unit): the batch written
    once and split at its line ends, or row by row when a string holds a line end (a quoted
    value spans lines then).

    Raises:
        pyarrow.ArrowInvalid / ArrowNotImplementedError: for a column type CSV cannot hold
            (lists, structs ...).
    """
    if batch.num_rows == 0:
        return []
    lines = _csv_text(batch).split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    if len(lines) == batch.num_rows:
        return lines
    return [_csv_text(batch.slice(i, 1))[:-1] for i in range(batch.num_rows)]


def encode_keys(column: Any, key_serializer: Callable[[Any], bytes],
                serializer_name: str | None) -> list[bytes | None]:
    """The message keys of a key column: None for a null (no key, as the per-row path
    leaves a None key), else ``key_serializer(value)``.

    Args:
        column: the key column (``pyarrow.Array``).
        key_serializer: the sink's key serializer.
        serializer_name: its built-in name (``"str"``, ``"bytes"``, ``"json"``) or None for
            a user callable. ``"str"`` / ``"bytes"`` of a string or binary column take the
            column's bytes as they are (UTF-8 for strings), without a Python string per row.

    Raises:
        Exception: whatever the serializer raises for a value (e.g. ``TypeError`` for an
            integer through ``"str"``).
    """
    import pyarrow as pa

    t = pa.types
    typ = column.type
    if serializer_name in ("str", "bytes") and (
            t.is_string(typ) or t.is_large_string(typ) or t.is_binary(typ)
            or t.is_large_binary(typ)):
        keys: list[bytes | None] = column.cast(
            pa.large_binary() if t.is_large_string(typ) or t.is_large_binary(typ)
            else pa.binary()).to_pylist()
        return keys
    return [None if v is None else key_serializer(v) for v in column.to_pylist()]


def is_record_batch(item: Any) -> bool:
    """Whether ``item`` is a ``pyarrow.RecordBatch`` (False before pyarrow is imported:
    no batch can exist then)."""
    pa = sys.modules.get("pyarrow")
    return pa is not None and isinstance(item, pa.RecordBatch)
