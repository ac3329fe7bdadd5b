"""Checking record batches against a declared schema, with errors that say where.

A columnar stream declares its schema (``pyarrow.Schema``) when it is built; each operator
that produces batches (a source, ``map_batches``, ``to_columnar``) checks what it produces,
so a batch that does not match fails at the operator that made it, naming the operator, the
column and the source position of the batch's first row.

The source position travels with a batch as schema metadata (:data:`POSITION_KEY`): pyarrow
keeps a batch's schema metadata through ``filter``, ``take``, ``select`` and ``slice``.
"""

from __future__ import annotations

from typing import Any

from ..errors import ReactiveError
from ..extras import require

pa: Any = require("pyarrow", "columnar", "columnar streams")
pc: Any = require("pyarrow.compute", "columnar", "columnar streams")

__all__ = ["POSITION_KEY", "SchemaMismatchError", "check_batch", "pa", "pc", "position_of",
           "with_position"]

POSITION_KEY = b"reactive.position"
"""Schema-metadata key of a batch's source position (its first row's, as text)."""


class SchemaMismatchError(ReactiveError):
    """A record batch does not have the schema its stream declared.

    Attributes:
        operator: the name of the operator that produced the batch.
        column: the offending column (missing, unexpected or of another type).
        position: the source position of the batch's first row, when known, else None.
    """

    def __init__(self, operator: str, column: str, detail: str, position: str | None) -> None:
        where = f" at source position {position}" if position is not None else ""
        super().__init__(f"operator {operator!r}: column {column!r}: {detail}{where}")
        self.operator = operator
        self.column = column
        self.position = position


def with_position(batch: Any, position: Any) -> Any:
    """Return ``batch`` carrying ``position`` (its first row's source position)."""
    meta = dict(batch.schema.metadata or {})
    meta[POSITION_KEY] = str(position).encode()
    return batch.replace_schema_metadata(meta)


def position_of(batch: Any) -> str | None:
    """The source position a batch carries, or None."""
    meta = batch.schema.metadata
    if meta and POSITION_KEY in meta:
        return bytes(meta[POSITION_KEY]).decode()
    return None


def check_batch(batch: Any, schema: Any, operator: str) -> None:
    """Check that ``batch`` has exactly the fields of ``schema`` (names, order, types;
    metadata is ignored).

    Args:
        batch: a ``pyarrow.RecordBatch``.
        schema: the declared ``pyarrow.Schema``.
        operator: the producing operator's name, for the message.

    Raises:
        SchemaMismatchError: naming the first column that differs.
        TypeError: (as a SchemaMismatchError) when ``batch`` is not a RecordBatch.
    """
    if not isinstance(batch, pa.RecordBatch):
        raise SchemaMismatchError(operator, "*", f"expected a pyarrow.RecordBatch, got "
                                  f"{type(batch).__name__}", None)
    got = batch.schema
    if got.equals(schema, check_metadata=False):
        return
    position = position_of(batch)
    names = set(got.names)
    for field in schema:
        if field.name not in names:
            raise SchemaMismatchError(operator, field.name, "missing from the batch "
                                      f"(it has {got.names})", position)
        other = got.field(field.name)
        if not other.type.equals(field.type):
            raise SchemaMismatchError(operator, field.name, f"has type {other.type}, the "
                                      f"stream declares {field.type}", position)
    for name in got.names:
        if schema.get_field_index(name) < 0:
            raise SchemaMismatchError(operator, name, "is not in the declared schema "
                                      f"{schema.names}", position)
    raise SchemaMismatchError(operator, got.names[0], f"columns in order {got.names}, the "
                              f"stream declares {schema.names}", position)
