"""The Kafka source's columnar mode and the Kafka sink taking record batches, against
librdkafka's mock cluster (``tests/kafka_cluster.py``): each fetch of a partition is one
record batch of the declared schema with the records' metadata; values that do not decode
reach the dead-letter output with their partition and offset (or fail the job naming them);
a job through a failure and a restore at another parallelism counts every record exactly
once; record batches written to Kafka arrive as one record per row; the source's
per-partition watermarks drive columnar windows; a user decoder's wrong schema fails naming
the column and the fetch."""

from __future__ import annotations

import collections
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reactive import CheckpointConfig, Dataflow, RestartStrategy
from reactive.connectors.collections import ListSink
from reactive.connectors.files import CommittingFileSink
from reactive.connectors.kafka import KafkaDeadLetter, KafkaSink, KafkaSource, read_committed
from reactive.errors import ConfigurationError, JobFailedError
from reactive.sources import SourceReader
from tests.kafka_cluster import CLIENT_OPTIONS, MockKafkaCluster
from tests.support import HoldThenFail

pa = pytest.importorskip("pyarrow")

VALUES = pa.schema([("word", pa.string()), ("n", pa.int64())])


def source(cluster: MockKafkaCluster, topic: str, **options: Any) -> KafkaSource:
    options.setdefault("client_options", CLIENT_OPTIONS)
    options.setdefault("value_schema", VALUES)
    return KafkaSource(cluster.bootstrap_servers, topic, columnar=True, **options)


def chain(exc: BaseException | None) -> Iterator[BaseException]:
    while exc is not None:
        yield exc
        exc = exc.__cause__ or exc.__context__


async def read_all(reader: Any, count: int) -> list[Any]:
    """Read until ``count`` rows and dead letters came (each read waits at most
    ``max_wait``)."""
    out: list[Any] = []
    for _ in range(2_000):
        batch = await reader.read_batch(1_000)
        assert batch is not None
        out += batch
        if sum(b.num_rows if isinstance(b, pa.RecordBatch) else 1 for b in out) >= count:
            return out
    raise AssertionError(f"only {len(out)} pieces arrived")


async def test_a_fetch_of_a_partition_is_one_batch_and_bad_values_are_dead_letters(
        kafka_cluster):
    records = [(f"k{i}".encode(), json.dumps({"word": f"w{i % 7}", "n": i}).encode(), i % 2,
                (1_000 + i) * 1000) for i in range(40)]
    records[5] = (b"k5", b"\xff not json", 1, 1_005_000)  # partition 1 offset 2
    records[12] = (b"k12", b'{"word": "w", "n": "twelve"}', 0, 1_012_000)  # p0 offset 6
    records[20] = (None, None, 0, 1_020_000)  # a tombstone: a row of nulls (p0 offset 10)
    records[30] = (b"k30", json.dumps({"word": "w2", "n": 30}, indent=1).encode(), 0,
                   1_030_000)  # an object over several lines
    kafka_cluster.produce("col-1", records)
    reader = source(kafka_cluster, "col-1", errors="dead_letter",
                    partition_discovery_interval=None).create_reader(0, 1)
    try:
        pieces = await read_all(reader, 40)
    finally:
        await reader.close()
    batches = [p for p in pieces if isinstance(p, pa.RecordBatch)]
    dead = [p for p in pieces if isinstance(p, KafkaDeadLetter)]
    assert sorted((d.partition, d.offset, d.value) for d in dead) == [
        (0, 6, b'{"word": "w", "n": "twelve"}'), (1, 2, b"\xff not json")]
    schema = reader.source.schema
    assert schema.names == ["word", "n", "key", "partition", "offset", "timestamp"]
    for b in batches:  # one partition per batch, positioned at its first offset
        assert b.schema.equals(schema)
        assert len(set(b.column("partition").to_pylist())) == 1
        part, first = b.column("partition")[0].as_py(), b.column("offset")[0].as_py()
        assert b.schema.metadata[b"reactive.position"] == f"col-1/{part}@{first}".encode()
    rows = pa.Table.from_batches(batches).to_pylist()
    assert len(rows) == 38
    by_offset = {(r["partition"], r["offset"]): r for r in rows}
    for i, (key, value, part, stamp) in enumerate(records):
        where = (part, i // 2)
        if i in (5, 12):
            assert where not in by_offset
            continue
        row = by_offset[where]
        assert row["key"] == key and row["timestamp"].timestamp() == stamp / 1000
        assert {"word": row["word"], "n": row["n"]} == (
            json.loads(value) if value is not None else {"word": None, "n": None})
    # the position is the offset after each partition's last record
    assert {tuple(e[:3]) for e in reader.snapshot_state(1)} >= {("col-1", 0, 20),
                                                                 ("col-1", 1, 20)}


async def test_a_user_decoder_and_a_bad_record_failing_the_job_naming_it(kafka_cluster):
    def decode(values: list[bytes | None]) -> Any:
        words = [v.decode("ascii") for v in values if v is not None]  # raises on non-ASCII
        return pa.record_batch([pa.array(words), pa.array([len(w) for w in words],
                                                          pa.int64())], schema=VALUES)

    kafka_cluster.produce("col-2", [(None, b"abc", 0, None), (None, b"de", 0, None),
                                    (None, "é".encode(), 0, None), (None, b"f", 0, None)])
    out = ListSink()
    flow = Dataflow("kafka-columnar-decoder")
    flow.columnar_source(source(kafka_cluster, "col-2", value_decoder=decode,
                                metadata_columns=("offset",), stop_at_latest=True)
                         ).to_records().sink(out)
    with pytest.raises(JobFailedError) as info:
        await flow.run()
    message = " ".join(str(e) for e in chain(info.value))
    assert "col-2 partition 0 offset 2" in message and "UnicodeDecodeError" in message

    kafka_cluster.produce("col-3", [(None, b"abc", 1, None), (None, "é".encode(), 1, None),
                                    (None, b"f", 1, None)])
    flow = Dataflow("kafka-columnar-decoder-dl")
    stream = flow.columnar_source(source(kafka_cluster, "col-3", value_decoder=decode,
                                         metadata_columns=("offset",), stop_at_latest=True,
                                         errors="dead_letter"))
    rows, dead = ListSink(), ListSink()
    stream.to_records().sink(rows)
    stream.dead_letters().sink(dead)
    await flow.run()
    assert sorted(rows.records, key=lambda r: r["offset"]) == [
        {"word": "abc", "n": 3, "offset": 0}, {"word": "f", "n": 1, "offset": 2}]
    assert [(d.partition, d.offset) for d in dead.records] == [(1, 1)]


def test_configuration_errors(kafka_cluster):
    with pytest.raises(ConfigurationError, match="value_schema"):
        KafkaSource("x:1", "t", columnar=True)
    with pytest.raises(ConfigurationError, match="shadow"):
        KafkaSource("x:1", "t", columnar=True,
                    value_schema=pa.schema([("offset", pa.int64())]))
    with pytest.raises(ConfigurationError, match="unknown metadata column"):
        KafkaSource("x:1", "t", columnar=True, value_schema=VALUES,
                    metadata_columns=("headers",))
    with pytest.raises(ConfigurationError, match="columnar=True only"):
        KafkaSource("x:1", "t", value_schema=VALUES)


class FailingAfterCheckpoint(KafkaSource):
    """The columnar Kafka source of the exactly-once test's first run: once a reader has
    read a batch past offset 300 it reads no more until a checkpoint completed, then fails
    the job (:class:`HoldThenFail`): before the end of the topic on any machine."""

    def __init__(self, *args: Any, chk: Path, **options: Any) -> None:
        super().__init__(*args, **options)
        self.chk = chk  # the checkpoint directory

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        def past(b: Any) -> bool:  # a record batch (not a dead letter) past offset 300
            return (isinstance(b, pa.RecordBatch) and b.num_rows > 0
                    and b.column("offset")[0].as_py() >= 300)

        return HoldThenFail(super().create_reader(subtask, parallelism), past,
                            lambda: any(self.chk.glob("*/chk-*/_metadata")))


def counting_job(cluster: MockKafkaCluster, topic: str, out: Path, chk: Path,
                 parallelism: int, fail_after_checkpoint: bool) -> Dataflow:
    options: dict[str, Any] = {"stop_at_latest": True, "max_batch_records": 40,
                               "partition_discovery_interval": None,
                               "client_options": CLIENT_OPTIONS, "value_schema": VALUES}
    kafka = (FailingAfterCheckpoint(cluster.bootstrap_servers, topic, columnar=True, chk=chk,
                                    **options) if fail_after_checkpoint
             else source(cluster, topic, **options))
    flow = Dataflow("kafka-columnar-eo", parallelism=parallelism, max_parallelism=16)
    counts = (flow.columnar_source(kafka, name="kafka").uid("kafka")
              .key_by("word").agg(count=("word", "count"), total=("n", "sum")).uid("agg"))
    counts.to_records().sink(CommittingFileSink(out, format="jsonl"), name="sink").uid("sink")
    return flow


async def test_exactly_once_through_a_failure_and_a_restore_at_another_parallelism(
        kafka_cluster, tmp_path):
    words = [f"w{(i * 7919) % 31}" for i in range(4_000)]
    kafka_cluster.produce("col-eo", [(None, json.dumps({"word": w, "n": i}).encode(), i % 4,
                                      None) for i, w in enumerate(words)])
    assert set(kafka_cluster.lowest_offsets("col-eo").values()) == {0}
    out, chk = tmp_path / "out", tmp_path / "chk"
    config = CheckpointConfig(interval=0.01, directory=chk)
    first = counting_job(kafka_cluster, "col-eo", out, chk, 2, fail_after_checkpoint=True)
    with pytest.raises(JobFailedError) as info:
        await first.run(checkpoints=config, restart=RestartStrategy.none())
    assert any("injected failure" in str(e) for e in chain(info.value))
    second = counting_job(kafka_cluster, "col-eo", out, chk, 3, fail_after_checkpoint=False)
    await second.run(checkpoints=config, resume=True)

    rows = [json.loads(line) for part in sorted(out.glob("part-*"))
            for line in part.read_text().splitlines()]
    assert len(rows) == len(words)  # each record once: none lost, none replayed
    updates: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
    for r in rows:
        updates[r["word"]].append((r["count"], r["total"]))
    for word, count in collections.Counter(words).items():
        mine = sorted(updates[word])
        assert [c for c, _ in mine] == list(range(1, count + 1))
        assert mine[-1][1] == sum(i for i, w in enumerate(words) if w == word)


async def test_the_sink_writes_a_batch_as_one_record_per_row(kafka_cluster, tmp_path):
    table = pa.table({"word": [f"w{i % 5}" for i in range(300)], "n": list(range(300))})
    flow = Dataflow("kafka-columnar-sink", parallelism=2)
    flow.from_arrow(table, batch_size=64).sink(KafkaSink(
        kafka_cluster.bootstrap_servers, "col-sink", transactional_id_prefix="col-sink",
        key=lambda row: row["word"], marker_reader_options=CLIENT_OPTIONS))
    await flow.run(checkpoints=CheckpointConfig(interval=0.05, directory=str(tmp_path)))
    records = await read_committed(kafka_cluster.bootstrap_servers, "col-sink",
                                   CLIENT_OPTIONS)
    got = sorted((r.key, json.loads(r.value or b"null")["n"]) for r in records)
    assert got == sorted((f"w{i % 5}".encode(), i) for i in range(300))


async def test_columnar_windows_use_the_partitions_watermarks(kafka_cluster):
    """The columnar source's per-partition watermarks drive columnar windows over its
    ``timestamp`` column: the windows equal a batch count, and the record behind the
    watermark of the fetches before it is late (without the source's watermarks it would
    not be: nothing else moves event time)."""
    from reactive import TumblingEventTimeWindows

    value = json.dumps({"word": "x", "n": 1}).encode()
    # partition 0 only (the empty ones end at once with stop_at_latest), then a late record
    kafka_cluster.produce("col-wm", [(b"a", value, 0, (10 + i) * 1000) for i in range(300)]
                          + [(b"a", value, 0, 5_000)])
    flow = Dataflow("kafka-columnar-windows", parallelism=1)
    windowed = (flow.columnar_source(source(kafka_cluster, "col-wm", stop_at_latest=True,
                                            max_out_of_orderness=0.0, max_batch_records=25))
                .key_by("key").window(TumblingEventTimeWindows.of(10), timestamp="timestamp"))
    results, late = ListSink(), ListSink()
    windowed.agg(n=("n", "sum")).to_records().sink(results)
    windowed.late_data().to_records().sink(late)
    await flow.run()
    assert [(r["offset"], r["timestamp"].timestamp()) for r in late.records] == [(300, 5.0)]
    got = collections.Counter()
    for r in results.records:
        got[(r["key"], r["window_start"].timestamp())] += r["n"]
    assert got == collections.Counter({(b"a", 10.0 + 10 * i): 10 for i in range(30)})


async def test_a_decoder_returning_another_schema_fails_naming_the_column_and_the_fetch(
        kafka_cluster):
    def decode(values: list[bytes | None]) -> Any:
        return pa.record_batch([pa.array(["a"] * len(values)),
                                pa.array([1.5] * len(values))], names=["word", "n"])

    kafka_cluster.produce("col-schema", [(None, b"v", 2, None)])
    reader = source(kafka_cluster, "col-schema", value_decoder=decode,
                    partition_discovery_interval=None).create_reader(0, 1)
    from reactive.columnar import SchemaMismatchError

    try:
        with pytest.raises(SchemaMismatchError) as info:
            await read_all(reader, 1)
    finally:
        await reader.close()
    assert info.value.column == "n" and info.value.position == "col-schema/2@0"
    assert "double" in str(info.value)


@pytest.mark.e2e
@pytest.mark.parametrize("seed", [1])
def test_columnar_kafka_to_kafka_through_sigkills_and_rescales_is_exact(kafka_cluster,
                                                                        tmp_path, seed):
    """The Kafka -> count -> Kafka job of ``tests/connectors/kafka/test_kafka_exactly_once.py`` on record
    batches (``kafka_count_job.py ... columnar``), killed with SIGKILL at its seeded moments
    and restarted at other parallelisms: its committed output holds every record's running
    count exactly once."""
    import asyncio
    import os
    import signal
    import subprocess
    import sys

    from tests.connectors.kafka import test_kafka_exactly_once as eo

    items = eo.words(8_000, seed=seed)
    topics = (f"col-kill-in-{seed}", f"col-kill-out-{seed}")
    eo.produce_words(kafka_cluster, topics[0], items)
    log = tmp_path / "kills.log"
    env = {**os.environ, "PYTHONPATH": str(eo.ROOT), "REACTIVE_TEST_KILL_LOG": str(log)}
    codes = []
    for kill, parallelism in [*eo.kill_schedule(seed), ("none:0", 2)]:
        proc = subprocess.run(
            [sys.executable, str(eo.SCRIPT), kafka_cluster.bootstrap_servers, *topics,
             str(tmp_path / "chk"), str(parallelism), "columnar"],
            env={**env, "REACTIVE_TEST_KILL": kill}, capture_output=True, text=True,
            timeout=120, check=False)
        codes.append(proc.returncode)
        assert proc.returncode in (0, -signal.SIGKILL), proc.stderr[-3000:]
        if proc.returncode == 0:
            break
    assert codes[-1] == 0, "the job did not finish after the last kill"
    assert codes.count(-signal.SIGKILL) >= 4  # the kills around commits always happen
    assert asyncio.run(eo.committed_output(kafka_cluster, topics[1])) == eo.expected(items)
