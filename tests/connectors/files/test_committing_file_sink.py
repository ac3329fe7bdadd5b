"""The committing file sink: exactly-once part files across SIGKILLs, recovery of pending and
lingering files, rescaling, and parquet output with a declared schema.

The crash tests run ``tests/pipelines/committing_file_job.py`` in a subprocess that kills
itself with SIGKILL at a seeded kill point (a record, a pre-commit, a commit before or after
its rename); the test restarts it (it resumes from the latest completed checkpoint) until it
exits 0, then compares the union of the committed files with the batch result.
"""

from __future__ import annotations

import collections
import json
import os
import random
import re
import signal
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reactive import (
    CheckpointConfig,
    Dataflow,
    JobFailedError,
    RestartStrategy,
    UserFunctionError,
)
from reactive.connectors.files import CommittingFileSink, FileTransaction
from tests.pipelines import committing_file_job as pipeline
from tests.support import Count

SCRIPT = Path(pipeline.__file__)
ROOT = SCRIPT.parents[2]
RECORDS = 300_000
_PART = re.compile(r"^part-(\d+)-(\d+)\.(jsonl|parquet)$")


def expected_output(words: Iterable[str]) -> collections.Counter[tuple[str, int]]:
    """The batch result of the keyed count: ``(word, i)`` once for i in 1..count(word)."""
    counts = collections.Counter(words)
    return collections.Counter((w, i) for w, c in counts.items() for i in range(1, c + 1))


LOCK = ".reactive-lock"  # the run's lock of the directory (reactive.runtime.directory_lock)


def committed_records(directory: Path) -> collections.Counter[tuple[Any, ...]]:
    """Every record of every committed part file (a multiset, so duplicates show)."""
    out: collections.Counter[tuple[Any, ...]] = collections.Counter()
    for p in sorted(directory.iterdir()):
        if not _PART.match(p.name):
            continue
        if p.suffix == ".jsonl":
            with open(p, encoding="utf-8") as f:
                out.update(tuple(json.loads(line)) for line in f)
        else:
            table = pq.read_table(p)
            out.update(zip(*(table.column(i).to_pylist() for i in range(table.num_columns)),
                           strict=True))
    return out


def hidden_files(directory: Path) -> list[str]:
    """Hidden files left in the sink's directory, but for the run's lock."""
    return sorted(p.name for p in directory.iterdir()
                  if p.name.startswith(".") and p.name != LOCK)


def kill_schedule(seed: int) -> list[str]:
    """Seeded kill points: first between completion and commit (and during the recovery
    commit that follows), after a commit's rename, after a pre-commit, then at records."""
    rnd = random.Random(seed)
    return [
        f"commit:{rnd.randint(1, 3)}",
        f"commit:{rnd.randint(1, 2)}",
        f"committed:{rnd.randint(1, 3)}",
        f"precommit:{rnd.randint(1, 4)}",
        f"record:{rnd.randint(1_000, 60_000)}",
        f"record:{rnd.randint(1_000, 60_000)}",
    ]


def run_until_done(out: Path, chk: Path, fmt: str, schedule: list[str], log: Path) -> list[int]:
    """Run the pipeline with each kill point in turn, then without, until it exits 0.

    Returns:
        the exit codes, in order.
    """
    codes: list[int] = []
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REACTIVE_TEST_KILL_LOG": str(log)}
    for kill in [*schedule, "none:0"]:
        proc = subprocess.run(
            [sys.executable, str(SCRIPT), str(out), str(chk), fmt, str(RECORDS)],
            env={**env, "REACTIVE_TEST_KILL": kill}, capture_output=True, text=True,
            timeout=120, check=False,
        )
        codes.append(proc.returncode)
        assert proc.returncode in (0, -signal.SIGKILL), proc.stderr[-3000:]
        if proc.returncode == 0:
            break
    assert codes[-1] == 0, "the job did not finish after the last kill"
    return codes


@pytest.mark.e2e
@pytest.mark.parametrize(("fmt", "seed"), [("jsonl", 1), ("jsonl", 2), ("parquet", 3)])
def test_sigkill_at_random_moments_commits_every_record_once(tmp_path, fmt, seed):
    out, chk, log = tmp_path / "out", tmp_path / "chk", tmp_path / "kills.log"
    schedule = kill_schedule(seed)
    codes = run_until_done(out, chk, fmt, schedule, log)
    kills = log.read_text().split() if log.exists() else []
    # every kill happened where it was planned, and the first four (which need only a few
    # checkpoints of a run) certainly happened: completion-commit gaps, rename, pre-commit
    assert kills == schedule[: len(kills)]
    assert codes.count(-signal.SIGKILL) == len(kills) >= 4
    assert committed_records(out) == expected_output(pipeline.words(RECORDS))
    assert hidden_files(out) == []
    names = [p.name for p in out.iterdir() if p.name != LOCK]
    assert names and all(_PART.match(n) and n.endswith("." + fmt) for n in names)
    if fmt == "parquet":
        for p in out.iterdir():
            if p.name == LOCK:
                continue
            assert pq.read_schema(p).equals(pipeline.schema())


# ---------------------------------------------------------------------- in-process tests
WORDS = pipeline.words(40_000, seed=9)


class FailingCommitSink(CommittingFileSink):
    """Fails every commit while ``failing`` is set (a class attribute: shared by the
    per-subtask copies), like a crash between checkpoint completion and commit."""

    failing = True

    def commit(self, txn: FileTransaction) -> None:
        if FailingCommitSink.failing:
            raise OSError("injected commit failure")
        super().commit(txn)


def _flow(sink: CommittingFileSink, parallelism: int, words: list[str] = WORDS) -> Dataflow:
    flow = Dataflow("files", parallelism=parallelism, batch_size=256)
    (flow.from_collection(words).uid("words").key_by(lambda w: w)
         .process(Count()).uid("count").sink(sink).uid("files"))
    return flow


async def test_pending_files_of_a_crash_are_committed_after_rescaling(tmp_path):
    out, config = tmp_path / "out", CheckpointConfig(interval=None, directory=tmp_path / "chk")
    FailingCommitSink.failing = True
    # the final checkpoint completes, then every commit fails: the job fails for good with
    # the interval pre-committed (pending files) but invisible
    with pytest.raises(JobFailedError) as info:
        await _flow(FailingCommitSink(out), 3).run(checkpoints=config,
                                                   restart=RestartStrategy.none())
    assert isinstance(info.value.__cause__, UserFunctionError | OSError)
    pending = hidden_files(out)
    assert pending and all(n.endswith(".jsonl.pending") for n in pending)
    assert committed_records(out) == collections.Counter()
    # resumed at parallelism 2: the pending files of the 3 old subtasks are committed once
    FailingCommitSink.failing = False
    job = await _flow(FailingCommitSink(out), 2).run(checkpoints=config, resume=True)
    assert job.metrics.restored_checkpoints
    assert committed_records(out) == expected_output(WORDS)
    assert hidden_files(out) == []


async def test_lingering_files_are_removed_and_other_files_kept(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    lingering = [".part-0-0123abcd.jsonl.inprogress", ".part-1-7.jsonl.pending",
                 ".part-5-3.jsonl.pending"]  # subtask 5 no longer exists: 5 % 2 cleans it
    kept = [".part-0-0123abcd.parquet.inprogress", "notes.txt", ".hidden"]
    for name in lingering + kept:
        (out / name).write_text("stale\n")
    await _flow(CommittingFileSink(out), 2).run(
        checkpoints=CheckpointConfig(interval=0.05, directory=tmp_path / "chk"))
    assert sorted(n for n in os.listdir(out) if not _PART.match(n) and n != LOCK) == sorted(kept)
    assert committed_records(out) == expected_output(WORDS)


async def test_without_checkpoints_end_of_input_commits(tmp_path):
    out = tmp_path / "out"
    await _flow(CommittingFileSink(out), 2).run()
    assert committed_records(out) == expected_output(WORDS)
    assert sorted(n for n in os.listdir(out) if n != LOCK) == ["part-0-1.jsonl", "part-1-1.jsonl"]


async def test_parquet_is_readable_with_the_declared_schema(tmp_path):
    out = tmp_path / "out"
    schema = pa.schema([pa.field("word", pa.string(), nullable=False), ("count", pa.int32())])
    sink = CommittingFileSink(out, format="parquet", schema=schema, row_group_size=1000)
    await _flow(sink, 2).run(checkpoints=CheckpointConfig(interval=0.05, directory=tmp_path))
    files = sorted(f for f in out.iterdir() if f.name != LOCK)
    assert files and all(f.suffix == ".parquet" for f in files)
    for f in files:
        assert pq.read_schema(f).equals(schema)
        assert pq.ParquetFile(f).metadata.num_rows > 0
    # as a dataset: the directory read by pyarrow (which would skip hidden files)
    table = pq.read_table(out)
    assert table.schema.equals(schema) and table.num_rows == len(WORDS)
    assert committed_records(out) == expected_output(WORDS)


async def test_parquet_schema_is_inferred_from_dicts(tmp_path):
    out = tmp_path / "out"
    flow = Dataflow("dicts", parallelism=2)
    (flow.from_collection(range(5_000)).map(lambda i: {"i": i, "sq": float(i * i)})
         .sink(CommittingFileSink(out, format="parquet")))
    await flow.run(checkpoints=CheckpointConfig(interval=0.05, directory=tmp_path / "chk"))
    table = pq.read_table(out)
    assert table.schema.equals(pa.schema([("i", pa.int64()), ("sq", pa.float64())]))
    assert sorted(table.column("i").to_pylist()) == list(range(5_000))


@pytest.mark.parametrize(("records", "bad"), [
    ([("a", 1), ("b", "x"), ("c", 3)], "('b', 'x')"),  # a value of the wrong type
    ([("a", 1), ("b", 2, 3)], "('b', 2, 3)"),  # a record of the wrong width
])
async def test_a_record_that_does_not_fit_the_schema_fails_the_job_naming_it(
        tmp_path, records, bad):
    schema = pa.schema([("word", pa.string()), ("count", pa.int64())])
    flow = Dataflow("bad", parallelism=1)
    flow.from_collection(records).sink(
        CommittingFileSink(tmp_path / "out", format="parquet", schema=schema))
    with pytest.raises(JobFailedError) as info:
        await flow.run()
    assert f"record {bad} " in str(info.value.__cause__)
    assert hidden_files(tmp_path / "out") == []  # the open transaction was aborted


def test_configuration_errors(tmp_path):
    from reactive import ConfigurationError

    with pytest.raises(ConfigurationError):
        CommittingFileSink(tmp_path, format="csv")
    with pytest.raises(ConfigurationError):
        CommittingFileSink(tmp_path, format="jsonl", schema=pa.schema([("a", pa.int64())]))
    with pytest.raises(ConfigurationError):
        CommittingFileSink(tmp_path, format="parquet", schema=[("a", "int64")])


def test_commit_is_idempotent_and_loud_about_lost_files(tmp_path):
    sink = CommittingFileSink(tmp_path)
    sink.abort_lingering(None)
    txn = sink.begin_transaction()
    sink.write(txn, [("a", 1), {"b": [1, 2]}, "é"])
    sink.pre_commit(txn, 4)
    assert hidden_files(tmp_path) == [".part-0-4.jsonl.pending"]
    sink.commit(txn)
    sink.commit(txn)  # retried after a recovery: already renamed, done
    assert (tmp_path / "part-0-4.jsonl").read_text(encoding="utf-8").splitlines() == [
        '["a",1]', '{"b":[1,2]}', '"é"']
    (tmp_path / "part-0-4.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match="records of checkpoint 4 of subtask 0"):
        sink.commit(txn)


def test_jsonl_batches_encode_to_one_line_per_record():
    """The batch encoder's fast path (one C call per batch, separators turned into newlines)
    must agree with json.dumps for any batch, e.g. strings holding '],[' or nested arrays."""
    from reactive.connectors.files.encoders import _json_lines_encoder

    encode = _json_lines_encoder()
    rnd = random.Random(4)

    def value(depth: int) -> Any:
        k = rnd.random()
        if depth < 3 and k < 0.2:
            return [value(depth + 1) for _ in range(rnd.randint(0, 3))]
        if depth < 3 and k < 0.3:
            return {rnd.choice(["a", "],[", "},{"]): value(depth + 1)
                    for _ in range(rnd.randint(0, 3))}
        return rnd.choice([1, 2.5, None, True, "],[", "},{", "x\n", "é", ""])

    def record(kind: str) -> Any:
        if kind == "mixed":
            kind = rnd.choice(["scalar", "tuple", "dict"])
        if kind == "tuple":
            return tuple(value(1) for _ in range(rnd.randint(0, 3)))
        if kind == "dict":
            return {rnd.choice(["k", "],[", "},{"]): value(1) for _ in range(rnd.randint(0, 2))}
        return value(1)

    for _ in range(3_000):
        kind = rnd.choice(["mixed", "tuple", "dict"])  # homogeneous batches take the fast path
        batch = [record(kind) for _ in range(rnd.randint(1, 6))]
        lines = encode(batch).split("\n")
        assert [json.loads(line) for line in lines] == json.loads(json.dumps(batch))
