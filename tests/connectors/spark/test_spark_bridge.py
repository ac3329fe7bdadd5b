"""The PySpark bridge (connectors/spark): result logs, exactly-once validation, reading state
from checkpoints and bootstrapping a savepoint from Spark.

The test session's one SparkSession (the ``spark`` fixture of conftest.py) serves them.
Pipelines run once per module and their output is copied before a test tampers with it.
"""

from __future__ import annotations

import asyncio
import collections
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reactive import (
    CheckpointConfig,
    CheckpointStorage,
    Dataflow,
    KeyGroupRange,
    RestoreError,
    StateBackend,
    assign_to_key_group,
)
from reactive.backends.rocksdb import RocksDBStateBackend
from reactive.checkpoint.contract import (
    CheckpointMetadata,
    KeyedStateHandle,
    OperatorState,
    OperatorSubtaskState,
)
from reactive.connectors.collections import ListSink
from reactive.connectors.files import CommittingFileSink
from reactive.connectors.spark import (
    CheckpointReader,
    JavaNotFoundError,
    ResultLog,
    ResultLogError,
    SavepointWriteError,
    SavepointWriter,
    ValidationReport,
    find_java,
    local_session,
    validate_exactly_once,
)
from reactive.connectors.spark.__main__ import main as cli_main
from tests.support import Count, checkpoint_state, final_counts, paced, zipf_words

WORDS = zipf_words(40_000, 800, seed=11)
MAXP = 128


@dataclass
class Run:
    """A finished pipeline: its committed output and its checkpoint directory."""

    out: Path
    checkpoints: Path
    job: str

    def latest(self) -> Path:
        return CheckpointStorage(self.checkpoints, self.job).completed()[-1].path


def _run_count_job(root: Path, job: str, fmt: str = "jsonl", schema: Any = None,
                   backend: StateBackend | None = None, words: list[str] = WORDS) -> Run:
    """``words -> key_by -> Count -> CommittingFileSink``, parallelism 2, checkpoints every
    20 ms; the source waits for a completed checkpoint after each quarter of ``words``, so
    the output spans at least four checkpoints however fast the machine is."""
    run = Run(root / "out", root / "chk", job)
    flow = Dataflow(job, parallelism=2, batch_size=256)
    (flow.source(paced(words, every=-(-len(words) // 4))).uid("src").key_by(lambda w: w)
         .process(Count()).uid("count")
         .sink(CommittingFileSink(run.out, format=fmt, schema=schema)).uid("files"))
    asyncio.run(flow.run(checkpoints=CheckpointConfig(interval=0.02, directory=run.checkpoints,
                                                      retained=3),
                         state_backend=backend))
    return run


@pytest.fixture(scope="module")
def jsonl_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return _run_count_job(tmp_path_factory.mktemp("jsonl"), "count-jsonl")


def expected_counts(spark: Any, words: list[str], names: tuple[str, str] = ("f0", "f1")) -> Any:
    """The batch version of the pipeline in Spark: ``(word, n)`` for n in 1..count(word)."""
    from pyspark.sql import functions as F

    word, n = names
    df = spark.createDataFrame([(w,) for w in words], "word string")
    return (df.groupBy("word").count()
              .select(F.col("word").alias(word),
                      F.explode(F.sequence(F.lit(1).cast("bigint"), F.col("count"))).alias(n)))


def _lines(path: Path) -> int:
    return sum(1 for line in path.read_text().splitlines() if line.strip())


# ---------------------------------------------------------------------- round trip
def test_round_trip_validates_and_counts_duplicated_and_missing_rows(spark, jsonl_run, tmp_path):
    log = ResultLog(spark, jsonl_run.out)
    parts = log.parts()
    assert len(parts) >= 3, "the run should span several checkpoints"
    df = log.read()
    assert df.columns == ["f0", "f1", "checkpoint_id", "subtask"]
    # every row carries the checkpoint and subtask of its part file
    per_file = {(r["checkpoint_id"], r["subtask"]): r["count"]
                for r in df.groupBy("checkpoint_id", "subtask").count().collect()}
    assert per_file == {(p.checkpoint_id, p.subtask): _lines(p.path) for p in parts}
    expected = expected_counts(spark, WORDS)
    report = validate_exactly_once(df, expected, key=["f0", "f1"])
    assert report.ok, str(report)
    assert (report.expected, report.actual) == (len(WORDS), len(WORDS))

    # tamper with a copy: commit one part twice (as a retried commit under a new name
    # would) and lose another one
    out = tmp_path / "out"
    shutil.copytree(jsonl_run.out, out)
    dup, lost = parts[0], parts[-1]
    shutil.copy(out / dup.path.name, out / "part-9-999999.jsonl")
    (out / lost.path.name).unlink()
    report = validate_exactly_once(ResultLog(spark, out).read(), expected, key=["f0", "f1"])
    assert not report.ok
    assert report.duplicated == _lines(dup.path)
    assert report.missing == _lines(lost.path)
    assert (report.unexpected, report.mismatched) == (0, 0)
    assert report.actual == len(WORDS) + _lines(dup.path) - _lines(lost.path)
    assert len(report.samples["duplicated"]) == min(5, _lines(dup.path))
    assert f"{report.duplicated:,} duplicated" in report.reason()


def test_parquet_round_trip(spark, tmp_path):
    schema = pa.schema([("word", pa.string()), ("count", pa.int64())])
    run = _run_count_job(tmp_path, "count-parquet", fmt="parquet", schema=schema)
    df = ResultLog(spark, run.out).read()
    assert df.columns == ["word", "count", "checkpoint_id", "subtask"]
    report = validate_exactly_once(df, expected_counts(spark, WORDS, ("word", "count")),
                                   key=["word", "count"])
    assert report.ok and report.actual == len(WORDS), str(report)


# ---------------------------------------------------------------------- checkpoints
def test_checkpoint_reader_equals_the_pipelines_counts(spark, jsonl_run):
    truth = collections.Counter(WORDS)
    reader = CheckpointReader(spark, jsonl_run.latest())
    state = reader.keyed_state("count", "count")
    assert state.columns == ["key_group", "key", "value"]
    rows = state.collect()
    assert {r["key"]: r["value"] for r in rows} == truth
    assert len(rows) == len(truth)
    assert all(r["key_group"] == assign_to_key_group(r["key"], MAXP) for r in rows)
    assert checkpoint_state(jsonl_run.checkpoints, jsonl_run.job, "count", "count") == truth

    ops = {op.uid: op for op in reader.operators()}
    assert set(ops) == {"src", "count", "files"}
    count = ops["count"]
    assert (count.parallelism, count.keyed, count.backends, count.state_names) == \
        (2, True, ["heap"], ["count"])
    on_disk = sum(p.stat().st_size for p in jsonl_run.latest().glob("count-*.heap"))
    assert count.keyed_state_bytes == on_disk > 0
    assert ops["src"].keyed_state_bytes == 0 and ops["src"].operator_state_bytes > 0


def test_checkpoint_reader_reads_incremental_rocksdb_checkpoints(spark, tmp_path):
    words = WORDS[:20_000]
    run = _run_count_job(tmp_path, "count-rocksdb", words=words,
                         backend=RocksDBStateBackend(path=tmp_path / "state", incremental=True))
    reader = CheckpointReader(spark, run.latest())
    assert reader.operators()[0].backends == ["rocksdb"]
    rows = reader.keyed_state("count", "count").collect()
    assert {r["key"]: r["value"] for r in rows} == collections.Counter(words)
    assert all(r["key_group"] == assign_to_key_group(r["key"], MAXP) for r in rows)


def test_checkpoint_reader_refuses_incomplete_checkpoints_and_unknown_backends(
        spark, jsonl_run, tmp_path):
    incomplete = tmp_path / jsonl_run.job / "chk-77"
    shutil.copytree(jsonl_run.latest(), incomplete)
    (incomplete / "_metadata").unlink()
    with pytest.raises(RestoreError, match="incomplete checkpoint"):
        CheckpointReader(spark, incomplete)
    with pytest.raises(RestoreError, match="does not exist"):
        CheckpointReader(spark, tmp_path / "nowhere")

    storage = CheckpointStorage(tmp_path, "foreign")
    storage.checkpoint_dir(1).mkdir(parents=True)
    storage.write_metadata(1, CheckpointMetadata(
        job="foreign", checkpoint_id=1, kind="checkpoint", max_parallelism=MAXP, operators={
            "op": OperatorState("op", 1, True, {0: OperatorSubtaskState(
                KeyedStateHandle("lsm-tree", "x", ()), None, KeyGroupRange(0, MAXP - 1))})}))
    reader = CheckpointReader(spark, storage.checkpoint_dir(1))
    with pytest.raises(RestoreError, match="unsupported backend 'lsm-tree'"):
        reader.keyed_state("op", "count")
    with pytest.raises(RestoreError, match=r"no operator 'nope'.*\['op'\]"):
        reader.keyed_state("nope", "count")


# ---------------------------------------------------------------------- bootstrap
def _count_flow(job: str, words: list[str], sink: ListSink, parallelism: int) -> Dataflow:
    flow = Dataflow(job, parallelism=parallelism, batch_size=256)
    (flow.from_collection(words).uid("src").key_by(lambda w: w)
         .process(Count()).uid("count").sink(sink))
    return flow


def test_spark_written_savepoint_bootstraps_a_pipeline(spark, tmp_path):
    history, new = WORDS[:30_000], WORDS[30_000:]
    counts = (spark.createDataFrame([(w,) for w in history], "word string")
              .groupBy("word").count().withColumnRenamed("count", "n"))
    savepoint = (SavepointWriter(MAXP, "boot")
                 .with_keyed_state("count", "count", counts, key_column="word",
                                   value_column="n", parallelism=2)
                 .write(tmp_path / "sp"))
    assert savepoint == tmp_path / "sp" / "boot" / "chk-1"
    back = CheckpointReader(spark, savepoint)
    assert back.kind == "savepoint"
    assert {k: v for _, k, v in back.entries("count", "count")} == \
        collections.Counter(history)

    # restored at another parallelism (3): state follows key groups
    sink = ListSink()
    job = asyncio.run(_count_flow("boot", new, sink, parallelism=3).run(
        restore_from=savepoint,
        checkpoints=CheckpointConfig(interval=None, directory=tmp_path / "chk")))
    assert job.metrics.restored_checkpoints == [1]
    bootstrapped = checkpoint_state(tmp_path / "chk", "boot", "count", "count")

    # the same counts as a pipeline that processed the history itself
    reference_sink = ListSink()
    asyncio.run(_count_flow("ref", WORDS, reference_sink, parallelism=2).run(
        checkpoints=CheckpointConfig(interval=None, directory=tmp_path / "ref")))
    reference = checkpoint_state(tmp_path / "ref", "ref", "count", "count")
    assert bootstrapped == reference == collections.Counter(WORDS)
    # and the stream's output continued the counts from the savepoint
    assert final_counts(sink.records) == {w: c for w, c in collections.Counter(WORDS).items()
                                          if w in set(new)}


def test_savepoint_writer_tuple_keys_several_states_and_errors(spark, tmp_path):
    df = spark.createDataFrame([("a", 1, 10, "x"), ("a", 2, 20, "y"), ("b", 1, 30, None)],
                               "origin string, day int, total bigint, label string")
    path = (SavepointWriter(8, "multi")
            .with_keyed_state("agg", "total", df, ["origin", "day"], "total", parallelism=4)
            .with_keyed_state("agg", "label", df, ["origin", "day"], "label", parallelism=4)
            .write(tmp_path))
    reader = CheckpointReader(spark, path)
    assert reader.operators()[0].parallelism == 4
    assert reader.state_names("agg") == ["label", "total"]
    totals = {k: (kg, v) for kg, k, v in reader.entries("agg", "total")}
    assert totals == {k: (assign_to_key_group(k, 8), v)
                      for k, v in {("a", 1): 10, ("a", 2): 20, ("b", 1): 30}.items()}
    # a null value means no state for the key
    assert {k: v for _, k, v in reader.entries("agg", "label")} == {("a", 1): "x", ("a", 2): "y"}
    rows = reader.keyed_state("agg", "total").orderBy("value").collect()
    assert [(r["key"]["_1"], r["key"]["_2"], r["value"]) for r in rows] == \
        [("a", 1, 10), ("a", 2, 20), ("b", 1, 30)]

    twice = df.union(df.limit(1))
    with pytest.raises(SavepointWriteError, match=r"duplicate key \('a', 1\)"):
        SavepointWriter(8, "dup").with_keyed_state("agg", "total", twice, ["origin", "day"],
                                                   "total").write(tmp_path)
    with pytest.raises(SavepointWriteError, match="already exists"):
        SavepointWriter(8, "multi").with_keyed_state("agg", "total", df, "origin",
                                                     "total").write(tmp_path, checkpoint_id=1)


# ---------------------------------------------------------------------- result logs
def _write_jsonl(path: Path, records: list[Any]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def _object_log(d: Path) -> None:
    d.mkdir()
    _write_jsonl(d / "part-0-1.jsonl", [{"k": "a", "v": 1}, {"k": "b", "v": 2}])
    _write_jsonl(d / "part-1-1.jsonl", [{"k": "c", "v": 3}])
    _write_jsonl(d / "part-0-2.jsonl", [{"k": "d", "v": 4}])
    _write_jsonl(d / "part-1-3.jsonl", [{"k": "e", "v": 5}])
    # not committed, or not part files: all ignored
    _write_jsonl(d / ".part-0-9f3a2b.jsonl.inprogress", [{"k": "zz", "v": 0}])
    _write_jsonl(d / ".part-1-4.jsonl.pending", [{"k": "zz", "v": 0}])
    _write_jsonl(d / "part-x-1.jsonl", [{"k": "zz", "v": 0}])
    _write_jsonl(d / "part-0-5.json", [{"k": "zz", "v": 0}])
    (d / "_SUCCESS").write_text("")


def test_result_log_reads_committed_parts_by_checkpoint_range(spark, tmp_path):
    _object_log(tmp_path / "log")
    log = ResultLog(spark, tmp_path / "log")
    assert log.checkpoints() == [1, 2, 3]

    def keys(df: Any) -> list[tuple[str, int, int, int]]:
        return sorted((r["k"], r["v"], r["checkpoint_id"], r["subtask"]) for r in df.collect())

    assert keys(log.read()) == [("a", 1, 1, 0), ("b", 2, 1, 0), ("c", 3, 1, 1), ("d", 4, 2, 0),
                                ("e", 5, 3, 1)]
    assert keys(log.read(after_checkpoint=1)) == [("d", 4, 2, 0), ("e", 5, 3, 1)]
    assert keys(log.read(after_checkpoint=1, up_to=2)) == [("d", 4, 2, 0)]
    nothing_new = log.read(after_checkpoint=3)
    assert nothing_new.columns == ["k", "v", "checkpoint_id", "subtask"]
    assert nothing_new.count() == 0

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ResultLogError, match="no committed part files"):
        ResultLog(spark, empty).read()
    typed = ResultLog(spark, empty, schema="k string, v bigint").read()
    assert typed.columns == ["k", "v", "checkpoint_id", "subtask"] and typed.count() == 0


def test_result_log_errors_name_the_file(spark, tmp_path):
    with pytest.raises(ResultLogError, match=f"{re.escape(str(tmp_path / 'missing'))} does not exist"):
        ResultLog(spark, tmp_path / "missing").read()

    log = tmp_path / "log"
    _object_log(log)
    bad = log / "part-2-2.jsonl"
    bad_re = re.escape(str(bad))
    bad.write_text('{"k": "x", "v": 1}\n{"k": "y", oops\n')
    with pytest.raises(ResultLogError, match=f"{bad_re} is not JSON lines: line 2"):
        ResultLog(spark, log).read()
    bad.write_text("not json at all\n")
    with pytest.raises(ResultLogError, match=f"{bad_re} is not JSON lines"):
        ResultLog(spark, log).read()
    bad.write_text('{"key": "x", "value": 1}\n')
    with pytest.raises(ResultLogError, match=f"schema mismatch: part file {bad_re} has fields"):
        ResultLog(spark, log).read()
    bad.write_text('{"k": 7, "v": 1}\n')
    with pytest.raises(ResultLogError, match=f"field 'k' holds integer values in part file {bad_re}"):
        ResultLog(spark, log).read()
    bad.write_text('{"k": "x", "v": 1.5}\n')  # ints and floats are both numbers
    assert ResultLog(spark, log).read().count() == 6

    pq_dir = tmp_path / "pq"
    pq_dir.mkdir()
    pq.write_table(pa.table({"k": ["a"], "v": [1]}), pq_dir / "part-0-1.parquet")
    pq.write_table(pa.table({"k": ["b"], "v": ["one"]}), pq_dir / "part-1-1.parquet")
    with pytest.raises(ResultLogError, match=r"schema mismatch: part file .*part-1-1\.parquet"):
        ResultLog(spark, pq_dir).read()
    (pq_dir / "part-1-1.parquet").write_bytes(b"PAR1 truncated")
    with pytest.raises(ResultLogError, match=r"cannot read part file .*part-1-1\.parquet"):
        ResultLog(spark, pq_dir).read()

    _write_jsonl(pq_dir / "part-1-2.jsonl", [{"k": "c"}])
    with pytest.raises(ResultLogError, match="both jsonl and parquet"):
        ResultLog(spark, pq_dir).read()


# ---------------------------------------------------------------------- validation
def test_validation_counts_each_kind_of_difference(spark):
    schema = "k string, v bigint"
    expected = spark.createDataFrame([("a", 1), ("b", 2), ("c", 3), ("d", 4), ("e", 5)], schema)
    actual = spark.createDataFrame(
        [("a", 1), ("a", 1), ("a", 1),  # two extra copies
         ("b", 2),
         ("c", 30),  # a different value
         ("e", 5), ("e", 5),  # one extra copy
         ("z", 9)],  # nobody expected z; d is missing
        schema)
    report = validate_exactly_once(actual, expected, key=["k"])
    assert isinstance(report, ValidationReport)
    assert (report.expected, report.actual) == (5, 8)
    assert (report.missing, report.duplicated, report.unexpected, report.mismatched) == \
        (1, 3, 1, 1)
    assert not report.ok
    assert report.samples["missing"] == [{"k": "d", "expected_rows": 1, "actual_rows": 0}]
    assert [s["k"] for s in report.samples["duplicated"]] == ["a", "e"]
    assert report.samples["mismatched"][0]["actual_values"] == [{"v": 30}]
    table = str(report)
    assert "| duplicated rows | 3 |" in table and "| missing rows    | 1 |" in table
    assert report.reason() == ("exactly-once violated: 1 missing, 3 duplicated, 1 unexpected, "
                               "1 mismatched (expected 5 rows, got 8)")
    with pytest.raises(ValueError, match=r"columns \['v'\] of the expected"):
        validate_exactly_once(actual.select("k"), expected, key=["k"])


def test_cli_validate_exit_status(spark, tmp_path, capsys):
    _object_log(tmp_path / "log")
    expected = tmp_path / "expected.jsonl"
    _write_jsonl(expected, [{"k": k, "v": v} for k, v in zip("abcde", range(1, 6), strict=True)])
    args = ["validate", "--results", str(tmp_path / "log"), "--expected", str(expected),
            "--key", "k", "--master", "local[2]"]
    assert cli_main(args) == 0
    assert "OK: exactly-once holds: 5 rows match the 5 expected" in capsys.readouterr().out

    shutil.copy(tmp_path / "log" / "part-0-1.jsonl", tmp_path / "log" / "part-0-7.jsonl")
    assert cli_main(args) == 1
    captured = capsys.readouterr()
    assert "| duplicated rows | 2 |" in captured.out
    assert captured.err.strip() == ("exactly-once violated: 2 duplicated (expected 5 rows, "
                                    "got 7)")
    assert cli_main([*args[:2], str(tmp_path / "nope"), *args[3:]]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.e2e
def test_missing_java_is_reported_with_how_to_install_it(monkeypatch, tmp_path):  # runs java
    assert find_java().name == "java"
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(JavaNotFoundError, match="apt-get install openjdk-17-jre-headless"):
        local_session()
    monkeypatch.delenv("JAVA_HOME")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(JavaNotFoundError, match="no `java` on PATH"):
        find_java()
