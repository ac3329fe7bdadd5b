"""The Kafka sink's encoding of record batches: per row against vectorized, then a columnar
job writing to Kafka both ways.

    python -m bench.kafka_sink_encoding [--records 200000] [--job-records 40000]
                                        [--batch 10000] [--rounds 3] [--no-job]

The input is ``--records`` rows of the types the CSV source infers: ``word`` (string,
Zipf(1.1) over 10,000 words, ``bench.common.zipf_keys``, numpy seed 42), ``n`` (int64),
``x`` (float64), ``ok`` (bool) and ``at`` (timestamp[s]), cut into record batches of
``--batch`` rows. Encoding (no Kafka): ``KafkaSink.serialize_all`` over every batch, the
message keyed by the ``word`` column, value the row as JSON:

- per row: the sink's per-row path (``RecordBatch.to_pylist()``, then the key and value
  serializers per row, orjson), forced with ``vectorized = False``;
- vectorized, orjson: ``connectors/kafka/batch_encoding.py`` with Polars hidden (orjson over
  the batch's rows in one call, split at the separators);
- vectorized, Polars: the same with Polars' NDJSON writer (when Polars is installed);
- CSV values, vectorized: ``value_serializer="csv"`` (``pyarrow.csv.write_csv`` split by
  line; other bytes than the JSON rows, so its ratio is to the per-row JSON path).

Each variant's messages must equal the per-row ones (SystemExit otherwise). The job (unless
``--no-job``) writes the first ``--job-records`` rows (the mock keeps only a few MB per
partition and silently drops older data): ``Dataflow.from_arrow(table, batch_size=--batch)``
-> ``KafkaSink`` exactly once (checkpoints every 1 s, p=1) into librdkafka's mock cluster
started in this process (``examples/flights_kafka.py``'s ``MockCluster``), per row
(``key=lambda r: r["word"]``) against vectorized (``key="word"``); each run writes to a new
topic and must leave exactly ``--job-records`` committed records there (``read_committed``).
Records/s are min / median / max over ``--rounds``; the last column is the median's ratio to
the per-row median of the same kind of run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from typing import Any

from bench.common import print_table, zipf_keys


def make_table(records: int) -> Any:
    import pyarrow as pa

    words = zipf_keys(records, 10_000)
    return pa.table({
        "word": pa.array(words, pa.string()),
        "n": pa.array(range(records), pa.int64()),
        "x": pa.array([i / 8 for i in range(records)], pa.float64()),
        "ok": pa.array([i % 3 == 0 for i in range(records)], pa.bool_()),
        "at": pa.array([1_700_000_000 + i for i in range(records)], pa.timestamp("s")),
    })


def encoding_rates(table: Any, batch: int, rounds: int) -> dict[str, list[float]]:
    """Records/s of each encoding variant, ``rounds`` times, interleaved."""
    from reactive.connectors.kafka import KafkaSink, batch_encoding

    batches = table.to_batches(max_chunksize=batch)
    sink = KafkaSink("unused:9092", "t", semantic="at_least_once", key="word")
    with_polars = batch_encoding._polars
    variants: list[tuple[str, bool, Any]] = [("per row", False, with_polars),
                                             ("vectorized, orjson", True, lambda: None)]
    if with_polars() is not None:
        variants.append(("vectorized, Polars", True, with_polars))
    csv_sink = KafkaSink("unused:9092", "t", semantic="at_least_once", key="word",
                         value_serializer="csv")
    expected = None
    rates: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    rates["CSV values, vectorized"] = []
    try:
        for _ in range(rounds):
            for name, vectorized, polars in variants:
                sink.vectorized = vectorized
                batch_encoding._polars = polars  # type: ignore[assignment]
                started = time.perf_counter()
                out = sink.serialize_all(batches)
                elapsed = time.perf_counter() - started
                if expected is None:
                    expected = out
                elif out != expected:
                    raise SystemExit(f"error: {name} wrote other bytes than per row")
                rates[name].append(table.num_rows / elapsed)
                print(f"  encode, {name}: {rates[name][-1]:,.0f} records/s", flush=True)
            started = time.perf_counter()
            csv_sink.serialize_all(batches)
            name = "CSV values, vectorized"
            rates[name].append(table.num_rows / (time.perf_counter() - started))
            print(f"  encode, {name}: {rates[name][-1]:,.0f} records/s", flush=True)
    finally:
        batch_encoding._polars = with_polars  # type: ignore[assignment]
    return rates


async def job(bootstrap: str, table: Any, batch: int, vectorized: bool, topic: str) -> float:
    """Seconds of one job writing ``table`` to ``topic``; checks what Kafka committed."""
    from bench.kafka import CLIENT_OPTIONS
    from reactive import CheckpointConfig, Dataflow
    from reactive.connectors.kafka import KafkaSink, read_committed

    def word(row: Any) -> Any:
        return row["word"]

    sink = KafkaSink(bootstrap, topic, transactional_id_prefix=topic,
                     key="word" if vectorized else word, marker_reader_options=CLIENT_OPTIONS)
    flow = Dataflow(f"kafka-sink-{topic}", parallelism=1)
    flow.from_arrow(table, batch_size=batch).sink(sink)
    with tempfile.TemporaryDirectory() as d:
        started = time.perf_counter()
        await flow.run(checkpoints=CheckpointConfig(interval=1.0, directory=d))
        elapsed = time.perf_counter() - started
    committed = await read_committed(bootstrap, topic, CLIENT_OPTIONS)
    if len(committed) != table.num_rows:
        raise SystemExit(f"error: {topic} holds {len(committed):,} committed records, "
                         f"expected {table.num_rows:,}")
    return elapsed


def job_rates(table: Any, batch: int, rounds: int) -> dict[str, list[float]]:
    from bench.kafka import mock_cluster
    from reactive.runtime.loop import run_coroutine

    cluster = mock_cluster()
    rates: dict[str, list[float]] = {"job, per row": [], "job, vectorized": []}
    try:
        for r in range(rounds):
            for name, vectorized in [("job, per row", False), ("job, vectorized", True)]:
                topic = f"bench-sink-{'vec' if vectorized else 'row'}-{r}"
                elapsed = run_coroutine(job(cluster.bootstrap_servers, table, batch,
                                            vectorized, topic))
                rates[name].append(table.num_rows / elapsed)
                print(f"  {name}: {rates[name][-1]:,.0f} records/s", flush=True)
    finally:
        cluster.close()
    return rates


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description="Kafka sink: per-row vs vectorized encoding")
    p.add_argument("--records", type=int, default=200_000)
    p.add_argument("--job-records", type=int, default=40_000,
                   help="rows of the job writing to the mock cluster")
    p.add_argument("--batch", type=int, default=10_000, help="rows per record batch")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-job", action="store_true", help="only the encoding table")
    args = p.parse_args(argv)
    table = make_table(args.records)
    rates = encoding_rates(table, args.batch, args.rounds)
    if not args.no_job:
        rates.update(job_rates(table.slice(0, args.job_records), args.batch, args.rounds))
    print(f"\nKafka sink encoding: {args.records:,} rows (string, int64, float64, bool, "
          f"timestamp[s]) in batches of {args.batch:,}, keyed by word, JSON values, "
          f"{args.rounds} round(s); the jobs {min(args.job_records, args.records):,} rows, "
          "exactly once into the mock cluster, p=1, checkpoints every 1 s")
    rows = []
    for name, r in rates.items():
        base = statistics.median(rates["job, per row" if name.startswith("job") else
                                       "per row"])
        rows.append([name, min(r), statistics.median(r), max(r),
                     statistics.median(r) / base])
    return print_table(["run", "min records/s", "median records/s", "max records/s",
                        "median vs per row"], rows)


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    main()
