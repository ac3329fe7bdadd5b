"""Kafka -> keyed count -> Kafka: the exactly-once sink, the at-least-once sink and a plain
aiokafka consume-produce loop, on the same input, against one mock cluster.

    python -m bench.kafka [--records 200000] [--vocabulary 10000] [--parallelism 1,2]
                          [--interval 1.0] [--rounds 1] [--no-verify]
                          [--png PATH]

The cluster is librdkafka's mock cluster (the ``confluent-kafka`` wheel; the ``test``
extra), started in this process (``examples/flights_kafka.py``'s ``MockCluster``): its
broker threads share the machine's 2 cores with the runs, the same for each. The input is
``--records`` Zipf(1.1) words (``bench.common.zipf_keys``, numpy seed 42) produced once,
round robin over the topic's 4 partitions, uncompressed; the mock keeps only a few MB per
partition, so the run checks that every partition still starts at offset 0 (and fails
loudly otherwise). Then, in this order, each run reading the whole topic and writing
``[word, n]`` (JSON, key = the word) for the n-th occurrence of each word to a topic of its
own:

- plain loop: one ``AIOKafkaConsumer`` assigned to the 4 partitions, ``getmany`` -> count in
  a dict -> ``AIOKafkaProducer.send`` (acks=all, idempotent: the producer settings of the
  sink), no checkpoints, until the end offsets of the start; the baseline;
- pipeline, at least once: ``KafkaSource(stop_at_latest=True) -> key_by -> count
  (KeyedProcessFunction, heap backend) -> KafkaSink(semantic="at_least_once")``,
  checkpoints every ``--interval`` s (the sink flushes at each);
- pipeline, exactly once: the same with the transactional sink (each checkpoint's records
  are sent with a commit marker in one Kafka transaction when the checkpoint completes).

The pipelines run at each ``--parallelism`` (all instances share one event loop). Records/s
is input records over the wall time from the start (consumer start-up included) until the
output is in Kafka (flushed; committed for exactly once: the final checkpoint's commit
included). Unless ``--no-verify``, each output topic is then read back (committed records
only, ``read_committed``) and must hold exactly one record per input record. ``--png PATH``
also draws the ratio column as a bar chart (``bench/figures.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import peak_rss_mb, print_table, zipf_keys
from bench.figures import write_ratio_png
from reactive import CheckpointConfig, Dataflow, KeyedProcessFunction, ValueStateDescriptor

ROOT = Path(__file__).resolve().parent.parent
INPUT = "bench-words"
PARTITIONS = 4  # the mock cluster creates topics with 4 partitions
CLIENT_OPTIONS = {"check_crcs": False}  # aiokafka against the mock cluster


class Count(KeyedProcessFunction):
    """``(word, n)`` for the n-th occurrence of the word of a Kafka record."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def process_element(self, record: Any, ctx: Any) -> Any:
        n = self.count.value() + 1
        self.count.update(n)
        return [(ctx.current_key, n)]


def mock_cluster() -> Any:
    """librdkafka's mock cluster in this process (``examples/flights_kafka.py``)."""
    sys.path.insert(0, str(ROOT / "examples"))
    from flights_kafka import MockCluster

    return MockCluster()


def produce_input(cluster: Any, words: list[str]) -> None:
    """Produce ``words`` round robin over the input topic's partitions, check none was
    dropped."""
    import confluent_kafka

    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.bootstrap_servers,
                                         "log_level": 3, "linger.ms": 20})
    for i, w in enumerate(words):
        while True:
            try:
                producer.produce(INPUT, w.encode(), partition=i % PARTITIONS)
                break
            except BufferError:  # the local queue is full: let deliveries drain
                producer.poll(0.1)
    if producer.flush(60):
        raise SystemExit("error: the mock cluster did not take every input record")
    cluster.check_complete(INPUT, len(words))  # SystemExit if the mock dropped any


async def plain_loop(bootstrap: str, output: str) -> float:
    """Records/s of a consume-count-produce loop on aiokafka alone."""
    import orjson
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    started = time.perf_counter()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest", **CLIENT_OPTIONS)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                enable_idempotence=True)
    await consumer.start()
    await producer.start()
    try:
        tps = [TopicPartition(INPUT, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        left = {tp for tp in tps if ends[tp] > 0}
        counts: dict[str, int] = {}
        get = counts.get
        dumps = orjson.dumps
        records = 0
        futures = []
        while left:
            fetched = await consumer.getmany(timeout_ms=50)
            for tp, batch in fetched.items():
                for r in batch:
                    word = r.value.decode()
                    n = get(word, 0) + 1
                    counts[word] = n
                    futures.append(await producer.send(output, dumps((word, n)),
                                                       key=r.value))
                records += len(batch)
                if batch and batch[-1].offset + 1 >= ends[tp]:
                    left.discard(tp)
            if len(futures) > 50_000:
                await asyncio.gather(*futures)
                futures.clear()
        await producer.flush()
        await asyncio.gather(*futures)
    finally:
        await consumer.stop()
        await producer.stop()
    return records / (time.perf_counter() - started)


async def pipeline(bootstrap: str, output: str, semantic: str, parallelism: int,
                   interval: float, directory: str) -> tuple[float, Any]:
    """Records/s of the keyed count between a Kafka source and sink; and the finished job."""
    from reactive.connectors.kafka import KafkaSink, KafkaSource

    flow = Dataflow(f"kafka-{semantic.replace('_', '-')}-p{parallelism}",
                    parallelism=parallelism, max_parallelism=128)
    sink = KafkaSink(bootstrap, output, semantic=semantic,
                     transactional_id_prefix=f"bench-{output}", key=lambda r: r[0],
                     marker_reader_options=CLIENT_OPTIONS)
    (flow.source(KafkaSource(bootstrap, INPUT, stop_at_latest=True, value_deserializer="str",
                             partition_discovery_interval=None,
                             client_options=CLIENT_OPTIONS), name="words").uid("words")
         .key_by(lambda r: r.value)
         .process(Count()).uid("count")
         .sink(sink).uid("kafka-out"))
    started = time.perf_counter()
    job = await flow.run(checkpoints=CheckpointConfig(interval=interval, directory=directory))
    records = job.metrics.operators["words"]["records_out"]
    return records / (time.perf_counter() - started), job


def verify(cluster: Any, topic: str, expected: int) -> int:
    """The committed records of ``topic``; SystemExit unless exactly ``expected`` and none
    dropped by the mock."""
    from reactive.connectors.kafka import read_committed
    from reactive.runtime.loop import run_coroutine

    cluster.check_complete(topic)
    n = len(run_coroutine(read_committed(cluster.bootstrap_servers, topic, CLIENT_OPTIONS)))
    if n != expected:
        raise SystemExit(f"error: {topic!r} holds {n:,} committed records, expected "
                         f"{expected:,}")
    return n


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description="Kafka -> keyed count -> Kafka benchmark")
    p.add_argument("--records", type=int, default=200_000)
    p.add_argument("--vocabulary", type=int, default=10_000)
    p.add_argument("--parallelism", default="1,2",
                   help="comma-separated parallelisms of the pipelines (default: %(default)s)")
    p.add_argument("--interval", type=float, default=1.0, help="checkpoint interval, seconds")
    p.add_argument("--rounds", type=int, default=1,
                   help="run every variant this many times; the table shows the median")
    p.add_argument("--no-verify", dest="verify", action="store_false",
                   help="do not read the output topics back")
    p.add_argument("--png", default=None, help="also draw the ratios as a bar chart PNG")
    args = p.parse_args(argv)
    parallelisms = [int(x) for x in args.parallelism.split(",")]
    from reactive.runtime.loop import run_coroutine

    cluster = mock_cluster()
    words = zipf_keys(args.records, args.vocabulary)
    t = time.perf_counter()
    produce_input(cluster, words)
    print(f"input: {args.records:,} words produced to {INPUT!r} ({PARTITIONS} partitions) in "
          f"{time.perf_counter() - t:.1f} s; mock cluster at {cluster.bootstrap_servers}",
          flush=True)
    bootstrap = cluster.bootstrap_servers
    variants: list[tuple[str, str | None, int]] = [("plain aiokafka loop", None, 1)]
    for par in parallelisms:
        variants += [(f"pipeline, at least once, p={par}", "at_least_once", par),
                     (f"pipeline, exactly once, p={par}", "exactly_once", par)]
    rates: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    checkpoints: dict[str, list[int]] = {name: [] for name, _, _ in variants}
    run = 0
    for _ in range(args.rounds):
        for name, semantic, par in variants:
            run += 1
            output = f"bench-out-{run}"
            if semantic is None:
                rate = run_coroutine(plain_loop(bootstrap, output))
            else:
                with tempfile.TemporaryDirectory() as d:
                    rate, job = run_coroutine(pipeline(bootstrap, output, semantic, par,
                                                       args.interval, d))
                checkpoints[name].append(job.metrics.totals.completed)
            rates[name].append(rate)
            if args.verify:
                verify(cluster, output, args.records)
            print(f"  {name}: {rate:,.0f} records/s", flush=True)
    base = statistics.median(rates[variants[0][0]])
    print(f"\nKafka -> keyed count -> Kafka: {args.records:,} Zipf(1.1) words over "
          f"{args.vocabulary:,}, {PARTITIONS} partitions, mock cluster in process, checkpoints "
          f"every {args.interval:g} s, median of {args.rounds} round(s)"
          + ("; output verified (one committed record per input record)" if args.verify
             else ""))
    rows = []
    for name, semantic, _ in variants:
        rate = statistics.median(rates[name])
        chk = (f"{statistics.median(checkpoints[name]):g}" if semantic is not None else "-")
        rows.append([name, rate, rate / base, chk])
    table = print_table(["run", "records/s", "vs plain loop", "checkpoints"], rows)
    if args.png:
        print()
        write_ratio_png(table, args.png, f"Kafka -> keyed count -> Kafka, {args.records:,} "
                        "records (mock cluster)")
    print(f"\npeak RSS {peak_rss_mb():,.0f} MiB")
    cluster.close()
    return table


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    main()
