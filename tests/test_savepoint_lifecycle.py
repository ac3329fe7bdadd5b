"""Savepoints after they leave the job: their ids are never given out again, and what they
pre-committed stays restorable through failovers and resumes."""

from __future__ import annotations

from pathlib import Path

from reactive import CheckpointConfig, CheckpointStorage, Dataflow, PushSource
from reactive.connectors.files import CommittingFileSink


def _flow(source: PushSource, out: Path) -> Dataflow:
    flow = Dataflow("spids", parallelism=1)
    flow.source(source).uid("src").map(lambda x: x).uid("m") \
        .sink(CommittingFileSink(out)).uid("out")
    return flow


async def test_a_moved_savepoint_keeps_its_id_reserved(tmp_path):
    config = CheckpointConfig(interval=None, directory=tmp_path / "chk", retained=1)
    job = await _flow(PushSource(), tmp_path / "out").start(checkpoints=config)
    first = await job.checkpoint()
    second = await job.checkpoint()
    savepoint = await job.savepoint(tmp_path / "sp")
    await job.cancel()
    assert savepoint.checkpoint_id == second.checkpoint_id + 1 > first.checkpoint_id
    assert not (tmp_path / "chk" / "spids" / f"chk-{savepoint.checkpoint_id}").exists()
    assert CheckpointStorage(tmp_path / "chk", "spids").latest_id() == savepoint.checkpoint_id

    resumed = await _flow(PushSource(), tmp_path / "out").start(checkpoints=config, resume=True)
    after = await resumed.checkpoint()
    await resumed.cancel()
    assert resumed.restored_from is not None
    assert resumed.restored_from.checkpoint_id == second.checkpoint_id
    assert after.checkpoint_id > savepoint.checkpoint_id
