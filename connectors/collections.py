"""In-memory sources and sinks: a collection source, a list sink, callback and print sinks."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

from typing_extensions import TypeVar

from reactive.sinks import Sink, SinkWriter
from reactive.sources import Source, SourceReader

__all__ = ["CallbackSink", "CollectionSource", "DiscardingSink", "ListSink", "PrintSink"]

T = TypeVar("T", default=Any)


class CollectionSource(Source[T]):
    """A non-parallel source over a list (the iterable is materialized once).

    Its position is the index of the next record, so a restore resumes exactly there.
    """

    max_source_parallelism = 1

    def __init__(self, items: Iterable[T]) -> None:
        self.items = list(items)

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader[T]:
        return _CollectionReader(self.items)


class _CollectionReader(SourceReader[T]):
    def __init__(self, items: list[T]) -> None:
        self.items = items
        self.position = 0

    async def read_batch(self, max_records: int) -> list[T] | None:
        start = self.position
        if start >= len(self.items):
            return None
        self.position = end = min(start + max_records, len(self.items))
        return self.items[start:end]

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        return [self.position]

    def restore_state(self, entries: list[Any]) -> None:
        self.position = int(entries[0])

    def describe_position(self) -> Any:
        return f"index {self.position}"


class CallbackSink(Sink):
    """Calls ``fn(record)`` for every record. At-least-once: after a recovery, the records
    since the last completed checkpoint are delivered again."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def create_writer(self, subtask: int, parallelism: int) -> SinkWriter:
        return _CallbackWriter(self.fn)


class _CallbackWriter(SinkWriter):
    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def write(self, batch: list[Any]) -> None:
        fn = self.fn
        for r in batch:
            fn(r)


class ListSink(Sink[T]):
    """Collects every record into ``self.records`` (shared by all instances).

    At-least-once: after a recovery the list holds the replayed records twice. With
    ``delay`` (seconds per batch) it simulates a slow sink, for backpressure tests.
    """

    def __init__(self, delay: float = 0.0) -> None:
        self.records: list[T] = []
        self.delay = delay

    def create_writer(self, subtask: int, parallelism: int) -> SinkWriter[T]:
        return _ListWriter(self)


class _ListWriter(SinkWriter[T]):
    def __init__(self, sink: ListSink[T]) -> None:
        self.sink = sink

    def write(self, batch: list[T]) -> Any:
        self.sink.records.extend(batch)
        if self.sink.delay:
            return asyncio.sleep(self.sink.delay)
        return None


class PrintSink(Sink):
    """Prints every record (with a prefix). At-least-once."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix

    def create_writer(self, subtask: int, parallelism: int) -> SinkWriter:
        prefix = f"{self.prefix}{subtask}> " if parallelism > 1 else self.prefix
        return _CallbackWriter(lambda r: print(f"{prefix}{r}"))


class DiscardingSink(Sink):
    """Drops every record, counting them in ``self.count`` (for benchmarks)."""

    def __init__(self) -> None:
        self.count = 0

    def create_writer(self, subtask: int, parallelism: int) -> SinkWriter:
        return _DiscardingWriter(self)


class _DiscardingWriter(SinkWriter):
    def __init__(self, sink: DiscardingSink) -> None:
        self.sink = sink

    def write(self, batch: list[Any]) -> None:
        self.sink.count += len(batch)
