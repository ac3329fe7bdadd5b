"""Kafka on aiokafka (the ``kafka`` extra): an exactly-once source whose partition offsets
live in the job's checkpoints, and a sink that writes exactly once (transactions committed
with the checkpoints, recoverable after a crash) or at least once.

``KafkaSource`` (:mod:`.source`), ``KafkaSink`` (:mod:`.sink`), the records a source emits
(:mod:`.records`), the (de)serializers (:mod:`.serialization`), and :func:`read_committed`
(:mod:`.committed_reader`), which reads a topic's committed records from the raw record
batches, whatever isolation the broker applies.
"""

from .committed_reader import CommittedRecord, read_committed
from .records import KafkaDeadLetter, KafkaRecord
from .sink import KafkaSink, KafkaSinkError, KafkaTransaction
from .source import KafkaSource, partition_owner

__all__ = [
    "CommittedRecord",
    "KafkaDeadLetter",
    "KafkaRecord",
    "KafkaSink",
    "KafkaSinkError",
    "KafkaSource",
    "KafkaTransaction",
    "partition_owner",
    "read_committed",
]
