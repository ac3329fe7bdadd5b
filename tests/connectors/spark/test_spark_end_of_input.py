"""A bounded source's end of input on Spark costs no micro-batch of its own: the
end-of-input marker rides in the micro-batch that reads the last record (for line files,
CSV files and collections, trailing empty files included), and a key-group query (no
timers) runs no micro-batch without input after it. The output stays the embedded run's,
each key's state carried into the micro-batch that holds the marker."""

from __future__ import annotations

import collections
import json
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reactive import Dataflow
from reactive.connectors.collections import CollectionSource
from reactive.connectors.files import CommittingFileSink, CsvFileSource, LineFileSource
from reactive.connectors.spark import SparkRunner, list_part_files
from reactive.connectors.spark.key_group_plan import KEY_GROUP_SHAPE
from reactive.connectors.spark.runner import NO_DATA_MICRO_BATCHES
from reactive.connectors.spark.stream_source import ReactiveSource, source_options
from tests.support import Count, pickled_by_value


@pytest.fixture(scope="module")
def spark(spark: Any) -> Iterator[Any]:
    """The test session's SparkSession; the workers unpickle this module's functions by value."""
    with pickled_by_value(__name__):
        yield spark


def micro_batches(kind: str, source: Any, limit: int) -> list[tuple[Any, Any]]:
    """The ``(start, end)`` offsets of the micro-batches a query makes of ``source``."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    r = ReactiveSource(options=source_options(kind, source, limit, 1)).streamReader(None)
    spans, start = [], r.initialOffset()
    while (end := r.latestOffset(start, ReadMaxRows(limit))) != start:
        spans.append((start, end))
        start = end
    return spans


def records_of(kind: str, source: Any, limit: int) -> list[list[Any]]:
    """The records of each micro-batch (the end-of-input marker as None)."""
    r = ReactiveSource(options=source_options(kind, source, limit, 1)).streamReader(None)
    out = []
    for start, end in micro_batches(kind, source, limit):
        batch = []
        for part in r.partitions(start, end):
            for b in r.read(part):
                batch += [None if d is None else pickle.loads(d)
                          for d in b.column("record").to_pylist()]
        out.append(batch)
    return out


@pytest.mark.parametrize("limit", [5, 6, 7, 100])
def test_line_files_end_in_the_micro_batch_of_their_last_line(
        tmp_path: Path, limit: int) -> None:
    # 12 + 6 lines, then an empty file: with limit 6 the second-to-last file ends exactly
    # at a micro-batch's end, and only an empty file follows
    (tmp_path / "a.txt").write_text("".join(f"a{i}\n" for i in range(12)))
    (tmp_path / "b.txt").write_text("".join(f"b{i}\n" for i in range(6)))
    (tmp_path / "c.txt").write_text("")
    batches = records_of("lines", LineFileSource(tmp_path), limit)
    assert len(batches) == -(-18 // limit)  # no micro-batch for the marker alone
    flat = [r for b in batches for r in b]
    assert flat == [f"a{i}" for i in range(12)] + [f"b{i}" for i in range(6)] + [None]
    assert all(None not in b for b in batches[:-1])


@pytest.mark.parametrize("limit", [4, 10, 11, 1000])
def test_a_collection_ends_in_the_micro_batch_of_its_last_item(limit: int) -> None:
    items = list(range(20))
    batches = records_of("collection", CollectionSource(items), limit)
    assert len(batches) == -(-20 // limit)
    assert [r for b in batches for r in b] == [*items, None]
    assert micro_batches("collection", CollectionSource([]), limit) == [
        ({"index": 0, "done": False}, {"index": 0, "done": True})]  # the marker alone


@pytest.mark.parametrize("limit", [3, 10, 1000])
def test_csv_files_end_in_the_micro_batch_of_their_last_row(
        tmp_path: Path, limit: int) -> None:
    (tmp_path / "a.csv").write_text("k,v\n" + "".join(f"a{i},{i}\n" for i in range(10)))
    (tmp_path / "b.csv").write_text("k,v\n")  # a header and no row
    # one row per block: a micro-batch ends at the limit, and a file's end is found after it
    source = CsvFileSource(tmp_path, column_types={"v": "int64"}, block_size=8)
    batches = records_of("csv", source, limit)
    assert len(batches) == -(-10 // limit)
    assert [r for b in batches for r in b] == [(f"a{i}", i) for i in range(10)] + [None]


def word_count(data: Path, out: Path) -> Dataflow:
    flow = Dataflow("eoi", parallelism=2, max_parallelism=128)
    (flow.read_text_file(data, uid="words").key_by(lambda w: w).process(Count()).uid("count")
         .sink(CommittingFileSink(out)).uid("out"))
    return flow


@pytest.mark.e2e
def test_a_key_group_query_ends_with_its_last_records(spark: Any, tmp_path: Path) -> None:
    words = [f"w{i % 11}" for i in range(200)]
    (tmp_path / "words.txt").write_text("".join(w + "\n" for w in words))
    no_data = spark.conf.get(NO_DATA_MICRO_BATCHES, None)
    job = SparkRunner(spark, tmp_path / "chk", max_records_per_batch=90).run(
        word_count(tmp_path / "words.txt", tmp_path / "out"))
    assert job.shapes == {"out": KEY_GROUP_SHAPE}
    # three micro-batches with records, the marker in the last: none for it alone, and
    # none without input after it
    summary = job.summary()["out"]
    assert summary["micro_batches"] == 3
    assert summary["input_rows"] == len(words) + 1
    # every key's count carried into the micro-batch with the marker, exactly once
    seen: collections.Counter[str] = collections.Counter()
    expected = []
    for w in words:
        seen[w] += 1
        expected.append([w, seen[w]])
    got = [json.loads(line) for p in list_part_files(tmp_path / "out")
           for line in p.path.read_text(encoding="utf-8").splitlines()]
    assert sorted(got) == sorted(expected)
    assert spark.conf.get(NO_DATA_MICRO_BATCHES, None) == no_data  # the session as it was


def embedded_records(source: LineFileSource) -> list[Any]:
    """What the embedded line-file source reads from ``source`` (one subtask)."""
    import asyncio

    async def read() -> list[Any]:
        reader, out = source.create_reader(0, 1), []
        while (batch := await reader.read_batch(1000)) is not None:
            out += batch
        return out

    return asyncio.run(read())


@pytest.mark.parametrize("with_offsets", [False, True])
@pytest.mark.parametrize("limit", [3, 64, 10_000])
def test_line_files_read_by_spark_are_the_embedded_records(
        tmp_path: Path, with_offsets: bool, limit: int) -> None:
    from reactive.connectors.files import InvalidLine

    # CRLF and LF line ends, an empty line, a line that is not UTF-8, non-ASCII text and a
    # last line without its newline
    (tmp_path / "a.txt").write_bytes(b"one\r\ntwo\n\nthr\xffee\n" + "vier\u00e9\n".encode()
                                     + b"x" * 300 + b"\n")
    (tmp_path / "b.txt").write_bytes(b"".join(b"b%d\n" % i for i in range(100)) + b"last")
    source = LineFileSource(tmp_path, with_offsets=with_offsets, errors="dead_letter")
    got = [r for b in records_of("lines", source, limit) for r in b]
    assert got[-1] is None
    expected = embedded_records(source)

    def plain(r: Any) -> Any:
        return (r.path, r.offset, r.raw, r.reason) if isinstance(r, InvalidLine) else r

    assert [plain(r) for r in got[:-1]] == [plain(r) for r in expected]
    assert sum(isinstance(r, InvalidLine) for r in got) == 1
    failing = LineFileSource(tmp_path, with_offsets=with_offsets)  # errors="fail"
    with pytest.raises(ValueError, match=r"a\.txt: the line at byte offset 10 is not valid"):
        records_of("lines", failing, limit)
