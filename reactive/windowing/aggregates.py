"""Built-in aggregations (SQL's COUNT, SUM, AVG, MIN, MAX, FIRST_VALUE, LAST_VALUE; Flink
SQL's built-in aggregate functions) as one :class:`AggregateFunction` the embedded runtime
runs like any other, and that a runner can recognize and run natively (the Spark runner
translates a window aggregated by :class:`Aggregates` to ``groupBy(window(...), key).agg``).

```python
from reactive.windowing.aggregates import Aggregates, count, max_of, mean, sum_of
stats = Aggregates(count(), sum_of("cancelled", dtype="int"), mean("dep_delay"),
                   max_of("dep_delay"))
keyed.window(TumblingEventTimeWindows.of(3600)).aggregate(stats)   # value: a 4-tuple
```

Semantics are SQL's: a field whose value is None is skipped (``count(field)`` counts the
non-None values; ``count()`` counts records); SUM, AVG, MIN, MAX, FIRST and LAST of no
non-None value are None. A field's values are converted to the aggregation's ``dtype``
(``int`` or ``float``) before they are folded, so every runner computes with the same types.
FIRST and LAST are the first and last non-None value in the order the key's records arrive.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from .functions import AggregateFunction

__all__ = ["KINDS", "Aggregates", "BuiltinAggregate", "count", "first", "last", "max_of",
           "mean", "min_of", "sum_of"]

KINDS = ("count", "sum", "mean", "min", "max", "first", "last")
"""The built-in aggregation kinds."""

_Field = Callable[[Any], Any] | str
Dtype = Literal["int", "float"]
"""The type a built-in aggregation converts its field's values to."""


@dataclass(frozen=True)
class BuiltinAggregate:
    """One built-in aggregation over a field of the records.

    Attributes:
        kind: one of :data:`KINDS`.
        field: record -> value, or an attribute name (``"dep_delay"`` reads
            ``record.dep_delay``); None for ``count()`` of records.
        dtype: ``"int"`` or ``"float"``: the type the field's values are converted to (and
            of the result, but AVG's, which is a float, and COUNT's, an int).
    """

    kind: str
    field: _Field | None = None
    dtype: Dtype = "float"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown aggregation {self.kind!r}; built-in ones: {KINDS}")
        if self.dtype not in ("int", "float"):
            raise ValueError(f"dtype must be 'int' or 'float', got {self.dtype!r}")
        if self.field is None and self.kind != "count":
            raise ValueError(f"{self.kind} needs a field")

    def extractor(self) -> Callable[[Any], Any] | None:
        """record -> the value folded (converted to ``dtype``; None is skipped), or None
        for ``count()`` of records."""
        f = self.field
        if f is None:
            return None
        get = operator.attrgetter(f) if isinstance(f, str) else f
        cast: Callable[[Any], Any] = int if self.dtype == "int" else float

        def value(record: Any) -> Any:
            v = get(record)
            return None if v is None else cast(v)

        return value

    @property
    def result_dtype(self) -> str:
        """The type of the result: ``"int"`` or ``"float"``."""
        if self.kind == "count":
            return "int"
        return "float" if self.kind == "mean" else self.dtype


def count(field: _Field | None = None) -> BuiltinAggregate:
    """COUNT: of records (no field), or of a field's non-None values."""
    return BuiltinAggregate("count", field, "int")


def sum_of(field: _Field, dtype: Dtype = "float") -> BuiltinAggregate:
    """SUM of a field's non-None values (None when there are none)."""
    return BuiltinAggregate("sum", field, dtype)


def mean(field: _Field, dtype: Dtype = "float") -> BuiltinAggregate:
    """AVG of a field's non-None values, a float (None when there are none)."""
    return BuiltinAggregate("mean", field, dtype)


def min_of(field: _Field, dtype: Dtype = "float") -> BuiltinAggregate:
    """MIN of a field's non-None values (None when there are none)."""
    return BuiltinAggregate("min", field, dtype)


def max_of(field: _Field, dtype: Dtype = "float") -> BuiltinAggregate:
    """MAX of a field's non-None values (None when there are none)."""
    return BuiltinAggregate("max", field, dtype)


def first(field: _Field, dtype: Dtype = "float") -> BuiltinAggregate:
    """FIRST_VALUE: the first non-None value in arrival order (None when there is none)."""
    return BuiltinAggregate("first", field, dtype)


def last(field: _Field, dtype: Dtype = "float") -> BuiltinAggregate:
    """LAST_VALUE: the last non-None value in arrival order (None when there is none)."""
    return BuiltinAggregate("last", field, dtype)


class Aggregates(AggregateFunction):
    """Several built-in aggregations of the same records: the result is the tuple of their
    results, in the order given.

    Args:
        *aggregations: at least one :class:`BuiltinAggregate` (``count()``, ``sum_of(...)``
            ...).

    Raises:
        ValueError: without aggregations, or given something that is not one.

    The accumulator is a list with one slot per aggregation: a count, a sum or None, a
    ``[sum, count]`` pair for AVG, the value (or None) for the others. ``merge`` is
    associative, with ``a`` covering records before ``b``'s (FIRST and LAST rely on it).
    """

    def __init__(self, *aggregations: BuiltinAggregate) -> None:
        if not aggregations:
            raise ValueError("Aggregates needs at least one aggregation")
        for a in aggregations:
            if not isinstance(a, BuiltinAggregate):
                raise ValueError(f"{a!r} is not a built-in aggregation (count(), sum_of()...)")
        self.aggregations = tuple(aggregations)
        self._plan = [(a.kind, a.extractor()) for a in self.aggregations]

    def __getstate__(self) -> dict[str, Any]:
        return {"aggregations": self.aggregations}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(*state["aggregations"])  # type: ignore[misc]

    def create_accumulator(self) -> list[Any]:
        return [0 if kind == "count" else [0.0, 0] if kind == "mean" else None
                for kind, _ in self._plan]

    def add(self, value: Any, accumulator: list[Any]) -> list[Any]:
        acc = list(accumulator)
        for i, (kind, get) in enumerate(self._plan):
            if get is None:  # count() of records
                acc[i] += 1
                continue
            v = get(value)
            if v is None:
                continue
            a = acc[i]
            if kind == "count":
                acc[i] = a + 1
            elif kind == "sum":
                acc[i] = v if a is None else a + v
            elif kind == "mean":
                acc[i] = [a[0] + v, a[1] + 1]
            elif kind == "min":
                acc[i] = v if a is None or v < a else a
            elif kind == "max":
                acc[i] = v if a is None or v > a else a
            elif kind == "first":
                acc[i] = v if a is None else a
            else:  # last
                acc[i] = v
        return acc

    def merge(self, a: list[Any], b: list[Any]) -> list[Any]:
        out: list[Any] = []
        for (kind, _), x, y in zip(self._plan, a, b, strict=True):
            if kind == "count":
                out.append(x + y)
            elif kind == "mean":
                out.append([x[0] + y[0], x[1] + y[1]])
            elif x is None or y is None:
                out.append(y if x is None else x)
            elif kind == "sum":
                out.append(x + y)
            elif kind == "min":
                out.append(min(x, y))
            elif kind == "max":
                out.append(max(x, y))
            else:
                out.append(x if kind == "first" else y)
        return out

    def get_result(self, accumulator: list[Any]) -> tuple[Any, ...]:
        return tuple((a[0] / a[1] if a[1] else None) if kind == "mean" else a
                     for (kind, _), a in zip(self._plan, accumulator, strict=True))

    def __repr__(self) -> str:
        return f"Aggregates({', '.join(a.kind for a in self.aggregations)})"
