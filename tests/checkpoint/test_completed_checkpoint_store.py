"""Retention with explicit shared-file reference counts (``CompletedCheckpointStore``,
``SharedStateRegistry``) and failure reasons as an enum (``CheckpointFailureReason``)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from reactive.checkpoint.completed_checkpoint_store import (
    CompletedCheckpointStore,
    remove_checkpoint_dir,
)
from reactive.checkpoint.contract import (
    CheckpointMetadata,
    FileRef,
    KeyedStateHandle,
    OperatorState,
    OperatorSubtaskState,
)
from reactive.checkpoint.failure_reason import CheckpointFailureReason
from reactive.checkpoint.lineage import RejectedCheckpoint, candidates_in
from reactive.checkpoint.metadata import CompletedCheckpoint, write_metadata
from reactive.checkpoint.shared_state_registry import SharedStateRegistry
from reactive.checkpoint.storage import CheckpointStorage


def test_registry_counts_references_per_checkpoint():
    reg = SharedStateRegistry()
    reg.register(1, ["shared/a", "shared/b"])
    reg.register(2, ["shared/b", "shared/c"])
    assert reg.reference_count("shared/b") == 2
    assert reg.unregister(1) == ["shared/a"]
    assert reg.reference_count("shared/b") == 1
    assert reg.unregister(2) == ["shared/b", "shared/c"]
    assert reg.unregister(2) == []  # unregistering twice frees nothing more


def _complete(storage: CheckpointStorage, n: int, shared: list[str],
              kind: str = "checkpoint") -> CompletedCheckpoint:
    """Write checkpoint n referencing ``shared`` files (created) and its metadata."""
    refs: list[FileRef] = []
    for rel in shared:
        path = storage.job_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rel.encode())
        refs.append(FileRef(rel, len(rel), "-"))
    handle = KeyedStateHandle("test", None, tuple(refs), tuple(refs))
    metadata = CheckpointMetadata(
        job="j", checkpoint_id=n, kind=kind, max_parallelism=8, operators={
            "op": OperatorState("op", 1, True, {0: OperatorSubtaskState(handle)})})
    storage.checkpoint_dir(n).mkdir(parents=True, exist_ok=True)
    write_metadata(storage.checkpoint_dir(n), metadata)
    return storage.load(storage.checkpoint_dir(n), verify=False)


def _shared_files(storage: CheckpointStorage) -> set[str]:
    return {p.relative_to(storage.job_dir).as_posix()
            for p in storage.shared_dir.rglob("*") if p.is_file()}


async def test_subsumed_checkpoints_release_their_shared_files(tmp_path: Path):
    storage = CheckpointStorage(tmp_path, "j")
    store = CompletedCheckpointStore(storage, retained=2)
    await store.add(_complete(storage, 1, ["shared/a", "shared/b"]))
    await store.add(_complete(storage, 2, ["shared/b", "shared/c"]))
    assert await store.add(_complete(storage, 3, ["shared/c", "shared/d"])) == [1]
    # a is gone with checkpoint 1; b is still referenced by checkpoint 2
    assert _shared_files(storage) == {"shared/b", "shared/c", "shared/d"}
    assert await store.add(_complete(storage, 4, ["shared/d"])) == [2]
    assert _shared_files(storage) == {"shared/c", "shared/d"}
    assert [c.checkpoint_id for c in store.checkpoints] == [3, 4]


async def test_deletion_waits_while_a_checkpoint_is_in_flight(tmp_path: Path):
    storage = CheckpointStorage(tmp_path, "j")
    store = CompletedCheckpointStore(storage, retained=1)
    await store.add(_complete(storage, 1, ["shared/a"]))
    storage.checkpoint_dir(3).mkdir()  # checkpoint 3 is being taken: it may reuse shared/a
    await store.add(_complete(storage, 2, ["shared/b"]))
    assert "shared/a" in _shared_files(storage)
    (storage.checkpoint_dir(3)).rmdir()
    await store.add(_complete(storage, 4, ["shared/b"]))
    assert _shared_files(storage) == {"shared/b"}


async def test_savepoints_in_storage_are_never_subsumed(tmp_path: Path):
    storage = CheckpointStorage(tmp_path, "j")
    store = CompletedCheckpointStore(storage, retained=1)
    await store.add(_complete(storage, 1, [], kind="savepoint"))
    await store.add(_complete(storage, 2, []))
    await store.add(_complete(storage, 3, []))
    assert [c.checkpoint_id for c in store.checkpoints] == [1, 3]


async def test_counts_are_rebuilt_from_the_retained_metadata(tmp_path: Path):
    """A new store (a restart) knows what the retained checkpoints reference, and removes
    the uploads of checkpoints that never completed."""
    storage = CheckpointStorage(tmp_path, "j")
    first = CompletedCheckpointStore(storage, retained=2)
    await first.add(_complete(storage, 1, ["shared/a"]))
    await first.add(_complete(storage, 2, ["shared/a", "shared/b"]))
    (storage.shared_dir / "orphan").write_bytes(b"an upload of an aborted checkpoint")
    again = CompletedCheckpointStore(storage, retained=2)
    assert again.registry.reference_count("shared/a") == 2
    assert await again.remove_orphans() == 1
    assert _shared_files(storage) == {"shared/a", "shared/b"}


@pytest.mark.parametrize("rounds", [
    300, pytest.param(1_500, marks=pytest.mark.slow, id="1500-slow")])
def test_listing_checkpoints_while_retention_removes_them(tmp_path: Path, caplog, rounds):
    """A user lists a running job's checkpoints (``reactive checkpoints list``, the Spark
    bridge, a sink checking what completed) while retention removes subsumed ones in a
    worker thread: a checkpoint removed between the listing and the reading of its metadata
    is simply gone; the listing neither fails nor reports it as damaged."""
    storage = CheckpointStorage(tmp_path, "j")
    # each checkpoint completes, then subsumes the previous one as the store does
    # (remove_checkpoint_dir: its _metadata first); bounded by count, not by time
    done = threading.Event()
    errors: list[BaseException] = []

    def retention() -> None:
        try:
            for n in range(1, rounds + 1):
                _complete(storage, n, [])
                if n > 1:
                    remove_checkpoint_dir(storage.checkpoint_dir(n - 1))
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)
        finally:
            done.set()

    worker = threading.Thread(target=retention)
    listings = 0
    with caplog.at_level(logging.WARNING):
        worker.start()
        while not done.is_set():
            listings += 1
            storage.completed()
            rejected = [c for c in candidates_in(storage) if isinstance(c, RejectedCheckpoint)]
            assert not rejected, rejected
        worker.join()
    assert not errors
    assert listings > 1
    assert [c.checkpoint_id for c in storage.completed()] == [rounds]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_failure_reasons_say_whether_they_count():
    assert CheckpointFailureReason.CHECKPOINT_EXPIRED.counts_as_failure
    assert CheckpointFailureReason.CHECKPOINT_DECLINED.counts_as_failure
    assert not CheckpointFailureReason.CHECKPOINT_SUBSUMED.counts_as_failure
    assert not CheckpointFailureReason.CHECKPOINT_DECLINED_SUBSUMED.counts_as_failure
