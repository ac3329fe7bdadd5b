"""The logical graph a :class:`~reactive.dataflow.Dataflow` builds: transformations and edges.

Each :class:`Transformation` is one logical operator with a name, a stable ``uid`` and a
parallelism; its :class:`Edge` s say where its input comes from and how it is partitioned.
The runtime expands it into the execution graph (``reactive.runtime.execution_graph``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from .runtime.operators import StreamOperator
from .serialization import Serializer
from .time.clock import ProcessingClock

__all__ = ["Edge", "GraphBuilder", "LogicalGraph", "Partitioning", "Transformation"]

Partitioning = Literal["forward", "rebalance", "hash", "broadcast"]


@dataclass
class Edge:
    """An input of a transformation.

    Attributes:
        upstream: the producing transformation.
        partitioning: how records are routed to the consumer's instances.
        key_selector: record -> key, for ``"hash"`` (key_by) edges.
        key_serializer: encodes the keys of a ``"hash"`` edge instead of the canonical key
            encoding (``key_by(selector, key_serializer=...)``); None for the canonical one.
        side: which input of a two-input operator the edge feeds (0: the first, 1: the
            second, as ``process_element1``/``process_element2``); 0 for every other edge
            (a union's inputs are all the same input).
    """

    upstream: Transformation
    partitioning: Partitioning
    key_selector: Callable[[Any], Any] | None = None
    key_serializer: Serializer | None = None
    side: int = 0


@dataclass(eq=False)
class Transformation:
    """One logical operator.

    Attributes:
        id: position in the dataflow (construction order, so inputs come first).
        kind: ``"source"``, ``"map"``, ``"process"``, ``"sink"`` ...
        name: display name.
        uid: stable id that snapshots are keyed by (defaults to ``<kind>-<id>``).
        parallelism: None means the dataflow's default.
        factory: ``factory()`` returns a fresh operator instance.
        inputs: where records come from (empty for sources).
        max_parallelism: a bound imposed by the operator (e.g. a non-parallel source).
        timestamp_fn: record -> event time (seconds), set by ``assign_timestamps``; event-time
            windows downstream re-derive record timestamps with it.
        sink: the :class:`~reactive.sinks.Sink` of a ``sink`` transformation (the job asks
            it whether it is exactly-once when choosing a checkpoint to restore).
        source: the :class:`~reactive.sources.Source` of a ``source`` transformation (the
            job tells an application-fed source when it starts and ends).
        loop_head: for an iteration's tail, the iteration's head, which its feedback
            reaches through the loop's back edge (the one edge not in ``inputs``).
        batch_size: elements per channel batch on its output edges (None: the dataflow's);
            1 for operators that emit Arrow record batches, so each record batch is sent
            on its own, paced by the channels' bounds, and barriers pass between them.
    """

    id: int
    kind: str
    name: str
    factory: Callable[[], StreamOperator]
    inputs: list[Edge] = field(default_factory=list)
    uid: str | None = None
    parallelism: int | None = None
    max_parallelism: int | None = None
    timestamp_fn: Callable[[Any], float] | None = None
    sink: Any = None
    source: Any = None
    loop_head: Transformation | None = None
    batch_size: int | None = None

    @property
    def resolved_uid(self) -> str:
        """The uid, or the default derived from kind and position."""
        return self.uid if self.uid is not None else f"{self.kind}-{self.id}"


class LogicalGraph(Protocol):
    """A dataflow program as the runtime sees it (``reactive.Dataflow`` is one): its
    transformations and the settings of its execution."""

    name: str
    parallelism: int
    max_parallelism: int
    batch_size: int
    buffer_timeout: float
    channel_capacity: int
    transformations: list[Transformation]


class GraphBuilder(Protocol):
    """What the parts of the fluent API outside ``reactive.dataflow`` (windowed streams) use
    to add operators to the dataflow being built."""

    processing_clock: ProcessingClock

    def _add(self, kind: str, name: str | None,
             factory: Callable[[Transformation], StreamOperator], inputs: list[Edge],
             max_parallelism: int | None = None) -> Transformation: ...
