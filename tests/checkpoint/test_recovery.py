"""Recovery: resume from the latest completed checkpoint, skip incomplete and corrupted ones,
and resume a line-file source at its byte offset."""

from __future__ import annotations

import logging
import shutil

import pytest

from reactive import (
    CheckpointConfig,
    CheckpointStorage,
    Dataflow,
    JobFailedError,
    RestartStrategy,
    UserFunctionError,
)
from reactive.connectors.collections import ListSink
from tests.support import (
    Count,
    FailureInjector,
    checkpoint_state,
    failing_count,
    final_counts,
    paced,
)


def _flow(words, fn, sink, name="resume"):
    flow = Dataflow(name, parallelism=2, batch_size=128)
    # paced by completed checkpoints: several complete before any injected failure
    (flow.source(paced(words, every=5_000)).uid("src")
         .key_by(lambda w: w).process(fn).uid("count").sink(sink))
    return flow


def _config(directory, mode):
    return CheckpointConfig(interval=0.02, directory=directory, retained=10, mode=mode)


@pytest.fixture(scope="module")
def failed_run(few_words, tmp_path_factory):
    """``await failed_run(directory, mode)``: the checkpoints of a run that failed for good at
    record 30,000, copied into ``directory``; returns the checkpoint config over it.

    The failed run is made once per mode and module (it is the same run for every test here)
    and each test gets a copy of its own, since the tests corrupt or add checkpoints.
    """
    runs = {}

    async def copy_into(directory, mode="exactly_once"):
        if mode not in runs:
            runs[mode] = tmp_path_factory.mktemp(f"failed-{mode}")
            flow = _flow(few_words, failing_count(FailureInjector([30_000])), ListSink())
            with pytest.raises(JobFailedError) as info:
                await flow.run(checkpoints=_config(runs[mode], mode),
                               restart=RestartStrategy.none())
            assert isinstance(info.value.__cause__, UserFunctionError)
        shutil.copytree(runs[mode], directory, dirs_exist_ok=True)
        return _config(directory, mode)

    return copy_into


@pytest.mark.parametrize("mode", ["exactly_once", "synchronous"])
async def test_resume_continues_from_latest_checkpoint(few_words, few_truth, tmp_path, mode,
                                                       failed_run):
    config = await failed_run(tmp_path, mode)
    storage = CheckpointStorage(tmp_path, "resume")
    latest = storage.latest_restorable()
    assert latest is not None
    sink = ListSink()
    job = await _flow(few_words, Count(), sink).run(checkpoints=config, resume=True)
    assert job.metrics.restored_checkpoints == [latest.checkpoint_id]
    # the job's final checkpoint holds the exact counts
    assert checkpoint_state(tmp_path, "resume", "count", "count") == few_truth
    # only the records after the restored checkpoint were processed again
    assert 0 < len(sink.records) < len(few_words)
    assert all(few_truth[k] >= n for k, n in final_counts(sink.records).items())


async def test_directory_without_metadata_is_ignored(few_words, few_truth, tmp_path, failed_run):
    config = await failed_run(tmp_path)
    storage = CheckpointStorage(tmp_path, "resume")
    completed = storage.completed()
    assert len(completed) >= 2
    newest, previous = completed[-1], completed[-2]
    (newest.path / "_metadata").unlink()
    assert storage.latest_restorable().checkpoint_id == previous.checkpoint_id
    sink = ListSink()
    job = await _flow(few_words, Count(), sink).run(checkpoints=config, resume=True)
    assert job.metrics.restored_checkpoints == [previous.checkpoint_id]
    assert checkpoint_state(tmp_path, "resume", "count", "count") == few_truth


async def test_corrupted_state_file_falls_back_to_previous_checkpoint(few_words, few_truth,
                                                                      tmp_path, caplog,
                                                                      failed_run):
    config = await failed_run(tmp_path)
    storage = CheckpointStorage(tmp_path, "resume")
    previous, newest = storage.completed()[-2:]
    state_file = next(newest.path.glob("count-0.heap"))
    data = bytearray(state_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state_file.write_bytes(bytes(data))
    sink = ListSink()
    with caplog.at_level(logging.WARNING, logger="reactive.checkpoint"):
        job = await _flow(few_words, Count(), sink).run(checkpoints=config, resume=True)
    assert f"checkpoint {newest.checkpoint_id} is corrupted" in caplog.text
    assert "sha256" in caplog.text
    assert job.metrics.restored_checkpoints == [previous.checkpoint_id]
    assert checkpoint_state(tmp_path, "resume", "count", "count") == few_truth


async def test_restore_from_a_copied_checkpoint(few_words, few_truth, tmp_path, failed_run):
    config = await failed_run(tmp_path / "chk")
    latest = CheckpointStorage(tmp_path / "chk", "resume").latest_restorable()
    # a checkpoint is self-contained for the heap backend: it can be moved
    moved = tmp_path / "moved" / "resume" / latest.path.name
    shutil.copytree(latest.path, moved)
    sink = ListSink()
    job = await _flow(few_words, Count(), sink).run(checkpoints=config, restore_from=moved)
    assert job.metrics.restored_checkpoints == [latest.checkpoint_id]
    assert checkpoint_state(tmp_path / "chk", "resume", "count", "count") == few_truth


async def test_resume_without_checkpoints_starts_fresh(few_words, few_truth, tmp_path):
    sink = ListSink()
    job = await _flow(few_words, Count(), sink).run(
        checkpoints=CheckpointConfig(interval=0.05, directory=tmp_path), resume=True)
    assert job.metrics.restored_checkpoints == []
    assert final_counts(sink.records) == few_truth


@pytest.mark.parametrize("mode", ["exactly_once", "synchronous"])
async def test_line_file_source_resumes_at_byte_offset(tmp_path, mode):
    lines = [f"line {i} word{i % 97}" for i in range(50_000)]
    data = tmp_path / "input"
    data.mkdir()
    (data / "a.txt").write_text("\n".join(lines[:30_000]) + "\n")
    (data / "b.txt").write_text("\n".join(lines[30_000:]) + "\n")
    injector = FailureInjector([10_000, 40_000])
    sink = ListSink()
    flow = Dataflow("files", parallelism=2, batch_size=100)
    (flow.read_text_file(data, uid="lines").set_parallelism(2)
         .key_by(lambda line: line)
         .process(failing_count(injector)).uid("count")
         .sink(sink))
    job = await flow.run(checkpoints=CheckpointConfig(interval=0.02, directory=tmp_path / "c",
                                                      mode=mode),
                         restart=RestartStrategy.fixed(5, 0.0))
    assert job.metrics.restarts == 2
    # every line counted exactly once in the state (each line is unique)
    assert final_counts(sink.records) == {line: 1 for line in lines}
