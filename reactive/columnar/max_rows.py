"""The rows with a group's highest value, ties kept: a vectorized aggregate that keeps rows.

SQL's ``RANK() OVER (PARTITION BY window ORDER BY x DESC) = 1`` (Flink's Window Top-N with
``N = 1`` ranked by ``RANK``, which keeps every row tied first), as a
:class:`~reactive.columnar.user_aggregates.VectorizedAggregateFunction` over a struct column
holding the rows to keep:

```python
rows = pa.struct([("auction", pa.int64()), ("price", pa.int64()), ("extra", pa.string())])
top = (bids.select("window", row=pc.make_struct(pc.field("auction"), pc.field("price"),
                                                 pc.field("extra"),
                                                 field_names=["auction", "price", "extra"]))
           .key_by("window")
           .window(TumblingEventTimeWindows.of(10), timestamp="ts")
           .agg(top=("row", MaxRows(rows, by="price"))))
```

Each slot (key or window) keeps its highest ``by`` value, how many rows have it, and
``capacity`` positions per field of the row; a row that beats the value empties the
positions. A slot with more ties than ``capacity`` fails the job (:class:`ValueError`)
instead of dropping one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ConfigurationError
from .schema import pa
from .user_aggregates import VectorizedAggregateFunction

__all__ = ["MaxRows"]


def _numpy_type(t: Any) -> tuple[Any, Any]:
    """The accumulator dtype and neutral value holding an Arrow field's values."""
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        return np.dtype(t.to_pandas_dtype()), 0
    if pa.types.is_timestamp(t):
        return np.dtype(f"datetime64[{t.unit}]"), np.datetime64(0, t.unit)
    return np.dtype(object), None  # strings, binaries, nested values: Python objects


class MaxRows(VectorizedAggregateFunction):
    """The rows of a slot whose field ``by`` has the slot's highest value, every tie kept,
    in arrival order, as a ``list<struct>`` per slot (SQL's ``RANK() = 1``).

    Rows whose ``by`` is null (or NaN) are skipped; a slot that saw none has an empty list.
    A number, boolean or timestamp field of a kept row must not be null (its accumulator is
    a numpy array of that type); string and nested fields may be.

    Args:
        row_type: the input column's ``pa.struct`` type (the rows to keep).
        by: the numeric (or timestamp) field of ``row_type`` that ranks the rows.
        capacity: the most rows that may tie in one slot.

    Raises:
        ConfigurationError: if ``row_type`` is not a struct, ``by`` is not one of its
            numeric or timestamp fields, or ``capacity < 1``.
    """

    def __init__(self, row_type: Any, by: str, capacity: int = 8) -> None:
        if not isinstance(row_type, pa.StructType):
            raise ConfigurationError(f"MaxRows: row_type must be a pa.struct, got {row_type}")
        if row_type.get_field_index(by) < 0:
            raise ConfigurationError(f"MaxRows: no field {by!r} in {row_type}")
        rank_type = row_type.field(by).type
        if not (pa.types.is_integer(rank_type) or pa.types.is_floating(rank_type)
                or pa.types.is_timestamp(rank_type)):
            raise ConfigurationError(f"MaxRows: field {by!r} is {rank_type}: rank by a "
                                     "number or a timestamp")
        if capacity < 1:
            raise ConfigurationError(f"MaxRows: capacity must be >= 1, got {capacity}")
        self.row_type = row_type
        self.by = by
        self.capacity = capacity
        self.result_type = pa.list_(row_type)
        self._fields = [(f.name, f.type, *_numpy_type(f.type)) for f in row_type]
        # the ranking value as int64 or float64 ("max" starts below every value: n == 0
        # says the slot is empty, so the start value is never taken for a row's)
        self._float = pa.types.is_floating(rank_type)
        self._rank_dtype = np.dtype(np.float64 if self._float else np.int64)
        low = -np.inf if self._float else np.iinfo(np.int64).min
        self.accumulators = {
            "max": (self._rank_dtype, low), "n": (np.int64, 0),
            **{f"{k}.{name}": (dtype, initial)
               for k in range(capacity) for name, _, dtype, initial in self._fields}}

    def _ranks(self, values: Any) -> tuple[np.ndarray, np.ndarray]:
        """The rows with a ranking value and those values (int64 or float64)."""
        column = values.field(self.by)
        if pa.types.is_timestamp(column.type):
            column = column.cast(pa.int64())
        valid = np.ones(len(column), bool) if not column.null_count \
            else column.is_valid().to_numpy(zero_copy_only=False)
        if column.null_count:
            column = column.fill_null(0)
        rank = column.to_numpy(zero_copy_only=False).astype(self._rank_dtype, copy=False)
        if self._float:
            valid &= ~np.isnan(rank)
        return np.flatnonzero(valid), rank

    def update(self, acc: dict[str, np.ndarray], slots: np.ndarray, groups: np.ndarray,
               values: Any) -> None:
        rows, rank = self._ranks(values)
        if len(rows) < len(rank):
            groups, rank = groups[rows], rank[rows]
        if not len(rows):
            return
        low = self.accumulators["max"][1]
        top = np.full(len(slots), low, self._rank_dtype)
        np.maximum.at(top, groups, rank)
        seen = np.zeros(len(slots), bool)
        seen[groups] = True
        before, count = acc["max"][slots], acc["n"][slots]
        beaten = seen & ((count == 0) | (top > before))
        acc["n"][slots[beaten]] = 0
        acc["max"][slots[beaten]] = top[beaten]
        at_top = np.flatnonzero(rank == acc["max"][slots][groups])
        self._append(acc, slots[groups[at_top]], values.take(pa.array(rows[at_top])))

    def _append(self, acc: dict[str, np.ndarray], slots: np.ndarray, rows: Any) -> None:
        """Append rows (at their slot's highest value) to their slots' positions."""
        if not len(slots):
            return
        order = np.argsort(slots, kind="stable")
        slots = slots[order]
        rank = np.arange(len(slots)) - np.searchsorted(slots, slots, side="left")
        position = acc["n"][slots] + rank
        if int(position.max()) >= self.capacity:
            raise ValueError(f"more than {self.capacity} rows tie for a slot's highest "
                             f"{self.by!r} ({acc['max'][slots[0]]}): raise MaxRows' capacity")
        columns = {name: _as_numpy(rows.field(name), dtype).take(order)
                   for name, _, dtype, _ in self._fields}
        for k in range(int(position.max()) + 1):
            at = position == k
            for name, column in columns.items():
                acc[f"{k}.{name}"][slots[at]] = column[at]
        np.add.at(acc["n"], slots, 1)

    def merge(self, acc: dict[str, np.ndarray], into: np.ndarray,
              other: dict[str, np.ndarray]) -> None:
        for i, slot in enumerate(into.tolist()):
            n = int(other["n"][i])
            if not n:
                continue
            top = other["max"][i]
            if acc["n"][slot] == 0 or top > acc["max"][slot]:
                acc["max"][slot], acc["n"][slot] = top, 0
            if top == acc["max"][slot]:
                rows = pa.StructArray.from_arrays(
                    [pa.array(np.array([other[f"{k}.{name}"][i] for k in range(n)], dtype),
                              t)
                     for name, t, dtype, _ in self._fields],
                    fields=list(self.row_type))
                self._append(acc, np.full(n, slot, np.int64), rows)

    def result(self, acc: dict[str, np.ndarray]) -> Any:
        n = acc["n"]
        kept = np.arange(self.capacity) < n[:, None]  # (slot, position) pairs in use
        fields = []
        for name, t, _, _ in self._fields:
            values = np.stack([acc[f"{k}.{name}"] for k in range(self.capacity)], axis=1)
            fields.append(pa.array(values[kept], t))
        offsets = np.zeros(len(n) + 1, np.int32)
        np.cumsum(n, out=offsets[1:])
        rows = pa.StructArray.from_arrays(fields, fields=list(self.row_type))
        return pa.ListArray.from_arrays(pa.array(offsets), rows)


def _as_numpy(column: Any, dtype: Any) -> np.ndarray:
    """An Arrow column's values as an array of ``dtype`` (nulls as None in object arrays).

    Raises:
        ValueError: for a null in a number or timestamp field (its array has no null).
    """
    if dtype == np.dtype(object):
        return np.array(column.to_pylist(), dtype=object)
    if column.null_count:
        raise ValueError(f"MaxRows keeps no null in a {column.type} field: fill it first "
                         "or make the field a string")
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=dtype)
