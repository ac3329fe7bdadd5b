"""User-defined vectorized aggregates: Flink's ``AggregateFunction`` (create / add / merge /
get result) over arrays, in the shape of DataFusion's ``GroupsAccumulator``: the
accumulators of every key (or window) are numpy arrays indexed by slot, and one call folds a
whole batch into them.

```python
class Variance(VectorizedAggregateFunction):
    accumulators = {"n": (np.int64, 0), "sum": (np.float64, 0.0), "sq": (np.float64, 0.0)}
    result_type = pa.float64()

    def update(self, acc, slots, groups, values):
        x = values.to_numpy(zero_copy_only=False)
        np.add.at(acc["n"], slots[groups], 1)
        np.add.at(acc["sum"], slots[groups], x)
        np.add.at(acc["sq"], slots[groups], x * x)

    def merge(self, acc, into, other):
        for name in acc:
            np.add.at(acc[name], into, other[name])

    def result(self, acc):
        n = np.maximum(acc["n"], 1)
        mean = acc["sum"] / n
        return pa.array(acc["sq"] / n - mean * mean, mask=acc["n"] == 0)

stream.key_by("k").agg(var=("x", Variance()), emit="final")
```

The runtime owns the arrays (grows them, snapshots them per key group, restores them at any
parallelism, compacts a window operator's panes): the function only reads and writes them
in place, and keeps no state of its own.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigurationError
from .schema import pa

__all__ = ["UserAggregateSpec", "VectorizedAggregateFunction"]


class VectorizedAggregateFunction(ABC):
    """An aggregate over arrays (Flink's ``AggregateFunction``; DataFusion's
    ``GroupsAccumulator``).

    Attributes:
        accumulators: the accumulator arrays, ``name -> (numpy dtype, initial value)``: the
            value of a key or window that has seen nothing (Flink's
            ``createAccumulator``).
        result_type: the ``pyarrow.DataType`` of :meth:`result`.
    """

    accumulators: dict[str, tuple[Any, Any]] = {}
    result_type: Any = None

    @abstractmethod
    def update(self, acc: dict[str, np.ndarray], slots: np.ndarray, groups: np.ndarray,
               values: Any) -> None:
        """Fold a batch's rows into the accumulators, in place (Flink's ``add``, for a whole
        batch).

        Args:
            acc: the accumulator arrays by name (indexed by slot).
            slots: per group of the batch, its slot (``int64``; distinct).
            groups: per row, its group (``int64`` in ``[0, len(slots))``); rows in input
                order.
            values: the input column (a ``pyarrow.Array``, nulls included).
        """

    @abstractmethod
    def merge(self, acc: dict[str, np.ndarray], into: np.ndarray,
              other: dict[str, np.ndarray]) -> None:
        """Merge accumulators into others, in place (Flink's ``merge``; session windows).

        Args:
            acc: the accumulator arrays by name.
            into: per accumulator of ``other``, the slot it merges into (may repeat).
            other: accumulators by name, one element per entry of ``into``.
        """

    @abstractmethod
    def result(self, acc: dict[str, np.ndarray]) -> Any:
        """The results of some slots (Flink's ``getResult``).

        Args:
            acc: the accumulator arrays of those slots, by name (equal lengths).

        Returns:
            A ``pyarrow.Array`` of :attr:`result_type`, one value per slot.
        """


@dataclass(frozen=True)
class UserAggregateSpec:
    """One user aggregate: ``output = function(column)``, with the interface of the
    built-in :class:`~reactive.columnar.aggregates.AggregateSpec` the operators use."""

    output: str
    column: str
    fn: VectorizedAggregateFunction

    function = "user"
    floating = False

    def __post_init__(self) -> None:
        fn = self.fn
        if not fn.accumulators or not isinstance(fn.accumulators, dict):
            raise ConfigurationError(f"agg: {self.output}=: {type(fn).__name__}.accumulators "
                                     "must name at least one array: {name: (dtype, initial)}")
        if not isinstance(fn.result_type, pa.DataType):
            raise ConfigurationError(f"agg: {self.output}=: {type(fn).__name__}.result_type "
                                     "must be a pyarrow DataType")

    def output_field(self) -> Any:
        """The output column's ``pyarrow.Field``."""
        return pa.field(self.output, self.fn.result_type)

    def state_columns(self) -> list[str]:
        """The names of its per-slot arrays."""
        return list(self.fn.accumulators)

    def dtype(self, part: str) -> Any:
        """The numpy dtype of array ``part``."""
        return np.dtype(self.fn.accumulators[part][0])

    def initial(self, part: str) -> Any:
        """The value of an element of array ``part`` for a slot that has seen nothing."""
        return self.fn.accumulators[part][1]

    def update(self, state: dict[str, np.ndarray], batch: Any, codes: np.ndarray,
               slots: np.ndarray, row_slots: np.ndarray | None) -> Any:
        """Fold ``batch``; with ``row_slots`` (a running value per row), row by row and
        return each row's result (a ``pyarrow.Array``), else at once and return None."""
        values = batch.column(self.column)
        fn = self.fn
        if row_slots is None:
            fn.update(state, slots, codes, values)
            return None
        one = np.zeros(1, np.int64)
        out = []
        for i, slot in enumerate(row_slots.tolist()):
            fn.update(state, np.array([slot], np.int64), one, values.slice(i, 1))
            out.append(fn.result({p: a[slot:slot + 1] for p, a in state.items()}))
        return pa.concat_arrays(out) if out else pa.array([], fn.result_type)

    def result(self, state: dict[str, np.ndarray], size: int) -> Any:
        """The result per slot ``[0, size)``."""
        out = self.fn.result({p: a[:size] for p, a in state.items()})
        if len(out) != size:
            raise ValueError(f"{type(self.fn).__name__}.result returned {len(out)} values "
                             f"for {size} slots")
        return out
