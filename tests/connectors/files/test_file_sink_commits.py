"""Commits of the committing file sink: a commit never replaces a file (A), it publishes only
what pre-commit wrote (B), a fresh run does not add its output to an earlier run's (C), and
pending transactions restored at another parallelism are committed exactly once (D).

The rescaling trials run ``tests/pipelines/committing_file_job.py`` in subprocesses: the
first run, at parallelism p, has its source decline one checkpoint (the barrier still
flows, so every sink instance pre-commits it and keeps it pending into the next checkpoint)
and is killed with SIGKILL in the first commit after the next checkpoint completed; the
second run resumes at p'. So the restored checkpoint lists, per old instance, pending
transactions of two checkpoint ids.
"""

from __future__ import annotations

import collections
import hashlib
import os
import pickle
import random
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reactive import (
    CheckpointConfig,
    ConfigurationError,
    Dataflow,
    JobFailedError,
    RestartStrategy,
)
from reactive.connectors.files import CommittingFileSink, FileTransaction, PartFileError
from tests.connectors.files.test_committing_file_sink import (
    FailingCommitSink,
    committed_records,
    expected_output,
    hidden_files,
)
from tests.pipelines import committing_file_job as pipeline
from tests.support import Count

SCRIPT = Path(pipeline.__file__)
ROOT = SCRIPT.parents[2]
RECORDS = 300_000
_PENDING = re.compile(r"^\.part-(\d+)-(\d+)\.jsonl\.pending$")


def causes(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc`` and its causes (``__cause__``/``__context__``), outermost first."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def cause_of(exc: BaseException, kind: type[BaseException]) -> BaseException:
    found = [e for e in causes(exc) if isinstance(e, kind)]
    assert found, f"no {kind.__name__} in the causes of {exc!r}"
    return found[0]


def _flow(sink: CommittingFileSink, words: list[str], parallelism: int = 2) -> Dataflow:
    flow = Dataflow("commits", parallelism=parallelism, batch_size=256)
    (flow.from_collection(words).uid("words").key_by(lambda w: w)
         .process(Count()).uid("count").sink(sink).uid("files"))
    return flow


WORDS = pipeline.words(20_000, seed=11)


def _pre_committed(directory: Path, records: list[Any], checkpoint_id: int,
                   subtask: int = 0, fmt: str = "jsonl") -> tuple[CommittingFileSink,
                                                                  FileTransaction]:
    """A sink instance and a transaction holding ``records``, pre-committed."""
    sink = CommittingFileSink(directory, format=fmt, mode="append")
    sink.subtask = subtask
    sink.abort_lingering(None)
    txn = sink.begin_transaction()
    sink.write(txn, records)
    sink.pre_commit(txn, checkpoint_id)
    return sink, txn


# ---------------------------------------------------------------------- A: never replace
def test_commit_does_not_replace_a_committed_file_of_an_earlier_run(tmp_path):
    earlier = tmp_path / "part-0-4.jsonl"
    earlier.write_text('["earlier",1]\n')
    sink, txn = _pre_committed(tmp_path, [("later", 1), ("later", 2)], 4)
    with pytest.raises(PartFileError) as info:
        sink.commit(txn)
    message = str(info.value)
    assert str(earlier) in message and "checkpoint 4" in message
    assert "exists already with other content" in message and "bytes" in message
    assert info.value.checkpoint_id == 4 and info.value.path == earlier
    assert earlier.read_text() == '["earlier",1]\n'  # untouched
    assert hidden_files(tmp_path) == [".part-0-4.jsonl.pending"]  # the new data is kept


def test_a_commit_retried_after_recovery_is_idempotent(tmp_path):
    sink, txn = _pre_committed(tmp_path, [("a", 1)], 7)
    pending, final = tmp_path / txn.name, tmp_path / "part-0-7.jsonl"
    # a crash between the link and the removal of the pending name: both name one file
    os.link(pending, final)
    sink.commit(txn)
    assert hidden_files(tmp_path) == [] and final.read_text() == '["a",1]\n'
    sink.commit(txn)  # committed, pending name gone: done
    # the same content under the committed name, as another file, with the pending kept
    sink2, txn2 = _pre_committed(tmp_path, [("b", 1)], 8)
    (tmp_path / "part-0-8.jsonl").write_bytes((tmp_path / txn2.name).read_bytes())
    sink2.commit(txn2)
    assert hidden_files(tmp_path) == []
    assert sorted(os.listdir(tmp_path)) == ["part-0-7.jsonl", "part-0-8.jsonl"]


async def test_a_run_appending_into_a_directory_never_overwrites_its_parts(tmp_path):
    """Two runs with their own checkpoint directories use the same checkpoint ids, so the
    second one's part names are taken: its commit fails instead of replacing them."""
    out = tmp_path / "out"
    await _flow(CommittingFileSink(out), WORDS).run(
        checkpoints=CheckpointConfig(interval=None, directory=tmp_path / "chk1"))
    before = {p.name: p.read_bytes() for p in out.iterdir() if not p.name.startswith(".")}
    other = pipeline.words(20_000, seed=12)
    with pytest.raises(JobFailedError) as info:
        await _flow(CommittingFileSink(out, mode="append"), other).run(
            checkpoints=CheckpointConfig(interval=None, directory=tmp_path / "chk2"),
            restart=RestartStrategy.none())
    error = cause_of(info.value, PartFileError)
    assert "exists already with other content" in str(error)
    assert {p.name: p.read_bytes() for p in out.iterdir() if not p.name.startswith(".")} \
        == before
    assert committed_records(out) == expected_output(WORDS)


# ---------------------------------------------------------------------- B: verify content
@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_pre_commit_records_size_and_digest_of_what_it_wrote(tmp_path, fmt):
    sink, txn = _pre_committed(tmp_path, [("a", i) for i in range(1000)], 3, fmt=fmt)
    data = (tmp_path / txn.name).read_bytes()
    assert txn.size == len(data) and txn.sha256 == hashlib.sha256(data).hexdigest()
    restored = pickle.loads(pickle.dumps(txn))  # as stored in the checkpoint
    assert (restored.size, restored.sha256, restored.final) == (txn.size, txn.sha256,
                                                                "part-0-3." + fmt)
    sink.commit(restored)
    assert (tmp_path / f"part-0-3.{fmt}").read_bytes() == data


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_pending_file_is_not_committed(tmp_path, damage):
    sink, txn = _pre_committed(tmp_path, [("w", i) for i in range(5000)], 5)
    pending = tmp_path / txn.name
    data = pending.read_bytes()
    if damage == "truncate":
        pending.write_bytes(data[: len(data) // 2])
    else:
        pending.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    with pytest.raises(PartFileError) as info:
        sink.commit(txn)
    message = str(info.value)
    assert str(pending) in message and "checkpoint 5" in message
    assert ("bytes, pre-commit wrote" if damage == "truncate" else "SHA-256") in message
    assert not (tmp_path / "part-0-5.jsonl").exists()


def test_a_damaged_committed_file_fails_a_retried_commit(tmp_path):
    sink, txn = _pre_committed(tmp_path, [("w", 1), ("w", 2)], 6)
    sink.commit(txn)
    final = tmp_path / "part-0-6.jsonl"
    final.write_bytes(final.read_bytes()[:5])
    with pytest.raises(PartFileError, match="checkpoint 6"):
        sink.commit(txn)


async def test_a_pending_file_truncated_before_the_recovery_commit_fails_the_job(tmp_path):
    out, config = tmp_path / "out", CheckpointConfig(interval=None, directory=tmp_path / "chk")
    FailingCommitSink.failing = True
    with pytest.raises(JobFailedError):
        await _flow(FailingCommitSink(out), WORDS).run(checkpoints=config,
                                                      restart=RestartStrategy.none())
    pending = sorted(out / n for n in hidden_files(out))
    assert len(pending) == 2
    damaged = pending[1]
    damaged.write_bytes(damaged.read_bytes()[:1000])
    FailingCommitSink.failing = False
    with pytest.raises(JobFailedError) as info:
        await _flow(FailingCommitSink(out), WORDS).run(checkpoints=config, resume=True,
                                                      restart=RestartStrategy.none())
    error = cause_of(info.value, PartFileError)
    assert str(damaged) in str(error) and "truncated or changed" in str(error)
    final = damaged.name[1:].removesuffix(".pending")
    assert not (out / final).exists()  # never published as if it were whole


# ---------------------------------------------------------------------- C: fresh runs
async def test_a_fresh_run_into_a_directory_with_committed_parts_is_refused(tmp_path):
    out, chk = tmp_path / "out", tmp_path / "chk"
    config = CheckpointConfig(interval=None, directory=chk)
    await _flow(CommittingFileSink(out), WORDS).run(checkpoints=config)
    parts = sorted(n for n in os.listdir(out) if n != ".reactive-lock")
    assert len(parts) == 2
    with pytest.raises(JobFailedError) as info:
        await _flow(CommittingFileSink(out), WORDS).run(checkpoints=config)
    error = cause_of(info.value, ConfigurationError)
    message = str(error)
    for needle in (str(out), "2 committed part file(s)", "resume=True", "--resume",
                   "delete them", "mode='append'"):
        assert needle in message
    # nothing written, nothing removed
    assert sorted(n for n in os.listdir(out) if n != ".reactive-lock") == parts
    assert committed_records(out) == expected_output(WORDS)


async def test_resuming_is_never_refused_and_appending_adds_on_purpose(tmp_path):
    out, chk = tmp_path / "out", tmp_path / "chk"
    config = CheckpointConfig(interval=None, directory=chk)
    await _flow(CommittingFileSink(out), WORDS).run(checkpoints=config)
    # resuming the run that wrote the parts restores its sink state: no fresh start
    job = await _flow(CommittingFileSink(out), WORDS).run(checkpoints=config, resume=True)
    assert job.metrics.restored_checkpoints
    assert committed_records(out) == expected_output(WORDS)
    # appending on purpose adds this run's output (new checkpoint ids, new part names)
    await _flow(CommittingFileSink(out, mode="append"), WORDS).run(checkpoints=config)
    doubled = expected_output(WORDS)
    assert committed_records(out) == doubled + doubled


async def test_instances_of_one_fresh_run_do_not_refuse_each_others_parts(tmp_path):
    """Without checkpoints, an instance that receives no record starts its sink when the
    other one may already have committed its part at end of input: still a fresh run."""
    out = tmp_path / "out"
    words = ["only"] * 5_000  # one key: one of the two instances gets nothing
    await _flow(CommittingFileSink(out), words).run()
    assert committed_records(out) == expected_output(words)


def test_fresh_start_refusal_and_modes_at_the_writer(tmp_path):
    (tmp_path / "part-3-9.parquet").write_bytes(b"x")
    with pytest.raises(ConfigurationError, match="1 committed part file"):
        CommittingFileSink(tmp_path).abort_lingering(None)
    CommittingFileSink(tmp_path).abort_lingering(9)  # a restore never refuses
    CommittingFileSink(tmp_path, mode="append").abort_lingering(None)
    with pytest.raises(ConfigurationError, match="mode"):
        CommittingFileSink(tmp_path, mode="overwrite")


# ---------------------------------------------------------------------- D: rescaling
def _run(out: Path, chk: Path, parallelism: int, backend: str,
         **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(out), str(chk), "jsonl", str(RECORDS),
         str(parallelism), backend],
        env={**os.environ, "PYTHONPATH": str(ROOT), "REACTIVE_TEST_KILL": "none:0", **env},
        capture_output=True, text=True, timeout=180, check=False,
    )


def _pending_by_subtask(out: Path) -> dict[int, set[int]]:
    found: dict[int, set[int]] = collections.defaultdict(set)
    for name in os.listdir(out):
        m = _PENDING.match(name)
        if m:
            found[int(m.group(1))].add(int(m.group(2)))
    return dict(found)


@pytest.mark.e2e
@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
@pytest.mark.parametrize(("p", "p2"), [(2, 3), (4, 3), (3, 2)])
def test_pending_transactions_restored_at_another_parallelism_are_committed_once(
        tmp_path, p, p2, backend):
    rnd = random.Random(p * 10 + p2)
    out, chk = tmp_path / "out", tmp_path / "chk"
    first = _run(out, chk, p, backend, REACTIVE_TEST_DECLINE=str(rnd.choice([2, 3])),
                 REACTIVE_TEST_KILL="commitdeclined:1")
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    # the situation of the report: each old instance has pending transactions of two
    # checkpoints (the declined one and the completed one), none committed yet
    pending = _pending_by_subtask(out)
    assert sorted(pending) == list(range(p)) and all(len(c) == 2 for c in pending.values()), \
        pending
    second = _run(out, chk, p2, backend)
    assert second.returncode == 0, second.stderr[-3000:]
    assert committed_records(out) == expected_output(pipeline.words(RECORDS))
    assert hidden_files(out) == []


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("seed", range(12))
def test_kills_between_completion_and_commit_across_rescalings(tmp_path, seed):
    """Seeded schedules: every run at a random parallelism (1-4), on one backend per seed,
    killed at a commit (of a declined checkpoint's transaction or any), after a commit's
    rename, at a pre-commit or at a record, until a run finishes; then a run without kill
    (it resumes the finished job: nothing more may be committed)."""
    rnd = random.Random(seed)
    out, chk, log = tmp_path / "out", tmp_path / "chk", tmp_path / "kills.log"
    backend = rnd.choice(["heap", "rocksdb"])
    kills = ["commitdeclined:1", f"commit:{rnd.randint(1, 3)}",
             f"committed:{rnd.randint(1, 3)}", f"precommit:{rnd.randint(1, 4)}",
             f"commitdeclined:{rnd.randint(1, 2)}", f"record:{rnd.randint(1_000, 60_000)}",
             f"commit:{rnd.randint(1, 2)}"]
    for kill in kills:
        if kill.startswith("commitdeclined"):
            # the n-th commit of the declined checkpoint's transactions: n instances at least
            decline, parallelism = rnd.choice([2, 3]), rnd.randint(2, 4)
        else:
            decline, parallelism = rnd.choice([0, 0, 2, 3]), rnd.randint(1, 4)
        run = _run(out, chk, parallelism, backend, REACTIVE_TEST_KILL=kill,
                   REACTIVE_TEST_DECLINE=str(decline), REACTIVE_TEST_KILL_LOG=str(log))
        assert run.returncode in (0, -signal.SIGKILL), (kill, run.stderr[-3000:])
        if run.returncode == 0:
            break  # the job finished before the kill point
    final = _run(out, chk, rnd.randint(1, 4), backend)
    assert final.returncode == 0, final.stderr[-3000:]
    assert len(log.read_text().split()) >= 2  # the schedule did kill, more than once
    assert committed_records(out) == expected_output(pipeline.words(RECORDS))
    assert hidden_files(out) == []
