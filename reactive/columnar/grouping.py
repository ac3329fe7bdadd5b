"""Rows grouped by their batch-local key code, with array operations only: each row's rank
within its group (a running count), segmented prefix sums and running extrema.

The grouping is one stable sort of the codes. Codes below 2**16 sort as ``uint16``, which
numpy sorts with a radix sort (O(rows)); larger codes are sorted in two such passes (least
significant 16 bits first, as an LSD radix sort), never with a comparison sort.
"""

from __future__ import annotations

import numpy as np

__all__ = ["Grouping", "combine_codes", "running_first", "running_last"]

_RADIX = 1 << 16


def _stable_order(codes: np.ndarray, num_groups: int) -> np.ndarray:
    """The stable sorting permutation of ``codes`` (non-negative, < ``num_groups``)."""
    if num_groups <= _RADIX:
        return np.argsort(codes.astype(np.uint16), kind="stable")
    low = np.argsort((codes & 0xFFFF).astype(np.uint16), kind="stable")
    high = (codes[low] >> 16)
    if num_groups <= _RADIX * _RADIX:
        return low[np.argsort(high.astype(np.uint16), kind="stable")]
    return low[np.argsort(high, kind="stable")]


class Grouping:
    """The rows of a batch grouped by code.

    Args:
        codes: per row, its group (``int64``, in ``[0, num_groups)``).
        num_groups: the number of groups.

    Attributes:
        order: the rows in group order (stable: a group's rows keep their input order).
        counts: rows per group (``int64``, length ``num_groups``).
        starts: per group, the position of its first row in ``order``.
        sorted_groups: the group of each position of ``order``.

    The sort behind ``order``, ``starts`` and ``sorted_groups`` happens at their first use:
    per-group totals (:meth:`totals`) need none.
    """

    __slots__ = ("_order", "_sorted_groups", "_starts", "codes", "counts", "num_groups")

    def __init__(self, codes: np.ndarray, num_groups: int) -> None:
        self.codes = codes
        self.num_groups = num_groups
        self.counts = np.bincount(codes, minlength=num_groups)
        self._order: np.ndarray | None = None
        self._starts: np.ndarray | None = None
        self._sorted_groups: np.ndarray | None = None

    @property
    def order(self) -> np.ndarray:
        if self._order is None:
            self._order = _stable_order(self.codes, self.num_groups)
        return self._order

    @property
    def starts(self) -> np.ndarray:
        if self._starts is None:
            self._starts = np.cumsum(self.counts) - self.counts
        return self._starts

    @property
    def sorted_groups(self) -> np.ndarray:
        if self._sorted_groups is None:
            self._sorted_groups = np.repeat(np.arange(self.num_groups), self.counts)
        return self._sorted_groups

    def totals(self, values: np.ndarray, kind: str = "sum") -> np.ndarray:
        """Per group, the sum (``kind="sum"``) or the largest value (``"max"``; groups
        without rows: the dtype's lowest value) of its rows' ``values``, in O(rows) with
        no sort (a sum adds a group's values in row order)."""
        if kind == "sum":
            if values.dtype == np.float64:
                # bincount adds each group's weights in row order, as add.at does, in one
                # pass without ufunc.at's per-element dispatch (about 3x faster)
                sums: np.ndarray = np.bincount(self.codes, weights=values,
                                               minlength=self.num_groups)
                return sums
            out = np.zeros(self.num_groups, values.dtype)
            np.add.at(out, self.codes, values)
            return out
        out = np.full(self.num_groups, _lowest(values.dtype), values.dtype)
        np.maximum.at(out, self.codes, values)
        return out

    def unsort(self, sorted_values: np.ndarray) -> np.ndarray:
        """Values given in group order, back in row order."""
        out = np.empty_like(sorted_values)
        out[self.order] = sorted_values
        return out

    def rank(self) -> np.ndarray:
        """Per row, how many rows of its group come before it in the batch."""
        n = len(self.order)
        return self.unsort(np.arange(n, dtype=np.int64) - self.starts[self.sorted_groups])

    def running_sum(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per row, the sum of its group's values up to and including it; and per group,
        its total.

        Args:
            values: per row (``int64`` or ``float64``).

        Returns:
            ``(running per row, total per group)``.
        """
        in_order = values[self.order]
        prefix = np.cumsum(in_order)
        before = (prefix - in_order)[np.minimum(self.starts, max(len(prefix) - 1, 0))] \
            if len(prefix) else prefix
        before = np.where(self.counts > 0, before, 0)
        running = prefix - before[self.sorted_groups]
        ends = self.starts + self.counts - 1
        totals = np.where(self.counts > 0, prefix[np.maximum(ends, 0)] - before, 0) \
            if len(prefix) else np.zeros(len(self.counts), values.dtype)
        return self.unsort(running), totals.astype(values.dtype, copy=False)

    def running_max(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per row, the largest value of its group up to and including it; and per group,
        its largest value (groups without rows: the dtype's lowest value).

        A segmented maximum from one cumulative maximum: each value is replaced by its rank
        among the batch's values, offset by ``group * rows``, so a group's offsets exceed
        every earlier group's and the running maximum never crosses a group boundary.
        """
        n = len(values)
        in_order = values[self.order]
        by_value = np.argsort(in_order, kind="stable")
        value_rank = np.empty(n, np.int64)
        value_rank[by_value] = np.arange(n, dtype=np.int64)
        offset = self.sorted_groups.astype(np.int64) * n
        best = np.maximum.accumulate(value_rank + offset) - offset
        running = in_order[by_value[best]]
        lowest = _lowest(values.dtype)
        totals = np.full(len(self.counts), lowest, values.dtype)
        nonempty = self.counts > 0
        totals[nonempty] = running[(self.starts + self.counts - 1)[nonempty]]
        return self.unsort(running), totals


def _segment_positions(grouping: Grouping, valid: np.ndarray | None
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = len(grouping.order)
    positions = np.arange(n, dtype=np.int64)
    valid_sorted = np.ones(n, bool) if valid is None else valid[grouping.order]
    return positions, valid_sorted, grouping.starts[grouping.sorted_groups]


def running_last(grouping: Grouping, valid: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the row (an index into the batch) of the last valid value of its group up
    to and including it, or -1; and per group, the row of its last valid value, or -1.

    Args:
        grouping: the batch's grouping.
        valid: per row, whether its value counts (None: all do).
    """
    positions, valid_sorted, group_start = _segment_positions(grouping, valid)
    # positions grow along the group order, so a plain cumulative maximum is segmented
    # once a position before the group's start is read as "none"
    last = np.maximum.accumulate(np.where(valid_sorted, positions, -1)) if len(positions) \
        else positions
    last = np.where(last >= group_start, last, -1)
    rows = np.where(last >= 0, grouping.order[np.maximum(last, 0)], -1)
    ends = grouping.starts + grouping.counts - 1
    per_group = np.where(grouping.counts > 0, rows[np.maximum(ends, 0)] if len(rows) else -1, -1)
    return grouping.unsort(rows), per_group


def running_first(grouping: Grouping, valid: np.ndarray | None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the row of the first valid value of its group up to and including it, or
    -1; and per group, the row of its first valid value, or -1."""
    positions, valid_sorted, _ = _segment_positions(grouping, valid)
    n = len(positions)
    per_group_pos = np.full(len(grouping.counts), n, np.int64)
    nonempty = grouping.counts > 0
    if n:
        per_group_pos[nonempty] = np.minimum.reduceat(np.where(valid_sorted, positions, n),
                                                      grouping.starts[nonempty])
    first = per_group_pos[grouping.sorted_groups] if n else positions
    reached = positions >= first
    rows = np.where(reached, grouping.order[np.minimum(first, max(n - 1, 0))], -1) \
        if n else positions
    per_group = np.where(per_group_pos < n, grouping.order[np.minimum(per_group_pos,
                                                                      max(n - 1, 0))], -1) \
        if n else np.full(len(grouping.counts), -1, np.int64)
    return grouping.unsort(rows), per_group


def _lowest(dtype: np.dtype) -> object:
    return -np.inf if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).min


def combine_codes(a: np.ndarray, n_a: int, b: np.ndarray, n_b: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Dense codes of the pairs ``(a[i], b[i])`` (``a`` in ``[0, n_a)``, ``b`` in
    ``[0, n_b)``): per row its group, and per group ``a * n_b + b``, ascending. O(rows) by
    direct addressing when ``n_a * n_b`` is small, else one integer sort.
    """
    combined = a.astype(np.int64, copy=False) * n_b + b
    size = n_a * n_b
    if size <= max(1 << 16, 2 * len(a)):
        present = np.flatnonzero(np.bincount(combined, minlength=size))
        remap = np.empty(size, np.int64)
        remap[present] = np.arange(len(present), dtype=np.int64)
        return remap[combined], present
    present, codes = np.unique(combined, return_inverse=True)
    return codes.reshape(-1).astype(np.int64, copy=False), present
