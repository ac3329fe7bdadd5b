"""Kafka -> keyed count -> Kafka, exactly once, run as a subprocess by
``tests/connectors/kafka/test_kafka_exactly_once.py`` and killed with SIGKILL at chosen moments.

Usage::

    python kafka_count_job.py BOOTSTRAP INPUT OUTPUT CHECKPOINTS PARALLELISM [columnar]

It reads INPUT (bounded: up to the end offsets of its first start), counts the words, writes
``[word, n]`` for the n-th occurrence of each word to OUTPUT with a transactional
:class:`~reactive.connectors.kafka.KafkaSink`, resumes from the latest completed checkpoint in
CHECKPOINTS (every 100 ms) at PARALLELISM, and exits 0 when the input is done. Each source
reader reads at most ``PER_CHECKPOINT`` records per checkpoint, so every run spans several
checkpoints (the kill points below count commits). With ``columnar`` the same job runs on
record batches: the source's columnar mode (one batch per fetch of a partition) ->
``key_by("word").agg(count=...)`` -> the same sink, one record per row.

``REACTIVE_TEST_KILL`` names where the process kills itself (counters per process):

- ``record:<n>``: at the keyed count's n-th record;
- ``commit:<n>``: at the start of the sink's n-th commit: after the checkpoint completed,
  before anything reached Kafka (also during the recovery's commits);
- ``midcommit:<n>``: in the n-th commit, after the records were sent in the open Kafka
  transaction, before it commits (the transaction is left open for the restart to fence);
- ``committed:<n>``: right after the n-th Kafka commit (the restart finds its marker);
- ``precommit:<n>``: right after the n-th pre-commit (its checkpoint never completes).

Before killing itself it appends the kill point to ``REACTIVE_TEST_KILL_LOG`` (if set).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Iterable
from typing import Any

from reactive import (
    CheckpointConfig,
    Dataflow,
    KeyedProcessFunction,
    RestartStrategy,
    ValueStateDescriptor,
)
from reactive.connectors.kafka import KafkaSink, KafkaSource, KafkaTransaction
from reactive.connectors.kafka.source import KafkaSourceReader
from reactive.sources import SourceReader

JOB = "kafka-count"
CLIENT_OPTIONS = {"check_crcs": False}  # aiokafka against librdkafka's mock cluster

_KIND, _, _AT = os.environ.get("REACTIVE_TEST_KILL", "none:0").partition(":")
_COUNT = [0]


def tick(kind: str) -> None:
    """Kill the process if ``kind`` is the kill point and this is its n-th occurrence."""
    if kind != _KIND:
        return
    _COUNT[0] += 1
    if _COUNT[0] == int(_AT):
        log = os.environ.get("REACTIVE_TEST_KILL_LOG")
        if log:
            with open(log, "a") as f:
                f.write(f"{kind}:{_AT}\n")
                f.flush()
                os.fsync(f.fileno())
        os.kill(os.getpid(), signal.SIGKILL)


class Count(KeyedProcessFunction):
    """Emits ``[word, n]`` for the n-th occurrence of ``word``."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def process_element(self, value: Any, ctx: Any) -> Iterable[Any]:
        tick("record")
        n = self.count.value() + 1
        self.count.update(n)
        yield [ctx.current_key, n]


class KillingKafkaSink(KafkaSink):
    """The Kafka sink with the kill points of ``REACTIVE_TEST_KILL``."""

    def pre_commit(self, txn: KafkaTransaction, checkpoint_id: int) -> None:
        super().pre_commit(txn, checkpoint_id)
        tick("precommit")

    async def commit(self, txn: KafkaTransaction) -> None:
        tick("commit")
        await super().commit(txn)
        tick("committed")

    async def _send_all(self, producer: Any, records: list[Any]) -> None:
        await super()._send_all(producer, records)
        if _KIND == "midcommit":
            await producer.flush()
            tick("midcommit")


#: records a reader hands over between two of its snapshots
PER_CHECKPOINT = 1_000


# The Kafka connector paced by snapshots: the test is about that connector's exactly-once
# commits, which a TestingSource would replace.
class PacedKafkaSource(KafkaSource):
    """The Kafka source, paced by checkpoints: each reader reads at most
    :data:`PER_CHECKPOINT` records between two of its snapshots. The kill points count
    commits and pre-commits, so a run must span several checkpoints however fast the
    machine reads (unpaced, a run at parallelism 1 could read all its input before its
    third commit, and the kill never came)."""

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        return PacedKafkaReader(self, subtask, parallelism)


class PacedKafkaReader(KafkaSourceReader):
    """A :class:`KafkaSourceReader` with a record allowance renewed by each snapshot."""

    def __init__(self, source: KafkaSource, subtask: int, parallelism: int) -> None:
        super().__init__(source, subtask, parallelism)
        self.allowance = PER_CHECKPOINT

    async def read_batch(self, max_records: int) -> list[Any] | None:
        if self.allowance <= 0:
            # none ready until the next barrier; a short wait, so the idle reader does not
            # spin the CPU the mock cluster (in the test's process) needs
            await asyncio.sleep(0.002)
            return []
        batch = await super().read_batch(min(max_records, self.allowance))
        if batch:
            # a columnar source's batch counts its rows
            self.allowance -= sum(getattr(b, "num_rows", 1) for b in batch)
        return batch

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        self.allowance = PER_CHECKPOINT
        return super().snapshot_state(checkpoint_id)


def build(bootstrap: str, input_topic: str, output_topic: str, parallelism: int) -> Dataflow:
    """The job's dataflow."""
    flow = Dataflow(JOB, parallelism=parallelism, batch_size=256)
    (flow.source(PacedKafkaSource(bootstrap, input_topic, stop_at_latest=True,
                             value_deserializer="str", client_options=CLIENT_OPTIONS),
                 name="words").uid("words")
         .key_by(lambda r: r.value)
         .process(Count()).uid("count")
         .sink(KillingKafkaSink(bootstrap, output_topic, transactional_id_prefix=f"{JOB}-out",
                                key=lambda r: r[0], marker_reader_options=CLIENT_OPTIONS))
         .uid("kafka-out"))
    return flow


def decode_words(values: list[bytes | None]) -> Any:
    """The values as a ``word`` column (one UTF-8 check for the whole fetch)."""
    import pyarrow as pa

    return pa.record_batch([pa.array(values, pa.binary()).cast(pa.string())], names=["word"])


def tick_rows(batch: Any) -> Any:
    """The ``record`` kill point for each row of a batch of the columnar count."""
    for _ in range(batch.num_rows):
        tick("record")
    return batch


def build_columnar(bootstrap: str, input_topic: str, output_topic: str,
                   parallelism: int) -> Dataflow:
    """The job's dataflow on record batches."""
    import pyarrow as pa

    source = PacedKafkaSource(bootstrap, input_topic, stop_at_latest=True, columnar=True,
                              value_schema=pa.schema([("word", pa.string())]),
                              value_decoder=decode_words, metadata_columns=(),
                              max_batch_records=250, client_options=CLIENT_OPTIONS)
    flow = Dataflow(JOB, parallelism=parallelism, batch_size=256)
    (flow.columnar_source(source, name="words").uid("words")
         .key_by("word").agg(count=("word", "count")).uid("count")
         .map_batches(tick_rows).uid("ticks")
         .sink(KillingKafkaSink(bootstrap, output_topic, transactional_id_prefix=f"{JOB}-out",
                                key=lambda r: r["word"],
                                value=lambda r: [r["word"], r["count"]],
                                marker_reader_options=CLIENT_OPTIONS))
         .uid("kafka-out"))
    return flow


async def main(bootstrap: str, input_topic: str, output_topic: str, checkpoints: str,
               parallelism: int, columnar: bool = False) -> None:
    """Run (resume) the job."""
    flow = (build_columnar if columnar else build)(bootstrap, input_topic, output_topic,
                                                   parallelism)
    await flow.run(checkpoints=CheckpointConfig(interval=0.1, directory=checkpoints),
                   restart=RestartStrategy.fixed(5, 0.0), resume=True)


if __name__ == "__main__":
    a = sys.argv[1:]
    asyncio.run(main(a[0], a[1], a[2], a[3], int(a[4]), a[5:] == ["columnar"]))
