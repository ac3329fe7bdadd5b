"""The Kafka source per record against its columnar mode (one record batch per fetch of a
partition), on the same topic of JSON values, against one mock cluster.

    python -m bench.kafka_columnar [--records 200000] [--vocabulary 10000] [--rounds 3]
                                   [--interval 1.0]

The cluster is librdkafka's mock cluster (the ``confluent-kafka`` wheel; the ``test``
extra), started in this process (``examples/flights_kafka.py``'s ``MockCluster``): its
broker threads share the machine's cores with the runs, the same for each. The input is
``--records`` JSON objects ``{"word": w, "n": i}`` with Zipf(1.1) words
(``bench.common.zipf_keys``, numpy seed 42), produced once round robin over the topic's 4
partitions; the run checks that the mock dropped none. Then, per round and in this order,
each run reads the whole topic (``stop_at_latest``) at parallelism 1 with checkpoints every
``--interval`` s (heap backend):

- read, per record: ``KafkaSource(value_deserializer="json")`` (orjson) -> a callback sink
  counting the records;
- read, columnar: ``KafkaSource(columnar=True, value_schema=...)`` (``pyarrow.json``, key,
  partition, offset and timestamp columns) -> a callback sink adding up the batches' rows;
- keyed count, per record: the same source -> ``key_by(value["word"])`` -> a running count
  (``KeyedProcessFunction``, one ``(word, n)`` per record) -> a counting sink;
- keyed count, columnar: the columnar source -> ``key_by("word").agg(count=...)`` (the
  changelog: one row per input row) -> a sink adding up the rows.

Records/s is input records over the wall time of the run (consumer start-up included); every
run must see exactly ``--records`` rows (SystemExit otherwise). The table shows min / median
/ max over ``--rounds`` and the median's ratio to the per-record run of the same job.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from typing import Any

from bench.common import peak_rss_mb, print_table, zipf_keys
from bench.kafka import CLIENT_OPTIONS, PARTITIONS, Count, mock_cluster
from reactive import CheckpointConfig, Dataflow

INPUT = "bench-json-words"


def produce_input(cluster: Any, words: list[str]) -> None:
    """Produce ``{"word": w, "n": i}`` round robin over the partitions; check none dropped."""
    import confluent_kafka

    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.bootstrap_servers,
                                         "log_level": 3, "linger.ms": 20})
    for i, w in enumerate(words):
        value = json.dumps({"word": w, "n": i}).encode()
        while True:
            try:
                producer.produce(INPUT, value, partition=i % PARTITIONS)
                break
            except BufferError:  # the local queue is full: let deliveries drain
                producer.poll(0.1)
    if producer.flush(60):
        raise SystemExit("error: the mock cluster did not take every input record")
    cluster.check_complete(INPUT, len(words))  # SystemExit if the mock dropped any


def source(bootstrap: str, columnar: bool) -> Any:
    from reactive.connectors.kafka import KafkaSource

    if not columnar:
        return KafkaSource(bootstrap, INPUT, stop_at_latest=True, value_deserializer="json",
                           partition_discovery_interval=None, client_options=CLIENT_OPTIONS)
    import pyarrow as pa

    return KafkaSource(bootstrap, INPUT, stop_at_latest=True, columnar=True,
                       value_schema=pa.schema([("word", pa.string()), ("n", pa.int64())]),
                       partition_discovery_interval=None, client_options=CLIENT_OPTIONS)


async def run(bootstrap: str, columnar: bool, keyed: bool, interval: float) -> tuple[float,
                                                                                       int]:
    """Records/s of one run, and the rows its sink saw."""
    seen = [0]

    def count_rows(batch: Any) -> None:
        seen[0] += batch.num_rows

    def count_record(record: Any) -> None:
        seen[0] += 1

    flow = Dataflow(f"kafka-{'columnar' if columnar else 'records'}-{'count' if keyed else 'read'}",
                    parallelism=1, max_parallelism=128)
    if columnar:
        stream = flow.columnar_source(source(bootstrap, True), name="words")
        if keyed:
            stream = stream.key_by("word").agg(count=("word", "count"))
        stream.sink(count_rows)
    else:
        records = flow.source(source(bootstrap, False), name="words")
        if keyed:
            records = records.key_by(lambda r: r.value["word"]).process(Count())
        records.sink(count_record)
    with tempfile.TemporaryDirectory() as d:
        started = time.perf_counter()
        await flow.run(checkpoints=CheckpointConfig(interval=interval, directory=d))
        elapsed = time.perf_counter() - started
    return elapsed, seen[0]


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description="Kafka source: per record vs columnar")
    p.add_argument("--records", type=int, default=200_000)
    p.add_argument("--vocabulary", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--interval", type=float, default=1.0, help="checkpoint interval, seconds")
    args = p.parse_args(argv)
    import pyarrow.json  # noqa: F401 - imported once before the timed runs

    import reactive.columnar  # noqa: F401
    from reactive.runtime.loop import run_coroutine

    cluster = mock_cluster()
    produce_input(cluster, zipf_keys(args.records, args.vocabulary))
    bootstrap = cluster.bootstrap_servers
    variants = [("read, per record", False, False), ("read, columnar", True, False),
                ("keyed count, per record", False, True), ("keyed count, columnar", True, True)]
    rates: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    for _ in range(args.rounds):
        for name, columnar, keyed in variants:
            elapsed, seen = run_coroutine(run(bootstrap, columnar, keyed, args.interval))
            if seen != args.records:
                raise SystemExit(f"error: {name} saw {seen:,} rows, expected {args.records:,}")
            rates[name].append(args.records / elapsed)
            print(f"  {name}: {rates[name][-1]:,.0f} records/s", flush=True)
    print(f"\nKafka source per record vs columnar: {args.records:,} JSON records, "
          f"{PARTITIONS} partitions, mock cluster in process, p=1, checkpoints every "
          f"{args.interval:g} s, {args.rounds} round(s)")
    rows = []
    for name, _, keyed in variants:
        base = statistics.median(rates[variants[2 if keyed else 0][0]])
        r = rates[name]
        rows.append([name, min(r), statistics.median(r), max(r),
                     statistics.median(r) / base])
    table = print_table(["run", "min records/s", "median records/s", "max records/s",
                         "median vs per record"], rows)
    print(f"\npeak RSS {peak_rss_mb():,.0f} MiB")
    cluster.close()
    return table


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    main()
