"""The Spark sources cut a micro-batch into read partitions: together the parts give the
micro-batch's records once each, in order, and only the last one the end-of-input marker
(the files and the collection a dataflow reads, without a Spark session)."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

from reactive.connectors.collections import CollectionSource
from reactive.connectors.files import LineFileSource
from reactive.connectors.spark.stream_source import ReactiveSource, source_options


def reader(kind: str, source: Any, limit: int, parts: int) -> Any:
    return ReactiveSource(options=source_options(kind, source, limit, parts)).streamReader(None)


def rows(r: Any, partitions: list[Any]) -> list[tuple[Any, Any]]:
    out = []
    for part in partitions:
        for batch in r.read(part):
            for data, seq in zip(batch.column("record").to_pylist(),
                                 batch.column("seq").to_pylist(), strict=True):
                out.append((None if data is None else pickle.loads(data), seq))
    return out


def micro_batches(r: Any) -> list[tuple[Any, Any]]:
    from pyspark.sql.streaming.datasource import ReadMaxRows

    spans, start = [], r.initialOffset()
    while True:
        end = r.latestOffset(start, ReadMaxRows(r.limit))
        if end == start:
            return spans
        spans.append((start, end))
        start = end


@pytest.mark.parametrize("parts", [1, 2, 3, 7])
@pytest.mark.parametrize("limit", [5, 40, 1000])
def test_line_files_cut_into_parts_give_every_line_once_in_order(
        tmp_path: Path, parts: int, limit: int) -> None:
    texts = [f"a{i}" for i in range(23)], [f"b{i}" for i in range(17)], ["c0"]
    for name, lines in zip("abc", texts, strict=True):
        (tmp_path / f"{name}.txt").write_text("".join(line + "\n" for line in lines))
    source = LineFileSource(tmp_path, with_offsets=True)
    r = reader("lines", source, limit, parts)
    whole = reader("lines", source, limit, 1)
    got, expected = [], []
    for start, end in micro_batches(r):
        cut = r.partitions(start, end)
        assert len(cut) == (min(parts, end["seq"] - start["seq"])
                            if end["seq"] - start["seq"] >= 2 else 1)
        got += rows(r, list(cut))
        expected += rows(whole, list(whole.partitions(start, end)))
    assert got == expected
    lines = [line for t in texts for line in t]
    assert [rec[1] for rec, _ in got if rec is not None] == lines
    assert [seq for _, seq in got] == list(range(len(lines) + 1))
    assert got[-1][0] is None  # the marker, once, last


@pytest.mark.parametrize("parts", [1, 2, 4])
def test_a_collection_cut_into_parts_gives_every_item_once_in_order(parts: int) -> None:
    items = list(range(50))
    r = reader("collection", CollectionSource(items), 12, parts)
    got = []
    for start, end in micro_batches(r):
        got += rows(r, list(r.partitions(start, end)))
    assert [rec for rec, _ in got] == [*items, None]
    assert [seq for _, seq in got] == list(range(51))


@pytest.mark.parametrize("parts", [1, 2, 3])
@pytest.mark.parametrize("limit", [5, 40, 1000])
def test_csv_files_cut_into_parts_give_every_row_and_dead_letter_once_in_order(
        tmp_path: Path, parts: int, limit: int) -> None:
    from reactive.connectors.files import CsvFileSource, InvalidRow

    for name, n in (("a", 53), ("b", 31), ("c", 1)):
        body = "".join(f"{name}{i},{i}\n" if i % 10 != 7 else f"{name}{i},bad\n"
                       for i in range(n))
        (tmp_path / f"{name}.csv").write_text("key,value\n" + body)
    source = CsvFileSource(tmp_path, column_types={"value": "int64"}, block_size=64,
                           errors="dead_letter")
    r = reader("csv", source, limit, parts)
    got = []
    for start, end in micro_batches(r):
        got += rows(r, list(r.partitions(start, end)))
    records = [rec for rec, _ in got[:-1]]
    seqs = [seq for _, seq in got]
    assert got[-1][0] is None  # the end-of-input marker, last and once
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    # the embedded source's records: values, and each bad row a dead letter at its offset
    expected: list[Any] = []
    for name, n in (("a", 53), ("b", 31), ("c", 1)):
        offset = len("key,value\n")
        for i in range(n):
            line = f"{name}{i},{i}\n" if i % 10 != 7 else f"{name}{i},bad\n"
            expected.append((str(tmp_path / f"{name}.csv"), offset) if i % 10 == 7
                            else (f"{name}{i}", i))
            offset += len(line)
    assert [(x.path, x.offset) if isinstance(x, InvalidRow) else x
            for x in records] == expected


def test_file_sources_are_read_in_as_many_tasks_as_the_dataflows_parallelism(
        tmp_path: Path) -> None:
    from reactive import Dataflow
    from reactive.connectors.files import CommittingFileSink, CsvFileSource
    from reactive.connectors.spark import SparkRunner
    from reactive.connectors.spark.translation import translate

    (tmp_path / "in.csv").write_text("key,value\na,1\n")
    (tmp_path / "in.txt").write_text("a\n")

    def flow(parallelism: int) -> Dataflow:
        f = Dataflow("parts", parallelism=parallelism)
        f.source(CsvFileSource(tmp_path / "in.csv")).sink(CommittingFileSink(tmp_path / "a"))
        f.read_text_file(tmp_path / "in.txt").sink(CommittingFileSink(tmp_path / "b"))
        f.from_collection(["a"]).sink(CommittingFileSink(tmp_path / "c"))
        return f

    runner = SparkRunner(None, tmp_path / "chk")  # type: ignore[arg-type]
    for parallelism in (1, 2, 3):
        csv, lines, collection = (p.source for p in translate(flow(parallelism)))
        assert runner.read_partitions_for(flow(parallelism), csv) == parallelism
        assert runner.read_partitions_for(flow(parallelism), lines) == parallelism
        assert runner.read_partitions_for(flow(parallelism), collection) == 1
    # a number given to the runner holds for every source
    chosen = SparkRunner(None, tmp_path / "chk", read_partitions=4)  # type: ignore[arg-type]
    csv, lines, _ = (p.source for p in translate(flow(2)))
    assert chosen.read_partitions_for(flow(2), csv) == chosen.read_partitions_for(
        flow(2), lines) == 4
