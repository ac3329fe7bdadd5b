"""A job whose stop-with-savepoint never completes: its sink's pre-commit waits forever (a
remote store that stopped answering), for the double Ctrl-C test of ``reactive run``:
``reactive run tests/pipelines/stuck_savepoint_job.py:flow --interval 3600``. It prints
``running`` on standard error at its first record and ``snapshot waits`` when the sink's
snapshot starts waiting (the savepoint is under way); no periodic checkpoint comes first
with an interval of an hour."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from reactive import Dataflow
from reactive.sinks import Sink, SinkWriter
from reactive.testing import TestingSource


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
# 0 .. 999, then an open stream (a live upstream with no new input) until the job is stopped
numbers = TestingSource([*range(1_000), TestingSource.HOLD], batch_size=10)
flow.source(numbers).uid("numbers").map(lambda x: x).uid("same").sink(StuckSink()).uid("out")
