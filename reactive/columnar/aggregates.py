"""The built-in columnar aggregates: count, sum, mean, min, max, first and last over a column, kept per
slot in numpy arrays and updated from a whole batch (DataFusion's ``GroupsAccumulator``:
``update_batch`` over a batch's group indices, state as arrays indexed by group).

Nulls are skipped as in SQL: ``count`` counts the non-null values; ``sum``, ``mean``,
``min``, ``max``, ``first`` and ``last`` of a key with no non-null value so far are null
(``first``/``last``: the first/last non-null value in input order).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigurationError
from .grouping import Grouping, running_first, running_last
from .schema import pa
from .user_aggregates import UserAggregateSpec, VectorizedAggregateFunction

__all__ = ["FUNCTIONS", "AggregateSpec", "Spec", "merge_states", "parse_aggregates"]

FUNCTIONS = ("count", "sum", "mean", "min", "max", "first", "last")


@dataclass(frozen=True)
class AggregateSpec:
    """One aggregate: ``output = function(column)``.

    Attributes:
        output: the output column's name.
        column: the input column's name.
        function: one of :data:`FUNCTIONS`.
        floating: whether the input column is floating point (else integer; count takes
            any type).
    """

    output: str
    column: str
    function: str
    floating: bool

    @property
    def value_dtype(self) -> Any:
        """The numpy dtype of the accumulator (``acc``)."""
        return np.float64 if self.floating or self.function == "mean" else np.int64

    def output_field(self) -> Any:
        """The output column's ``pyarrow.Field``."""
        if self.function == "count":
            return pa.field(self.output, pa.int64(), nullable=False)
        if self.function == "mean" or self.floating:
            return pa.field(self.output, pa.float64())
        return pa.field(self.output, pa.int64())

    def state_columns(self) -> list[str]:
        """The names of its per-slot arrays: ``n`` (non-null values) and, except for count,
        ``acc`` (the sum, minimum or maximum)."""
        return ["n"] if self.function == "count" else ["n", "acc"]

    def dtype(self, part: str) -> Any:
        """The numpy dtype of array ``part``."""
        return self.value_dtype if part == "acc" else np.int64

    def initial(self, part: str) -> Any:
        """The value of an array element of a slot that has seen nothing."""
        if part == "n" or self.function in ("sum", "mean"):
            return 0
        dtype = self.value_dtype
        big = np.inf if dtype == np.float64 else np.iinfo(np.int64).max
        return big if self.function == "min" else -big


Spec = AggregateSpec | UserAggregateSpec
"""A built-in or a user-defined aggregate."""


def parse_aggregates(schema: Any, aggregates: dict[str, tuple[str, Any]]) -> list[Spec]:
    """Check ``output=(column, function)`` pairs against ``schema``; ``function`` is the
    name of a built-in (:data:`FUNCTIONS`) or a
    :class:`~reactive.columnar.user_aggregates.VectorizedAggregateFunction`.

    Raises:
        ConfigurationError: for no aggregate, an unknown function or column, a non-numeric
            column for sum/mean/min/max, or an output that shadows another column.
    """
    if not aggregates:
        raise ConfigurationError("agg: give at least one output=(column, function)")
    specs: list[Spec] = []
    for output, spec in aggregates.items():
        if not (isinstance(spec, tuple) and len(spec) == 2):
            raise ConfigurationError(f"agg: {output}= takes (column, function), got {spec!r}")
        column, function = spec
        if isinstance(function, VectorizedAggregateFunction):
            if schema.get_field_index(column) < 0:
                raise ConfigurationError(f"agg: {output}=: no column {column!r} in "
                                         f"{schema.names}")
            specs.append(UserAggregateSpec(output, column, function))
            continue
        if not isinstance(function, str) or function not in FUNCTIONS:
            raise ConfigurationError(f"agg: {output}=: unknown function {function!r} "
                                     f"(known: {', '.join(FUNCTIONS)})")
        if schema.get_field_index(column) < 0:
            raise ConfigurationError(f"agg: {output}=: no column {column!r} in {schema.names}")
        t = schema.field(column).type
        floating = pa.types.is_floating(t)
        if function != "count" and not (floating or pa.types.is_integer(t)):
            raise ConfigurationError(f"agg: {output}=: {function} needs a numeric column, "
                                     f"{column!r} is {t}")
        specs.append(AggregateSpec(output, column, function, floating))
    return specs


def _values(batch: Any, spec: AggregateSpec) -> tuple[np.ndarray, np.ndarray | None]:
    """The column as a numpy array of the accumulator's dtype, nulls filled with the
    function's neutral value, and the validity mask (None: no nulls)."""
    column = batch.column(spec.column)
    valid = None
    if column.null_count:
        valid = column.is_valid().to_numpy(zero_copy_only=False)
        column = column.fill_null(spec.initial("acc"))
    return column.to_numpy(zero_copy_only=False).astype(spec.value_dtype, copy=False), valid


def update(spec: Spec, state: dict[str, np.ndarray], batch: Any, grouping: Grouping,
           slots: np.ndarray, row_slots: np.ndarray | None) -> Any:
    """Fold ``batch`` into the aggregate's arrays; return the per-row running values
    (a ``pyarrow.Array``) when ``row_slots`` (per row, its slot) is given, else None.

    Args:
        spec: the aggregate.
        state: its arrays (``n``, ``acc``), indexed by slot, long enough for ``slots``.
        batch: the record batch.
        grouping: the batch's rows grouped by batch-local key code.
        slots: per group, its slot.
        row_slots: per row, its slot (changelog mode), or None (final mode).
    """
    if isinstance(spec, UserAggregateSpec):
        return spec.update(state, batch, grouping.codes, slots, row_slots)
    n = state["n"]
    if spec.function == "count":
        column = batch.column(spec.column)
        running: np.ndarray | None = None
        if column.null_count and row_slots is None:
            totals = grouping.totals(column.is_valid().to_numpy(zero_copy_only=False)
                                     .astype(np.int64))
        elif column.null_count:
            valid = column.is_valid().to_numpy(zero_copy_only=False).astype(np.int64)
            running, totals = grouping.running_sum(valid)
        else:
            running = grouping.rank() + 1 if row_slots is not None else None
            totals = grouping.counts
        out = None
        if row_slots is not None:
            assert running is not None
            out = pa.array(n[row_slots] + running)
        n[slots] += totals
        return out
    values, valid = _values(batch, spec)
    acc = state["acc"]
    if row_slots is None and spec.function not in ("first", "last"):
        # final values only: per-group totals in O(rows), no sort
        n[slots] += grouping.counts if valid is None else \
            np.bincount(grouping.codes[valid], minlength=grouping.num_groups)
        if spec.function in ("sum", "mean"):
            acc[slots] += grouping.totals(values)
        else:
            sign = 1 if spec.function == "max" else -1
            acc[slots] = np.maximum(acc[slots] * sign, grouping.totals(values * sign, "max")) \
                * sign
        return None
    if valid is None:
        run_n = grouping.rank() + 1 if row_slots is not None else None
        n_totals = grouping.counts
    else:
        run_n, n_totals = grouping.running_sum(valid.astype(np.int64))
    if spec.function in ("first", "last"):
        pick = running_first if spec.function == "first" else running_last
        rows, group_rows = pick(grouping, valid)
        if row_slots is not None:
            before = acc[row_slots]  # the keys' values before this batch (a copy)
            values_run = np.where(rows >= 0, values[np.maximum(rows, 0)], 0)
            if spec.function == "last":
                # rows before their key's first valid value in the batch keep the old one
                values_run = np.where(rows >= 0, values_run, before)
            else:
                # a key that had a first value before this batch keeps it
                values_run = np.where(n[row_slots] > 0, before, values_run)
        has = group_rows >= 0
        if spec.function == "first":
            has &= n[slots] == 0  # a key's first value never changes
        acc[slots[has]] = values[group_rows[has]]
    elif spec.function in ("sum", "mean"):
        values_run, totals = grouping.running_sum(values)
        if row_slots is not None:
            values_run = acc[row_slots] + values_run
        acc[slots] += totals
    else:
        sign = 1 if spec.function == "max" else -1
        values_run, totals = grouping.running_max(values * sign)
        if row_slots is not None:
            values_run = np.maximum(acc[row_slots] * sign, values_run) * sign
        acc[slots] = np.maximum(acc[slots] * sign, totals) * sign
    out = None
    if row_slots is not None:
        assert run_n is not None
        seen = n[row_slots] + run_n
        out = _result(spec, values_run, seen)
    n[slots] += n_totals
    return out


def results(spec: Spec, state: dict[str, np.ndarray], size: int) -> Any:
    """The aggregate's value per slot ``[0, size)`` (a ``pyarrow.Array``)."""
    if isinstance(spec, UserAggregateSpec):
        return spec.result(state, size)
    n = state["n"][:size]
    if spec.function == "count":
        return pa.array(n)
    return _result(spec, state["acc"][:size], n)


def _result(spec: AggregateSpec, acc: np.ndarray, n: np.ndarray) -> Any:
    empty = n == 0
    values = acc / np.maximum(n, 1) if spec.function == "mean" else acc
    return pa.array(values, mask=empty if empty.any() else None)


def merge_states(spec: Spec, state: dict[str, np.ndarray], into: np.ndarray,
                 sources: np.ndarray) -> None:
    """Merge the accumulators of slots ``sources`` into slots ``into`` (element-wise pairs;
    ``into`` may repeat), in place (session windows merging).

    Raises:
        ValueError: for ``first``/``last``, whose merge needs the values' arrival order.
    """
    if isinstance(spec, UserAggregateSpec):
        spec.fn.merge(state, into, {p: a[sources] for p, a in state.items()})
        return
    if spec.function in ("first", "last"):
        raise ValueError(f"{spec.function} cannot merge accumulators")
    np.add.at(state["n"], into, state["n"][sources])
    if "acc" in state:
        acc = state["acc"]
        if spec.function in ("sum", "mean"):
            np.add.at(acc, into, acc[sources])
        elif spec.function == "min":
            np.minimum.at(acc, into, acc[sources])
        else:
            np.maximum.at(acc, into, acc[sources])
