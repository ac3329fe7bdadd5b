"""Partitioners: split an output batch into per-channel batches.

Each returns ``list[list]`` with one (possibly empty) list per output channel. They work on
whole batches, so the per-record cost is one function call and a list append.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from ..errors import UnsupportedKeyError
from ..keygroups import KeyGroupAssigner
from ..serialization import Serializer

__all__ = [
    "BroadcastPartitioner",
    "ForwardPartitioner",
    "KeyGroupPartitioner",
    "KeySelectorError",
    "Partitioner",
    "RebalancePartitioner",
    "VectorizedKeySelector",
]


class KeySelectorError(Exception):
    """The key selector of a ``key_by`` raised (or returned an unhashable key) on ``record``."""

    def __init__(self, record: Any, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.record = record
        self.cause = cause


class Partitioner:
    """Base class: ``split(batch)`` returns a list of ``num_channels`` lists."""

    def __init__(self, num_channels: int) -> None:
        self.num_channels = num_channels

    def split(self, batch: list[Any]) -> list[list[Any]]:
        raise NotImplementedError


class VectorizedKeySelector(ABC):
    """A key selector whose ``key_by`` edge partitions whole batches itself (the columnar
    ``key_by``: record batches split by their rows' key groups), instead of the runtime's
    per-record :class:`KeyGroupPartitioner`. Called on one record it still returns that
    record's key (what the per-record API would use), so both put a key in one key group.
    """

    @abstractmethod
    def __call__(self, record: Any) -> Any:
        """The key of one record."""

    @abstractmethod
    def create_partitioner(self, num_channels: int, max_parallelism: int,
                           operator: str | None) -> Partitioner:
        """The partitioner of a ``key_by`` edge into ``num_channels`` instances.

        Args:
            num_channels: the downstream parallelism.
            max_parallelism: the number of key groups.
            operator: the keyed operator's uid, named in key errors.
        """


class ForwardPartitioner(Partitioner):
    """Everything to the single channel (point-wise edge between equal parallelisms)."""

    def split(self, batch: list[Any]) -> list[list[Any]]:
        return [batch]


class RebalancePartitioner(Partitioner):
    """Round robin over channels, a whole batch at a time (evens load, keeps batches big)."""

    def __init__(self, num_channels: int, start: int = 0) -> None:
        super().__init__(num_channels)
        self._next = start % num_channels

    def split(self, batch: list[Any]) -> list[list[Any]]:
        out: list[list[Any]] = [[] for _ in range(self.num_channels)]
        out[self._next] = batch
        self._next = (self._next + 1) % self.num_channels
        return out


class BroadcastPartitioner(Partitioner):
    """Every record to every channel."""

    def split(self, batch: list[Any]) -> list[list[Any]]:
        return [list(batch) for _ in range(self.num_channels)]


class KeyGroupPartitioner(Partitioner):
    """``key_by``: record -> key -> key group -> owning instance (DESIGN.md, key groups).

    Args:
        num_channels: the downstream parallelism.
        key_selector: record -> hashable key.
        max_parallelism: the number of key groups.
        key_serializer: the ``key_by`` key serializer (None: the canonical key encoding); the
            keyed operator's state backend encodes keys with the same one.
        operator: the uid of the keyed operator downstream, named in key errors.
    """

    def __init__(
        self, num_channels: int, key_selector: Callable[[Any], Any], max_parallelism: int,
        key_serializer: Serializer | None = None, operator: str | None = None,
    ) -> None:
        super().__init__(num_channels)
        self.key_selector = key_selector
        self.max_parallelism = max_parallelism
        self.operator = operator
        self.assigner = KeyGroupAssigner(max_parallelism, key_serializer=key_serializer)
        # key group -> channel, precomputed: instance_for(kg) = kg * p // maxp
        self._channel_of = [kg * num_channels // max_parallelism for kg in range(max_parallelism)]
        # key -> channel memo: a known key costs one dict hit in the per-record loop (no
        # call into the assigner); bounded like the assigner's own memo
        self._channel_cache: dict[Any, int] = {}

    def key_group_of(self, record: Any) -> int:
        """The key group of ``record``'s key."""
        return self.assigner(self.key_selector(record))

    def _channel_for(self, key: Any) -> int:
        """The memo miss: the key's channel from its key group, then memoized."""
        channel = self._channel_of[self.assigner(key)]
        cache = self._channel_cache
        if len(cache) >= self.assigner.cache_size:
            cache.clear()
        cache[key] = channel
        return channel

    def split(self, batch: list[Any]) -> list[list[Any]]:
        """Split ``batch`` by the owning instance of each record's key group.

        Raises:
            KeySelectorError: if the key selector raises, or returns a key without an
                encoding (its cause is then an :class:`~reactive.errors.UnsupportedKeyError`
                naming the keyed operator).
        """
        n = self.num_channels
        if n == 1:
            return [batch]
        out: list[list[Any]] = [[] for _ in range(n)]
        appends = [o.append for o in out]
        key_of = self.key_selector
        get = self._channel_cache.get
        miss = self._channel_for
        r = None
        try:
            for r in batch:
                key = key_of(r)
                channel = get(key)
                if channel is None:
                    channel = miss(key)
                appends[channel](r)
        except UnsupportedKeyError as exc:
            raise KeySelectorError(r, exc.for_operator(self.operator)) from exc
        except TypeError as exc:
            # an unhashable key fails the memo lookup before the assigner sees it: let the
            # assigner name it as it does
            try:
                miss(key_of(r))
            except UnsupportedKeyError as named:
                raise KeySelectorError(r, named.for_operator(self.operator)) from named
            except Exception:
                pass
            raise KeySelectorError(r, exc) from exc
        except Exception as exc:
            raise KeySelectorError(r, exc) from exc
        return out
