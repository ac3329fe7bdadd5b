"""The Kafka sink's vectorized encoding of a record batch (``connectors/kafka/batch_encoding.py``):
the messages it makes are byte for byte those of the per-row path (each row of
``to_pylist()`` through the sink's key and value serializers), on the Polars path and on the
orjson path, for every type the CSV source's columnar mode infers; bad rows fail naming the
row as on the per-row path."""

from __future__ import annotations

import io
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reactive.connectors.kafka import KafkaSink, KafkaSinkError, batch_encoding

pa = pytest.importorskip("pyarrow")
pacsv = pytest.importorskip("pyarrow.csv")

CSV = b"\n".join([
    b"word,n,x,ok,at,frac,empty",
    b"alpha,1,0.5,true,2024-01-02 03:04:05,2024-01-02 03:04:05.25,",
    b'"b,""q""",-7,1e20,false,1970-01-01 00:00:00,1970-01-01 00:00:00.5,',
    b",,,,,,",
    "\u00e9\U0001f600,9223372036854775807,-0.0,true,2262-04-11 23:47:16,"
    "2000-01-01 00:00:00.000001,".encode(),
    b'"},{ line\nbreak",0,3.141592653589793,false,2000-02-29 12:00:00,'
    b"2000-02-29 12:00:00.1,",
    b""])


def csv_batch() -> Any:
    """A batch as the CSV source's columnar mode reads it (pyarrow.csv's inference)."""
    table = pacsv.read_csv(io.BytesIO(CSV))
    return table.combine_chunks().to_batches()[0]


def sink(**options: Any) -> KafkaSink:
    return KafkaSink("unused:9092", "t", semantic="at_least_once", **options)


def per_row(s: KafkaSink, batch: Any) -> list[Any]:
    return [s.serialize(row) for row in batch.to_pylist()]


@pytest.fixture(params=["polars", "orjson"])
def path(request, monkeypatch) -> str:
    """Each test once on the Polars path (when installed) and once on orjson's."""
    if request.param == "polars":
        pytest.importorskip("polars")
    else:
        monkeypatch.setattr(batch_encoding, "_polars", lambda: None)
    return str(request.param)


def test_the_csv_sources_types_encode_as_the_per_row_serializer(path):
    batch = csv_batch()
    types = {f.name: str(f.type) for f in batch.schema}
    assert types == {"word": "string", "n": "int64", "x": "double", "ok": "bool",
                     "at": "timestamp[s]", "frac": "timestamp[ns]", "empty": "null"}
    # to_pylist() turns a nanosecond timestamp into pandas.Timestamp, which orjson refuses:
    # both paths fail naming the row
    for encode in (sink().serialize_batch, lambda b: per_row(sink(), b)):
        with pytest.raises(KafkaSinkError, match=r"cannot serialize record.*Timestamp"):
            encode(batch)
    batch = batch.drop_columns(["frac"])
    for key in (None, "word"):
        s = sink(key=key)
        assert s.vectorized
        assert s.serialize_batch(batch) == per_row(s, batch)
    # the path under test is the one taken
    assert (batch_encoding.json_values_by_polars(batch) is not None) == (path == "polars")
    micros = pa.record_batch([batch.column("at").cast(pa.timestamp("us"))], ["at"])
    assert sink().serialize_batch(micros) == per_row(sink(), micros)  # orjson's on both
    utc = pa.record_batch([batch.column("at").cast(pa.timestamp("s", tz="UTC"))], ["at"])
    assert sink().serialize_batch(utc) == per_row(sink(), utc)


def test_keys_through_each_serializer(path):
    batch = pa.record_batch({"s": ["a", None, "é"], "i": [1, 2, None], "v": [1.5, 2.5, 3.5]})
    for column, key_serializer in [("s", "str"), ("s", "bytes"), ("i", "json"),
                                   ("s", "json"), ("i", lambda k: str(k * 2).encode())]:
        s = sink(key=column, key_serializer=key_serializer)
        assert s.serialize_batch(batch) == per_row(s, batch)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.none(), st.text()),
                          st.one_of(st.none(), st.integers(-2**63, 2**63 - 1)),
                          st.one_of(st.none(), st.floats()), st.booleans(),
                          # seconds from year 1 to 9999 (Python's datetime range)
                          st.one_of(st.none(), st.integers(-62135596800, 253402300799))),
                min_size=1, max_size=30))
def test_any_values_encode_as_the_per_row_serializer(rows):
    batch = pa.record_batch({"s": pa.array([r[0] for r in rows], pa.string()),
                             "i": pa.array([r[1] for r in rows], pa.int64()),
                             "f": pa.array([r[2] for r in rows], pa.float64()),
                             "b": pa.array([r[3] for r in rows], pa.bool_()),
                             "t": pa.array([r[4] for r in rows], pa.timestamp("s")),
                             "u": pa.array([r[4] for r in rows], pa.timestamp("s", tz="UTC"))})
    if batch_encoding._polars() is not None:  # the Polars path is the one under test
        assert batch_encoding.json_values_by_polars(batch) is not None
    s = sink(key="s")
    assert s.serialize_batch(batch) == per_row(s, batch)


def test_a_bad_row_fails_naming_it_as_the_per_row_path(path):
    batch = pa.record_batch({"k": [1, 2], "v": ["a", "b"]})
    with pytest.raises(KafkaSinkError, match=r"cannot serialize record \{'k': 1, 'v': 'a'\}"):
        sink(key="k").serialize_batch(batch)  # 'str' takes str or bytes
    with pytest.raises(KafkaSinkError, match="no key column 'word'"):
        sink(key="word").serialize_batch(batch)
    big = pa.record_batch({"v": ["x", "y" * 200, "z"]})
    with pytest.raises(KafkaSinkError, match=r"record \{'v': 'yyy.*more than max_request_size"):
        sink(max_request_size=100).serialize_batch(big)


def test_other_configurations_take_the_per_row_path():
    batch = pa.record_batch({"k": ["a", "b"], "v": [1, 2]})
    for s in [sink(value=lambda r: r["v"]), sink(value_serializer="str", value=str),
              sink(key=lambda r: r["k"]), sink(headers=lambda r: [("h", b"1")])]:
        assert not s.vectorized
        assert s.serialize_all([batch]) == per_row(s, batch)
    mixed = sink(key="k")
    assert mixed.serialize_all([{"k": "z", "v": 0}, batch]) == [
        mixed.serialize({"k": "z", "v": 0}), *per_row(mixed, batch)]


def test_csv_values_are_the_rows_written_one_at_a_time():
    batch = csv_batch()  # a string with a line end: the row-by-row fallback
    for b in (batch, batch.slice(0, 4)):  # and without: one write, split
        rows = []
        for i in range(b.num_rows):
            out = io.BytesIO()
            pacsv.write_csv(b.slice(i, 1), out, pacsv.WriteOptions(include_header=False))
            rows.append(out.getvalue().removesuffix(b"\n"))
        assert batch_encoding.encode_csv_values(b) == rows
        s = sink(key="word", value_serializer="csv")
        keys = [None if w is None else w.encode() for w in b.column("word").to_pylist()]
        assert s.serialize_batch(b) == [(k, v, None) for k, v in zip(keys, rows, strict=True)]
    assert rows[0] == b'"alpha",1,0.5,true,2024-01-02 03:04:05,2024-01-02 03:04:05.250000000,'
    assert rows[2] == b'"",,,,,,'  # an empty string is quoted, a null empty


def test_csv_refuses_records_and_types_it_cannot_hold():
    s = sink(value_serializer="csv")
    with pytest.raises(KafkaSinkError, match=r"cannot serialize record \{'a': 1\}.*record batch"):
        s.serialize_all([{"a": 1}])
    nested = pa.record_batch({"l": pa.array([[1, 2]])})
    with pytest.raises(KafkaSinkError, match="as CSV"):
        s.serialize_batch(nested)
    from reactive.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="csv"):
        sink(value_serializer="csv", value=lambda r: r["a"])


def csv_decoder(schema: Any) -> Any:
    """A columnar Kafka source's ``value_decoder`` of the CSV lines the sink writes."""
    def decode(values: list[bytes | None]) -> Any:
        return pacsv.read_csv(
            io.BytesIO(b"\n".join(v or b"" for v in values)),
            read_options=pacsv.ReadOptions(column_names=schema.names),
            parse_options=pacsv.ParseOptions(newlines_in_values=True),
            convert_options=pacsv.ConvertOptions(column_types=schema,
                                                 strings_can_be_null=True,
                                                 quoted_strings_can_be_null=False))
    return decode


def round_trip_table() -> Any:
    """600 rows of the CSV source's types, with nulls in every column."""
    n = 600
    return pa.table({
        "word": pa.array([None if i % 97 == 0 else f"w{i % 13}-é" for i in range(n)]),
        "n": pa.array(range(n), pa.int64()),
        "x": pa.array([None if i % 11 == 0 else i / 8 - 20 for i in range(n)], pa.float64()),
        "ok": pa.array([None if i % 7 == 0 else i % 3 == 0 for i in range(n)]),
        "at": pa.array([None if i % 5 == 0 else 1_700_000_000 + i for i in range(n)],
                       pa.timestamp("s")),
    })


@pytest.mark.e2e
@pytest.mark.parametrize("semantic,values", [("exactly_once", "json"),
                                             ("at_least_once", "json"), ("exactly_once", "csv")])
async def test_a_columnar_stream_round_trips_through_kafka(kafka_cluster, tmp_path, semantic,
                                                          values):
    """Record batches written by the sink (vectorized) and read back by the columnar Kafka
    source give the same table; exactly once, a failure between checkpoints (the job
    restarts from the last one and replays its batches) leaves every row in Kafka once. JSON
    values decode by the source's JSON parse, CSV values by a ``pyarrow.csv`` decoder."""
    from reactive import CheckpointConfig, Dataflow, RestartStrategy
    from reactive.connectors.kafka import KafkaSource, read_committed
    from reactive.testing import TestingSource
    from tests.kafka_cluster import CLIENT_OPTIONS

    table = round_trip_table()
    topic = f"batch-rt-{semantic}-{values}"
    items: list[Any] = []
    for i, batch in enumerate(table.to_batches(max_chunksize=50)):
        if i in (4, 8):
            items.append(TestingSource.CHECKPOINT)  # a checkpoint completes here
        if i == 10 and semantic == "exactly_once":
            items.append(TestingSource.ABORT)  # fails once, past the second checkpoint
        items.append(batch)
    batches = TestingSource(items, batch_size=1)
    batches.schema = table.schema  # type: ignore[attr-defined]
    sink = KafkaSink(kafka_cluster.bootstrap_servers, topic, semantic=semantic,
                     transactional_id_prefix=topic, key="word", value_serializer=values,
                     marker_reader_options=CLIENT_OPTIONS)
    assert sink.vectorized
    flow = Dataflow(f"kafka-batch-round-trip-{semantic}-{values}")
    flow.columnar_source(batches, name="batches").sink(sink, name="kafka")
    await flow.run(checkpoints=CheckpointConfig(interval=0.02, directory=str(tmp_path)),
                   restart=RestartStrategy.fixed(1, 0.0))
    assert batches.aborts_raised == (1 if semantic == "exactly_once" else 0)

    committed = await read_committed(kafka_cluster.bootstrap_servers, topic, CLIENT_OPTIONS)
    assert len(committed) == table.num_rows  # each row once: none lost, none replayed
    assert sorted((r.key or b"") for r in committed) == sorted(
        (w or "").encode() for w in table.column("word").to_pylist())

    back: list[Any] = []
    read = Dataflow(f"kafka-batch-read-{semantic}-{values}")
    read.columnar_source(KafkaSource(
        kafka_cluster.bootstrap_servers, topic, columnar=True, value_schema=table.schema,
        value_decoder=csv_decoder(table.schema) if values == "csv" else None,
        metadata_columns=(), stop_at_latest=True, client_options=CLIENT_OPTIONS)
    ).sink(back.append)
    await read.run()
    got = pa.Table.from_batches(back, schema=table.schema).sort_by("n")
    assert got.equals(table)
