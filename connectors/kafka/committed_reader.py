"""Reading what a topic holds *committed*, from its raw record batches.

A ``read_committed`` consumer relies on the broker to tell it which transactions aborted
(the aborted-transactions list of a fetch response). This reader does not: it fetches the
raw record batches and keeps a transactional record only when a COMMIT control marker of its
producer follows it (Kafka's transaction protocol, KIP-98: every transaction ends with a
COMMIT or ABORT control batch in each partition it wrote to). Records of aborted and of
still-open transactions are left out; non-transactional records are kept.

Two users need that independence from the broker: the exactly-once :class:`KafkaSink`, which
reads its commit markers on recovery (a marker of an aborted transaction must never count
as committed), and tests, which run against librdkafka's mock cluster (it ignores
``isolation.level`` and hands aborted records to read-committed consumers).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["CommittedRecord", "read_committed"]

# control record types (KIP-98): the key of a control record is (version int16, type int16)
_ABORT, _COMMIT = 0, 1


@dataclass(frozen=True, slots=True)
class CommittedRecord:
    """A record of a committed transaction (or written outside any transaction).

    Attributes:
        partition: its partition.
        offset: its offset.
        timestamp: Kafka timestamp in milliseconds.
        key: key bytes or None.
        value: value bytes or None.
        headers: ``((name, bytes), ...)``.
    """

    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


async def read_committed(bootstrap_servers: str, topic: str,
                         client_options: Mapping[str, Any] | None = None,
                         max_bytes: int = 4 << 20) -> list[CommittedRecord]:
    """Every committed record of ``topic`` from each partition's first readable offset up to
    its end offset at the time of the call, ordered by partition and offset.

    Args:
        bootstrap_servers: ``host:port[,host:port...]``.
        topic: the topic; a topic that does not exist reads as empty.
        client_options: more options for aiokafka's client (security, timeouts).
        max_bytes: bytes fetched per request at most.

    Raises:
        aiokafka.errors.KafkaError: a fetch failed (the error code of the partition).
    """
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.errors import for_code
    from aiokafka.protocol.fetch import FetchRequest
    from aiokafka.record.memory_records import MemoryRecords

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap_servers, enable_auto_commit=False,
                                **dict(client_options or {}))
    await consumer.start()
    try:
        client = consumer._client  # the raw fetch below needs the connection, not a consumer
        cluster = await client.fetch_all_metadata()
        tps = [TopicPartition(topic, p)
               for p in sorted(cluster.partitions_for_topic(topic) or ())]
        if not tps:
            return []
        begin = await consumer.beginning_offsets(tps)
        end = await consumer.end_offsets(tps)
        out: list[CommittedRecord] = []
        for tp in tps:
            offset, stop = begin[tp], end[tp]
            # producer id -> records of its open transaction, in offset order
            open_txns: dict[int, list[CommittedRecord]] = defaultdict(list)
            kept: list[CommittedRecord] = []
            while offset < stop:
                leader = cluster.leader_for_partition(tp)
                request = FetchRequest(100, 1, max_bytes, 0,
                                       [(topic, [(tp.partition, offset, max_bytes)])])
                response = await client.send(leader, request)
                part = response.topics[0][1][0]
                error = part[1]
                if error:
                    raise for_code(error)(f"fetching {tp} at offset {offset}")
                records = MemoryRecords(part[-1])
                progressed = False
                while (batch := records.next_batch()) is not None:
                    if batch.next_offset <= offset:
                        continue  # a batch the fetch returned from before the offset asked
                    progressed = True
                    if batch.is_control_batch:
                        for control in batch:
                            kind = int.from_bytes(bytes(control.key or b"\0\0\0\0")[2:4], "big")
                            done = open_txns.pop(batch.producer_id, [])
                            if kind == _COMMIT:
                                kept.extend(done)
                    else:
                        target = (open_txns[batch.producer_id] if batch.is_transactional
                                  else kept)
                        for r in batch:
                            if r.offset >= offset:
                                target.append(CommittedRecord(
                                    tp.partition, r.offset, r.timestamp, r.key, r.value,
                                    tuple((k, bytes(v)) for k, v in r.headers)))
                    offset = batch.next_offset
                if not progressed:
                    break  # nothing more to read below the end offset (e.g. a gap)
            out.extend(sorted(kept, key=lambda r: r.offset))
        return out
    finally:
        await consumer.stop()
