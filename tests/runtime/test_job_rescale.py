"""``job.rescale(parallelism)`` on a running job: the change travels with a checkpoint's
barrier, and the job restores that checkpoint in-process at the new parallelism (Carbone
2018 (PhD thesis), sections 4.5.5 and 4.2); state and committed output stay exactly once,
the metadata records the rescale, and restarts and resumes restore the rescaled job."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest

from reactive import (
    CheckpointConfig,
    Dataflow,
    JobFailedError,
    PushSource,
    ReconfigurationError,
    RestartStrategy,
)
from reactive.backends.heap import HeapStateBackend
from reactive.backends.rocksdb import RocksDBStateBackend
from reactive.checkpoint import Reconfiguration, read_metadata
from reactive.connectors.collections import ListSink
from reactive.connectors.files import CommittingFileSink
from reactive.state.backend import StateBackend
from tests.connectors.files.test_committing_file_sink import committed_records
from tests.runtime.test_job_update import TaggedCount, _FailingSnapshotSink
from tests.support import Count, FailureInjector, failing_count

WORDS = [f"w{i}" for i in range(40)]


def _backend(name: str, tmp_path: Path) -> StateBackend:
    return HeapStateBackend() if name == "heap" else RocksDBStateBackend(path=tmp_path / "db")


def _flow(name: str, source: PushSource, out: Path, count: Any = None,
          parallelism: int = 2) -> Dataflow:
    flow = Dataflow(name, parallelism=parallelism)
    counts = (flow.source(source).uid("src").key_by(lambda w: w)
              .process(count or Count()).uid("count"))
    counts.sink(ListSink()).uid("out")
    counts.sink(CommittingFileSink(out)).uid("files")
    return flow


async def _send_rounds(source: PushSource, rounds: int) -> None:
    for _ in range(rounds):
        for w in WORDS:
            await source.send(w)


def _expected(rounds: int) -> list[tuple[str, int]]:
    return sorted((w, n) for w in WORDS for n in range(1, rounds + 1))


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
async def test_rescale_while_running_is_exactly_once(tmp_path, backend):
    source = PushSource()
    out = tmp_path / "out"
    job = await _flow("rescale", source, out).start(
        checkpoints=CheckpointConfig(interval=0.05, directory=str(tmp_path / "chk"),
                                     retained=100),
        state_backend=_backend(backend, tmp_path))
    results = job.results("out")
    rounds = 0
    steps = [4, {"count": 3}, 1, {"count": 2, "files": 3}]
    completed = []
    for step in steps:
        await _send_rounds(source, 3)
        rounds += 3
        completed.append(await job.rescale(step))
        assert job.status == "running"
    await _send_rounds(source, 3)
    rounds += 3
    source.close()
    got = [r async for r in results]
    await job.wait()
    # every count once, in order per key, across four rescales
    assert sorted(got) == _expected(rounds)
    for w in WORDS:
        assert [n for k, n in got if k == w] == list(range(1, rounds + 1))
    assert committed_records(out) == collections.Counter(_expected(rounds))
    assert job.parallelism == {"src": 1, "count": 2, "out": 1, "files": 3}
    assert job.metrics.restarts == 0
    # each rescale is in its checkpoint's metadata, on disk
    first = read_metadata(completed[0].path)
    assert first.reconfigurations == (
        Reconfiguration("rescale", "count", parallelism=4, previous_parallelism=2),
        Reconfiguration("rescale", "out", parallelism=4, previous_parallelism=2),
        Reconfiguration("rescale", "files", parallelism=4, previous_parallelism=2))
    assert first.rescaled == {"count": 4, "out": 4, "files": 4}
    assert read_metadata(completed[1].path).reconfigurations == (
        Reconfiguration("rescale", "count", parallelism=3, previous_parallelism=4),)
    # the first checkpoint after a rescale restored is taken at the new parallelism
    after = read_metadata(completed[3].path)
    assert after.reconfigurations[0].to_json() == {
        "version": 1, "kind": "rescale", "operator": "count", "previous_parallelism": 1,
        "parallelism": 2}


async def test_an_invalid_rescale_is_refused_before_anything_is_sent(tmp_path):
    source = PushSource()
    job = await _flow("rescale-refused", source, tmp_path / "out").start(
        checkpoints=CheckpointConfig(interval=None, directory=str(tmp_path / "chk")))
    results = job.results("out")
    await _send_rounds(source, 2)
    with pytest.raises(ReconfigurationError, match="no operator"):
        await job.rescale({"nope": 2})
    with pytest.raises(ReconfigurationError, match="supports parallelism <= 1"):
        await job.rescale({"src": 2})
    with pytest.raises(ReconfigurationError, match="max_parallelism 128"):
        await job.rescale(200)
    assert job.metrics.checkpoints == []
    await _send_rounds(source, 2)
    source.close()
    assert sorted([r async for r in results]) == _expected(4)
    await job.wait()


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
async def test_a_failure_after_a_rescale_restores_the_rescaled_job(tmp_path, backend):
    # fails at the 30th record the count sees after the rescale (the injector counts
    # from its creation: every record before the rescale is counted too)
    injector = FailureInjector([len(WORDS) * 4 + 30])
    source = PushSource()
    out = tmp_path / "out"
    job = await _flow("rescale-then-fail", source, out, failing_count(injector)).start(
        checkpoints=CheckpointConfig(interval=0.05, directory=str(tmp_path / "chk")),
        state_backend=_backend(backend, tmp_path),
        restart=RestartStrategy.fixed(2, delay=0.0))
    results = job.results("out")
    await _send_rounds(source, 4)
    completed = await job.rescale(3)
    await _send_rounds(source, 4)
    source.close()
    got = [r async for r in results]
    await job.wait()
    assert injector.failures == 1
    assert job.metrics.restarts == 1
    assert job.restored_from is not None
    assert job.restored_from.checkpoint_id >= completed.checkpoint_id
    # the restart restored the rescaled job: the checkpoint it restored (the rescale's
    # own, or a later one) records parallelism 3, and the job runs at it
    assert job.restored_from.metadata.rescaled["count"] == 3
    assert job.parallelism["count"] == 3
    assert sorted(got) == _expected(8)
    assert committed_records(out) == collections.Counter(_expected(8))


class _OnceFailingCommitSink(CommittingFileSink):
    """Fails its first commit once ``armed`` (a class attribute: shared by the instances),
    like a crash between the rescale checkpoint's completion and its commit."""

    armed = [False]

    def commit(self, txn: Any) -> None:
        if _OnceFailingCommitSink.armed[0]:
            _OnceFailingCommitSink.armed[0] = False
            raise OSError("injected commit failure")
        super().commit(txn)


async def test_a_failed_rescale_checkpoint_leaves_the_parallelism(tmp_path):
    source = PushSource()
    sink = _FailingSnapshotSink()
    flow = Dataflow("rescale-fails", parallelism=2)
    counts = flow.source(source).uid("src").key_by(lambda w: w).process(Count()).uid("count")
    counts.sink(ListSink()).uid("out")
    counts.sink(sink).uid("broken")
    job = await flow.start(checkpoints=CheckpointConfig(interval=None,
                                                        directory=str(tmp_path)))
    results = job.results("out")
    await _send_rounds(source, 3)
    sink.armed[0] = True
    with pytest.raises(ReconfigurationError, match="injected snapshot failure") as info:
        await job.rescale(4)
    assert "at the parallelism that checkpoint recorded" in str(info.value)
    # no restart: the sources read on, at parallelism 2
    assert job.status == "running"
    assert job.parallelism["count"] == 2
    await _send_rounds(source, 3)
    completed = await job.checkpoint()
    assert completed.metadata.rescaled == {}
    assert completed.metadata.operators["count"].parallelism == 2
    source.close()
    assert sorted([r async for r in results]) == _expected(6)
    await job.wait()
    assert job.metrics.restarts == 0


async def test_a_failure_after_the_rescale_checkpoint_restores_it_rescaled(tmp_path):
    source = PushSource()
    out = tmp_path / "out"
    flow = Dataflow("rescale-commit-fails", parallelism=2)
    counts = flow.source(source).uid("src").key_by(lambda w: w).process(Count()).uid("count")
    counts.sink(ListSink()).uid("out")
    counts.sink(_OnceFailingCommitSink(out)).uid("files")
    job = await flow.start(checkpoints=CheckpointConfig(interval=None,
                                                        directory=str(tmp_path / "chk")),
                           restart=RestartStrategy.fixed(1, delay=0.0))
    results = job.results("out")
    await _send_rounds(source, 3)
    await job.checkpoint()
    await _send_rounds(source, 3)
    _OnceFailingCommitSink.armed[0] = True
    with pytest.raises(ReconfigurationError, match="injected commit failure"):
        await job.rescale(3)
    await _send_rounds(source, 3)
    source.close()
    got = [r async for r in results]
    await job.wait()
    # the rescale's checkpoint had completed: the restart restored it, rescaled, and
    # committed its pending transactions once
    assert job.metrics.restarts == 1
    assert job.restored_from is not None
    assert job.restored_from.metadata.reconfigurations[0].kind == "rescale"
    assert job.parallelism["count"] == 3
    assert sorted(got) == _expected(9)
    assert committed_records(out) == collections.Counter(_expected(9))


async def test_a_resume_after_a_crash_runs_the_rescaled_job(tmp_path):
    injector = FailureInjector([len(WORDS) * 6 + 10])
    source = PushSource()
    out = tmp_path / "out"
    config = CheckpointConfig(interval=None, directory=str(tmp_path / "chk"))
    job = await _flow("rescale-resume", source, out, failing_count(injector)).start(
        checkpoints=config, restart=RestartStrategy.none())
    await _send_rounds(source, 3)
    await job.rescale({"count": 3})
    await _send_rounds(source, 3)
    await job.checkpoint()
    await _send_rounds(source, 3)  # the count fails on the 10th record of these
    with pytest.raises(JobFailedError) as info:
        await job.wait()
    assert info.value.resumable
    # a new run of the same program (parallelism 2) resumes the rescaled job
    source2 = PushSource()
    job2 = await _flow("rescale-resume", source2, out).start(checkpoints=config, resume=True)
    results = job2.results("out")
    await _send_rounds(source2, 3)
    source2.close()
    got = [r async for r in results]
    await job2.wait()
    assert job2.restored_from is not None
    assert job2.restored_from.metadata.rescaled == {"count": 3}
    assert job2.parallelism["count"] == 3
    assert sorted(got) == sorted((w, n) for w in WORDS for n in range(7, 10))
    assert committed_records(out) == collections.Counter(_expected(9))


async def _reconfigured_run(tmp_path: Path) -> tuple[Path, int, int]:
    """A run rescaled once and updated once; its job directory and the two checkpoint
    ids."""
    source = PushSource()
    job = await _flow("reconfigured", source, tmp_path / "out").start(
        checkpoints=CheckpointConfig(interval=None, directory=str(tmp_path / "chk"),
                                     retained=10))
    await _send_rounds(source, 1)
    rescaled = await job.rescale({"count": 3})
    await _send_rounds(source, 1)
    updated = await job.update("count", TaggedCount())
    source.close()
    await job.wait()
    return tmp_path / "chk" / "reconfigured", rescaled.checkpoint_id, updated.checkpoint_id


async def test_checkpoints_list_shows_each_checkpoints_reconfigurations(tmp_path, capsys):
    from reactive.cli import main

    job_dir, rescaled, updated = await _reconfigured_run(tmp_path)
    capsys.readouterr()
    assert main(["checkpoints", "list", str(job_dir)]) == 0
    rows = {int(r.split()[1]): r.split() for r in capsys.readouterr().out.splitlines()[1:]}
    assert rows[rescaled][-2] == "rescale(count:2->3)"
    assert rows[updated][-2] == f"update(count:{TaggedCount.__module__}.TaggedCount)"
    assert all(r[-2] == "-" for n, r in rows.items() if n not in (rescaled, updated))
    assert main(["checkpoints", "inspect", str(job_dir / f"chk-{rescaled}")]) == 0
    text = capsys.readouterr().out
    assert "reconfigured at this checkpoint: rescale count 2 -> 3" in text
    assert "operator 'count' (Count), parallelism 2" in text  # taken before the switch


async def test_the_spark_bridge_reads_the_reconfiguration_history(tmp_path, spark):
    from reactive.connectors.spark import CheckpointReader, reconfiguration_history

    job_dir, rescaled, updated = await _reconfigured_run(tmp_path)
    history = reconfiguration_history(spark, job_dir).collect()
    assert [tuple(r) for r in history] == [
        (rescaled, "rescale", "count", None, 2, 3),
        (updated, "update", "count", f"{TaggedCount.__module__}.TaggedCount", None, None)]
    reader = CheckpointReader(spark, job_dir / f"chk-{rescaled}")
    assert [r.parallelism for r in reader.reconfigurations().collect()] == [3]
    assert reader.reconfiguration_entries[0].kind == "rescale"


async def test_a_rescale_keeps_the_updated_function(tmp_path):
    source = PushSource()
    job = await _flow("update-then-rescale", source, tmp_path / "out").start(
        checkpoints=CheckpointConfig(interval=None, directory=str(tmp_path / "chk")))
    results = job.results("out")
    await _send_rounds(source, 2)
    await job.update("count", TaggedCount())
    await _send_rounds(source, 2)
    await job.rescale(3)
    await _send_rounds(source, 2)
    source.close()
    got = [r async for r in results]
    await job.wait()
    # the instances built by the rescale run version 2, with the counts carried over
    assert sorted(got) == sorted([(w, n) for w in WORDS for n in (1, 2)]
                                 + [(w, n, "v2") for w in WORDS for n in range(3, 7)])
