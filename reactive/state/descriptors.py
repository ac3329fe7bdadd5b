"""State descriptors: the name, kind, default and serializer of a piece of keyed state.

Created in a function's ``open()`` and passed to ``ctx.get_state(...)``. The name is the
state's identity inside its operator: it is what a snapshot stores and a restore matches.
Every kind takes a keyword ``ttl``: seconds, or a
:class:`~reactive.state.ttl_config.StateTtlConfig`, after which an entry expires
(:mod:`reactive.state.ttl`). Adding or removing a ttl changes how the state is stored: a job
restored from a checkpoint must keep it as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from ..serialization import Serializer

if TYPE_CHECKING:
    from .ttl_config import StateTtlConfig

__all__ = [
    "ListStateDescriptor",
    "MapStateDescriptor",
    "ReducingStateDescriptor",
    "StateDescriptor",
    "ValueStateDescriptor",
]


@dataclass(frozen=True)
class StateDescriptor:
    """Base of all descriptors.

    Attributes:
        name: unique within the operator.
        serializer: how values are stored in snapshots (and in RocksDB); ``None`` = pickle.
    """

    name: str
    kind: ClassVar[str] = "abstract"


@dataclass(frozen=True)
class ValueStateDescriptor(StateDescriptor):
    """A single value per key. ``default`` is returned for keys without a value; it is shared
    between keys, so it must be immutable (a number, a string, a tuple, None)."""

    default: Any = None
    serializer: Serializer | None = field(default=None, compare=False)
    ttl: StateTtlConfig | float | None = field(default=None, compare=False, kw_only=True)
    kind: ClassVar[str] = "value"


@dataclass(frozen=True)
class ListStateDescriptor(StateDescriptor):
    """A list of elements per key; ``serializer`` applies to the whole list."""

    serializer: Serializer | None = field(default=None, compare=False)
    ttl: StateTtlConfig | float | None = field(default=None, compare=False, kw_only=True)
    kind: ClassVar[str] = "list"


@dataclass(frozen=True)
class MapStateDescriptor(StateDescriptor):
    """A map of user keys to values per key; ``serializer`` applies to the whole map."""

    serializer: Serializer | None = field(default=None, compare=False)
    ttl: StateTtlConfig | float | None = field(default=None, compare=False, kw_only=True)
    kind: ClassVar[str] = "map"


@dataclass(frozen=True)
class ReducingStateDescriptor(StateDescriptor):
    """A value per key folded with ``reduce_fn(accumulated, new) -> accumulated``."""

    reduce_fn: Callable[[Any, Any], Any] = field(default=lambda a, b: b, compare=False)
    serializer: Serializer | None = field(default=None, compare=False)
    ttl: StateTtlConfig | float | None = field(default=None, compare=False, kw_only=True)
    kind: ClassVar[str] = "reducing"
