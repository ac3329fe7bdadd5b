"""Streams of the fluent API: :class:`Stream` (records of one transformation) and
:class:`KeyedStream` (partitioned by key); their methods add operators to the dataflow
(:mod:`reactive.dataflow`) that made them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, Self, overload

from typing_extensions import TypeVar

from .errors import ConfigurationError
from .functions import KeyedProcessFunction, ProcessFunction
from .graph import Edge, Partitioning, Transformation
from .runtime import operators as ops
from .serialization import Serializer
from .sinks import Sink
from .time.clock import ProcessingClock

if TYPE_CHECKING:
    from .columnar import ColumnarStream
    from .connected_streams import BroadcastConnectedStream, BroadcastStream, ConnectedStreams
    from .joined_streams import IntervalJoin, JoinedStreams
    from .runtime.operators.async_wait import AsyncFailure
    from .state.descriptors import MapStateDescriptor
    from .windowing.assigners import WindowAssigner
    from .windowing.stream import WindowedStream

__all__ = ["DataflowBuilder", "KeyedStream", "Stream"]

# The record type of a stream and the key type of a keyed stream; Any by default (PEP 696),
# so a plain ``Stream`` annotation means a stream of anything.
T = TypeVar("T", default=Any)
K = TypeVar("K", default=Any)
U = TypeVar("U")
KU = TypeVar("KU")


class DataflowBuilder(Protocol):
    """What a stream needs of the dataflow that made it (:class:`reactive.dataflow.Dataflow`):
    adding a transformation to its logical graph, and its processing-time clock."""

    processing_clock: ProcessingClock

    def _add(self, kind: str, name: str | None,
             factory: Callable[[Transformation], ops.StreamOperator], inputs: list[Edge],
             max_parallelism: int | None = None) -> Transformation: ...


class Stream(Generic[T]):
    """A stream of records of type ``T`` produced by one transformation; methods add
    operators, and type checkers follow the record type through them
    (``Stream[str].map(len)`` is a ``Stream[int]``).

    Args:
        flow: the dataflow being built.
        transformation: the operator producing the stream.
        partitioning: how the next operator's instances receive it.
        primary: the stateful operator this stream's configuration belongs to, when the
            stream is the output of a helper after it (a window operator's result filter):
            ``uid`` and ``name`` then name that operator (its uid keys its state; the helper
            gets ``<uid>/results``), and ``set_parallelism`` applies to both.
    """

    def __init__(self, flow: DataflowBuilder, transformation: Transformation,
                 partitioning: Partitioning = "forward",
                 primary: Transformation | None = None) -> None:
        self.flow = flow
        self.transformation = transformation
        self._partitioning: Partitioning = partitioning
        self._primary = primary

    def _edge(self) -> Edge:
        return Edge(self.transformation, self._partitioning)

    def _derive(self, transformation: Transformation,
                primary: Transformation | None = None) -> Stream[Any]:
        """The stream of another transformation of the same dataflow."""
        return Stream(self.flow, transformation, primary=primary)

    def _then(self, kind: str, name: str | None,
              factory: Callable[[Transformation], ops.StreamOperator]) -> Stream[Any]:
        return Stream(self.flow, self.flow._add(kind, name, factory, [self._edge()]))

    # configuration of the last operator
    def name(self, name: str) -> Self:
        """Set the operator's display name."""
        (self._primary or self.transformation).name = name
        return self

    def uid(self, uid: str) -> Self:
        """Set the operator's stable id (snapshots are keyed by it); set it on every stateful
        operator of a program that will evolve."""
        if self._primary is not None:
            self._primary.uid = uid
            self.transformation.uid = f"{uid}/results"
        else:
            self.transformation.uid = uid
        return self

    def set_parallelism(self, parallelism: int) -> Self:
        """Set the operator's parallelism.

        Raises:
            ConfigurationError: if < 1, or above what the operator supports.
        """
        t = self.transformation
        if parallelism < 1:
            raise ConfigurationError(f"parallelism must be >= 1, got {parallelism}")
        if t.max_parallelism is not None and parallelism > t.max_parallelism:
            raise ConfigurationError(
                f"operator {t.name!r} supports parallelism <= {t.max_parallelism}"
            )
        t.parallelism = parallelism
        if self._primary is not None:
            self._primary.parallelism = parallelism
        return self

    # transformations
    def map(self, fn: Callable[[T], U], name: str | None = None) -> Stream[U]:
        """One output per record: ``fn(record)``."""
        return self._then("map", name, lambda t: ops.MapOperator(t.name, t.resolved_uid, fn))

    def filter(self, fn: Callable[[T], object], name: str | None = None) -> Stream[T]:
        """Keep the records for which ``fn(record)`` is true."""
        return self._then("filter", name,
                          lambda t: ops.FilterOperator(t.name, t.resolved_uid, fn))

    def flat_map(self, fn: Callable[[T], Iterable[U] | None], name: str | None = None
                 ) -> Stream[U]:
        """Zero or more outputs per record: the items of ``fn(record)`` (None: none).

        A returned ``str`` or ``bytes`` fails the job with a ``UserFunctionError`` naming
        the operator and the record (iterating it would emit one record per character).
        """
        return self._then("flat_map", name,
                          lambda t: ops.FlatMapOperator(t.name, t.resolved_uid, fn))

    @overload
    def map_async(
        self,
        fn: Callable[[T], Awaitable[U]],
        capacity: int = 100,
        timeout: float | None = 5.0,
        ordered: bool = True,
        retry: ops.RetryPolicy | int | None = None,
        *,
        on_failure: Literal["dead_letter"],
        name: str | None = None,
    ) -> Stream[U | AsyncFailure]: ...

    @overload
    def map_async(
        self,
        fn: Callable[[T], Awaitable[U]],
        capacity: int = 100,
        timeout: float | None = 5.0,
        ordered: bool = True,
        retry: ops.RetryPolicy | int | None = None,
        on_failure: Literal["fail"] | Sink[AsyncFailure] | Callable[[AsyncFailure], object]
        = "fail",
        name: str | None = None,
    ) -> Stream[U]: ...

    def map_async(
        self,
        fn: Callable[[T], Awaitable[U]],
        capacity: int = 100,
        timeout: float | None = 5.0,
        ordered: bool = True,
        retry: ops.RetryPolicy | int | None = None,
        on_failure: Literal["fail", "dead_letter"] | Sink[AsyncFailure]
        | Callable[[AsyncFailure], object] = "fail",
        name: str | None = None,
    ) -> Stream[Any]:
        """One output per record: ``await fn(record)``, with at most ``capacity`` calls in
        flight per instance (Flink's async I/O); a full operator makes its task wait.

        The inputs of the calls not yet emitted at a checkpoint are in its snapshot and are
        called again, first, after a restore: ``fn`` must be idempotent. Set a ``uid`` on it.

        Args:
            fn: ``async def fn(record) -> result``.
            capacity: calls started and not yet emitted per instance, at most (>= 1).
            timeout: seconds one attempt may take (None: no limit).
            ordered: emit results in input order; else as calls complete, with watermarks
                as fences (no result crosses a watermark).
            retry: None (one attempt), a number of attempts (``retry=3``: three, with the
                default backoff), or a ``reactive.runtime.operators.RetryPolicy``.
            on_failure: for a call that timed out or failed on its last attempt:
                ``"fail"`` fails the job with an error naming the operator and the record;
                ``"dead_letter"`` emits an ``AsyncFailure(record, reason, attempts)`` in
                place of its result; a sink (or a callback) receives those ``AsyncFailure``
                records as a side output, and the stream returned carries results only.

        Raises:
            ConfigurationError: on invalid options.
        """
        emit = on_failure != "fail"
        if isinstance(on_failure, str) and on_failure not in ("fail", "dead_letter"):
            raise ConfigurationError(
                f"on_failure must be 'fail', 'dead_letter', a sink or a callable, got "
                f"{on_failure!r}")
        # validate now, not when the job starts
        ops.AsyncWaitOperator("", "", fn, capacity, timeout, ordered, retry)

        def factory(t: Transformation) -> ops.StreamOperator:
            return ops.AsyncWaitOperator(t.name, t.resolved_uid, fn, capacity, timeout,
                                         ordered, retry, "emit" if emit else "fail")

        stream = self._then("map_async", name, factory)
        if isinstance(on_failure, str):
            return stream
        # a side output, as windows' late data: the failures travel in band, wrapped, and
        # two filters after the operator split them from the results
        flow, t = self.flow, stream.transformation
        main = flow._add("map_async_results", f"{t.name}-results",
                         lambda mt: ops.FilterOperator(mt.name, mt.resolved_uid,
                                                       ops.is_async_result),
                         [Edge(t, "forward")])
        failed = flow._add("map_async_failures", f"{t.name}-failures",
                           lambda ft: ops.FilterOperator(ft.name, ft.resolved_uid,
                                                         ops.is_async_failure),
                           [Edge(t, "forward")])
        self._derive(failed).sink(on_failure, name=f"{t.name}-failures-sink")
        return self._derive(main, primary=t)

    def process(self, fn: ProcessFunction[T, U], name: str | None = None) -> Stream[U]:
        """Run a :class:`ProcessFunction` (operator state via ``ctx.get_operator_state``)."""
        if isinstance(fn, KeyedProcessFunction):
            raise ConfigurationError("a KeyedProcessFunction needs key_by(...) before process()")
        return self._then("process", name or type(fn).__name__,
                          lambda t: ops.ProcessOperator(t.name, t.resolved_uid, fn))

    def assign_timestamps(self, timestamp_fn: Callable[[T], float],
                          max_out_of_orderness: float = 0.0, idleness: float | None = None,
                          name: str | None = None) -> Stream[T]:
        """Give records event time and generate watermarks (bounded out-of-orderness).

        Records pass unchanged; event-time operators downstream re-derive each record's
        timestamp with ``timestamp_fn``. Each instance emits ``max timestamp -
        max_out_of_orderness`` as its watermark after each batch, and within a batch before
        any record behind the watermark of the records before it, so records are late as
        with one watermark per record, whatever the batch size; a record more than
        ``max_out_of_orderness`` seconds older than the largest one seen may be late.

        Args:
            timestamp_fn: record -> event time (seconds).
            max_out_of_orderness: tolerated disorder (seconds, >= 0).
            idleness: seconds without records after which the instance is marked idle, so
                downstream watermarks do not wait for it (None: never idle).

        Raises:
            ConfigurationError: on a negative delay or a non-positive idleness.
        """
        from .runtime.operators.timestamps import TimestampsAndWatermarksOperator

        clock = self.flow.processing_clock
        # validate now, not when the job starts
        TimestampsAndWatermarksOperator("", "", timestamp_fn, max_out_of_orderness, idleness,
                                        clock)
        stream = self._then(
            "assign_timestamps", name,
            lambda t: TimestampsAndWatermarksOperator(
                t.name, t.resolved_uid, timestamp_fn, max_out_of_orderness, idleness,
                self.flow.processing_clock),
        )
        stream.transformation.timestamp_fn = timestamp_fn
        return stream

    def key_by(self, key_selector: Callable[[T], KU],
               key_serializer: Serializer | None = None) -> KeyedStream[KU, T]:
        """Partition by key: records with equal keys go to the same instance, and keyed
        state is scoped to the key.

        A key's key group (and its bytes in the RocksDB backend) come from its canonical
        encoding (:mod:`reactive.key_encoding`), the same in every process, so keys that
        compare equal (``1``, ``1.0``, ``True``) share their state. Keys must be None, bool,
        int, float (not NaN), str, bytes, or tuples and frozensets of them, unless a
        ``key_serializer`` is given.

        Args:
            key_selector: record -> key; deterministic and hashable.
            key_serializer: encodes the keys instead of the canonical encoding, for other
                key types (Decimal, datetime, frozen dataclasses ...). It must write equal
                keys as identical bytes in every process, and ``deserialize(serialize(k))``
                must equal ``k`` (the RocksDB backend stores keys as these bytes). State
                written with one key encoding is not restored with another.

        Returns:
            The keyed stream.

        Raises:
            ConfigurationError: if ``key_serializer`` has no ``serialize``/``deserialize``.
        """
        if key_serializer is not None and not isinstance(key_serializer, Serializer):
            raise ConfigurationError(
                f"key_serializer must have serialize(key) -> bytes and deserialize(bytes), "
                f"got {type(key_serializer).__name__}"
            )
        return KeyedStream(self.flow, self.transformation, key_selector, key_serializer)

    def to_columnar(self, schema: Any, name: str | None = None) -> ColumnarStream:
        """A columnar stream of this stream's records (``dict`` s: column -> value), each
        channel batch converted to one record batch of ``schema`` (a ``pyarrow.Schema``).

        Raises:
            UserFunctionError: (when running) for a record that does not convert, naming
                the operator, the record and the column.
        """
        from .columnar import ColumnarStream
        from .columnar.operators import ToColumnarOperator

        t = self._then("to_columnar", name,
                       lambda t: ToColumnarOperator(t.name, t.resolved_uid, schema))
        flow = self.flow
        return ColumnarStream(flow, t.transformation, schema, lambda t: Stream(flow, t))

    def rebalance(self) -> Stream[T]:
        """Distribute batches round robin over the next operator's instances."""
        return Stream(self.flow, self.transformation, "rebalance")

    @overload
    def broadcast(self) -> Stream[T]: ...

    @overload
    def broadcast(self, descriptor: MapStateDescriptor, /, *descriptors: MapStateDescriptor
                  ) -> BroadcastStream: ...

    def broadcast(self, *descriptors: MapStateDescriptor) -> Stream[T] | BroadcastStream:
        """Send every record to every instance of the next operator.

        With state descriptors, return a ``BroadcastStream`` to ``connect`` to another
        stream: the operator built from the connection keeps one broadcast state (a map)
        per descriptor, the same in every instance (Flink's broadcast state pattern; see
        ``reactive.connected_streams``).

        Raises:
            ConfigurationError: for descriptors that are not ``MapStateDescriptor`` s.
        """
        if not descriptors:
            return Stream(self.flow, self.transformation, "broadcast")
        from .connected_streams import BroadcastStream

        return BroadcastStream(self, list(descriptors))

    @overload
    def connect(self, other: BroadcastStream) -> BroadcastConnectedStream[Stream]: ...

    @overload
    def connect(self, other: Stream) -> ConnectedStreams[Stream]: ...

    def connect(self, other: Stream | BroadcastStream
                ) -> ConnectedStreams[Stream] | BroadcastConnectedStream[Stream]:
        """Connect two streams for one two-input operator (``map(fn1, fn2)``,
        ``process(CoProcessFunction)`` ...; keyed when both are keyed), or this stream with
        a broadcast stream (``process(BroadcastProcessFunction)``). Barriers are aligned
        across both inputs and the watermark is the minimum of both.

        Raises:
            ConfigurationError: for a stream of another dataflow.
        """
        from .connected_streams import BroadcastConnectedStream, BroadcastStream, ConnectedStreams

        if isinstance(other, BroadcastStream):
            return BroadcastConnectedStream(self, other)
        return ConnectedStreams(self, other)

    def join(self, other: Stream) -> JoinedStreams[Stream]:
        """A window join with ``other``: ``a.join(b).where(f).equal_to(g)
        .window(TumblingEventTimeWindows.of(60)).apply(lambda l, r: ...)`` (see
        ``reactive.joined_streams``)."""
        from .joined_streams import JoinedStreams

        if other.flow is not self.flow:
            raise ConfigurationError("join() of streams of different dataflows")
        return JoinedStreams(self, other)

    def union(self, *others: Stream[T]) -> Stream[T]:
        """Merge streams (of the same record type) into one."""
        edges = [self._edge(), *(o._edge() for o in others)]
        for o in others:
            if o.flow is not self.flow:
                raise ConfigurationError("union() of streams of different dataflows")
        t = self.flow._add("union", "union",
                           lambda t: ops.StreamOperator(t.name, t.resolved_uid), edges)
        return Stream(self.flow, t)

    def iterate(self, step: Callable[[Stream[T]], tuple[Stream[T], Stream[U]]],
                name: str | None = None, uid: str | None = None) -> Stream[U]:
        """A loop: ``step(loop_input)`` returns ``(feedback, output)``; the feedback stream
        flows back into ``loop_input`` beside this stream's records, the output leaves the
        loop (structured loops: Carbone 2018 (PhD thesis), section 6.3.3; the only way to build
        a cycle).

        ```python
        def step(loop_input):            # (vertex, label) proposals
            best = loop_input.key_by(lambda p: p[0]).process(KeepSmallestLabel())
            return best.flat_map(to_neighbours), best
        labels = proposals.iterate(step, uid="propagate")
        ```

        The step may key, keep keyed state and chain several operators. Snapshots stay
        exactly once: the loop's head logs the records coming back around while a
        checkpoint's barrier travels the loop, and only those (ABS Algorithm 2; see
        ``reactive.runtime.iteration_head``). A bounded input ends once it has ended and no
        record is left in the loop. Watermarks do not circulate: event time inside and
        after the loop ends with the input.

        Args:
            step: the loop body, called once while the dataflow is built.
            name: the head's display name.
            uid: the head's stable id (its snapshot, the back-edge log, is keyed by it);
                the tail gets ``<uid>/tail``.

        Returns:
            The step's output stream.

        Raises:
            ConfigurationError: when the step does not return two streams of this
                dataflow, the feedback does not come from the loop's input, or the loop
                holds an async operator (its calls in flight would escape the back-edge
                log and the end-of-loop detection).
        """
        from .runtime.operators.iteration import IterationHeadOperator, IterationTailOperator

        flow = self.flow
        head = flow._add("iteration_head", name or "iteration",
                         lambda t: IterationHeadOperator(t.name, t.resolved_uid), [self._edge()])
        head.uid = uid
        result = step(Stream[T](flow, head))
        if (not isinstance(result, tuple) or len(result) != 2
                or not all(isinstance(s, Stream) and s.flow is flow for s in result)):
            raise ConfigurationError(
                "iterate(step): step(loop_input) must return (feedback, output), two streams "
                "of this dataflow")
        feedback, output = result
        body = _loop_body(head, feedback.transformation)
        if not body:
            raise ConfigurationError(
                "iterate(step): the feedback stream must be computed from loop_input")
        for t in body:
            if t.kind == "map_async":
                raise ConfigurationError(
                    f"iterate(step): operator {t.name!r} is a map_async inside the loop; its "
                    "calls in flight would escape the loop's snapshots and end detection")
        tail = flow._add("iteration_tail", f"{head.name}-feedback",
                         lambda t: IterationTailOperator(t.name, t.resolved_uid),
                         [feedback._edge()])
        tail.uid = None if uid is None else f"{uid}/tail"
        tail.loop_head = head
        return output

    def sink(self, sink: Sink[T] | Callable[[T], object], name: str | None = None
             ) -> Stream[T]:
        """Send records to a :class:`Sink`, or call ``sink(record)`` for each (a callback
        sink: at-least-once, it sees replayed records again after a recovery)."""
        from .defaults import callback_sink

        s: Sink[T] = sink if isinstance(sink, Sink) else callback_sink(sink)
        stream = self._then("sink", name or type(s).__name__,
                            lambda t: ops.SinkOperator(t.name, t.resolved_uid, s))
        stream.transformation.sink = s
        return stream


def _loop_body(head: Transformation, last: Transformation) -> list[Transformation]:
    """The transformations on a path from ``head`` to ``last`` (both included); empty when
    ``last`` does not descend from ``head``."""
    memo: dict[int, bool] = {}

    def reaches_head(t: Transformation) -> bool:
        if t is head:
            return True
        if t.id not in memo:
            memo[t.id] = any(reaches_head(e.upstream) for e in t.inputs)
        return memo[t.id]

    if not reaches_head(last):
        return []
    body, todo, seen = [], [last], set()
    while todo:
        t = todo.pop()
        if t.id in seen or not reaches_head(t):
            continue
        seen.add(t.id)
        body.append(t)
        todo.extend(e.upstream for e in t.inputs)
    return body


class KeyedStream(Stream[T], Generic[K, T]):
    """A stream of records of type ``T`` partitioned by keys of type ``K`` (after
    ``key_by``)."""

    def __init__(self, flow: DataflowBuilder, transformation: Transformation,
                 key_selector: Callable[[T], K],
                 key_serializer: Serializer | None = None) -> None:
        super().__init__(flow, transformation, "hash")
        self.key_selector = key_selector
        self.key_serializer = key_serializer

    def _edge(self) -> Edge:
        return Edge(self.transformation, "hash", self.key_selector, self.key_serializer)

    def process(self, fn: ProcessFunction[T, U], name: str | None = None) -> Stream[U]:
        """Run a :class:`KeyedProcessFunction` (a ``KeyedProcessFunction[K, T, U]`` emits a
        ``Stream[U]``); state is scoped to each record's key, and
        ``ctx.timer_service`` sets timers that call ``fn.on_timer``."""
        k = self.key_selector
        flow = self.flow
        return self._then("process", name or type(fn).__name__,
                          lambda t: ops.TimedKeyedProcessOperator(t.name, t.resolved_uid, fn, k,
                                                              flow.processing_clock))

    def window(self, assigner: WindowAssigner,
               timestamp: Callable[[Any], float] | None = None) -> WindowedStream[Stream]:
        """Cut each key's records into windows (``TumblingEventTimeWindows.of(60)`` ...).

        Args:
            assigner: the window assigner.
            timestamp: record -> event time (seconds); default: the function given to the
                ``assign_timestamps`` upstream.

        Raises:
            ConfigurationError: for event-time windows without timestamps upstream.
        """
        from .windowing.stream import WindowedStream

        return WindowedStream(self, [assigner], timestamp)

    def windows(self, assigners: list[WindowAssigner],
                timestamp: Callable[[Any], float] | None = None) -> WindowedStream[Stream]:
        """Several periodic window definitions over the same records, aggregated with
        shared partial aggregates (Cutty, Carbone 2018 (PhD thesis), chapter 5); results carry
        the definition's index as ``WindowResult.query``.

        Raises:
            ConfigurationError: for non-periodic or mixed count/time assigners.
        """
        from .windowing.stream import WindowedStream

        return WindowedStream(self, list(assigners), timestamp)

    def count_window(self, size: int, slide: int | None = None) -> WindowedStream[Stream]:
        """Windows of ``size`` records of a key, every ``slide`` records (tumbling when
        None); windows are ``[start, end)`` positions of the key's records.

        Raises:
            ConfigurationError: if size or slide is not a positive integer.
        """
        from .windowing.assigners import CountWindows
        from .windowing.stream import WindowedStream

        return WindowedStream(self, [CountWindows.of(size, slide)])

    def interval_join(self, other: KeyedStream[K, Any]) -> IntervalJoin[Stream]:
        """Join with another keyed stream on event time: ``a.key_by(f).interval_join(
        b.key_by(g)).between(-60, 0).process(fn)`` pairs each record of this stream at
        ``t`` with the records of ``other`` with an equal key at ``t - 60 <= t' <= t``
        (Flink's interval join; see ``reactive.joined_streams``).

        Raises:
            ConfigurationError: when ``other`` is not keyed or encodes its keys otherwise.
        """
        from .joined_streams import IntervalJoin

        return IntervalJoin(self, other)

    def reduce(self, fn: Callable[[T, T], T], name: str | None = None) -> Stream[T]:
        """Emit the running ``fn(accumulated, record)`` per key (the first record as is)."""
        k = self.key_selector
        return self._then("reduce", name,
                          lambda t: ops.ReduceOperator(t.name, t.resolved_uid, k, fn))
