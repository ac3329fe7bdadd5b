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
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast, overload

from typing_extensions import TypeVar, Unpack

from .config import CheckpointConfig, RestartStrategy, StartOptions
from .embedding.trio_host import running_under_trio
from .errors import ConfigurationError
from .graph import Edge, Transformation
from .runtime import operators as ops
from .sources import Source
from .stream import KeyedStream, Stream
from .time.clock import ProcessingClock, SystemClock

if TYPE_CHECKING:
    from .columnar import ColumnarStream
    from .runtime.job import Job
    from .state.backend import StateBackend

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
        # the batches leave the source's instances point-wise, in the order it read them: a
        # different parallelism would turn the edge into a rebalance and interleave them
        t = self._add("columnar_source_batches", f"{stream.transformation.name}-batches",
                      lambda t: SourceOutput(t.name, t.resolved_uid, batches=True),
                      [Edge(stream.transformation, "forward")],
                      max_parallelism=source.max_source_parallelism)
        t.parallelism = stream.transformation.parallelism
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
