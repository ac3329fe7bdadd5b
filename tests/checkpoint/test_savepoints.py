"""Savepoints (Flink's savepoints, thesis 4.2): self-contained, movable, never deleted by
retention; ``job.savepoint``, ``job.stop(savepoint=True)`` and ``reactive savepoint``."""

from __future__ import annotations

import collections
import shutil
from pathlib import Path

import pytest

from reactive import CheckpointConfig, CheckpointError, CheckpointStorage, RestartStrategy
from reactive.cli import main as cli_main
from tests.checkpoint.test_rescaling import (
    BACKENDS,
    Budget,
    SplitsSource,
    WaitableSink,
    assert_exactly_once,
    count_flow,
    final_checkpoint,
    keyed_state,
    make_backend,
)

KEYS = [i % 40 for i in range(2_000)]
SPLITS = [KEYS[i::3] for i in range(3)]
TRUTH = dict(collections.Counter(KEYS))


def _assert_self_contained(path: Path) -> None:
    sp = CheckpointStorage.load(path)  # verifies every file's checksum
    assert sp.is_savepoint and sp.metadata.self_contained
    assert sp.job_dir == path
    for _, _, sub in sp.metadata.subtask_states():
        if sub.keyed_state is not None:
            assert not sub.keyed_state.shared and not sub.keyed_state.shared_reused
    for ref in sp.metadata.file_refs():
        assert not ref.path.startswith(("chk-", "/", ".."))
        assert (path / ref.path).is_file()


@pytest.mark.parametrize("backend", BACKENDS)
async def test_moved_savepoint_restores(backend: str, tmp_path: Path) -> None:
    budget = Budget(1_000)
    sink = WaitableSink()
    # RocksDB is incremental here: the savepoint must still copy every file it needs
    job = await count_flow(SplitsSource(SPLITS, budget), sink, 3).start(
        checkpoints=CheckpointConfig(interval=0.01, directory=tmp_path / "c", retained=1),
        state_backend=make_backend(backend, tmp_path))
    await sink.wait_for(1_000)
    await job.checkpoint()  # an incremental base exists before the savepoint
    sp = await job.savepoint(tmp_path / "sp")
    assert sp.path == tmp_path / "sp"
    _assert_self_contained(sp.path)
    await job.cancel()
    moved = tmp_path / "elsewhere" / "renamed"
    shutil.move(str(sp.path), str(moved))
    shutil.rmtree(tmp_path / "c")  # nothing of the job directory is needed any more
    _assert_self_contained(moved)
    sink2 = WaitableSink()
    job2 = await count_flow(SplitsSource(SPLITS, Budget()), sink2, 2).run(
        checkpoints=CheckpointConfig(interval=None, directory=tmp_path / "c2"),
        state_backend=make_backend(backend, tmp_path / "b2"), restore_from=moved)
    assert job2.metrics.restored_checkpoints == [sp.checkpoint_id]
    state = keyed_state(final_checkpoint(tmp_path / "c2"), "count", "count", tmp_path / "s")
    assert {k: v for part in state.values() for k, v in part.items()} == TRUTH


async def test_savepoint_in_checkpoint_storage_survives_retention(tmp_path: Path) -> None:
    budget = Budget(500)
    sink = WaitableSink()
    job = await count_flow(SplitsSource(SPLITS, budget), sink, 2).start(
        checkpoints=CheckpointConfig(interval=None, directory=tmp_path, retained=1))
    await sink.wait_for(500)
    sp = await job.savepoint()
    assert sp.path == CheckpointStorage(tmp_path, "rescale").checkpoint_dir(sp.checkpoint_id)
    later = [await job.checkpoint() for _ in range(3)]
    await job.cancel()
    ids = [c.checkpoint_id for c in CheckpointStorage(tmp_path, "rescale").completed()]
    # retained=1 keeps the newest checkpoint, and the savepoint whatever its age
    assert ids == [sp.checkpoint_id, later[-1].checkpoint_id]
    _assert_self_contained(sp.path)


async def test_intermediate_savepoint_does_not_commit_side_effects(tmp_path: Path) -> None:
    from reactive import Dataflow
    from reactive.connectors.files import CommittingFileSink

    out = tmp_path / "out"
    flow = Dataflow("commits", parallelism=1, batch_size=16)
    budget = Budget(0)
    flow.source(SplitsSource([list(range(600))], budget), uid="src").sink(
        CommittingFileSink(out), name="files")
    job = await flow.start(checkpoints=CheckpointConfig(interval=None, directory=tmp_path / "c"))
    budget.allow(300)
    while budget.taken < 300:
        await budget.idle()
    # the savepoint's barrier follows the 300 records: they are pre-committed, not published
    sp = await job.savepoint(tmp_path / "sp")
    await job.checkpoint()  # the sink's mailbox would run a commit before this barrier
    assert list(out.glob("part-*")) == []
    # the next checkpoint commits what the savepoint pre-committed (the one after it makes
    # sure the sink ran that commit: mailbox actions precede channel items)
    chk = await job.checkpoint()
    await job.checkpoint()
    assert chk.checkpoint_id > sp.checkpoint_id
    records = [line for p in out.glob("part-*") for line in p.read_text().splitlines()]
    assert sorted(map(int, records)) == list(range(300))
    await job.stop(savepoint=False)
    assert job.status == "stopped"


async def test_stop_with_savepoint_then_restore_is_exactly_once(tmp_path: Path) -> None:
    sink = WaitableSink()
    job = await count_flow(SplitsSource(SPLITS, Budget(1_500)), sink, 3).start(
        checkpoints=CheckpointConfig(interval=0.01, directory=tmp_path / "c"),
        restart=RestartStrategy.none())
    await sink.wait_for(700)
    sp = await job.stop(savepoint=True, path=tmp_path / "sp")
    assert sp is not None and job.status == "stopped"
    await job.wait()
    sink2 = WaitableSink()
    await count_flow(SplitsSource(SPLITS, Budget()), sink2, 1).run(restore_from=sp.path)
    assert_exactly_once(sink.records + sink2.records, TRUTH)


async def test_savepoint_errors(tmp_path: Path) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    sink = WaitableSink()
    job = await count_flow(SplitsSource(SPLITS, Budget(10)), sink, 1).start()
    with pytest.raises(CheckpointError, match="checkpoint storage"):
        await job.savepoint()
    await job.cancel()
    job = await count_flow(SplitsSource(SPLITS, Budget(10)), sink, 1).start(
        checkpoints=CheckpointConfig(interval=None, directory=tmp_path / "c"))
    with pytest.raises(CheckpointError, match="not an empty directory"):
        await job.savepoint(tmp_path / "full")
    await job.cancel()


async def test_cli_savepoint_from_incremental_checkpoint(tmp_path: Path, capsys) -> None:
    from reactive.backends.rocksdb import RocksDBStateBackend

    job = await count_flow(SplitsSource(SPLITS, Budget()), WaitableSink(), 2).run(
        checkpoints=CheckpointConfig(interval=None, directory=tmp_path / "c"),
        state_backend=RocksDBStateBackend(path=tmp_path / "w", incremental=True))
    assert job.status == "finished"
    assert cli_main(["savepoint", str(tmp_path / "c" / "rescale"),
                     "--output", str(tmp_path / "sp")]) == 0
    assert "written to" in capsys.readouterr().out
    _assert_self_contained(tmp_path / "sp")
    shutil.rmtree(tmp_path / "c")
    # restore the exported savepoint into the heap backend at another parallelism
    sink = WaitableSink()
    await count_flow(SplitsSource(SPLITS, Budget()), sink, 3).run(
        checkpoints=CheckpointConfig(interval=None, directory=tmp_path / "c2"),
        restore_from=tmp_path / "sp")
    assert sink.records == []  # everything was read before the checkpoint
    state = keyed_state(final_checkpoint(tmp_path / "c2"), "count", "count", tmp_path / "s")
    assert {k: v for part in state.values() for k, v in part.items()} == TRUTH
    assert cli_main(["savepoint", str(tmp_path / "c2" / "rescale"),
                     "--output", str(tmp_path / "sp")]) == 2
