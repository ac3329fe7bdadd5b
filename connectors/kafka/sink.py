"""The Kafka sink: exactly once (one Kafka transaction per checkpoint interval and instance,
committed when the checkpoint completes) or at least once (idempotent producer, flushed at
every checkpoint).

The exactly-once design, and why. aiokafka cannot resume a transaction that a crashed
producer prepared: a new producer with the same transactional id fences it (InitProducerId
aborts the open transaction). A sink that wrote the interval's records into an open Kafka
transaction and committed it after the checkpoint completed would lose the interval when the
process dies between the completion and the Kafka commit. So this sink is the write-ahead-log
sink of Carbone 2018 (PhD thesis), table 4.1 (and Flink's ``GenericWriteAheadSink``) with an
idempotent commit:

1. During the interval the records are serialized and kept in the open (local) transaction.
2. At the checkpoint barrier the transaction is pre-committed: its records go into the
   checkpoint, as the sink's pending transaction (nothing is sent to Kafka yet).
3. When the checkpoint completes, the instance that owns the transaction sends its records
   *and a commit marker* (``<prefix>-<owner>:<checkpoint id>`` on the marker topic) in one
   Kafka transaction of the producer ``<prefix>-<owner>``, and commits it.
4. After a failure the restored checkpoint lists the transactions that may not have reached
   Kafka. Before committing one, the sink starts the producer ``<prefix>-<owner>``, which
   completes or aborts whatever that id left in flight (only that producer ever commits
   ``owner``'s transactions), then reads the marker topic's *committed* records
   (:mod:`.committed_reader`): a transaction whose marker is there is already in Kafka and is
   skipped, any other is sent again. Kafka makes the records and the marker visible
   together, so an interval is in Kafka exactly once.

Transactional ids are stable across restarts (prefix and instance); after a rescale to fewer
instances, the ids of the instances that no longer exist are fenced at start so that their
lingering transactions are aborted at once instead of holding read-committed consumers back
until the transaction timeout. The cost of the design: an interval's records are kept in
memory and in the checkpoint until it completes, and they reach Kafka one checkpoint interval
later than with an open transaction.
"""

from __future__ import annotations

import asyncio
import logging
import operator
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from reactive.errors import ConfigurationError, RecordRejectedError
from reactive.sinks import SinkWriter
from reactive.two_phase_commit import TwoPhaseCommitSink, TwoPhaseCommitWriter

from .batch_encoding import encode_csv_values, encode_json_values, encode_keys, is_record_batch
from .serialization import Serializer, SerializerName, serializer

__all__ = ["KafkaSink", "KafkaSinkError", "KafkaTransaction"]

log = logging.getLogger(__name__)

Headers = list[tuple[str, bytes]]
# a serialized record: (key bytes or None, value bytes, headers or None)
Serialized = tuple[bytes | None, bytes, Headers | None]


class KafkaSinkError(RecordRejectedError):
    """Kafka did not accept a record (broker down, record too large, authorization ...);
    the message names the topic and the record (``record``, None when a whole transaction
    failed). The job fails; nothing unaccepted was acknowledged."""

    def __init__(self, message: str, record: Any = None) -> None:
        super().__init__(message, record)


@dataclass
class KafkaTransaction:
    """The records of one instance's checkpoint interval (kept in the checkpoint once
    pre-committed).

    Attributes:
        owner: the instance that wrote them (its producer commits them).
        checkpoint_id: the checkpoint that pre-committed them (0 before).
        records: the serialized records, in order.
        restored: True when read back from a checkpoint (Kafka may already have it).
    """

    owner: int
    checkpoint_id: int = 0
    records: list[Serialized] = field(default_factory=list)
    restored: bool = False

    def __getstate__(self) -> dict[str, Any]:
        return {"owner": self.owner, "checkpoint_id": self.checkpoint_id,
                "records": self.records}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.restored = True


def _identity(record: Any) -> Any:
    return record


def _csv_refused(record: Any) -> bytes:
    raise TypeError("value_serializer='csv' writes the rows of record batches (a columnar "
                    "stream); this record is not in one")


def rows_of(batch: list[Any]) -> list[Any]:
    """The records of a channel batch, a columnar stream's record batches expanded to their
    rows (``dict`` s, converted by Arrow in one call per batch)."""
    pa = sys.modules.get("pyarrow")  # no record batch exists before pyarrow is imported
    if pa is None or not any(isinstance(r, pa.RecordBatch) for r in batch):
        return batch
    out: list[Any] = []
    for r in batch:
        if isinstance(r, pa.RecordBatch):
            out.extend(r.to_pylist())
        else:
            out.append(r)
    return out


class KafkaSink(TwoPhaseCommitSink[KafkaTransaction]):
    """Write records to a Kafka topic, exactly once (default) or at least once.

    Args:
        bootstrap_servers: ``host:port[,host:port...]``.
        topic: the topic to write to.
        semantic: ``"exactly_once"`` (transactions committed with the checkpoints; see the
            module's design) or ``"at_least_once"`` (idempotent producer, flushed at every
            checkpoint: after a failure the records since the last checkpoint are written
            again).
        transactional_id_prefix: the stable prefix of this sink's transactional ids and
            commit markers (required for exactly once, as in Flink's ``KafkaSink``); unique
            per sink across every job writing to the cluster.
        key: record -> key, or the name of a column (``record[key]``; None: no key,
            records then spread over the partitions). The rows of a columnar stream's
            record batches are records too, each a ``dict`` (column -> value).
        value: record -> value (default: the record).
        headers: record -> ``[(name, bytes), ...]`` (optional).
        key_serializer: ``"str"``, ``"bytes"``, ``"json"`` or a callable, for the key.
        value_serializer: the same for the value (default ``"json"``, orjson), or
            ``"csv"`` for the rows of record batches: each row one CSV line of the batch's
            columns (``pyarrow.csv.write_csv``, no header); a record that is not in a
            record batch then fails the job naming it.
        marker_topic: the topic of the commit markers (exactly once; default
            ``"<topic>.commits"``). Keep its retention longer than the oldest checkpoint
            you may restore.
        max_request_size: bytes a record may have at most (Kafka's ``max.request.size``);
            a larger one fails the job naming it, when it is written.
        client_options: more keyword options for ``aiokafka.AIOKafkaProducer``.

    A columnar stream's record batch is written as one message per row. With the default
    value (the row) and value serializer (``"json"``), no ``headers`` and ``key`` a column
    name or None, the batch is encoded vectorized (:mod:`.batch_encoding`: a few calls per
    batch, the same bytes as the per-row path); otherwise each row goes through ``key``,
    ``value``, ``headers`` and the serializers as a ``dict`` (one ``RecordBatch.to_pylist()``
    per batch).
        marker_reader_options: keyword options for the consumer that reads the commit
            markers on recovery (default: the connection and security options of
            ``client_options``).

    Raises:
        ConfigurationError: on an unknown semantic or a missing prefix.
    """

    def __init__(self, bootstrap_servers: str, topic: str, *,
                 semantic: Literal["exactly_once", "at_least_once"] = "exactly_once",
                 transactional_id_prefix: str | None = None,
                 key: Callable[[Any], Any] | str | None = None,
                 value: Callable[[Any], Any] = _identity,
                 headers: Callable[[Any], Headers] | None = None,
                 key_serializer: SerializerName | Serializer = "str",
                 value_serializer: SerializerName | Literal["csv"] | Serializer = "json",
                 marker_topic: str | None = None,
                 max_request_size: int = 1048576,
                 client_options: Mapping[str, Any] | None = None,
                 marker_reader_options: Mapping[str, Any] | None = None) -> None:
        if semantic not in ("exactly_once", "at_least_once"):
            raise ConfigurationError(f"Kafka sink: unknown semantic {semantic!r}: use "
                                     "'exactly_once' or 'at_least_once'")
        if semantic == "exactly_once" and not transactional_id_prefix:
            raise ConfigurationError(
                "Kafka sink: exactly_once needs a transactional_id_prefix, stable across "
                "restarts and unique per sink (e.g. '<job>-<sink uid>')")
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.semantic = semantic
        self.exactly_once = semantic == "exactly_once"
        self.prefix = transactional_id_prefix or ""
        self.key_column = key if isinstance(key, str) else None
        self.key_fn = operator.itemgetter(key) if isinstance(key, str) else key
        self.value_fn = value
        self.headers_fn = headers
        self.key_serializer = serializer(key_serializer)
        self.csv = value_serializer == "csv"
        self.value_serializer = _csv_refused if self.csv else serializer(
            value_serializer)  # type: ignore[arg-type]  # "csv" is handled above
        self._key_serializer_name = key_serializer if isinstance(key_serializer, str) else None
        # record batches encode vectorized when each row's message is the row as JSON
        self.vectorized = (value is _identity and value_serializer in ("json", "csv")
                           and headers is None and (key is None or isinstance(key, str)))
        if self.csv and not self.vectorized:
            raise ConfigurationError(
                "Kafka sink: value_serializer='csv' writes each row of a record batch as it "
                "is: leave value and headers unset and give key as a column name (or None)")
        self.marker_topic = marker_topic or f"{topic}.commits"
        self.max_request_size = max_request_size
        self.client_options = dict(client_options or {})
        shared = ("security_protocol", "ssl_context", "sasl_mechanism", "sasl_plain_username",
                  "sasl_plain_password", "request_timeout_ms", "client_id")
        self.marker_reader_options = {k: v for k, v in self.client_options.items() if k in shared}
        self.marker_reader_options.update(marker_reader_options or {})
        # per instance (set on the instance's copy): producers by owner, committed markers
        self.previous_parallelism = 0
        self._producers: dict[int, Any] = {}
        self._markers: set[str] | None = None

    # ------------------------------------------------------------------ records
    def serialize(self, record: Any) -> Serialized:
        """The bytes of ``record``.

        Raises:
            KafkaSinkError: when a serializer fails or the record exceeds
                ``max_request_size`` (the message names the record and the topic).
        """
        try:
            key = None if self.key_fn is None else self.key_fn(record)
            key_bytes = None if key is None else self.key_serializer(key)
            value_bytes = self.value_serializer(self.value_fn(record))
            headers = None if self.headers_fn is None else list(self.headers_fn(record))
        except Exception as exc:
            raise KafkaSinkError(f"Kafka sink to {self.topic!r}: cannot serialize record "
                                 f"{record!r:.200}: {type(exc).__name__}: {exc}",
                                 record) from exc
        size = len(value_bytes) + len(key_bytes or b"")
        if size > self.max_request_size:
            raise self._too_large(record, size)
        return key_bytes, value_bytes, headers

    def _too_large(self, record: Any, size: int) -> KafkaSinkError:
        return KafkaSinkError(
            f"Kafka sink to {self.topic!r}: record {record!r:.200} is {size} bytes, more "
            f"than max_request_size ({self.max_request_size}); Kafka would refuse it", record)

    def serialize_all(self, batch: list[Any]) -> list[Serialized]:
        """The bytes of a channel batch's records, in order: a record batch's rows encoded
        vectorized when the sink allows it (see the class), else row by row.

        Raises:
            KafkaSinkError: as :meth:`serialize`, naming the row.
        """
        if not self.vectorized or not any(map(is_record_batch, batch)):
            return list(map(self.serialize, rows_of(batch)))
        out: list[Serialized] = []
        for item in batch:
            if is_record_batch(item):
                out.extend(self.serialize_batch(item))
            else:
                out.append(self.serialize(item))
        return out

    def serialize_batch(self, batch: Any) -> list[Serialized]:
        """The messages of a ``pyarrow.RecordBatch``'s rows, encoded vectorized
        (:mod:`.batch_encoding`): the same bytes as :meth:`serialize` of each row of
        ``batch.to_pylist()``.

        Raises:
            KafkaSinkError: when a value does not encode or a message exceeds
                ``max_request_size`` (naming the row), or the key column is missing.
        """
        if batch.num_rows == 0:
            return []
        keys: list[bytes | None]
        try:
            if self.csv:
                try:
                    values = encode_csv_values(batch)
                except Exception as exc:  # a type CSV cannot hold: no row is to blame
                    position = (batch.schema.metadata or {}).get(b"reactive.position", b"")
                    raise KafkaSinkError(
                        f"Kafka sink to {self.topic!r}: cannot write the record batch "
                        f"{position.decode()!r} as CSV (columns: "
                        f"{', '.join(f'{f.name} {f.type}' for f in batch.schema)}): "
                        f"{type(exc).__name__}: {exc}") from exc
            else:
                values = encode_json_values(batch)
            if self.key_column is None:
                keys = [None] * batch.num_rows
            else:
                index = batch.schema.get_field_index(self.key_column)
                if index < 0:
                    raise KafkaSinkError(
                        f"Kafka sink to {self.topic!r}: the record batch has no key column "
                        f"{self.key_column!r} (its columns: {batch.schema.names})")
                keys = encode_keys(batch.column(index), self.key_serializer,
                                   self._key_serializer_name)
        except KafkaSinkError:
            raise
        except Exception:
            # the per-row path names the row that does not encode
            return list(map(self.serialize, batch.to_pylist()))
        longest = max(map(len, values)) + max((len(k) for k in keys if k is not None),
                                               default=0)
        if longest > self.max_request_size:
            for i, (key, value) in enumerate(zip(keys, values, strict=True)):
                size = len(value) + len(key or b"")
                if size > self.max_request_size:
                    raise self._too_large(batch.slice(i, 1).to_pylist()[0], size)
        return list(zip(keys, values, [None] * len(values), strict=True))

    # ------------------------------------------------------------------ producers
    def _new_producer(self, transactional_id: str | None) -> Any:
        from reactive.extras import require

        require("aiokafka", "kafka", "the Kafka sink")
        from aiokafka import AIOKafkaProducer

        options: dict[str, Any] = {"acks": "all", "enable_idempotence": True,
                                   "max_request_size": self.max_request_size}
        options.update(self.client_options)
        return AIOKafkaProducer(bootstrap_servers=self.bootstrap_servers,
                                transactional_id=transactional_id, **options)

    def transactional_id(self, owner: int) -> str:
        """The transactional id of instance ``owner``'s producer."""
        return f"{self.prefix}-{owner}"

    async def _producer(self, owner: int) -> Any:
        """The started producer that commits ``owner``'s transactions; starting it fences
        the id (Kafka completes or aborts what the id left in flight)."""
        producer = self._producers.get(owner)
        if producer is None:
            producer = self._new_producer(self.transactional_id(owner))
            await producer.start()
            self._producers[owner] = producer
            self._markers = None  # markers read before this fencing may be stale
        return producer

    async def _committed_markers(self) -> set[str]:
        if self._markers is None:
            from .committed_reader import read_committed

            records = await read_committed(self.bootstrap_servers, self.marker_topic,
                                           self.marker_reader_options)
            self._markers = {r.key.decode("utf-8") for r in records if r.key is not None}
        return self._markers

    def _marker(self, txn: KafkaTransaction) -> str:
        return f"{self.transactional_id(txn.owner)}:{txn.checkpoint_id}"

    # ------------------------------------------------------------------ two-phase commit
    def begin_transaction(self) -> KafkaTransaction:
        return KafkaTransaction(self.subtask)

    def write(self, txn: KafkaTransaction, batch: list[Any]) -> None:
        txn.records.extend(self.serialize_all(batch))

    def pre_commit(self, txn: KafkaTransaction, checkpoint_id: int) -> None:
        # the records go into the checkpoint with the transaction (the write-ahead log)
        txn.checkpoint_id = checkpoint_id

    async def commit(self, txn: KafkaTransaction) -> None:
        """Send ``txn``'s records and its marker in one Kafka transaction, unless a restored
        ``txn`` is already in Kafka (its marker is committed).

        Raises:
            KafkaSinkError: Kafka refused a record or the commit.
        """
        producer = await self._producer(txn.owner)
        marker = self._marker(txn)
        if txn.restored and marker in await self._committed_markers():
            log.info("Kafka sink %s: transaction of checkpoint %d is already committed",
                     self.transactional_id(txn.owner), txn.checkpoint_id)
            return
        await producer.begin_transaction()
        try:
            await self._send_all(producer, txn.records)
            await producer.send_and_wait(self.marker_topic, str(len(txn.records)).encode(),
                                         key=marker.encode())
            await producer.commit_transaction()
        except KafkaSinkError:
            await _abort_quietly(producer)
            raise
        except Exception as exc:
            await _abort_quietly(producer)
            raise KafkaSinkError(f"Kafka sink to {self.topic!r}: committing the transaction of "
                                 f"checkpoint {txn.checkpoint_id} failed: {exc!r}") from exc
        if self._markers is not None:
            self._markers.add(marker)

    async def _send_all(self, producer: Any, records: list[Serialized]) -> None:
        topic = self.topic
        futures = [(await producer.send(topic, value, key=key, headers=headers), key, value)
                   for key, value, headers in records]
        for future, key, value in futures:
            try:
                await future
            except Exception as exc:
                raise KafkaSinkError(f"Kafka sink to {topic!r}: Kafka refused the record "
                                     f"key={key!r:.80} value={value!r:.200}: {exc!r}") from exc

    def abort(self, txn: KafkaTransaction) -> None:
        """Nothing reached Kafka before the commit: dropping the records is the abort."""

    async def abort_lingering(self, restored_checkpoint_id: int | None) -> None:
        """Start this instance's producer (fencing its id) and fence the ids of instances
        that the previous parallelism had and this one lacks (this instance takes those
        with ``id % parallelism == subtask``)."""
        await self._producer(self.subtask)
        for owner in range(self.parallelism, self.previous_parallelism):
            if owner % self.parallelism == self.subtask:
                await self._producer(owner)

    def create_writer(self, subtask: int, parallelism: int) -> SinkWriter:
        """Instance ``subtask`` of ``parallelism``: a transactional writer, or an
        idempotent one for at least once."""
        instance = _copy_for(self, subtask, parallelism)
        if not self.exactly_once:
            return AtLeastOnceKafkaWriter(instance)
        return _KafkaTransactionalWriter(instance)


def _copy_for(sink: KafkaSink, subtask: int, parallelism: int) -> KafkaSink:
    import copy

    instance = copy.copy(sink)
    instance.subtask, instance.parallelism = subtask, parallelism
    instance._producers = {}
    instance._markers = None
    return instance


async def _abort_quietly(producer: Any) -> None:
    try:
        await producer.abort_transaction()
    except Exception as exc:  # the original error is the news; a fenced producer cannot abort
        log.debug("aborting a failed Kafka transaction failed too: %r", exc)


class _KafkaTransactionalWriter(TwoPhaseCommitWriter[KafkaTransaction]):
    """The two-phase-commit writer, plus: remember the restored checkpoint's parallelism
    (its epoch entries name every old instance) and close the producers."""

    sink: KafkaSink

    async def restore_state(self, entries: list[Any]) -> None:
        self.sink.previous_parallelism = 1 + max(
            (int(e["subtask"]) for e in entries if isinstance(e, dict) and "subtask" in e),
            default=-1)
        await super().restore_state(entries)

    async def close(self) -> None:
        super().close()
        producers, self.sink._producers = self.sink._producers, {}
        for producer in producers.values():
            try:
                await producer.stop()
            except Exception as exc:  # closing after a failure: the first error is the news
                log.debug("stopping a Kafka producer failed: %r", exc)


class AtLeastOnceKafkaWriter(SinkWriter):
    """At least once: an idempotent producer (no duplicates from its own retries), flushed
    at every checkpoint; a send that Kafka refused fails the job at the latest there.

    Args:
        sink: the per-instance copy of the sink.
    """

    def __init__(self, sink: KafkaSink) -> None:
        self.sink = sink
        self._producer: Any = None
        self._in_flight: list[tuple[asyncio.Future[Any], Serialized]] = []

    async def write(self, batch: list[Any]) -> None:
        if self._producer is None:
            self._producer = self.sink._new_producer(None)
            await self._producer.start()
        producer, topic = self._producer, self.sink.topic
        for serialized in self.sink.serialize_all(batch):
            key, value, headers = serialized
            future = await producer.send(topic, value, key=key, headers=headers)
            self._in_flight.append((future, serialized))
        if len(self._in_flight) > 50_000:
            await self._settle()

    async def _settle(self) -> None:
        in_flight, self._in_flight = self._in_flight, []
        for future, (key, value, _) in in_flight:
            try:
                await future
            except Exception as exc:
                raise KafkaSinkError(
                    f"Kafka sink to {self.sink.topic!r}: Kafka refused the record "
                    f"key={key!r:.80} value={value!r:.200}: {exc!r}") from exc

    async def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        """Flush: the checkpoint completes only when Kafka acknowledged every record before
        its barrier."""
        if self._producer is not None:
            await self._producer.flush()
        await self._settle()
        return []

    async def finish(self) -> None:
        await self.snapshot_state(0)

    async def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()


