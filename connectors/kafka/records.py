"""The records a Kafka source emits: one per Kafka record, or a dead letter for one that
does not deserialize."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["KafkaDeadLetter", "KafkaRecord"]


@dataclass(frozen=True, slots=True)
class KafkaRecord:
    """One record read from Kafka.

    Attributes:
        topic: the topic it was read from.
        partition: its partition.
        offset: its offset in the partition.
        timestamp: the Kafka timestamp (create or log-append time) in seconds since the epoch;
            the source's event time.
        key: the deserialized key (None when the record has no key).
        value: the deserialized value.
        headers: the record's headers, ``((name, bytes), ...)``.
    """

    topic: str
    partition: int
    offset: int
    timestamp: float
    key: Any
    value: Any
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class KafkaDeadLetter:
    """A record whose key or value could not be deserialized, emitted in place of its
    :class:`KafkaRecord` by a source with ``errors="dead_letter"``, so the pipeline routes it
    to a dead-letter output (``isinstance(record, KafkaDeadLetter)``); its position still
    advances, so it is neither lost nor read twice.

    Attributes:
        topic: the topic it was read from.
        partition: its partition.
        offset: its offset in the partition.
        timestamp: the Kafka timestamp in seconds.
        key: the raw key bytes (or None).
        value: the raw value bytes (or None).
        reason: what the deserializer raised.
    """

    topic: str
    partition: int
    offset: int
    timestamp: float
    key: bytes | None
    value: bytes | None
    reason: str


# the pipeline's state and buffers may hold them: pickle them under their public names
KafkaRecord.__module__ = "reactive.connectors.kafka"
KafkaDeadLetter.__module__ = "reactive.connectors.kafka"
