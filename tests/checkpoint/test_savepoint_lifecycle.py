"""Savepoints after they leave the job: their ids are never given out again, and what they
pre-committed stays restorable through failovers and resumes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from reactive import CheckpointConfig, CheckpointStorage, Dataflow, PushSource, RestartStrategy
from reactive.connectors.files import CommittingFileSink
from reactive.errors import JobFailedError


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


def _committed(out: Path, name: str) -> list[int]:
    return [int(line) for line in (out / name).read_text().splitlines()]


async def test_a_savepoint_stays_restorable_after_a_failover(tmp_path):
    out = tmp_path / "out"
    seen = {9: asyncio.Event(), 19: asyncio.Event()}
    failed: list[int] = []

    def step(x: int) -> int:
        if x in seen:
            seen[x].set()
        if x == 25 and not failed:  # once: the job fails over to its checkpoint
            failed.append(x)
            raise RuntimeError("transient failure")
        return x

    def flow(source: PushSource) -> Dataflow:
        f = Dataflow("spfail", parallelism=1)
        f.source(source).uid("src").map(step).uid("m").sink(CommittingFileSink(out)).uid("out")
        return f

    config = CheckpointConfig(interval=None, directory=tmp_path / "chk")
    source = PushSource()
    job = await flow(source).start(checkpoints=config, restart=RestartStrategy.fixed(3, 0.0))
    for i in range(10):
        await source.send(i)
    await seen[9].wait()
    checkpoint = await job.checkpoint()
    for i in range(10, 20):
        await source.send(i)
    await seen[19].wait()  # the savepoint's barrier follows record 19 through the chain
    savepoint = await job.savepoint(tmp_path / "sp")
    pending = out / f".part-0-{savepoint.checkpoint_id}.jsonl.pending"
    assert _committed(out, pending.name) == list(range(10, 20))
    for i in range(20, 30):
        await source.send(i)
    source.close()
    await job.wait()
    assert failed and job.metrics.restarts == 1
    assert job.metrics.restored_checkpoints == [checkpoint.checkpoint_id]
    # the failover restored the checkpoint before the savepoint: the savepoint's pending
    # part file is not lingering, the savepoint lists it
    assert pending.exists()

    later = PushSource()
    later.close()
    await flow(later).run(checkpoints=config, restore_from=savepoint.path)
    assert _committed(out, f"part-0-{savepoint.checkpoint_id}.jsonl") == list(range(10, 20))
    assert not pending.exists()


async def test_a_savepoint_without_its_pending_files_fails_saying_so(tmp_path):
    out = tmp_path / "out"
    seen = asyncio.Event()

    def step(x: int) -> int:
        if x == 4:
            seen.set()
        return x

    def flow(source: PushSource) -> Dataflow:
        f = Dataflow("spmove", parallelism=1)
        f.source(source).uid("src").map(step).uid("m").sink(CommittingFileSink(out)).uid("out")
        return f

    config = CheckpointConfig(interval=None, directory=tmp_path / "chk")
    source = PushSource()
    job = await flow(source).start(checkpoints=config)
    for i in range(5):
        await source.send(i)
    await seen.wait()
    savepoint = await job.savepoint(tmp_path / "sp")
    await job.cancel()
    # moved to another machine without the sink's pending part file
    (out / f".part-0-{savepoint.checkpoint_id}.jsonl.pending").unlink()
    later = PushSource()
    later.close()
    with pytest.raises(JobFailedError) as info:
        await flow(later).run(checkpoints=config, restore_from=savepoint.path,
                              restart=RestartStrategy.none())
    message = str(info.value.__cause__)
    assert f"records of checkpoint {savepoint.checkpoint_id}" in message
    assert "savepoint restored on another machine needs the pending part files" in message
