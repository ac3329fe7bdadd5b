"""A job whose stop-with-savepoint never completes: its sink's pre-commit waits forever (a
remote store that stopped answering), for the double Ctrl-C test of ``reactive run``:
``reactive run tests/pipelines/stuck_savepoint_job.py:flow --interval 3600``. It prints
``running`` on standard error at its first record and ``snapshot waits`` when the sink's
snapshot starts waiting (the savepoint is under way); no periodic checkpoint comes first
with an interval of an hour."""

from __future__ import annotations

import asyncio
import itertools
import sys
from typing import Any

from reactive import Dataflow
from reactive.sinks import Sink, SinkWriter
from reactive.sources import Source, SourceReader


class Endless(Source):
    """0, 1, 2, ... one small batch per 10 ms (a slow upstream)."""

    max_source_parallelism = 1

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        return _EndlessReader()


class _EndlessReader(SourceReader):
    def __init__(self) -> None:
        self.position = 0

    async def read_batch(self, max_records: int) -> list[Any] | None:
        await asyncio.sleep(0.01)  # the upstream's pace, not a synchronisation
        batch = list(itertools.islice(itertools.count(self.position), 10))
        self.position += len(batch)
        return batch

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        return [self.position]

    def restore_state(self, entries: list[Any]) -> None:
        self.position = entries[0]


class StuckSink(Sink):
    """A sink whose snapshot (its pre-commit) never returns."""

    def create_writer(self, subtask: int, parallelism: int) -> SinkWriter:
        return _StuckWriter()


class _StuckWriter(SinkWriter):
    def __init__(self) -> None:
        self.started = False

    def write(self, batch: list[Any]) -> None:
        if not self.started:
            self.started = True
            print("running", file=sys.stderr, flush=True)

    async def snapshot_state(self, checkpoint_id: int) -> list[Any]:  # type: ignore[override]
        print("snapshot waits", file=sys.stderr, flush=True)
        await asyncio.Event().wait()
        return []


flow = Dataflow("stuck-savepoint", parallelism=1)
flow.source(Endless()).uid("numbers").map(lambda x: x).uid("same").sink(StuckSink()).uid("out")
