"""The Kafka source: partitions are splits, their offsets are operator state (in our
checkpoints, never in a consumer group), records carry Kafka's timestamp, key, value, headers,
partition and offset.

Assignment: partition ``p`` of topic ``t`` belongs to instance ``(start(t) + p) % parallelism``
with ``start(t)`` a stable hash of the topic name (Flink's ``KafkaSourceEnumerator``), so
partitions spread round robin and every instance decides its own share. The position entries
are redistributed as a union on restore: every instance sees every partition's offset and
keeps those it owns at the new parallelism, so a rescale (p -> p') resumes every partition
exactly where the checkpoint left it. A partition that no entry names (created since, or at a
fresh start) starts at ``starting_offsets`` on the first start and at its earliest offset
afterwards (it is new: nothing of it was read).

In columnar mode (``columnar=True``) each fetch of a partition becomes one
``pyarrow.RecordBatch`` (:mod:`.batches`) and the position entries are the same: the offset
after the batch's last record, so restores and rescales are as exact as per record.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import mmh3

from reactive.errors import ConfigurationError
from reactive.sources import Source, SourceReader

from .batches import BatchDecoder, KafkaBatchDecoder
from .partition_watermarks import PartitionWatermarks
from .records import KafkaDeadLetter, KafkaRecord
from .serialization import Deserializer, SerializerName, deserializer

__all__ = ["KafkaSource", "partition_owner"]

log = logging.getLogger(__name__)

StartingOffsets = Literal["earliest", "latest"] | Mapping[tuple[str, int], int]


def partition_owner(topic: str, partition: int, parallelism: int) -> int:
    """The instance (0-based) of ``parallelism`` that reads ``partition`` of ``topic``."""
    start = (mmh3.hash(topic.encode("utf-8"), signed=False) * 31) & 0x7FFFFFFF
    return (start % parallelism + partition) % parallelism


def record_timestamp(record: KafkaRecord | KafkaDeadLetter) -> float:
    """The event time of a record of a Kafka source: its Kafka timestamp (seconds)."""
    return record.timestamp


def row_timestamp(row: Mapping[str, Any]) -> float:
    """The event time of a row of a columnar Kafka source read as a record
    (``to_records()``): its ``timestamp`` column (seconds)."""
    stamp = row["timestamp"]
    return float(stamp.timestamp())


class KafkaSource(Source):
    """Records of Kafka topics, exactly once through failures and rescaling (with
    checkpoints), as :class:`~reactive.connectors.kafka.KafkaRecord` objects.

    Args:
        bootstrap_servers: ``host:port[,host:port...]``.
        topics: a topic name or a list of them; partitions added later are picked up every
            ``partition_discovery_interval`` seconds.
        starting_offsets: where partitions start when nothing is restored: ``"earliest"``,
            ``"latest"``, or ``{(topic, partition): offset}`` (partitions it does not name
            start at the earliest offset).
        starting_timestamp: instead of ``starting_offsets``, start every partition at the
            first record with a timestamp >= this (seconds since the epoch).
        stop_at_latest: a bounded source: read each partition up to its end offset at the
            first start (kept in the checkpoint, so a restore stops at the same place), then
            end. Partitions are not discovered then.
        key_deserializer: ``"bytes"``, ``"str"``, ``"json"`` or a callable for the key.
        value_deserializer: the same for the value.
        errors: a record whose key or value does not deserialize fails the job with an error
            naming topic, partition and offset (``"fail"``), or is emitted as a
            :class:`~reactive.connectors.kafka.KafkaDeadLetter` in its place
            (``"dead_letter"``).
        max_out_of_orderness: seconds of disorder tolerated per partition; when given, each
            instance generates watermarks per partition (the minimum over its active
            partitions) and windows downstream use the Kafka timestamp as event time. None:
            no watermarks from the source.
        idleness: seconds without records after which a partition no longer holds the
            watermark back (None: never idle).
        partition_discovery_interval: seconds between looks for new partitions (None: only at
            start).
        group_id: commit the offsets of each completed checkpoint to this consumer group, for
            monitoring (lag tools); the source never reads them back.
        isolation_level: ``"read_committed"`` (the default: records of aborted transactions
            are never read) or ``"read_uncommitted"``.
        max_wait: seconds a read waits for data at most (barriers pass between reads).
        client_options: more keyword options for ``aiokafka.AIOKafkaConsumer`` (security,
            fetch sizes, ``check_crcs``).
        columnar: emit one ``pyarrow.RecordBatch`` of :attr:`schema` per fetch of a
            partition instead of records (read it with ``Dataflow.columnar_source``; dead
            letters, with ``errors="dead_letter"``, come beside the batches as
            ``KafkaDeadLetter`` s, the stream's ``dead_letters()``). Values decode as JSON
            objects against ``value_schema`` (``pyarrow.json``; other fields are ignored,
            missing ones and tombstones are nulls) or with ``value_decoder``; keys stay
            bytes. The position is the offset after each batch's last record.
        value_schema: with ``columnar``, the ``pyarrow.Schema`` of the decoded values.
        value_decoder: with ``columnar``, ``list[bytes | None] -> pyarrow.RecordBatch`` (or
            ``Table``) of ``value_schema``, one row per value in order, instead of JSON; it
            must raise only for bad values (a fetch it raises for is bisected to find them).
        metadata_columns: with ``columnar``, the Kafka metadata added after the value
            columns, among ``topic`` (string), ``key`` (binary), ``partition`` (int32),
            ``offset`` (int64) and ``timestamp`` (timestamp[ms, UTC]).
        max_batch_records: with ``columnar``, records fetched per read at most (over all
            partitions; aiokafka's ``max_partition_fetch_bytes`` also bounds a fetch).

    Attributes:
        schema: with ``columnar``, the ``pyarrow.Schema`` of the batches: the value columns,
            then the metadata columns; else None.

    Raises:
        ConfigurationError: on an invalid option.
        reactive.extras.MissingExtraError: when aiokafka is not installed (at the first read).
    """

    state_redistribution: Literal["split", "union"] = "union"

    def __init__(self, bootstrap_servers: str, topics: str | Sequence[str], *,
                 starting_offsets: StartingOffsets = "earliest",
                 starting_timestamp: float | None = None,
                 stop_at_latest: bool = False,
                 key_deserializer: SerializerName | Deserializer = "bytes",
                 value_deserializer: SerializerName | Deserializer = "bytes",
                 errors: Literal["fail", "dead_letter"] = "fail",
                 max_out_of_orderness: float | None = None,
                 idleness: float | None = None,
                 partition_discovery_interval: float | None = 30.0,
                 group_id: str | None = None,
                 isolation_level: Literal["read_committed", "read_uncommitted"] =
                 "read_committed",
                 max_wait: float = 0.05,
                 client_options: Mapping[str, Any] | None = None,
                 columnar: bool = False,
                 value_schema: Any = None,
                 value_decoder: BatchDecoder | None = None,
                 metadata_columns: Sequence[str] = ("key", "partition", "offset",
                                                    "timestamp"),
                 max_batch_records: int = 10_000) -> None:
        self.topics = [topics] if isinstance(topics, str) else list(topics)
        if not self.topics:
            raise ConfigurationError("Kafka source: no topic given")
        if errors not in ("fail", "dead_letter"):
            raise ConfigurationError(
                f"Kafka source: errors must be 'fail' or 'dead_letter', got {errors!r}")
        if not (isinstance(starting_offsets, Mapping)
                or starting_offsets in ("earliest", "latest")):
            raise ConfigurationError("Kafka source: starting_offsets must be 'earliest', "
                                     f"'latest' or a mapping, got {starting_offsets!r}")
        if isolation_level not in ("read_committed", "read_uncommitted"):
            raise ConfigurationError(f"Kafka source: unknown isolation_level {isolation_level!r}")
        if idleness is not None and not idleness > 0:
            raise ConfigurationError(f"Kafka source: idleness must be > 0 seconds, got {idleness}")
        self.columnar = columnar
        self.schema: Any = None
        self.batch_decoder: KafkaBatchDecoder | None = None
        if columnar:
            if max_batch_records < 1:
                raise ConfigurationError(
                    f"Kafka source: max_batch_records must be >= 1, got {max_batch_records}")
            self.batch_decoder = KafkaBatchDecoder(value_schema, metadata_columns,
                                                   value_decoder, errors == "dead_letter")
            self.schema = self.batch_decoder.schema
        elif value_schema is not None or value_decoder is not None:
            raise ConfigurationError("Kafka source: value_schema and value_decoder apply to "
                                     "columnar=True only")
        self.max_batch_records = max_batch_records
        if max_out_of_orderness is not None:
            PartitionWatermarks(max_out_of_orderness, idleness)  # validates the delay
            if columnar and "timestamp" not in metadata_columns:
                raise ConfigurationError("Kafka source: watermarks (max_out_of_orderness) "
                                         "of a columnar source need the 'timestamp' column "
                                         "in metadata_columns")
            self.timestamp_fn = row_timestamp if columnar else record_timestamp
        self.bootstrap_servers = bootstrap_servers
        self.starting_offsets = starting_offsets
        self.starting_timestamp = starting_timestamp
        self.stop_at_latest = stop_at_latest
        self.key_deserializer = deserializer(key_deserializer)
        self.value_deserializer = deserializer(value_deserializer)
        self.errors = errors
        self.max_out_of_orderness = max_out_of_orderness
        self.idleness = idleness
        self.partition_discovery_interval = partition_discovery_interval
        self.group_id = group_id
        self.isolation_level = isolation_level
        self.max_wait = max_wait
        self.client_options = dict(client_options or {})
        # processing time for idleness and discovery (tests substitute a manual clock)
        self.clock: Callable[[], float] = time.monotonic

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        return KafkaSourceReader(self, subtask, parallelism)


# a position entry: [topic, partition, next offset, stopping offset or None]
Entry = list[Any]


class KafkaSourceReader(SourceReader):
    """Reads the partitions that instance ``subtask`` of ``parallelism`` owns
    (:func:`partition_owner`) with one ``AIOKafkaConsumer`` assigned to them (no group
    membership: the checkpoint, not a rebalance, decides who reads what).

    Args:
        source: the source's configuration.
        subtask: this instance.
        parallelism: the number of instances.
    """

    def __init__(self, source: KafkaSource, subtask: int, parallelism: int) -> None:
        self.source = source
        self.subtask = subtask
        self.parallelism = parallelism
        self.positions: dict[tuple[str, int], Entry] = {}  # the partitions this instance owns
        self._restored = False
        self._consumer: Any = None
        self._next_discovery = 0.0
        self._pending_commits: list[tuple[int, dict[tuple[str, int], int]]] = []
        self._watermarks = (None if source.max_out_of_orderness is None else PartitionWatermarks(
            source.max_out_of_orderness, source.idleness, source.clock))

    # ------------------------------------------------------------------ state
    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        if self.source.group_id is not None:
            self._pending_commits.append(
                (checkpoint_id, {k: e[2] for k, e in self.positions.items()}))
        return [list(e) for e in self.positions.values()]

    def restore_state(self, entries: list[Any]) -> None:
        self._restored = True
        self.positions = {}
        for topic, partition, offset, stop in entries:
            if partition_owner(topic, partition, self.parallelism) == self.subtask:
                self.positions[(topic, partition)] = [topic, partition, offset, stop]

    async def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Commit the offsets of checkpoint ``checkpoint_id`` to ``group_id`` (monitoring
        only; a failed commit is logged, it changes nothing about where the source
        resumes)."""
        if self.source.group_id is None or self._consumer is None:
            return
        offsets: dict[tuple[str, int], int] | None = None
        while self._pending_commits and self._pending_commits[0][0] <= checkpoint_id:
            offsets = self._pending_commits.pop(0)[1]
        if not offsets:
            return
        from aiokafka import TopicPartition
        try:
            await self._consumer.commit({TopicPartition(t, p): o for (t, p), o in offsets.items()})
        except Exception as exc:  # monitoring only
            log.warning("Kafka source %d: committing offsets to group %r failed: %r",
                        self.subtask, self.source.group_id, exc)

    # ------------------------------------------------------------------ reading
    async def _start(self) -> None:
        from reactive.extras import require

        require("aiokafka", "kafka", "the Kafka source")
        from aiokafka import AIOKafkaConsumer

        s = self.source
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=s.bootstrap_servers, group_id=s.group_id,
            enable_auto_commit=False, auto_offset_reset="none",
            isolation_level=s.isolation_level, **s.client_options)
        await self._consumer.start()
        await self._discover(first=True)

    async def _discover(self, first: bool = False) -> None:
        """Assign the partitions this instance owns and position the new ones."""
        from aiokafka import TopicPartition

        s = self.source
        consumer = self._consumer
        cluster = await consumer._client.fetch_all_metadata()
        owned = [(t, p) for t in s.topics for p in sorted(cluster.partitions_for_topic(t) or ())
                 if partition_owner(t, p, self.parallelism) == self.subtask]
        if not first and s.stop_at_latest:
            owned = []
        new = [tp for tp in owned if tp not in self.positions]
        if new:
            tps = [TopicPartition(t, p) for t, p in new]
            fresh = first and not self._restored
            starts = await self._starting_offsets(tps, fresh)
            stops = await consumer.end_offsets(tps) if s.stop_at_latest else {}
            for tp in tps:
                self.positions[(tp.topic, tp.partition)] = [
                    tp.topic, tp.partition, starts[tp], stops.get(tp)]
            if not first:
                log.info("Kafka source %d: new partitions %s", self.subtask, new)
        all_tps = [TopicPartition(t, p) for t, p in self.positions]
        if first or new:
            consumer.assign(all_tps)
            for key, entry in self.positions.items():
                consumer.seek(TopicPartition(*key), entry[2])
                if self._watermarks is not None:
                    self._watermarks.add(key)
        interval = s.partition_discovery_interval
        self._next_discovery = float("inf") if interval is None else s.clock() + interval

    async def _starting_offsets(self, tps: list[Any], fresh: bool) -> dict[Any, int]:
        s = self.source
        consumer = self._consumer
        if not fresh:
            return dict(await consumer.beginning_offsets(tps))
        if s.starting_timestamp is not None:
            found = await consumer.offsets_for_times(
                {tp: int(s.starting_timestamp * 1000) for tp in tps})
            ends = await consumer.end_offsets(tps)
            return {tp: (found[tp].offset if found.get(tp) is not None else ends[tp])
                    for tp in tps}
        if s.starting_offsets == "latest":
            return dict(await consumer.end_offsets(tps))
        earliest = dict(await consumer.beginning_offsets(tps))
        if isinstance(s.starting_offsets, Mapping):
            for tp in tps:
                given = s.starting_offsets.get((tp.topic, tp.partition))
                if given is not None:
                    earliest[tp] = max(int(given), earliest[tp])
        return earliest

    def _finished(self) -> bool:
        return all(e[3] is not None and e[2] >= e[3] for e in self.positions.values())

    async def read_batch(self, max_records: int) -> list[Any] | None:
        if self._consumer is None:
            await self._start()
        s = self.source
        if s.stop_at_latest and self._finished():
            return None
        if s.clock() >= self._next_discovery:
            await self._discover()
        from aiokafka.errors import OffsetOutOfRangeError

        if s.batch_decoder is not None:
            max_records = s.max_batch_records
        try:
            fetched = await self._consumer.getmany(timeout_ms=int(s.max_wait * 1000),
                                                   max_records=max_records)
        except OffsetOutOfRangeError as exc:
            raise RuntimeError(
                f"Kafka source: the offsets to resume from are no longer in Kafka "
                f"({exc}); their records were deleted (retention) before this job read them. "
                "Nothing was skipped: restore an older checkpoint, or start fresh") from exc
        out: list[Any] = []
        watermarks = self._watermarks
        for tp, records in fetched.items():
            key = (tp.topic, tp.partition)
            entry = self.positions.get(key)
            if entry is None or not records:
                continue
            stop = entry[3]
            if stop is not None:
                records = [r for r in records if r.offset < stop]
                if not records:
                    continue
            if s.batch_decoder is not None:
                out.extend(s.batch_decoder.decode(tp.topic, tp.partition, records))
            else:
                out.extend(self._convert(tp.topic, tp.partition, records))
            entry[2] = records[-1].offset + 1
            if watermarks is not None:
                watermarks.on_records(key, max(r.timestamp for r in records) / 1000.0)
        if s.stop_at_latest:
            await self._check_stops()
        return out

    async def _check_stops(self) -> None:
        """Partitions whose remaining offsets below the stop are control markers (or
        records of aborted transactions) end by the consumer's position."""
        from aiokafka import TopicPartition

        for key, entry in self.positions.items():
            if entry[3] is not None and entry[2] < entry[3]:
                position = await self._consumer.position(TopicPartition(*key))
                if position >= entry[3]:
                    entry[2] = entry[3]
            if entry[3] is not None and entry[2] >= entry[3] and self._watermarks is not None:
                self._watermarks.finish(key)

    def _convert(self, topic: str, partition: int, records: list[Any]) -> list[Any]:
        kd, vd = self.source.key_deserializer, self.source.value_deserializer
        out: list[Any] = []
        for r in records:
            try:
                key = None if r.key is None else kd(r.key)
                value = None if r.value is None else vd(r.value)
            except Exception as exc:
                reason = f"{type(exc).__name__}: {exc}"
                if self.source.errors == "fail":
                    raise ValueError(
                        f"Kafka source: the record at {topic} partition {partition} offset "
                        f"{r.offset} does not deserialize ({reason}); key={r.key!r:.80} "
                        f"value={r.value!r:.200}; read with errors='dead_letter' to route such "
                        "records to a dead-letter output") from exc
                out.append(KafkaDeadLetter(topic, partition, r.offset, r.timestamp / 1000.0,
                                           r.key, r.value, reason))
                continue
            out.append(KafkaRecord(topic, partition, r.offset, r.timestamp / 1000.0, key, value,
                                   tuple(r.headers) if r.headers else ()))
        return out

    # ------------------------------------------------------------------ event time
    def current_watermark(self) -> float | None:
        return None if self._watermarks is None else self._watermarks.current_watermark()

    def is_idle(self) -> bool:
        return self._watermarks is not None and self._watermarks.is_idle()

    def describe_position(self) -> Any:
        return ", ".join(f"{t}/{p}@{e[2]}" for (t, p), e in sorted(self.positions.items()))

    async def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()
