"""A heap snapshot's file work ends with the job attempt: a job cancelled (or failed) while its
snapshot file is being synced and renamed in the writer thread returns only after that thread
is done, so nothing in the checkpoint directory changes after ``cancel()`` (or a failed
``run()``) returned. A user copying the directory then, or the next attempt restoring from
it, never races with a write or a delete of the previous one."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from reactive import CheckpointConfig, Dataflow, PushSource
from reactive.backends.heap import HeapStateBackend
from reactive.backends.heap import file_writer as file_writer_module
from reactive.connectors.collections import ListSink
from tests.support import Count


async def test_a_cancel_waits_for_the_snapshot_file_in_the_writer_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entered, release = threading.Event(), threading.Event()
    running = [0]  # worker jobs of the snapshot files started and not yet ended
    finish = file_writer_module.SnapshotFileWriter._finish
    abort = file_writer_module.SnapshotFileWriter._abort

    def held_finish(self: Any) -> str:
        running[0] += 1
        try:
            entered.set()
            release.wait(60)
            return finish(self)
        finally:
            running[0] -= 1

    def counted_abort(self: Any) -> None:
        running[0] += 1
        try:
            abort(self)
        finally:
            running[0] -= 1

    monkeypatch.setattr(file_writer_module.SnapshotFileWriter, "_finish", held_finish)
    monkeypatch.setattr(file_writer_module.SnapshotFileWriter, "_abort", counted_abort)
    source: PushSource[str] = PushSource()
    flow = Dataflow("held", parallelism=1)
    flow.source(source, uid="src").key_by(lambda w: w).process(Count()).uid("count") \
        .sink(ListSink())
    job = await flow.start(checkpoints=CheckpointConfig(interval=None, directory=tmp_path),
                           state_backend=HeapStateBackend())
    for i in range(500):
        await source.send(f"w{i % 50}")
    checkpoint = asyncio.create_task(job.checkpoint())
    assert await asyncio.to_thread(entered.wait, 60), "no snapshot file reached its sync"
    cancel = asyncio.create_task(job.cancel())
    # the writer thread holds the file: the cancel must not return meanwhile (the bounded
    # wait only gives a wrong implementation the time to return early)
    done, _ = await asyncio.wait({cancel}, timeout=1.0)
    assert not done, "cancel() returned while the snapshot file was still being written"
    release.set()
    await cancel
    assert running[0] == 0
    assert not [p for p in tmp_path.rglob("*.tmp")]
    with pytest.raises(BaseException):  # noqa: B017 (the checkpoint ended with the job)
        await checkpoint
