"""The columnar ``key_by`` exchange: each row's key group computed over the batch, then one
``take`` per output channel (instead of one Python call per record).

The key groups come from :class:`~reactive.columnar.key_index.KeyIndex`, which hashes each
distinct key's canonical bytes as the per-record partitioner does, so a row goes to the
instance that owns its key's key group under either API.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..runtime.partitioner import Partitioner, VectorizedKeySelector
from .key_index import KeyIndex
from .schema import pa

__all__ = ["ColumnKeySelector", "ColumnarKeyGroupPartitioner"]


class ColumnKeySelector(VectorizedKeySelector):
    """The key of a columnar ``key_by``: the values of ``columns``.

    Called on a record (a ``dict``, as ``to_records()`` emits), it returns the key the
    per-record API would use for it: the column's value, or the tuple of the columns'
    values. The runtime asks it for the edge's partitioner
    (:meth:`create_partitioner`), which works on whole record batches.

    Args:
        columns: the key column names (at least one).
    """

    def __init__(self, columns: list[str]) -> None:
        self.columns = columns

    def __call__(self, record: dict[str, Any]) -> Any:
        if len(self.columns) == 1:
            return record[self.columns[0]]
        return tuple(record[c] for c in self.columns)

    def create_partitioner(self, num_channels: int, max_parallelism: int,
                           operator: str | None) -> Partitioner:
        """The partitioner of a ``key_by`` edge into ``num_channels`` instances."""
        return ColumnarKeyGroupPartitioner(num_channels, self.columns, max_parallelism,
                                           operator)


class ColumnarKeyGroupPartitioner(Partitioner):
    """Splits each record batch of a channel batch by the owning instance of its rows' key
    groups (``instance = key_group * parallelism // max_parallelism``).

    Args:
        num_channels: the downstream parallelism.
        columns: the key columns.
        max_parallelism: the number of key groups.
        operator: the keyed operator's uid, named in key errors.
    """

    def __init__(self, num_channels: int, columns: list[str], max_parallelism: int,
                 operator: str | None = None) -> None:
        super().__init__(num_channels)
        # the index's memory is bounded like the per-record partitioner's key memo
        self.index = KeyIndex(columns, max_parallelism, operator, capacity=200_000)
        self._channel_of = (np.arange(max_parallelism, dtype=np.int64) * num_channels
                            // max_parallelism)

    def channels(self, batch: Any) -> np.ndarray:
        """Per row of ``batch``, the index of the channel its key group goes to."""
        keys = self.index.lookup(batch)
        group_channels = self._channel_of[self.index.key_groups[keys.slots]]
        channels: np.ndarray = group_channels[keys.codes]
        return channels

    def split(self, batch: list[Any]) -> list[list[Any]]:
        n = self.num_channels
        if n == 1:
            return [batch]
        out: list[list[Any]] = [[] for _ in range(n)]
        for b in batch:
            channel = self.channels(b)
            # channels < 2**15: a 16-bit stable sort is numpy's radix sort, O(rows)
            order = np.argsort(channel.astype(np.uint16), kind="stable")
            bounds = np.searchsorted(channel[order], np.arange(n + 1))
            for c in range(n):
                lo, hi = int(bounds[c]), int(bounds[c + 1])
                if hi > lo:
                    out[c].append(b if hi - lo == b.num_rows
                                  else b.take(pa.array(order[lo:hi])))
        return out
