"""State descriptors: the name, kind, default and serializer of a piece of keyed state.

Created in a function's ``open()`` and passed to ``ctx.get_state(...)``. The name is the
state's identity inside its operator: it is what a snapshot stores and a restore matches.
Descriptors are generic in the state's types, and ``RuntimeContext.get_state`` returns the
matching state: ``ctx.get_state(ValueStateDescriptor("count", default=0))`` is a
``ValueState[int]`` to a type checker (``ValueStateDescriptor[int | None]("last")`` for a
value without a default). Every kind takes a keyword ``ttl``: seconds, or a
:class:`~reactive.state.ttl_config.StateTtlConfig`, after which an entry expires
(:mod:`reactive.state.ttl`). Adding or removing a ttl changes how the state is stored: a job
restored from a checkpoint must keep it as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol

from typing_extensions import TypeVar

from ..serialization import Serializer

if TYPE_CHECKING:
    from .ttl_config import StateTtlConfig

__all__ = [
    "AggregatingStateDescriptor",
    "Aggregation",
    "ListStateDescriptor",
    "MapStateDescriptor",
    "ReducingStateDescriptor",
    "StateDescriptor",
    "ValueStateDescriptor",
]

# Any by default (PEP 696), so a plain ``ValueStateDescriptor`` annotation stays valid
T = TypeVar("T", default=Any)
K = TypeVar("K", default=Any)
V = TypeVar("V", default=Any)
IN = TypeVar("IN", default=Any)
ACC = TypeVar("ACC", default=Any)
OUT = TypeVar("OUT", default=Any)
IN_contra = TypeVar("IN_contra", contravariant=True, default=Any)
OUT_co = TypeVar("OUT_co", covariant=True, default=Any)


class Aggregation(Protocol[IN_contra, ACC, OUT_co]):
    """What an :class:`AggregatingStateDescriptor` folds with: the accumulator's life of
    Flink's ``AggregateFunction`` (``reactive.windowing.AggregateFunction`` is one)."""

    def create_accumulator(self) -> ACC:
        """A new, empty accumulator."""
        ...

    def add(self, value: IN_contra, accumulator: ACC) -> ACC:
        """Fold ``value`` into ``accumulator``; return the accumulator."""
        ...

    def get_result(self, accumulator: ACC) -> OUT_co:
        """The result of an accumulator."""
        ...


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
class ValueStateDescriptor(StateDescriptor, Generic[T]):
    """A single value of type ``T`` per key. ``default`` is returned for keys without a
    value; it is shared between keys, so it must be immutable (a number, a string, a tuple,
    None)."""

    default: T | None = None
    serializer: Serializer | None = field(default=None, compare=False)
    ttl: StateTtlConfig | float | None = field(default=None, compare=False, kw_only=True)
    kind: ClassVar[str] = "value"


@dataclass(frozen=True)
class ListStateDescriptor(StateDescriptor, Generic[T]):
    """A list of elements of type ``T`` per key; ``serializer`` applies to the whole list."""

    serializer: Serializer | None = field(default=None, compare=False)
    ttl: StateTtlConfig | float | None = field(default=None, compare=False, kw_only=True)
    kind: ClassVar[str] = "list"


@dataclass(frozen=True)
class MapStateDescriptor(StateDescriptor, Generic[K, V]):
    """A map of user keys of type ``K`` to values of type ``V`` per key; ``serializer``
    applies to the whole map."""

    serializer: Serializer | None = field(default=None, compare=False)
    ttl: StateTtlConfig | float | None = field(default=None, compare=False, kw_only=True)
    kind: ClassVar[str] = "map"


@dataclass(frozen=True)
class ReducingStateDescriptor(StateDescriptor, Generic[T]):
    """A value of type ``T`` per key folded with ``reduce_fn(accumulated, new) ->
    accumulated``."""

    reduce_fn: Callable[[T, T], T] = field(default=lambda a, b: b, compare=False)
    serializer: Serializer | None = field(default=None, compare=False)
    ttl: StateTtlConfig | float | None = field(default=None, compare=False, kw_only=True)
    kind: ClassVar[str] = "reducing"


@dataclass(frozen=True)
class AggregatingStateDescriptor(StateDescriptor, Generic[IN, ACC, OUT]):
    """An accumulator of type ``ACC`` per key, folded from inputs of type ``IN`` and read as
    a result of type ``OUT`` with ``aggregate_function`` (Flink's
    ``AggregatingStateDescriptor``). The accumulator is stored as a value state of the same
    name: ``serializer`` and ``ttl`` apply to it.

    Args:
        name: unique within the operator.
        aggregate_function: ``create_accumulator`` / ``add`` / ``get_result`` (a
            ``reactive.windowing.AggregateFunction`` or any object with those methods).
    """

    aggregate_function: Aggregation[IN, ACC, OUT] = field(compare=False)
    serializer: Serializer | None = field(default=None, compare=False)
    ttl: StateTtlConfig | float | None = field(default=None, compare=False, kw_only=True)
    kind: ClassVar[str] = "aggregating"

    def accumulator_descriptor(self) -> ValueStateDescriptor[ACC]:
        """The value state the accumulator is stored in (what backends and snapshots see)."""
        return ValueStateDescriptor(self.name, None, self.serializer, ttl=self.ttl)
