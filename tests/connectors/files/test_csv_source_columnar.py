"""The CSV source in columnar mode (``CsvFileSource(..., columnar=True)`` read with
``Dataflow.columnar_source``): record batches of the declared schema positioned by byte
offset, rows that do not parse or convert as dead letters with their offsets (nothing lost),
a batch factory's tables validated the same way, and a restore mid-file that re-reads no
row and skips none."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from reactive import (
    CheckpointConfig,
    ConfigurationError,
    Dataflow,
    JobFailedError,
    RestartStrategy,
)
from reactive.connectors.collections import ListSink
from reactive.connectors.files import CommittingFileSink, CsvFileSource, InvalidRow
from reactive.sources import SourceReader
from tests.support import HoldThenFail

TYPES = {"k": "string", "n": "int64", "x": "float64"}


def write_csv(path: Path, rows: int, seed: int = 1, bad_every: int = 0) -> tuple[Path, set[int]]:
    """A CSV of ``rows`` rows (k, n, x); with ``bad_every``, every such row is bad (a value
    that does not convert, a wrong field count, or bytes that are not UTF-8, in turn).
    Returns the path and the byte offsets of the bad rows."""
    rng = np.random.default_rng(seed)
    out = [b"k,n,x\n"]
    offset = len(out[0])
    bad = set()
    for i in range(rows):
        line = f"k{rng.integers(0, 20)},{rng.integers(-100, 100)},{rng.normal():.3f}\n".encode()
        if bad_every and i % bad_every == bad_every - 1:
            kind = (i // bad_every) % 3
            line = [line.replace(b",", b",zz", 1), line.replace(b"\n", b",1\n"),
                    line.replace(b"k", b"\xff", 1)][kind]
            bad.add(offset)
        out.append(line)
        offset += len(line)
    path.write_bytes(b"".join(out))
    return path, bad


def good_rows(path: Path, bad: set[int]) -> pa.Table:
    """The file's rows but those at the ``bad`` offsets, read by pyarrow (the reference)."""
    kept, offset = [], 0
    for line in path.read_bytes().splitlines(keepends=True):
        if offset not in bad:
            kept.append(line)
        offset += len(line)
    return pacsv.read_csv(pa.BufferReader(b"".join(kept)),
                          convert_options=pacsv.ConvertOptions(column_types=TYPES))


async def test_batches_and_dead_letters_cover_every_row_once(tmp_path):
    path, bad = write_csv(tmp_path / "in.csv", 3000, bad_every=97)
    flow = Dataflow("csv-columnar", parallelism=1)
    source = CsvFileSource(path, columns=["k", "n", "x"], column_types=TYPES,
                           errors="dead_letter", columnar=True, block_size=2048)
    stream = flow.columnar_source(source, uid="csv")
    batches, dead = ListSink(), ListSink()
    stream.sink(batches)
    stream.dead_letters().sink(dead)
    await flow.run()
    assert all(isinstance(d, InvalidRow) for d in dead.records)
    assert {d.offset for d in dead.records} == bad
    assert len(batches.records) > 1  # one batch per block
    got = pa.Table.from_batches(batches.records)
    assert got.equals(good_rows(path, bad).cast(got.schema))
    # each batch carries the byte offset of its first row
    for b in batches.records:
        where = b.schema.metadata[b"reactive.position"].decode()
        offset = int(where.split(" byte ")[1].split()[0])
        first = path.read_bytes()[offset:].split(b"\n", 1)[0]
        assert first.startswith(b.column("k")[0].as_py().encode()) or offset in bad


def test_columnar_mode_needs_every_type_and_a_schema_with_a_factory(tmp_path):
    path, _ = write_csv(tmp_path / "in.csv", 10)
    with pytest.raises(ConfigurationError, match="column_types"):
        CsvFileSource(path, columns=["k", "n"], column_types={"k": "string"}, columnar=True)
    with pytest.raises(ConfigurationError, match="schema"):
        CsvFileSource(path, columns=["k"], column_types={"k": "string"}, columnar=True,
                      batch_factory=lambda t: t)
    with pytest.raises(ConfigurationError, match="declares no schema"):
        Dataflow("x").columnar_source(CsvFileSource(path))


async def test_a_factory_that_raises_makes_its_bad_rows_dead_letters(tmp_path):
    path, _ = write_csv(tmp_path / "in.csv", 500)
    schema = pa.schema([("k", pa.string()), ("n2", pa.int64())])

    def doubled(table: Any) -> Any:
        n = table.column("n")
        if pc.any(pc.equal(n, 13)).as_py():
            raise ValueError("13 is unlucky")
        return pa.table({"k": table.column("k"), "n2": pc.multiply(n, 2)}, schema=schema)

    flow = Dataflow("csv-factory", parallelism=1)
    stream = flow.columnar_source(CsvFileSource(
        path, columns=["k", "n"], column_types=TYPES, batch_factory=doubled, schema=schema,
        errors="dead_letter", columnar=True, block_size=1024))
    batches, dead = ListSink(), ListSink()
    stream.sink(batches)
    stream.dead_letters().sink(dead)
    await flow.run()
    table = pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(column_types=TYPES))
    unlucky = pc.sum(pc.equal(table.column("n"), 13)).as_py()
    assert unlucky and len(dead.records) == unlucky
    assert all("13 is unlucky" in d.reason and d.raw.split(b",")[1] == b"13"
               for d in dead.records)
    got = pa.Table.from_batches(batches.records)
    assert got.num_rows == table.num_rows - unlucky
    assert got.column("n2").to_pylist() == [2 * n for n in table.column("n").to_pylist()
                                            if n != 13]


async def test_a_bad_row_fails_the_job_naming_its_offset_without_dead_letters(tmp_path):
    path = tmp_path / "in.csv"
    path.write_bytes(b"k,n,x\na,1,1.0\nb,oops,2.0\n")
    flow = Dataflow("csv-fail", parallelism=1)
    flow.columnar_source(CsvFileSource(path, columns=["k", "n", "x"], column_types=TYPES,
                                       columnar=True)).sink(ListSink())
    with pytest.raises(JobFailedError) as info:
        await flow.run(restart=RestartStrategy.none())
    text = repr(info.value) + "".join(str(e) for e in _chain(info.value))
    assert "byte offset 14" in text and "oops" in text


def _chain(exc: BaseException | None) -> list[BaseException]:
    out = []
    while exc is not None:
        out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out


class FailingAfterCommit(CsvFileSource):
    """The CSV source of :func:`test_a_restore_mid_file_reads_each_row_exactly_once`'s
    first run: once its reader has read past byte 40,000 it reads no more until a
    checkpoint's output is committed (a part file published when the checkpoint's completion
    reached the sink; its metadata alone would leave nothing committed), then fails the job
    (:class:`HoldThenFail`): mid-file on any machine."""

    def __init__(self, path: Path, *, out: Path, **options: Any) -> None:
        super().__init__(path, **options)
        self.out = out  # the committed output's directory

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        def past(b: Any) -> bool:  # a record batch (not a dead letter) past byte 40,000
            if not isinstance(b, pa.RecordBatch):
                return False
            where = b.schema.metadata[b"reactive.position"].decode()
            return int(where.split(" byte ")[1].split()[0]) > 40_000

        return HoldThenFail(super().create_reader(subtask, parallelism), past,
                            lambda: any(self.out.glob("part-*")))


async def test_a_restore_mid_file_reads_each_row_exactly_once(tmp_path):
    path, bad = write_csv(tmp_path / "in.csv", 6000, seed=4, bad_every=211)
    out, chk = tmp_path / "out", tmp_path / "chk"

    def job(fail: bool) -> Dataflow:
        options: dict[str, Any] = {"columns": ["k", "n", "x"], "column_types": TYPES,
                                   "errors": "dead_letter", "columnar": True,
                                   "block_size": 1500}
        flow = Dataflow("csv-restore", parallelism=1)
        stream = flow.columnar_source(FailingAfterCommit(path, out=out, **options) if fail
                                      else CsvFileSource(path, **options), uid="csv")
        stream.sink(CommittingFileSink(out, format="parquet")).uid("rows")
        stream.dead_letters().map(lambda d: {"offset": d.offset}) \
            .sink(CommittingFileSink(out / "dead", format="jsonl")).uid("dead")
        return flow

    config = CheckpointConfig(interval=0.005, directory=chk)
    with pytest.raises(JobFailedError):
        await job(True).run(checkpoints=config, restart=RestartStrategy.none())
    first = len(list(out.glob("part-*")))
    await job(False).run(checkpoints=config, resume=True)
    assert first and len(list(out.glob("part-*"))) > first  # resumed, not started over
    rows = pq.read_table([str(p) for p in sorted(out.glob("part-*"))])
    dead = [json.loads(line)["offset"] for p in (out / "dead").glob("part-*")
            for line in p.read_text().splitlines()]
    assert sorted(dead) == sorted(bad)
    assert rows.num_rows == 6000 - len(bad)
    expected = good_rows(path, bad)
    def tuples(t: pa.Table) -> list[tuple[Any, ...]]:
        return sorted(zip(*(c.to_pylist() for c in t.columns), strict=True))

    assert tuples(rows) == tuples(expected.cast(rows.schema))


async def test_a_factory_table_of_another_schema_fails_naming_column_and_position(tmp_path):
    from reactive.columnar import SchemaMismatchError

    path, _ = write_csv(tmp_path / "in.csv", 50)
    declared = pa.schema([("k", pa.string()), ("n", pa.int64())])

    def wrong(table: Any) -> Any:  # n as float64: not the declared int64
        return pa.table({"k": table.column("k"), "n": pc.cast(table.column("n"), pa.float64())})

    flow = Dataflow("csv-schema", parallelism=1)
    flow.columnar_source(CsvFileSource(path, columns=["k", "n"], column_types=TYPES,
                                       batch_factory=wrong, schema=declared,
                                       columnar=True)).sink(ListSink())
    with pytest.raises(JobFailedError) as info:
        await flow.run(restart=RestartStrategy.none())
    errors = [e for e in _chain(info.value) if isinstance(e, SchemaMismatchError)]
    assert errors, info.value
    assert errors[0].column == "n" and "CsvFileSource" in errors[0].operator
    assert errors[0].position == f"{path} byte 6 (line 2)"
