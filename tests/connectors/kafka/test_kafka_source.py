"""The Kafka source against librdkafka's mock cluster: per-partition watermarks (a slow
partition holds event time back, an idle one does not), dead letters with their offsets, a
clear failure naming topic/partition/offset, starting positions, partition discovery, and
offsets committed to a consumer group after checkpoints (for monitoring)."""

from __future__ import annotations

import asyncio
import collections
import json
from typing import Any

import pytest

from reactive import CheckpointConfig, Dataflow, TumblingEventTimeWindows
from reactive.connectors.collections import ListSink
from reactive.connectors.kafka import KafkaDeadLetter, KafkaRecord, KafkaSource
from reactive.errors import JobFailedError
from tests.kafka_cluster import CLIENT_OPTIONS, MockKafkaCluster


def source(cluster: MockKafkaCluster, topic: str, **options: Any) -> KafkaSource:
    options.setdefault("client_options", CLIENT_OPTIONS)
    return KafkaSource(cluster.bootstrap_servers, topic, **options)


async def read_until(reader: Any, count: int) -> list[Any]:
    """Read batches until ``count`` records came (each read waits at most ``max_wait``)."""
    out: list[Any] = []
    for _ in range(2_000):
        batch = await reader.read_batch(1_000)
        assert batch is not None
        out += batch
        if len(out) >= count:
            return out
    raise AssertionError(f"only {len(out)} of {count} records arrived")


async def test_per_partition_watermarks_slow_partition_holds_back_idle_one_does_not(
        kafka_cluster):
    # partition 0 runs 1,000 s ahead of partition 1 in event time; 2 and 3 get nothing
    # (timestamps from 1 s: a Kafka producer stamps a record given timestamp 0 with "now")
    kafka_cluster.produce("wm-1", [(None, b"x", 0, (1000 + i) * 1000) for i in range(100)])
    kafka_cluster.produce("wm-1", [(None, b"x", 1, (1 + i) * 1000) for i in range(100)])
    now = [0.0]
    src = source(kafka_cluster, "wm-1", max_out_of_orderness=2.0, idleness=0.3,
                 partition_discovery_interval=None)
    src.clock = lambda: now[0]
    reader = src.create_reader(0, 1)
    try:
        await read_until(reader, 200)
        # before the idleness elapses the empty partitions hold the watermark back
        assert reader.current_watermark() == float("-inf") and not reader.is_idle()
        # later, partitions 0 and 1 deliver again; 2 and 3 have been silent for 0.35 s
        now[0] = 0.35
        kafka_cluster.produce("wm-1", [(None, b"x", 0, 1100_000), (None, b"x", 1, 101_000)])
        await read_until(reader, 2)
        # the slow partition decides (101 - 2), not the fast one (1100 - 2)
        assert reader.current_watermark() == 99.0 and not reader.is_idle()
        # everything silent: the reader is idle and holds no watermark back
        now[0] = 0.7
        assert reader.is_idle() and reader.current_watermark() is None
        # the slow partition wakes up alone: it alone decides
        kafka_cluster.produce("wm-1", [(None, b"x", 1, 150_000)])
        await read_until(reader, 1)
        assert reader.current_watermark() == 148.0 and not reader.is_idle()
    finally:
        await reader.close()


async def test_windows_use_the_kafka_timestamp_as_event_time(kafka_cluster, tmp_path):
    """A job with event-time windows over the source's own watermarks (no
    ``assign_timestamps``): the windows are those of the Kafka timestamps, nothing is late
    although one partition lags 1,000 s behind, and the counts equal a batch count. (Which
    partition a fetch returns first is up to the client, so the reader-level test above is
    the one that pins the per-partition minimum.)"""
    kafka_cluster.produce("wm-2", [(b"fast", b"x", 0, (1000 + i) * 1000) for i in range(300)])
    kafka_cluster.produce("wm-2", [(b"slow", b"x", 1, (10 + i) * 1000) for i in range(300)])
    windows, late = ListSink(), ListSink()
    flow = Dataflow("kafka-windows", parallelism=1, batch_size=20)
    windowed = (flow.source(source(kafka_cluster, "wm-2", max_out_of_orderness=0.0,
                                   stop_at_latest=True))
                .key_by(lambda r: r.key)
                .window(TumblingEventTimeWindows.of(10))
                .side_output_late_data(late))
    windowed.aggregate(_CountAggregate()).sink(windows)
    await flow.run(checkpoints=CheckpointConfig(interval=0.05, directory=str(tmp_path)))
    assert late.records == []
    got = collections.Counter()
    for result in windows.records:
        got[(result.key, result.start)] += result.value
    want = collections.Counter({(b"fast", 1000 + 10 * i): 10 for i in range(30)})
    want.update({(b"slow", 10 + 10 * i): 10 for i in range(30)})
    assert got == want


class _CountAggregate:
    def create_accumulator(self) -> int:
        return 0

    def add(self, value: Any, acc: int) -> int:
        return acc + 1

    def get_result(self, acc: int) -> int:
        return acc

    def merge(self, a: int, b: int) -> int:
        return a + b


async def test_bad_bytes_reach_the_dead_letter_output_with_their_offsets(kafka_cluster):
    records = [(None, json.dumps({"n": i}).encode(), i % 2, None) for i in range(20)]
    records[5] = (None, b"\xff not json", 1, None)
    records[12] = (None, b"{broken", 0, None)
    kafka_cluster.produce("dl-1", records)
    out = ListSink()
    flow = Dataflow("kafka-dead-letters", parallelism=2)
    flow.source(source(kafka_cluster, "dl-1", value_deserializer="json",
                       errors="dead_letter", stop_at_latest=True)).sink(out)
    await flow.run()
    dead = [r for r in out.records if isinstance(r, KafkaDeadLetter)]
    good = [r for r in out.records if isinstance(r, KafkaRecord)]
    assert len(out.records) == 20
    # records 5 and 12: partition 1 offset 2 (1, 3, 5 -> 0, 1, 2) and partition 0 offset 6
    assert sorted((d.partition, d.offset, d.value) for d in dead) == [
        (0, 6, b"{broken"), (1, 2, b"\xff not json")]
    assert all("JSONDecodeError" in d.reason for d in dead)
    assert sorted(r.value["n"] for r in good) == [i for i in range(20) if i not in (5, 12)]


async def test_a_record_that_does_not_deserialize_fails_the_job_naming_it(kafka_cluster):
    kafka_cluster.produce("dl-2", [(None, b"1", 0, None), (None, b"oops", 0, None)])
    flow = Dataflow("kafka-bad-record")
    flow.source(source(kafka_cluster, "dl-2", value_deserializer="json",
                       stop_at_latest=True)).sink(ListSink())
    with pytest.raises(JobFailedError) as info:
        await flow.run()
    message = str(info.value)
    assert "dl-2 partition 0 offset 1" in message and "oops" in message


async def test_starting_positions(kafka_cluster):
    kafka_cluster.produce("start-1", [(None, str(i).encode(), 0, None) for i in range(10)])

    async def values(**options: Any) -> list[str]:
        out = ListSink()
        flow = Dataflow("kafka-start")
        flow.source(source(kafka_cluster, "start-1", value_deserializer="str",
                           stop_at_latest=True, **options)).sink(out)
        await flow.run()
        return [r.value for r in out.records]

    assert await values() == [str(i) for i in range(10)]
    assert await values(starting_offsets="latest") == []
    assert await values(starting_offsets={("start-1", 0): 7}) == ["7", "8", "9"]
    # (starting_timestamp is not checked here: the mock cluster answers ListOffsets by
    # timestamp with no offset)


async def test_new_partitions_are_discovered(kafka_cluster):
    """The topic does not exist when the job starts; once it does, its partitions are read."""
    seen: list[int] = []
    all_read = asyncio.Event()

    def collect(record: KafkaRecord) -> None:
        seen.append(int(record.value))
        if len(seen) == 40:
            all_read.set()

    flow = Dataflow("kafka-discovery", parallelism=2)
    flow.source(source(kafka_cluster, "late-topic", value_deserializer="str",
                       partition_discovery_interval=0.05)).sink(collect)
    job = await flow.start()
    try:
        kafka_cluster.produce("late-topic", [(None, str(i).encode(), i % 4, None)
                                             for i in range(40)])
        await asyncio.wait_for(all_read.wait(), timeout=60)
        assert sorted(seen) == list(range(40))
    finally:
        await job.cancel()


async def test_completed_checkpoints_commit_offsets_to_the_group_for_monitoring(
        kafka_cluster, tmp_path):
    kafka_cluster.produce("group-1", [(None, b"x", i % 4, None) for i in range(100)])
    flow = Dataflow("kafka-group", parallelism=2)
    flow.source(source(kafka_cluster, "group-1", stop_at_latest=True,
                       group_id="monitoring")).sink(ListSink())
    await flow.run(checkpoints=CheckpointConfig(interval=0.05, directory=str(tmp_path)))
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=kafka_cluster.bootstrap_servers,
                                group_id="monitoring", **CLIENT_OPTIONS)
    await consumer.start()
    try:
        committed = {p: await consumer.committed(TopicPartition("group-1", p)) for p in range(4)}
    finally:
        await consumer.stop()
    assert committed == {p: 25 for p in range(4)}


def test_configuration_errors():
    from reactive.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="errors must be"):
        KafkaSource("x:1", "t", errors="skip")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="starting_offsets"):
        KafkaSource("x:1", "t", starting_offsets="middle")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="deserializer"):
        KafkaSource("x:1", "t", value_deserializer="yaml")
    with pytest.raises(ConfigurationError, match="no topic"):
        KafkaSource("x:1", [])
