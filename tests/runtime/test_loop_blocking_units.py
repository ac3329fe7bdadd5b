"""Units of the off-loop file work: a thread step outlives no cancelled caller, a checkpoint
completes only once its metadata is durable (and holds its slot until then), retention never
deletes shared files while a checkpoint is pending, and a crash while deleting a subsumed
checkpoint leaves no "completed" checkpoint with missing files."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import reactive.checkpoint.completed_checkpoint_store as store_module
import reactive.checkpoint.storage as storage_module
from reactive import CheckpointConfig
from reactive.checkpoint.completed_checkpoint_store import CompletedCheckpointStore
from reactive.checkpoint.contract import CheckpointMetadata
from reactive.checkpoint.coordinator import CheckpointCoordinator, OperatorInfo
from reactive.checkpoint.off_loop import chunks, in_thread
from reactive.checkpoint.storage import CheckpointStorage
from reactive.errors import CheckpointError
from tests.checkpoint.test_completed_checkpoint_store import _complete, _shared_files

GUARD = 10.0  # seconds a blocked step waits before giving up: a guard against a hang only


async def test_a_cancelled_caller_waits_for_its_thread_step():
    started, release = threading.Event(), threading.Event()
    finished: list[bool] = []

    def step() -> int:
        started.set()
        release.wait(GUARD)
        finished.append(True)
        return 1

    task = asyncio.ensure_future(in_thread(step))
    await asyncio.to_thread(started.wait, GUARD)
    task.cancel()
    for _ in range(5):  # loop iterations, enough to deliver the cancellation
        await asyncio.sleep(0)
    assert not task.done()  # the thread still runs: so does the caller
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert finished == [True]


async def test_errors_of_a_thread_step_read_as_inline():
    def fails() -> None:
        raise FileNotFoundError("chk-3/_metadata")

    with pytest.raises(FileNotFoundError, match="chk-3/_metadata"):
        await in_thread(fails)


def test_chunks_are_bounded_and_complete():
    assert [list(c) for c in chunks(list(range(7)), 3)] == [[0, 1, 2], [3, 4, 5], [6]]
    with pytest.raises(ValueError):
        list(chunks([1], 0))


class _Mailbox:
    def __init__(self) -> None:
        self.posted: list[Any] = []

    def post(self, action: Any) -> None:
        self.posted.append(action)


async def test_a_checkpoint_completes_only_once_its_metadata_is_durable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    storage = CheckpointStorage(tmp_path, "j")
    writing, release = threading.Event(), threading.Event()
    write = storage_module.write_metadata

    def slow_write(directory: Path, metadata: CheckpointMetadata) -> None:
        writing.set()
        release.wait(GUARD)  # on the loop thread this would stall the whole test
        write(directory, metadata)

    monkeypatch.setattr(storage_module, "write_metadata", slow_write)
    coordinator = CheckpointCoordinator(
        CheckpointConfig(interval=None, directory=tmp_path, max_concurrent=1), storage, "j",
        16, [OperatorInfo("op", "op", 1, False)], 1, [])
    mailbox = _Mailbox()
    task = SimpleNamespace(task_id="op (1/1)", subtask=0, source=None, post=mailbox.post)
    coordinator.attach([task])  # type: ignore[list-item]
    runner = asyncio.create_task(coordinator.run())
    first = asyncio.create_task(coordinator.checkpoint())
    while coordinator.next_id == 1:
        await asyncio.sleep(0)  # until run() opened the store and checkpoint 1 triggered
    ack = asyncio.create_task(coordinator.acknowledge(
        1, task, {}, {"alignment": 0.0, "sync": 0.0, "async": 0.0, "size": 0.0}))
    await asyncio.to_thread(writing.wait, GUARD)
    second = asyncio.create_task(coordinator.checkpoint())
    for _ in range(5):  # loop iterations: what runs on the loop meanwhile gets to run
        await asyncio.sleep(0)
    # the metadata is being written: not completed, nobody notified, and the slot is held
    assert coordinator.latest_completed is None and not first.done()
    assert mailbox.posted == []
    assert coordinator.next_id == 2 and not second.done()
    release.set()
    await ack
    assert (await first).checkpoint_id == 1
    assert coordinator.latest_completed is not None
    assert (storage.checkpoint_dir(1) / "_metadata").exists()
    assert len(mailbox.posted) == 1  # the completion notification
    while coordinator.next_id == 2:
        await asyncio.sleep(0)  # the freed slot lets checkpoint 2 trigger
    coordinator.shutdown("test over")
    with pytest.raises(CheckpointError):
        await second
    await runner


async def test_shared_files_wait_while_the_coordinator_has_a_pending_checkpoint(
        tmp_path: Path):
    storage = CheckpointStorage(tmp_path, "j")
    pending = [True]
    store = CompletedCheckpointStore(storage, retained=1, in_flight=lambda: pending[0])
    await store.add(_complete(storage, 1, ["shared/a"]))
    await store.add(_complete(storage, 2, ["shared/b"]))
    assert "shared/a" in _shared_files(storage)  # checkpoint 3 may have chosen to reuse it
    pending[0] = False
    await store.add(_complete(storage, 4, ["shared/b"]))
    assert _shared_files(storage) == {"shared/b"}


async def test_a_crash_while_subsuming_leaves_no_completed_checkpoint_with_missing_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    storage = CheckpointStorage(tmp_path, "j")
    store = CompletedCheckpointStore(storage, retained=1)
    await store.add(_complete(storage, 1, ["shared/a"]))
    (storage.checkpoint_dir(1) / "state").write_bytes(b"x")

    def crash(path: Any, ignore_errors: bool = False) -> None:
        raise OSError("the process died here")

    monkeypatch.setattr(store_module.shutil, "rmtree", crash)
    with pytest.raises(OSError):
        await store.add(_complete(storage, 2, ["shared/b"]))
    assert storage.checkpoint_dir(1).exists()  # half deleted ...
    # ... but no longer a completed checkpoint: a restart never restores it
    assert [c.checkpoint_id for c in storage.completed()] == [2]
