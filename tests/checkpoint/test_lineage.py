"""Checkpoint lineage: ids that continue across runs and restores, failover inside one run's
lineage, restores that cannot be honoured, and falling back past damaged checkpoints
(``reactive.checkpoint.lineage``). Written from the user's side: what ends up committed."""

from __future__ import annotations

import collections
import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from reactive import (
    CheckpointConfig,
    CheckpointStorage,
    Dataflow,
    RestartStrategy,
)
from reactive.checkpoint.savepoints import export_savepoint
from reactive.connectors.files import CommittingFileSink
from reactive.errors import JobFailedError, RestoreError
from reactive.testing import TestingSource
from tests.support import Count, FailureInjector, failing_count, paced

JOB = "lineage"


def committed(out: Path) -> list[Any]:
    """Every record in the committed part files of ``out`` (hidden files are not committed)."""
    records: list[Any] = []
    for part in sorted(out.glob("part-*.jsonl")):
        records += [tuple(json.loads(line)) for line in part.read_text().splitlines()]
    return records


def counts_flow(words: list[str], out: Path, parallelism: int = 2,
                fn: Any = None) -> Dataflow:
    flow = Dataflow(JOB, parallelism=parallelism, batch_size=64)
    # paced by completed checkpoints: several complete before any injected failure
    (flow.source(paced(words, every=3_000)).uid("words")
         .key_by(lambda w: w)
         .process(fn or Count()).uid("count")
         .sink(CommittingFileSink(out, format="jsonl")).uid("files"))
    return flow


def words_of(n: int) -> list[str]:
    return [f"w{i % 37}" for i in range(n)]


def assert_exactly_once(out: Path, words: list[str]) -> None:
    """Each input record's count appears exactly once in the committed output."""
    got = collections.Counter(committed(out))
    expected: collections.Counter[tuple[str, int]] = collections.Counter()
    seen: collections.Counter[str] = collections.Counter()
    for w in words:
        seen[w] += 1
        expected[(w, seen[w])] += 1
    assert got == expected


def checkpoint_ids(directory: Path) -> list[int]:
    return [c.checkpoint_id for c in CheckpointStorage(directory, JOB).completed()]


@pytest.mark.parametrize("same_directory", [True, False], ids=["same-dir", "new-dir"])
async def test_restore_from_savepoint_continues_checkpoint_ids(tmp_path, same_directory):
    """Run to the end, take a savepoint of its state, restore it with more input: the new
    run's checkpoints (and part files) never reuse an id of the first run, so no committed
    file is replaced and no record is lost."""
    out = tmp_path / "out"
    first = words_of(200)
    config = CheckpointConfig(interval=0.01, directory=tmp_path / "chk", retained=50)
    await counts_flow(first, out).run(checkpoints=config)
    first_ids = checkpoint_ids(tmp_path / "chk")
    latest = CheckpointStorage(tmp_path / "chk", JOB).latest_restorable()
    savepoint = export_savepoint(latest, tmp_path / "sp")
    second_dir = tmp_path / ("chk" if same_directory else "chk2")
    more = words_of(400)  # the same collection grown: the restored position is index 200
    job = await counts_flow(more, out).run(
        checkpoints=CheckpointConfig(interval=0.01, directory=second_dir, retained=50),
        restore_from=savepoint.path)
    assert job.metrics.restored_checkpoints == [latest.checkpoint_id]
    new_ids = [c.checkpoint_id for c in job.metrics.completed_checkpoints]
    assert min(new_ids) > max(first_ids)
    assert_exactly_once(out, more)


async def test_fresh_run_in_a_used_directory_continues_ids(tmp_path):
    config = CheckpointConfig(interval=0.01, directory=tmp_path / "chk", retained=50)
    await counts_flow(words_of(100), tmp_path / "a").run(checkpoints=config)
    first = checkpoint_ids(tmp_path / "chk")
    job = await counts_flow(words_of(100), tmp_path / "b").run(checkpoints=config)
    assert job.metrics.restored_checkpoints == []
    assert min(c.checkpoint_id for c in job.metrics.completed_checkpoints) > max(first)
    assert_exactly_once(tmp_path / "b", words_of(100))


async def test_failover_before_the_first_checkpoint_never_restores_another_run(tmp_path):
    """A fresh run that fails before its first checkpoint starts again from scratch; it
    does not pick up the newest checkpoint of an earlier run in the same directory."""
    words = words_of(300)
    config = CheckpointConfig(interval=None, directory=tmp_path / "chk")  # final one only
    earlier = await counts_flow(words, tmp_path / "a").run(checkpoints=config)
    assert earlier.metrics.completed_checkpoints
    flow = counts_flow(words, tmp_path / "b", fn=failing_count(FailureInjector([50])))
    job = await flow.run(checkpoints=config, restart=RestartStrategy.fixed(2, 0.0))
    assert job.metrics.restarts == 1
    assert job.metrics.restored_checkpoints == []
    assert_exactly_once(tmp_path / "b", words)


async def test_failover_restores_this_runs_newest_checkpoint(tmp_path):
    words = words_of(20_000)
    config = CheckpointConfig(interval=0.005, directory=tmp_path / "chk", retained=5)
    await counts_flow(words_of(500), tmp_path / "a").run(checkpoints=config)
    earlier = set(checkpoint_ids(tmp_path / "chk"))
    flow = counts_flow(words, tmp_path / "b", fn=failing_count(FailureInjector([15_000])))
    job = await flow.run(checkpoints=config, restart=RestartStrategy.fixed(2, 0.0))
    assert job.metrics.restarts == 1
    restored = job.metrics.restored_checkpoints
    assert restored and not set(restored) & earlier
    assert_exactly_once(tmp_path / "b", words)


async def test_restore_from_a_missing_file_fails_the_job_instead_of_starting_fresh(tmp_path):
    config = CheckpointConfig(interval=0.01, directory=tmp_path / "chk")
    await counts_flow(words_of(300), tmp_path / "a").run(checkpoints=config)
    sp = export_savepoint(CheckpointStorage(tmp_path / "chk", JOB).latest_restorable(),
                          tmp_path / "sp")
    state_file = next(p for p in sp.path.iterdir() if p.name.startswith("count-"))
    state_file.unlink()
    job = await counts_flow(words_of(300), tmp_path / "b").start(
        checkpoints=CheckpointConfig(interval=0.01, directory=tmp_path / "chk2"),
        restore_from=sp.path, restart=RestartStrategy.fixed(3, 0.0))
    with pytest.raises(JobFailedError, match="is missing") as info:
        await job.wait()
    assert isinstance(info.value.__cause__, RestoreError)
    assert job.metrics.restarts == 0
    assert committed(tmp_path / "b") == []


async def test_a_restore_error_in_a_task_is_not_retried(tmp_path):
    """A backend that cannot read the restored state fails the job once, with the reason;
    the restart strategy does not turn it into a fresh start or a retry loop."""
    from reactive.backends.heap import HeapStateBackend

    class RefusingBackend(HeapStateBackend):
        def create_keyed_backend(self, **kw: Any) -> Any:
            kb = super().create_keyed_backend(**kw)

            def restore(handles: Any, job_dir: Any) -> None:
                raise RestoreError("this backend cannot read heap-v1 snapshots")

            kb.restore = restore  # type: ignore[method-assign]
            return kb

    config = CheckpointConfig(interval=0.01, directory=tmp_path / "chk")
    await counts_flow(words_of(300), tmp_path / "a").run(checkpoints=config)
    job = await counts_flow(words_of(300), tmp_path / "b").start(
        checkpoints=config, resume=True, state_backend=RefusingBackend(),
        restart=RestartStrategy.fixed(3, 0.0))
    with pytest.raises(JobFailedError, match="cannot read heap-v1") as info:
        await job.wait()
    assert info.value.attempts == 1
    assert committed(tmp_path / "b") == []


def _corrupt(chk_path: Path) -> None:
    """Flip bytes of the keyed-state file of a checkpoint (its sha256 then fails)."""
    victim = next(p for p in chk_path.iterdir() if p.name.startswith("count-"))
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))


async def _interrupted_run(tmp_path: Path, words: list[str]) -> CheckpointConfig:
    """A run that fails for good after several checkpoints committed output."""
    config = CheckpointConfig(interval=0.005, directory=tmp_path / "chk", retained=10)
    flow = counts_flow(words, tmp_path / "out", fn=failing_count(FailureInjector([15_000])))
    with pytest.raises(JobFailedError):
        await flow.run(checkpoints=config, restart=RestartStrategy.none())
    assert len(checkpoint_ids(tmp_path / "chk")) >= 3
    return config


async def test_resume_with_every_checkpoint_damaged_fails_and_lists_them(tmp_path):
    words = words_of(20_000)
    config = await _interrupted_run(tmp_path, words)
    completed = CheckpointStorage(tmp_path / "chk", JOB).completed()
    for chk in completed:
        _corrupt(chk.path)
    before = committed(tmp_path / "out")
    job = await counts_flow(words, tmp_path / "out").start(checkpoints=config, resume=True)
    with pytest.raises(JobFailedError, match="can restore none") as info:
        await job.wait()
    for chk in completed:
        assert f"checkpoint {chk.checkpoint_id} " in str(info.value)
    assert committed(tmp_path / "out") == before  # nothing replayed into the output


async def test_falling_back_past_a_checkpoint_that_committed_output_is_refused(tmp_path):
    words = words_of(20_000)
    config = await _interrupted_run(tmp_path, words)
    completed = CheckpointStorage(tmp_path / "chk", JOB).completed()
    newest = completed[-1]
    # damage every checkpoint but the oldest: the fallback then lies well before output
    # the newer ones committed (next to the newest, checkpoints taken while the paced source
    # waited hold the same position and committed nothing more)
    for chk in completed[1:]:
        _corrupt(chk.path)
    before = committed(tmp_path / "out")
    job = await counts_flow(words, tmp_path / "out").start(checkpoints=config, resume=True)
    with pytest.raises(JobFailedError, match="allow_replayed_output") as info:
        await job.wait()
    assert "not exactly-once" in str(info.value)
    assert committed(tmp_path / "out") == before
    # accepting the replay is an explicit choice: the records after the restored
    # checkpoint are then published a second time, and the job says so
    job = await counts_flow(words, tmp_path / "out").run(
        checkpoints=config, resume=True, allow_replayed_output=True)
    assert job.metrics.restored_checkpoints[0] < newest.checkpoint_id
    got = collections.Counter(committed(tmp_path / "out"))
    assert set(got) == {(w, n) for w, n in _expected(words)}
    assert max(got.values()) == 2


def _expected(words: Iterable[str]) -> list[tuple[str, int]]:
    seen: collections.Counter[str] = collections.Counter()
    out = []
    for w in words:
        seen[w] += 1
        out.append((w, seen[w]))
    return out


async def test_copied_checkpoint_directory_keeps_working(tmp_path):
    """A run restored into a new directory, which then fails over, restores its own newest
    checkpoint (ids above the restored one)."""
    words = words_of(60_000)
    await _interrupted_run(tmp_path, words)
    latest = CheckpointStorage(tmp_path / "chk", JOB).latest_restorable()
    shutil.copytree(latest.path, tmp_path / "copy" / JOB / latest.path.name)
    flow = counts_flow(words, tmp_path / "out", fn=failing_count(FailureInjector([40_000])))
    job = await flow.run(
        checkpoints=CheckpointConfig(interval=0.005, directory=tmp_path / "new"),
        restore_from=tmp_path / "copy" / JOB / latest.path.name,
        restart=RestartStrategy.fixed(2, 0.0))
    assert job.metrics.restored_checkpoints[0] == latest.checkpoint_id
    # the failover restored a checkpoint the new run took (ids continue after the restored)
    assert job.metrics.restored_checkpoints[1] > latest.checkpoint_id
    assert_exactly_once(tmp_path / "out", words)


async def _run_killed_before_its_first_checkpoint(flow_words: list[str], out: Path,
                                                  config: CheckpointConfig,
                                                  **options: Any) -> None:
    # the words, then no end: the run is cancelled before any checkpoint completes
    source = TestingSource([*flow_words, TestingSource.HOLD])
    flow = Dataflow(JOB, parallelism=2, batch_size=64)
    (flow.source(source, uid="words")
         .key_by(lambda w: w).process(Count()).uid("count")
         .sink(CommittingFileSink(out, format="jsonl")).uid("files"))
    job = await flow.start(checkpoints=config, **options)
    await source.wait_held()
    await job.cancel()  # as a kill would: no checkpoint of this run completed
    assert job.metrics.completed_checkpoints == []


async def test_resume_continues_a_fresh_run_killed_before_its_first_checkpoint(tmp_path):
    """Resume continues the most recent run: a fresh run that never checkpointed resumes
    from the beginning, not from an older run's checkpoint."""
    words = words_of(1_000)
    config = CheckpointConfig(interval=None, directory=tmp_path / "chk")
    await counts_flow(words, tmp_path / "a").run(checkpoints=config)
    await _run_killed_before_its_first_checkpoint(words, tmp_path / "b", config)
    job = await counts_flow(words, tmp_path / "b").run(checkpoints=config, resume=True)
    assert job.metrics.restored_checkpoints == []
    assert_exactly_once(tmp_path / "b", words)


async def test_resume_continues_a_restored_run_killed_before_its_first_checkpoint(tmp_path):
    """A run restored from a savepoint elsewhere and stopped before its first checkpoint is
    resumed from that savepoint (the checkpoint directory alone does not hold it)."""
    out = tmp_path / "out"
    config = CheckpointConfig(interval=None, directory=tmp_path / "chk")
    await counts_flow(words_of(300), out).run(checkpoints=config)
    sp = export_savepoint(CheckpointStorage(tmp_path / "chk", JOB).latest_restorable(),
                          tmp_path / "sp")
    shutil.rmtree(tmp_path / "chk")  # the savepoint is all that is left of the first run
    more = words_of(900)
    await _run_killed_before_its_first_checkpoint(more, out, config, restore_from=sp.path)
    job = await counts_flow(more, out).run(checkpoints=config, resume=True)
    assert job.metrics.restored_checkpoints == [sp.checkpoint_id]
    assert_exactly_once(out, more)


async def test_resume_after_a_refused_fresh_run_continues_the_run_before_it(tmp_path):
    """A fresh run refused at start (the sink will not add a second copy of committed output)
    committed nothing; resuming then continues the earlier run, not the refused one."""
    words = words_of(20_000)
    config = await _interrupted_run(tmp_path, words)
    newest = CheckpointStorage(tmp_path / "chk", JOB).completed()[-1]
    job = await counts_flow(words, tmp_path / "out").start(checkpoints=config)
    with pytest.raises(JobFailedError, match="append"):
        await job.wait()
    job = await counts_flow(words, tmp_path / "out").run(checkpoints=config, resume=True)
    assert job.metrics.restored_checkpoints == [newest.checkpoint_id]
    assert_exactly_once(tmp_path / "out", words)
