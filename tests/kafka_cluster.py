"""librdkafka's mock cluster (in the ``confluent-kafka`` wheel) as a pytest fixture: a Kafka
protocol peer on a local TCP port, started by the test itself.

Its limits shape the Kafka tests: it keeps only a few MB per partition (older data is
dropped silently, so the tests check the lowest readable offset), topics are created on
first produce with 4 partitions, and it ignores ``isolation.level``: a read-committed
consumer also sees records of aborted and open transactions. So the tests read output with
:func:`reactive.connectors.kafka.read_committed`, which keeps a transactional record only
when its transaction's COMMIT control marker follows it in the raw record batches, and
aiokafka needs ``check_crcs=False`` against it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pytest

# aiokafka against the mock cluster (its record batches fail aiokafka's CRC check)
CLIENT_OPTIONS = {"check_crcs": False}


class MockKafkaCluster:
    """A running mock cluster.

    Attributes:
        bootstrap_servers: ``host:port`` of its broker.
    """

    def __init__(self) -> None:
        confluent_kafka = pytest.importorskip(
            "confluent_kafka", reason="the Kafka tests need confluent-kafka's mock cluster "
            "(pip install -e '.[test]')")
        self._producer = confluent_kafka.Producer(
            {"test.mock.num.brokers": 1, "bootstrap.servers": "unused:9092",
             "log_level": 3})
        brokers = self._producer.list_topics(timeout=10).brokers.values()
        self.bootstrap_servers = ",".join(f"{b.host}:{b.port}" for b in brokers)
        # a producer of the test's own input, speaking to the cluster like any client
        self._input = confluent_kafka.Producer(
            {"bootstrap.servers": self.bootstrap_servers, "linger.ms": 5, "log_level": 3})

    def produce(self, topic: str, records: Iterable[tuple[bytes | None, bytes, int | None,
                                                            int | None]]) -> None:
        """Produce ``(key, value, partition or None, timestamp ms or None)`` records and wait
        until the cluster has them all."""
        for key, value, partition, timestamp in records:
            kwargs: dict[str, Any] = {"key": key, "value": value}
            if partition is not None:
                kwargs["partition"] = partition
            if timestamp is not None:
                kwargs["timestamp"] = timestamp
            while True:
                try:
                    self._input.produce(topic, **kwargs)
                    break
                except BufferError:  # the local queue is full: let deliveries drain
                    self._input.poll(0.1)
        assert self._input.flush(30) == 0, "the mock cluster did not take every record"

    def lowest_offsets(self, topic: str) -> dict[int, int]:
        """The lowest readable offset of each partition of ``topic`` (the mock drops the
        oldest data past a few MB per partition: a test that reads everything checks it is
        still 0)."""
        import confluent_kafka

        consumer = confluent_kafka.Consumer({"bootstrap.servers": self.bootstrap_servers,
                                             "group.id": "lowest-offsets", "log_level": 3})
        try:
            partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
            return {p: consumer.get_watermark_offsets(
                        confluent_kafka.TopicPartition(topic, p), timeout=10)[0]
                    for p in partitions}
        finally:
            consumer.close()

    def close(self) -> None:
        self._input.flush(5)
        self._producer.flush(5)


@pytest.fixture(scope="session")
def kafka_cluster() -> Iterator[MockKafkaCluster]:
    """One mock cluster for the session (tests use topics of their own)."""
    cluster = MockKafkaCluster()
    yield cluster
    cluster.close()
