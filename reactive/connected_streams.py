"""The fluent API of two-input operators: ``a.connect(b)`` gives :class:`ConnectedStreams`
(co-map, co-flat-map, co-process), ``rules.broadcast(descriptor)`` a :class:`BroadcastStream`
and ``events.connect(rules.broadcast(...))`` a :class:`BroadcastConnectedStream` (Flink's
``ConnectedStreams``, ``BroadcastStream`` and ``BroadcastConnectedStream``).

```python
class Enrich(KeyedCoProcessFunction):          # both inputs share the state of a key
    def open(self, ctx):
        self.name = ctx.get_state(ValueStateDescriptor("name"))
    def process_element1(self, user, ctx):     # (user_id, name)
        self.name.update(user[1])
    def process_element2(self, click, ctx):    # (user_id, url)
        yield (self.name.value(), click[1])

users.key_by(lambda u: u[0]).connect(clicks.key_by(lambda c: c[0])).process(Enrich())
```
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Generic, Protocol, TypeGuard, TypeVar

from .errors import ConfigurationError
from .graph import Edge, GraphBuilder, Transformation
from .runtime import operators as ops
from .runtime.operators.broadcast_process import (
    BroadcastProcessOperator,
    KeyedBroadcastProcessOperator,
)
from .runtime.operators.two_input import (
    CoFlatMapOperator,
    CoMapOperator,
    CoProcessOperator,
    KeyedCoProcessOperator,
)
from .state.descriptors import MapStateDescriptor
from .two_input_functions import (
    BroadcastProcessFunction,
    CoProcessFunction,
    KeyedBroadcastProcessFunction,
    KeyedCoProcessFunction,
)

__all__ = [
    "BroadcastConnectedStream",
    "BroadcastStream",
    "ConnectedStreams",
    "KeyedStreamInput",
    "StreamInput",
    "check_compatible_keys",
    "is_keyed",
    "two_input_edges",
]

S = TypeVar("S", covariant=True)


class StreamInput(Protocol[S]):
    """What a two-input operator needs of each input stream (the fluent API's ``Stream``),
    so that this module does not depend on the API module: its dataflow, transformation and
    edge, and how it makes a stream of another transformation (the type ``S`` of the
    streams the operators return)."""

    @property
    def flow(self) -> GraphBuilder: ...

    @property
    def transformation(self) -> Transformation: ...

    def _edge(self) -> Edge: ...

    def _derive(self, transformation: Transformation,
                primary: Transformation | None = None) -> S: ...

    def key_by(self, key_selector: Callable[[Any], Any]) -> KeyedStreamInput[S]: ...


class KeyedStreamInput(StreamInput[S], Protocol[S]):
    """A keyed input (the fluent API's ``KeyedStream``): its key selector and key
    serializer too."""

    @property
    def key_selector(self) -> Callable[[Any], Any]: ...

    @property
    def key_serializer(self) -> Any: ...


def is_keyed(stream: StreamInput[S]) -> TypeGuard[KeyedStreamInput[S]]:
    """Whether ``stream`` is keyed (came out of ``key_by``)."""
    return getattr(stream, "key_selector", None) is not None


def two_input_edges(first: StreamInput[Any], second: StreamInput[Any]) -> list[Edge]:
    """The edges of a two-input operator: ``first`` feeds input 1, ``second`` input 2.

    Raises:
        ConfigurationError: for streams of different dataflows.
    """
    if first.flow is not second.flow:
        raise ConfigurationError("connect()/join() of streams of different dataflows")
    edge2 = second._edge()
    edge2.side = 1
    return [first._edge(), edge2]


def check_compatible_keys(first: KeyedStreamInput[Any], second: KeyedStreamInput[Any],
                          what: str) -> None:
    """Both inputs of a keyed two-input operator must place equal keys in the same key
    group: both canonical (the default) or the same ``key_serializer``.

    Raises:
        ConfigurationError: when their key encodings differ.
    """
    if first.key_serializer is not second.key_serializer:
        raise ConfigurationError(
            f"{what}: both inputs must encode their keys alike (equal keys must reach the "
            "same instance and state): give both key_by(...) the same key_serializer, or "
            "neither")


class ConnectedStreams(Generic[S]):
    """Two streams connected for one two-input operator; records keep their input's type.

    Keyed when both are keyed (``a.key_by(f).connect(b.key_by(g))``): records with equal
    keys from either input then reach the same instance and share its keyed state.

    Args:
        first: input 1 (``map1``/``process_element1``).
        second: input 2.

    Raises:
        ConfigurationError: for streams of different dataflows, or when only one is keyed.
    """

    def __init__(self, first: StreamInput[S], second: StreamInput[Any]) -> None:
        if first.flow is not second.flow:
            raise ConfigurationError("connect() of streams of different dataflows")
        self.first = first
        self.second = second
        self.flow = first.flow

    @property
    def keyed(self) -> bool:
        """Whether both inputs are keyed."""
        return is_keyed(self.first) and is_keyed(self.second)

    def _add(self, kind: str, name: str | None,
             factory: Callable[[Transformation], ops.StreamOperator]) -> S:
        first, second = self.first, self.second
        if is_keyed(first) != is_keyed(second):
            raise ConfigurationError(
                f"{kind}: key both connected streams (a.key_by(f).connect(b.key_by(g))) or "
                "neither; one keyed input cannot share state with an unkeyed one")
        if is_keyed(first) and is_keyed(second):
            check_compatible_keys(first, second, kind)
        t = self.flow._add(kind, name, factory, two_input_edges(first, second))
        return first._derive(t)

    def map(self, fn1: Callable[[Any], Any], fn2: Callable[[Any], Any],
            name: str | None = None) -> S:
        """One output per record: ``fn1(record)`` for input 1, ``fn2(record)`` for input 2."""
        return self._add("co_map", name,
                         lambda t: CoMapOperator(t.name, t.resolved_uid, fn1, fn2))

    def flat_map(self, fn1: Callable[[Any], Iterable[Any] | None],
                 fn2: Callable[[Any], Iterable[Any] | None], name: str | None = None) -> S:
        """Zero or more outputs per record: the items ``fn1``/``fn2`` return."""
        return self._add("co_flat_map", name,
                         lambda t: CoFlatMapOperator(t.name, t.resolved_uid, fn1, fn2))

    def process(self, fn: CoProcessFunction, name: str | None = None) -> S:
        """Run a :class:`~reactive.two_input_functions.CoProcessFunction` (unkeyed inputs,
        operator state) or a ``KeyedCoProcessFunction`` (keyed inputs: keyed state and
        timers shared by both inputs' records of a key).

        Raises:
            ConfigurationError: a keyed function on unkeyed inputs, or a function that is
                not a co-process function.
        """
        if not isinstance(fn, CoProcessFunction):
            raise ConfigurationError(
                f"connect(...).process() takes a CoProcessFunction or KeyedCoProcessFunction, "
                f"got {type(fn).__name__}")
        label = name or type(fn).__name__
        first, second = self.first, self.second
        if is_keyed(first) and is_keyed(second):
            k1, k2 = first.key_selector, second.key_selector
            flow = self.flow
            return self._add("co_process", label, lambda t: KeyedCoProcessOperator(
                t.name, t.resolved_uid, fn, k1, k2, flow.processing_clock))
        if isinstance(fn, KeyedCoProcessFunction):
            raise ConfigurationError(
                f"{type(fn).__name__} is a KeyedCoProcessFunction: key both inputs first "
                "(a.key_by(f).connect(b.key_by(g)))")
        return self._add("co_process", label,
                         lambda t: CoProcessOperator(t.name, t.resolved_uid, fn))


class BroadcastStream:
    """A stream whose records reach every instance of the operator it is connected to,
    with the broadcast states that operator keeps (``stream.broadcast(descriptor, ...)``).

    Args:
        stream: the stream to broadcast.
        descriptors: the broadcast states (``MapStateDescriptor`` s, distinct names).

    Raises:
        ConfigurationError: for another kind of descriptor or duplicate names.
    """

    def __init__(self, stream: StreamInput[Any], descriptors: list[MapStateDescriptor]) -> None:
        for d in descriptors:
            if not isinstance(d, MapStateDescriptor):
                raise ConfigurationError(
                    f"broadcast state needs MapStateDescriptor s, got {type(d).__name__}")
        names = [d.name for d in descriptors]
        if len(set(names)) != len(names):
            raise ConfigurationError(f"broadcast state names must be distinct: {names}")
        self.flow = stream.flow
        self.transformation = stream.transformation
        self.descriptors = list(descriptors)

    def _edge(self) -> Edge:
        return Edge(self.transformation, "broadcast")


class BroadcastConnectedStream(Generic[S]):
    """A (keyed or unkeyed) stream connected with a :class:`BroadcastStream`; end it with
    :meth:`process`.

    Args:
        stream: the non-broadcast input (input 1).
        broadcast: the broadcast input (input 2).
    """

    def __init__(self, stream: StreamInput[S], broadcast: BroadcastStream) -> None:
        if stream.flow is not broadcast.flow:
            raise ConfigurationError("connect() of streams of different dataflows")
        self.stream = stream
        self.broadcast = broadcast

    def process(self, fn: BroadcastProcessFunction, name: str | None = None) -> S:
        """Run a ``BroadcastProcessFunction`` (unkeyed input) or a
        ``KeyedBroadcastProcessFunction`` (keyed input).

        Raises:
            ConfigurationError: when the function does not match the input (keyed or not).
        """
        stream, descriptors = self.stream, list(self.broadcast.descriptors)
        flow = stream.flow
        keyed = is_keyed(stream)
        if keyed != isinstance(fn, KeyedBroadcastProcessFunction) or \
                not isinstance(fn, BroadcastProcessFunction):
            wanted = "KeyedBroadcastProcessFunction" if keyed else "BroadcastProcessFunction"
            raise ConfigurationError(
                f"connect(broadcast).process() on a{' keyed' if keyed else 'n unkeyed'} "
                f"stream takes a {wanted}, got {type(fn).__name__}")
        edge2 = self.broadcast._edge()
        edge2.side = 1
        edges = [stream._edge(), edge2]
        label = name or type(fn).__name__
        if is_keyed(stream):
            k = stream.key_selector
            t = flow._add("broadcast_process", label,
                          lambda t: KeyedBroadcastProcessOperator(
                              t.name, t.resolved_uid, fn, k, descriptors,
                              flow.processing_clock), edges)
        else:
            t = flow._add("broadcast_process", label,
                          lambda t: BroadcastProcessOperator(t.name, t.resolved_uid, fn,
                                                             descriptors), edges)
        return stream._derive(t)
