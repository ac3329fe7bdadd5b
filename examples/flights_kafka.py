"""The flights job's Kafka pieces (``examples/flights.py --source kafka``): a mock Kafka
cluster in this process, the producer of the input topic, the job's Kafka source and sinks,
and reading the committed output back.

    python examples/flights_kafka.py --bootstrap HOST:PORT [--data FILE] [--topic NAME]

produces the flights CSV to a topic of a Kafka cluster of your own (the topic should have
:data:`PARTITIONS` partitions); ``flights.py --source kafka`` does all of it in one process:

1. :class:`MockCluster` starts librdkafka's mock cluster (the Kafka protocol on a local
   port, from the ``confluent-kafka`` wheel; no server to install). It lives as long as this
   process keeps the object, so the job itself runs in a child process that connects to it
   over TCP (and may be killed and restarted like the file variant).
2. :func:`produce_flights` writes every data line of the CSV (not the header) as one record,
   round robin over the topic's 4 partitions, with the flight's scheduled departure as the
   Kafka timestamp, gzip-compressed (see the function for why), then checks that the cluster
   still holds every record (:meth:`MockCluster.check_complete`).
3. The job reads the topic with :func:`source` (bounded: up to the end offsets of its first
   start, per-partition watermarks from the Kafka timestamps) and writes the window results
   and the dead letters with :func:`results_sink` and :func:`dead_letter_sink`, exactly once
   (Kafka transactions committed with the checkpoints).
4. :func:`read_topic` reads what the output topics hold *committed*
   (:func:`reactive.connectors.kafka.read_committed`: the mock cluster ignores isolation
   levels, so the reader keeps only records whose transaction has a COMMIT marker).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from flights_data import MalformedRow, parse_flight, prepare_flights

INPUT_TOPIC = "flights"
RESULTS_TOPIC = "flights-hourly-delays"
DEAD_LETTER_TOPIC = "flights-dead-letters"
PARTITIONS = 4  # librdkafka's mock cluster creates topics with 4 partitions
# aiokafka against the mock cluster: its record batches fail aiokafka's CRC check
CLIENT_OPTIONS: dict[str, Any] = {"check_crcs": False}
# gzip: the only codec aiokafka decodes without an extra package (lz4, snappy, zstd need one)
COMPRESSION = "gzip"


class MockCluster:
    """librdkafka's mock Kafka cluster, inside this process (one broker).

    The mock keeps only a few MB per partition and drops older records silently, so whoever
    reads a topic to its start checks :meth:`lowest_offsets` (or
    :meth:`check_complete`) first.

    Attributes:
        bootstrap_servers: ``host:port`` of its broker.
    """

    def __init__(self) -> None:
        import confluent_kafka  # the test extra: pip install -e '.[test]'

        # this object *is* the cluster: it lives as long as the producer is referenced
        self._owner = confluent_kafka.Producer({"test.mock.num.brokers": 1,
                                                "bootstrap.servers": "unused:9092",
                                                "log_level": 3})
        brokers = self._owner.list_topics(timeout=10).brokers.values()
        self.bootstrap_servers = ",".join(f"{b.host}:{b.port}" for b in brokers)

    def lowest_offsets(self, topic: str) -> dict[int, tuple[int, int]]:
        """``partition -> (lowest readable offset, end offset)`` of ``topic``."""
        return watermark_offsets(self.bootstrap_servers, topic)

    def check_complete(self, topic: str, records: int | None = None) -> None:
        """Fail loudly when the mock dropped records of ``topic`` (a lowest readable offset
        above 0) or, given ``records``, when it holds another number of them.

        Raises:
            SystemExit: naming the partitions and the records lost.
        """
        offsets = self.lowest_offsets(topic)
        dropped = {p: low for p, (low, _) in offsets.items() if low > 0}
        if dropped:
            lost = ", ".join(f"partition {p}: offsets 0-{low - 1}"
                             for p, low in sorted(dropped.items()))
            raise SystemExit(
                f"error: the mock Kafka cluster dropped the oldest records of topic {topic!r} "
                f"({lost}): it keeps only a few MB per partition. A job reading this topic "
                "would miss them; run on less data (--limit N)")
        held = sum(end for _, end in offsets.values())
        if records is not None and held != records:
            raise SystemExit(f"error: topic {topic!r} holds {held:,} records, expected "
                             f"{records:,}")

    def close(self) -> None:
        """Let the cluster's owner flush (the cluster stops when the object goes away)."""
        self._owner.flush(5)


def watermark_offsets(bootstrap_servers: str, topic: str) -> dict[int, tuple[int, int]]:
    """``partition -> (lowest readable offset, end offset)`` of ``topic`` (confluent-kafka's
    ``get_watermark_offsets``); empty when the topic does not exist."""
    import confluent_kafka

    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap_servers,
                                         "group.id": "flights-offsets", "log_level": 3})
    try:
        meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None:
            return {}
        return {p: consumer.get_watermark_offsets(confluent_kafka.TopicPartition(topic, p),
                                                  timeout=10)
                for p in sorted(meta.partitions)}
    finally:
        consumer.close()


def flight_timestamps(lines: list[bytes]) -> list[int]:
    """The Kafka timestamp (ms) of each data line: the flight's scheduled departure, its
    event time. A line that does not parse (it goes to the dead letters) takes the timestamp
    of the valid line before it (after it, for leading ones), so it never moves its
    partition's watermark: the file is ordered by event time, so neighbours are close."""
    stamps: list[int | None] = []
    for raw in lines:
        try:
            stamps.append(int(parse_flight(raw.decode("utf-8")).ts * 1000))
        except (MalformedRow, UnicodeDecodeError):
            stamps.append(None)
    valid = [s for s in stamps if s is not None]
    last = valid[0] if valid else 1  # librdkafka reads a timestamp of 0 as "now"
    out = []
    for s in stamps:
        last = s if s is not None else last
        out.append(last)
    return out


def produce_flights(bootstrap_servers: str, data: Path, topic: str = INPUT_TOPIC,
                    partitions: int = PARTITIONS) -> int:
    """Produce every data line of the flights CSV ``data`` (the header left out) to
    ``topic``; return the number of records.

    Partitioning is round robin (line ``i`` to partition ``i % partitions``), not by a key:
    the file is ordered by scheduled departure, so every partition gets an event-time
    ordered share, which is what the source's per-partition watermarks need (a record is
    never more than ``max_out_of_orderness`` behind its partition), and the 4 partitions
    hold the same number of records (keying by origin would put the 3 airports, 105,000 to
    121,000 flights each, into at most 3 partitions, and the mock cluster keeps only a few
    MB per partition). Keeping an origin's flights in order is not needed: the windows
    aggregate per (origin, carrier, hour) whatever the order within the watermark's bound.

    Records are gzip-compressed batches: the ~31 MB of CSV, uncompressed, are ~8 MB per
    partition and the mock cluster would silently drop about 45% of each; compressed they
    are ~2 MB.
    """
    import confluent_kafka

    lines = data.read_bytes().split(b"\n")[1:]
    if lines and lines[-1] == b"":
        lines.pop()
    stamps = flight_timestamps(lines)
    producer = confluent_kafka.Producer({
        "bootstrap.servers": bootstrap_servers, "log_level": 3, "linger.ms": 50,
        "compression.type": COMPRESSION, "batch.size": 1_000_000})
    errors: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(f"partition {msg.partition()}: {err}")

    for i, (line, ts) in enumerate(zip(lines, stamps, strict=True)):
        while True:
            try:
                producer.produce(topic, line, partition=i % partitions, timestamp=ts,
                                 on_delivery=delivered)
                break
            except BufferError:  # the local queue is full: let deliveries drain
                producer.poll(0.1)
    left = producer.flush(60)
    if left or errors:
        raise SystemExit(f"error: producing the flights to {topic!r} failed: {left} record(s) "
                         f"not delivered; {errors[:3]}")
    return len(lines)


def source(bootstrap_servers: str, max_out_of_orderness: float) -> Any:
    """The job's source: the input topic, bounded, with per-partition watermarks from the
    Kafka timestamps; a line that is not UTF-8 becomes a ``KafkaDeadLetter``."""
    from reactive.connectors.kafka import KafkaSource

    return KafkaSource(bootstrap_servers, INPUT_TOPIC, stop_at_latest=True,
                       value_deserializer="str", errors="dead_letter",
                       max_out_of_orderness=max_out_of_orderness,
                       partition_discovery_interval=None, client_options=CLIENT_OPTIONS)


def _sink(bootstrap_servers: str, topic: str, key: Callable[[Any], Any] | None) -> Any:
    from reactive.connectors.kafka import KafkaSink

    return KafkaSink(bootstrap_servers, topic, transactional_id_prefix=f"flights-{topic}",
                     key=key, client_options={"compression_type": COMPRESSION},
                     marker_reader_options=CLIENT_OPTIONS)


def results_sink(bootstrap_servers: str) -> Any:
    """The window results (JSON objects, the columns of the file variant's parquet), keyed
    ``origin,carrier`` so that one route's hours stay in order in one partition; exactly
    once."""
    return _sink(bootstrap_servers, RESULTS_TOPIC,
                 lambda row: f"{row['origin']},{row['carrier']}")


def dead_letter_sink(bootstrap_servers: str) -> Any:
    """The dead letters (JSON objects), exactly once."""
    return _sink(bootstrap_servers, DEAD_LETTER_TOPIC, None)


def read_topic(bootstrap_servers: str, topic: str) -> list[Any]:
    """The committed JSON values of ``topic``, by partition and offset.

    Raises:
        SystemExit: when the mock cluster dropped records of the topic.
    """
    import asyncio

    import orjson

    from reactive.connectors.kafka import read_committed

    records = asyncio.run(read_committed(bootstrap_servers, topic, CLIENT_OPTIONS))
    dropped = {p: low for p, (low, _) in watermark_offsets(bootstrap_servers, topic).items()
               if low > 0}
    if dropped:
        raise SystemExit(f"error: the mock Kafka cluster dropped the oldest records of topic "
                         f"{topic!r} (lowest offsets {dropped}): its output cannot be checked")
    return [orjson.loads(r.value) for r in records if r.value is not None]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Produce the flights CSV to a Kafka topic.")
    p.add_argument("--bootstrap", required=True, help="host:port of the Kafka cluster")
    p.add_argument("--data", default=str(Path(__file__).resolve().parent.parent / "data"
                                         / "flights.csv"))
    p.add_argument("--topic", default=INPUT_TOPIC)
    args = p.parse_args(argv)
    n = produce_flights(args.bootstrap, prepare_flights(Path(args.data)), args.topic)
    print(f"produced {n:,} flights to {args.topic!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
