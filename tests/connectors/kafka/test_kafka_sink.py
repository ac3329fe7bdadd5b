"""The Kafka sink against librdkafka's mock cluster: at least once, refusals that name the
record, and the fencing of a previous parallelism's lingering transactions."""

from __future__ import annotations

import collections
import json

import pytest

from reactive import CheckpointConfig, Dataflow
from reactive.connectors.kafka import KafkaSink, KafkaSinkError, read_committed
from reactive.errors import ConfigurationError, JobFailedError, UserFunctionError
from tests.kafka_cluster import CLIENT_OPTIONS


async def test_at_least_once_writes_every_record(kafka_cluster, tmp_path):
    flow = Dataflow("kafka-alo", parallelism=2)
    (flow.from_collection(range(2_000))
         .map(lambda i: {"n": i})
         .sink(KafkaSink(kafka_cluster.bootstrap_servers, "alo-out", semantic="at_least_once",
                         key=lambda r: str(r["n"] % 7))))
    await flow.run(checkpoints=CheckpointConfig(interval=0.05, directory=str(tmp_path)))
    records = await read_committed(kafka_cluster.bootstrap_servers, "alo-out", CLIENT_OPTIONS)
    values = collections.Counter(json.loads(r.value or b"")["n"] for r in records)
    # no failure: every record exactly once (after a failure, at least once)
    assert values == collections.Counter(range(2_000))
    assert {r.key for r in records} == {str(i).encode() for i in range(7)}


@pytest.mark.parametrize("semantic", ["exactly_once", "at_least_once"])
async def test_a_record_kafka_would_refuse_fails_the_job_naming_it(kafka_cluster, semantic):
    flow = Dataflow(f"kafka-too-large-{semantic}")
    (flow.from_collection(["small", "x" * 5_000, "never"])
         .sink(KafkaSink(kafka_cluster.bootstrap_servers, f"too-large-{semantic}",
                         semantic=semantic, transactional_id_prefix=f"too-large-{semantic}",
                         value_serializer="str", max_request_size=1_000)))
    with pytest.raises(JobFailedError) as info:
        await flow.run()
    error = info.value.__cause__
    # the job's error names the refused record (not the first record of its batch)
    assert isinstance(error, UserFunctionError) and error.record == "x" * 5_000
    assert isinstance(error.__cause__, KafkaSinkError)
    message = str(info.value)
    assert f"too-large-{semantic}" in message and "5000 bytes" in message
    # nothing was acknowledged: the exactly-once sink committed nothing
    if semantic == "exactly_once":
        assert await read_committed(kafka_cluster.bootstrap_servers,
                                    f"too-large-{semantic}", CLIENT_OPTIONS) == []


async def test_lingering_transactions_of_a_larger_parallelism_are_fenced(kafka_cluster):
    """After a rescale from 4 to 2 instances, instance 1 starts the producers of its own id
    and of old instance 3 (3 % 2 == 1): starting a producer with a transactional id is what
    makes Kafka abort that id's open transaction (InitProducerId). The mock cluster does not
    enforce producer epochs, so what this checks is which ids are fenced; the crash tests
    check the outcome."""
    sink = KafkaSink(kafka_cluster.bootstrap_servers, "fence-out",
                     transactional_id_prefix="fence")
    writers = [sink.create_writer(i, 2) for i in range(2)]
    try:
        fenced = []
        for writer in writers:
            instance = writer.sink  # type: ignore[attr-defined]
            instance.previous_parallelism = 4
            await instance.abort_lingering(7)
            fenced.append(sorted(p._txn_manager.transactional_id
                                 for p in instance._producers.values()))
        assert fenced == [["fence-0", "fence-2"], ["fence-1", "fence-3"]]
    finally:
        for writer in writers:
            await writer.close()  # type: ignore[misc]


def test_configuration_errors():
    with pytest.raises(ConfigurationError, match="transactional_id_prefix"):
        KafkaSink("x:1", "t")
    with pytest.raises(ConfigurationError, match="semantic"):
        KafkaSink("x:1", "t", semantic="maybe", transactional_id_prefix="p")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="serializer"):
        KafkaSink("x:1", "t", transactional_id_prefix="p", value_serializer="yaml")
