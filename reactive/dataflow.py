"""The fluent API: build a dataflow, then run it.

```python
flow = Dataflow("wordcount", parallelism=2, max_parallelism=128)
(flow.from_collection(words)
     .key_by(lambda w: w)
     .process(Count())
     .sink(results))
await flow.run(checkpoints=CheckpointConfig(interval=1.0, directory="chk"))
```
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Literal, Self, cast, overload

from typing_extensions import TypeVar, Unpack

from .config import CheckpointConfig, RestartStrategy, StartOptions
from .embedding.trio_host import running_under_trio
from .errors import ConfigurationError
from .functions import KeyedProcessFunction, ProcessFunction
from .graph import Edge, Partitioning, Transformation
from .runtime import operators as ops
from .serialization import Serializer
from .sinks import Sink
from .sources import Source
from .time.clock import ProcessingClock, SystemClock

if TYPE_CHECKING:
    from .columnar import ColumnarStream
    from .connected_streams import BroadcastConnectedStream, BroadcastStream, ConnectedStreams
    from .joined_streams import IntervalJoin, JoinedStreams
    from .runtime.job import Job
    from .runtime.operators.async_wait import AsyncFailure
    from .state.backend import StateBackend
    from .state.descriptors import MapStateDescriptor
    from .windowing.assigners import WindowAssigner
    from .windowing.stream import WindowedStream

__all__ = ["Dataflow", "KeyedStream", "Stream"]

# The record type of a stream and the key type of a keyed stream; Any by default (PEP 696),
# so a plain ``Stream`` annotation means a stream of anything.
T = TypeVar("T", default=Any)
K = TypeVar("K", default=Any)
U = TypeVar("U")
KU = TypeVar("KU")


class Dataflow:
    """A named dataflow program (a logical graph) and its runtime defaults.

    Args:
        name: the job name; checkpoints go to ``<directory>/<name>``.
        parallelism: default parallelism of operators (>= 1).
        max_parallelism: number of key groups; the upper bound of any keyed operator's
            parallelism, fixed for the life of the job's state (default 128).
        batch_size: records per channel batch.
        buffer_timeout: seconds after which a partial batch is sent downstream.
        channel_capacity: batches (and events) a channel holds before the producer waits.

    Attributes:
        processing_clock: processing time for timers and idleness checks (the system clock;
            tests put a ``reactive.time.ManualClock`` here before running).

    Raises:
        ConfigurationError: on values out of range.
    """

    def __init__(
        self,
        name: str,
        parallelism: int = 1,
        max_parallelism: int = 128,
        batch_size: int = 1024,
        buffer_timeout: float = 0.05,
        channel_capacity: int = 8,
    ) -> None:
        from .checkpoint.storage import validate_job_name

        validate_job_name(name)
        if parallelism < 1:
            raise ConfigurationError(f"parallelism must be >= 1, got {parallelism}")
        if not 1 <= max_parallelism <= 32768:
            raise ConfigurationError(f"max_parallelism must be in 1..32768, got {max_parallelism}")
        if batch_size < 1 or channel_capacity < 1 or buffer_timeout < 0:
            raise ConfigurationError("batch_size and channel_capacity must be >= 1, "
                                     "buffer_timeout >= 0")
        self.name = name
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism
        self.batch_size = batch_size
        self.buffer_timeout = buffer_timeout
        self.channel_capacity = channel_capacity
        self.transformations: list[Transformation] = []
        self.processing_clock: ProcessingClock = SystemClock()

    # ------------------------------------------------------------------ building
    def _add(
        self,
        kind: str,
        name: str | None,
        factory: Callable[[Transformation], ops.StreamOperator],
        inputs: list[Edge],
        max_parallelism: int | None = None,
    ) -> Transformation:
        t = Transformation(len(self.transformations), kind, name or kind,
                           lambda: ops.StreamOperator("", ""), inputs,
                           max_parallelism=max_parallelism)
        t.factory = lambda: factory(t)
        self.transformations.append(t)
        return t

    def source(self, source: Source[U], name: str | None = None, uid: str | None = None
               ) -> Stream[U]:
        """Add a source; returns its stream (of the source's record type)."""
        t = self._add(
            "source", name or type(source).__name__,
            lambda t: ops.SourceOperator(t.name, t.resolved_uid, source), [],
            max_parallelism=source.max_source_parallelism,
        )
        t.uid = uid
        t.source = source
        # a source that generates watermarks gives its records' event time to the windows
        t.timestamp_fn = source.timestamp_fn
        if source.max_source_parallelism is not None:
            t.parallelism = min(self.parallelism, source.max_source_parallelism)
        return Stream(self, t)

    def from_collection(self, items: Iterable[U], name: str | None = None,
                        uid: str | None = None) -> Stream[U]:
        """A non-parallel source over an in-memory collection (position = index)."""
        from .defaults import collection_source

        source: Source[U] = collection_source(items)
        return self.source(source, name=name or "collection", uid=uid)

    @overload
    def read_text_file(self, path: str | os.PathLike[str], name: str | None = None,
                       uid: str | None = None, with_offsets: Literal[False] = False,
                       errors: Literal["fail"] = "fail") -> Stream[str]: ...

    @overload
    def read_text_file(self, path: str | os.PathLike[str], name: str | None = None,
                       uid: str | None = None, *, with_offsets: Literal[True],
                       errors: Literal["fail"] = "fail") -> Stream[tuple[int, str]]: ...

    @overload
    def read_text_file(self, path: str | os.PathLike[str], name: str | None = None,
                       uid: str | None = None, with_offsets: bool = False,
                       errors: Literal["fail", "dead_letter"] = "fail") -> Stream[Any]: ...

    def read_text_file(self, path: str | os.PathLike[str], name: str | None = None,
                       uid: str | None = None, with_offsets: bool = False,
                       errors: Literal["fail", "dead_letter"] = "fail") -> Stream[Any]:
        """A source of the lines (UTF-8) of a file (or of the files of a directory), without
        the line ending; the position is a byte offset.

        Args:
            path: a file or a directory.
            name: the source's display name (default ``"file"``).
            uid: the source's stable id.
            with_offsets: emit ``(byte_offset, line)`` instead of ``line``.
            errors: a line that is not valid UTF-8 fails the job (``"fail"``, naming the
                file and the line's byte offset) or is emitted, in place of its record, as
                a ``reactive.connectors.files.InvalidLine(path, offset, raw, reason)`` for the
                pipeline to route to its dead-letter output (``"dead_letter"``).

        Raises:
            FileNotFoundError: if ``path`` does not exist.
            ConfigurationError: if ``errors`` is not ``"fail"`` or ``"dead_letter"``.
        """
        from .defaults import line_file_source

        source: Source[Any] = line_file_source(Path(path), with_offsets, errors)
        return self.source(source, name=name or "file", uid=uid)

    def from_arrow(self, data: Any, batch_size: int = 65536, name: str | None = None,
                   uid: str | None = None) -> ColumnarStream:
        """A non-parallel columnar source over an Arrow table (or record batches): a
        stream of record batches of ``batch_size`` rows; the position is the row index,
        so a restore resumes at the exact row (see ``reactive.columnar``).

        Raises:
            ConfigurationError: for a batch size < 1, or batches of different schemas.
            MissingExtraError: without pyarrow (the ``columnar`` extra).
        """
        from .columnar import ArrowSource, ColumnarStream

        source = ArrowSource(data, batch_size, name or "arrow")
        stream = self.source(source, name=name or "arrow", uid=uid)
        return ColumnarStream(self, stream.transformation, source.schema,
                              lambda t: Stream(self, t))

    def columnar_source(self, source: Source, name: str | None = None,
                        uid: str | None = None) -> ColumnarStream:
        """A columnar stream from a source that emits ``pyarrow.RecordBatch`` es of its
        ``schema`` attribute, e.g. ``CsvFileSource(..., columnar=True)``; the records it
        emits beside them (dead letters) are the stream's ``dead_letters()``.

        Raises:
            ConfigurationError: for a source without a ``schema``.
        """
        from .columnar import ColumnarStream
        from .columnar.source import SourceOutput

        schema = getattr(source, "schema", None)
        if schema is None:
            raise ConfigurationError(
                f"columnar_source: {type(source).__name__} declares no schema (a columnar "
                "source has one, e.g. CsvFileSource(..., columnar=True))")
        stream = self.source(source, name=name, uid=uid)
        t = self._add("columnar_source_batches", f"{stream.transformation.name}-batches",
                      lambda t: SourceOutput(t.name, t.resolved_uid, batches=True),
                      [Edge(stream.transformation, "forward")])
        out = ColumnarStream(self, t, schema, lambda t: Stream(self, t),
                             primary=stream.transformation)
        out.dead_letter_input = stream.transformation
        return out

    # ------------------------------------------------------------------ running
    async def start(
        self,
        checkpoints: CheckpointConfig | None = None,
        restart: RestartStrategy | None = None,
        state_backend: StateBackend | None = None,
        resume: bool = False,
        restore_from: str | os.PathLike[str] | None = None,
        allow_non_restored_state: bool = False,
        allow_replayed_output: bool = False,
    ) -> Job:
        """Start the job on the running event loop and return its handle at once.

        Under trio (``trio.run``), the job runs on its own asyncio loop thread and the
        handle is a :class:`~reactive.embedding.trio_host.TrioJob` with the same methods,
        awaited from trio (``reactive.embedding.trio_host``).

        Each call starts a new *run* (``job.run_id``). Without ``resume`` or
        ``restore_from`` the run starts fresh, whatever the checkpoint directory holds
        (checkpoint ids continue after the ones on disk). After a failure the restart
        strategy restores the newest checkpoint of this run (or the one it started from),
        never one of another run (``reactive.checkpoint.lineage``).

        Args:
            checkpoints: checkpointing configuration; None disables checkpoints.
            restart: restart strategy (default: three restarts with checkpointing, none
                without).
            state_backend: keyed state backend (default: heap).
            resume: restore the newest completed checkpoint of ``<directory>/<job>``,
                whichever earlier run wrote it, after checking its files (start fresh when
                the directory holds none; fail, listing why, when it holds some but none can
                be restored).
            restore_from: restore exactly this checkpoint or savepoint directory; the job
                fails with the reason if it cannot (never a fresh start).
            allow_non_restored_state: accept a checkpoint with state of operators that the
                program no longer has.
            allow_replayed_output: accept restoring an older checkpoint when a newer one is
                damaged although the newer one had committed output (its records are then
                published again by exactly-once sinks).

        Raises:
            ConfigurationError: for an invalid program or options, before anything runs.
            RestoreError: when ``restore_from`` is not a completed checkpoint, was taken with
                another max parallelism, or holds state of unknown operators.
        """
        options: dict[str, Any] = {"checkpoints": checkpoints, "restart": restart,
                   "state_backend": state_backend, "resume": resume,
                   "restore_from": restore_from,
                   "allow_non_restored_state": allow_non_restored_state,
                   "allow_replayed_output": allow_replayed_output}
        if running_under_trio():
            from .embedding.trio_host import start_under_trio

            return cast("Job", await start_under_trio(self, **options))
        return await self._start_on_asyncio(**options)

    async def _start_on_asyncio(
        self,
        checkpoints: CheckpointConfig | None = None,
        restart: RestartStrategy | None = None,
        state_backend: StateBackend | None = None,
        resume: bool = False,
        restore_from: str | os.PathLike[str] | None = None,
        allow_non_restored_state: bool = False,
        allow_replayed_output: bool = False,
    ) -> Job:
        """``start`` on the running asyncio loop (arguments as ``start``)."""
        from .runtime.job import Job, JobOptions

        if (resume or restore_from) and checkpoints is None and restore_from is None:
            raise ConfigurationError("resume=True needs checkpoints=CheckpointConfig(directory=...)")
        options = JobOptions(
            checkpoints=checkpoints,
            restart=restart or RestartStrategy.default(checkpoints is not None),
            state_backend=state_backend,
            resume=resume,
            restore_from=Path(restore_from) if restore_from is not None else None,
            allow_non_restored_state=allow_non_restored_state,
            allow_replayed_output=allow_replayed_output,
        )
        job = Job(self, options)
        job.start()
        return job

    async def run(self, **options: Unpack[StartOptions]) -> Job:
        """``start`` then ``wait``: run to the end of input; returns the finished handle.

        Args:
            **options: the keyword arguments of :meth:`start`
                (:class:`~reactive.config.StartOptions`).

        Raises:
            JobFailedError: when the job failed and its restart strategy gave up.
        """
        if running_under_trio():
            from .embedding.trio_host import run_under_trio

            return await run_under_trio(self, **options)
        job = await self.start(**options)
        await job.wait()
        return job

    def execute(self, **options: Unpack[StartOptions]) -> Job:
        """Run the job to completion on a new event loop (uvloop when installed).

        Args:
            **options: the keyword arguments of :meth:`start`
                (:class:`~reactive.config.StartOptions`).

        SIGINT or SIGTERM stops it with a savepoint in its checkpoint storage (so a run with
        ``resume=True`` continues from there; without checkpointing it is cancelled), and it
        returns with ``status == "stopped"``; a second signal cancels at once.
        """
        from .runtime.graceful_stop import run_until_stopped
        from .runtime.loop import run_coroutine

        return run_coroutine(run_until_stopped(self, **options)).job


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

    def __init__(self, flow: Dataflow, transformation: Transformation,
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
        from .time.timestamps import TimestampsAndWatermarksOperator

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

    def __init__(self, flow: Dataflow, transformation: Transformation,
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
