"""The CSV file source end to end: pipelines that read CSV files in vectorized blocks, count
each row exactly once across failures and restores (a checkpoint inside a file resumes at
the exact row), equal a batch computation with Python's csv module, and route every kind of
bad row to the dead-letter output with its offset and line while keeping the rest of its
block (or fail the job naming the file, the offset and the operator)."""

from __future__ import annotations

import collections
import csv
import io
import pickle
import random
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from reactive import (
    CheckpointConfig,
    CheckpointStorage,
    ConfigurationError,
    Dataflow,
    JobFailedError,
    RestartStrategy,
    UserFunctionError,
)
from reactive.connectors.collections import ListSink
from reactive.connectors.files import CsvFileSource, InvalidLine, InvalidRow
from reactive.errors import MissingExtraError
from tests.support import FailureInjector, failing_count, final_counts

HEADER = "id,city,amount,note\n"


class Sale(NamedTuple):
    id: int
    city: str
    amount: float
    note: str


TYPES = {"id": "int64", "city": "string", "amount": "float64", "note": "string"}


def sales_rows(n: int, seed: int, start: int = 0) -> list[str]:
    """``n`` CSV lines with unique ids; some notes are quoted, with a comma, a doubled
    quote or a newline inside."""
    rnd = random.Random(seed)
    out = []
    for i in range(start, start + n):
        note = rnd.choice(['plain', '"a, b"', '"say ""hi"""', '"two\nlines"', ''])
        out.append(f"{i},{rnd.choice(['AMS', 'BER', 'CDG', 'LHR'])},"
                   f"{rnd.randint(0, 9999) / 100},{note}\n")
    return out


def batch_sums(paths: list[Path]) -> dict[str, tuple[int, float]]:
    """The reference: per city, the number of rows and the amount, with the csv module."""
    out: dict[str, tuple[int, float]] = {}
    for p in paths:
        with open(p, newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                n, total = out.get(row["city"], (0, 0.0))
                out[row["city"]] = (n + 1, total + float(row["amount"]))
    return out


async def read_all_async(source: CsvFileSource, subtask: int = 0,
                         parallelism: int = 1) -> list[Any]:
    """Every record instance ``subtask`` of ``parallelism`` reads, without a job."""
    reader = source.create_reader(subtask, parallelism)
    out: list[Any] = []
    while (batch := await reader.read_batch(1024)) is not None:
        out += batch
    return out


def read_all(source: CsvFileSource, subtask: int = 0, parallelism: int = 1) -> list[Any]:
    import asyncio

    return asyncio.run(read_all_async(source, subtask, parallelism))


# ---------------------------------------------------------------- pipelines, batch equality

@pytest.mark.parametrize("block_size", [64, 4096, 1 << 20])
async def test_a_pipeline_over_csv_files_equals_the_batch_computation(tmp_path, block_size):
    data = tmp_path / "in"
    data.mkdir()
    (data / "a.csv").write_text(HEADER + "".join(sales_rows(3_000, 1)))
    (data / "b.csv").write_text(HEADER + "".join(sales_rows(2_000, 2, start=3_000)))
    sink = ListSink()
    flow = Dataflow("csv-sums", parallelism=2)
    (flow.source(CsvFileSource(data, column_types=TYPES, row_factory=Sale,
                               block_size=block_size), uid="sales")
         .map(lambda s: (s.city, (1, s.amount)))
         .key_by(lambda kv: kv[0])
         .reduce(lambda a, b: (a[0], (a[1][0] + b[1][0], a[1][1] + b[1][1])))
         .sink(sink))
    await flow.run()
    got = {city: v for city, v in sink.records}  # the last reduce output per city wins
    expected = batch_sums([data / "a.csv", data / "b.csv"])
    assert got.keys() == expected.keys()
    for city, (n, total) in expected.items():
        assert got[city][0] == n
        assert got[city][1] == pytest.approx(total)


# ------------------------------------------------------------------- failures and restores

def restored_positions(directory: Path, job: str, checkpoint_id: int) -> list[list[Any]]:
    chk = next(c for c in CheckpointStorage(directory, job).completed()
               if c.checkpoint_id == checkpoint_id)
    entries: list[list[Any]] = []
    for sub in chk.metadata.operators["sales"].subtasks.values():
        assert sub.operator_state is not None
        for f in sub.operator_state.files:
            entries += pickle.loads((chk.job_dir / f.path).read_bytes())["source-position"][1]
    return entries


@pytest.mark.parametrize("mode", ["exactly_once", "synchronous"])
async def test_each_row_counts_once_across_failures_and_restores(tmp_path, mode):
    data = tmp_path / "in"
    data.mkdir()
    rows = sales_rows(12_000, 3) + sales_rows(12_000, 4, start=12_000)
    (data / "a.csv").write_text(HEADER + "".join(rows[:12_000]))
    (data / "b.csv").write_text(HEADER + "".join(rows[12_000:]))
    injector = FailureInjector([10_000, 20_000])
    sink = ListSink()
    flow = Dataflow("csv-restore", parallelism=2, batch_size=100)
    (flow.source(CsvFileSource(data, column_types=TYPES, row_factory=Sale, block_size=2048),
                 uid="sales").set_parallelism(2)
         .key_by(lambda s: s.id)
         .process(failing_count(injector)).uid("count")
         .sink(sink))
    chk = tmp_path / "chk"
    # every checkpoint is retained: the test reads the restored ones after the run, however
    # many complete after them on a busy machine
    job = await flow.run(checkpoints=CheckpointConfig(interval=0.02, directory=chk, mode=mode,
                                                      retained=1_000_000),
                         restart=RestartStrategy.fixed(5, 0.0))
    assert job.metrics.restarts == 2
    # every row counted exactly once in the keyed state (each id is unique)
    assert final_counts(sink.records) == {i: 1 for i in range(24_000)}
    sizes = {str(p): p.stat().st_size for p in data.iterdir()}
    assert job.metrics.restored_checkpoints  # the test is about restores
    for cid in job.metrics.restored_checkpoints:
        for path, offset, line in restored_positions(chk, "csv-restore", cid):
            if offset == -1:
                continue
            assert len(HEADER) <= offset <= sizes[path]
            # a row start (never inside a quoted note's two lines), with its line number
            before = Path(path).read_bytes()[:offset]
            assert before.endswith(b"\n") and before.count(b'"') % 2 == 0
            assert line == before.count(b"\n") + 1


def test_a_restore_inside_a_file_resumes_at_the_exact_row(tmp_path):
    """The reader's position after any batch, restored in a new reader, continues with the
    next row: together the two readers give every row once."""
    import asyncio

    path = tmp_path / "sales.csv"
    path.write_text(HEADER + "".join(sales_rows(2_000, 5)))
    source = CsvFileSource(path, column_types=TYPES, row_factory=Sale, block_size=777)
    everything = read_all(source)
    assert [s.id for s in everything] == list(range(2_000))

    async def cut_after(batches: int) -> tuple[list[Any], list[Any]]:
        first = source.create_reader(0, 1)
        head: list[Any] = []
        for _ in range(batches):
            batch = await first.read_batch(1024)
            assert batch is not None
            head += batch
        position = first.snapshot_state(1)
        first.close()
        second = source.create_reader(0, 1)
        second.restore_state(pickle.loads(pickle.dumps(position)))
        tail: list[Any] = []
        while (batch := await second.read_batch(1024)) is not None:
            tail += batch
        return head, tail

    for batches in (1, 7, 30):
        head, tail = asyncio.run(cut_after(batches))
        assert head + tail == everything
        assert 0 < len(head) < len(everything)  # the cut was inside the file


# ------------------------------------------------------------------------------ bad rows

def check_amount(id: int, city: str, amount: float, note: str) -> Sale:
    if amount < 0:
        raise ValueError(f"negative amount {amount}")
    return Sale(id, city, amount, note)


def checked_sales(table: Any) -> list[Sale]:
    import pyarrow.compute as pc

    if pc.any(pc.less(table.column("amount"), 0)).as_py():
        raise ValueError("negative amount")
    return list(map(Sale, *(c.to_pylist() for c in table.columns)))


BAD = {  # a bad row of each kind, and what its reason must say
    "too few fields": (b"7,AMS,1.5\n", "expected 4 fields, got 3"),
    "too many fields": (b"8,AMS,1.5,x,y\n", "expected 4 fields, got 5"),
    "not numeric": (b"9,AMS,lots,x\n", "invalid value 'lots'"),
    "not UTF-8": (b"10,AMS,1.0,caf\xe9\n", "invalid UTF-8 at byte offset"),
    "factory raises": (b"11,AMS,-3.0,x\n", "negative amount"),
}


def write_with_bad_rows(path: Path, crlf: bool) -> tuple[list[Sale], dict[str, tuple[int, int]]]:
    """Good rows around one bad row of each kind; returns the good sales and, per kind, the
    bad row's byte offset and line number."""
    end = b"\r\n" if crlf else b"\n"
    out = io.BytesIO()
    out.write(HEADER.encode().replace(b"\n", end))
    good: list[Sale] = []
    where: dict[str, tuple[int, int]] = {}
    line = 2
    next_id = 100
    for kind, (raw, _) in BAD.items():
        for _ in range(3):
            out.write(f"{next_id},LHR,2.5,ok".encode() + end)
            good.append(Sale(next_id, "LHR", 2.5, "ok"))
            next_id += 1
            line += 1
        where[kind] = (out.tell(), line)
        out.write(raw.replace(b"\n", end))
        line += 1
        out.write(f'{next_id},CDG,1.25,"multi{end.decode()}line"'.encode() + end)
        good.append(Sale(next_id, "CDG", 1.25, f"multi{end.decode()}line"))
        next_id += 1
        line += 2
    path.write_bytes(out.getvalue())
    return good, where


@pytest.mark.parametrize("crlf", [False, True])
@pytest.mark.parametrize("block_size", [16, 200, 1 << 20])
@pytest.mark.parametrize("factory", ["row", "batch"])
async def test_each_kind_of_bad_row_reaches_the_dead_letters_and_its_block_is_kept(
        tmp_path, crlf, block_size, factory):
    path = tmp_path / "sales.csv"
    good, where = write_with_bad_rows(path, crlf)
    source = CsvFileSource(path, column_types=TYPES, block_size=block_size,
                           errors="dead_letter",
                           **({"row_factory": check_amount} if factory == "row"
                              else {"batch_factory": checked_sales}))
    main, dead = ListSink(), ListSink()
    flow = Dataflow("csv-dead-letters", parallelism=1)
    rows = flow.source(source, uid="sales")
    rows.filter(lambda r: isinstance(r, InvalidLine)).sink(dead)
    rows.filter(lambda r: not isinstance(r, InvalidLine)).sink(main)
    await flow.run()
    assert main.records == good  # every good row, in file order, the bad rows' blocks too
    assert all(isinstance(d, InvalidRow) for d in dead.records)
    assert [(d.offset, d.line) for d in dead.records] == list(where.values())
    # in the source's own output each dead letter stands in its row's place: after the
    # three good rows before it
    in_order = await read_all_async(source)
    kinds = ["bad" if isinstance(r, InvalidRow) else "ok" for r in in_order]
    assert kinds == (["ok"] * 3 + ["bad", "ok"]) * len(BAD)
    data = path.read_bytes()
    for d, (kind, (raw, reason)) in zip(dead.records, BAD.items(), strict=True):
        assert d.path == str(path)
        assert d.raw == raw.rstrip(b"\n"), kind
        assert data[d.offset:].startswith(d.raw), kind
        assert reason in d.reason, (kind, d.reason)


@pytest.mark.parametrize("block_size", [300, 1 << 20])
def test_rows_with_a_wrong_field_count_keep_their_place_in_a_clean_block(tmp_path, block_size):
    """The vectorized path (pyarrow skips the rows and reports their numbers): each dead
    letter stands between the same rows as in the file, with its offset and line."""
    lines = sales_rows(400, 11)
    for i in range(13, 400, 37):
        lines[i] = lines[i].replace(",", ";", 1) if i % 2 else lines[i][:-1] + ",extra\n"
    path = tmp_path / "sales.csv"
    path.write_text(HEADER + "".join(lines))
    records = read_all(CsvFileSource(path, column_types=TYPES, row_factory=Sale,
                                     block_size=block_size, errors="dead_letter"))
    offset, line = len(HEADER), 2
    assert len(records) == len(lines)
    for text, record in zip(lines, records, strict=True):
        raw = text.encode()
        if ";" in text or ",extra" in text:
            assert isinstance(record, InvalidRow)
            assert (record.offset, record.line, record.raw) == (offset, line, raw[:-1])
            assert "expected 4 fields" in record.reason
        else:
            assert record.id == int(text.split(",")[0])
        offset += len(raw)
        line += raw.count(b"\n")


@pytest.mark.parametrize("kind", ["factory raises", "not numeric"])
async def test_a_bad_row_without_dead_letters_fails_the_job_naming_file_offset_and_operator(
        tmp_path, kind):
    path = tmp_path / "sales.csv"
    _, where = write_with_bad_rows(path, crlf=False)
    offset, line = where[kind]
    # the rows before this kind's row are made good, so this one is the first bad row
    data = path.read_bytes()
    head = data[:offset]
    for other, (raw, _) in BAD.items():
        if other != kind:
            head = head.replace(raw, b"1,AMS,1.0,fixed\n")
    path.write_bytes(head + data[offset:])
    offset = len(head)
    flow = Dataflow("csv-strict", parallelism=1)
    flow.source(CsvFileSource(path, column_types=TYPES, row_factory=check_amount),
                name="sales-csv", uid="sales").sink(ListSink())
    with pytest.raises(JobFailedError) as info:
        await flow.run()
    error = info.value.__cause__
    assert isinstance(error, UserFunctionError)
    assert error.operator == "sales-csv"
    message = str(error)
    assert "'sales-csv'" in message
    assert f"{path}: the row at byte offset {offset} (line {line})" in message
    assert BAD[kind][1] in message
    assert "errors='dead_letter'" in message


# -------------------------------------------------------------------------- configuration

def test_options_are_checked_when_the_program_is_built(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text(HEADER)
    with pytest.raises(ConfigurationError, match="errors"):
        CsvFileSource(path, errors="skip")
    with pytest.raises(ConfigurationError, match="not both"):
        CsvFileSource(path, row_factory=Sale, batch_factory=checked_sales)
    with pytest.raises(ConfigurationError, match="column_names"):
        CsvFileSource(path, header=False)
    with pytest.raises(FileNotFoundError):
        CsvFileSource(tmp_path / "missing.csv")


def test_a_batch_factory_must_return_one_record_per_row(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text(HEADER + "".join(sales_rows(10, 1)))
    source = CsvFileSource(path, column_types=TYPES, batch_factory=lambda t: [],
                           errors="dead_letter")
    with pytest.raises(ConfigurationError, match="one record per row"):
        read_all(source)


def test_without_pyarrow_the_source_names_the_extra(tmp_path, monkeypatch):
    path = tmp_path / "x.csv"
    path.write_text(HEADER)
    monkeypatch.setitem(sys.modules, "pyarrow.csv", None)
    with pytest.raises(MissingExtraError, match=r"reactive\[parquet\]"):
        CsvFileSource(path)


def test_columns_header_and_files_of_a_directory(tmp_path):
    data = tmp_path / "in"
    data.mkdir()
    (data / "1.csv").write_text("a;b;c\n1;x;2\n\n3;y;4")  # an empty line, no final newline
    (data / "2.csv").write_text("5;z;6\n")
    (data / ".hidden.csv").write_text("junk\n")
    with_header = CsvFileSource(data / "1.csv", columns=["c", "a"], delimiter=";")
    assert read_all(with_header) == [(2, 1), (4, 3)]
    # without a header, the names are given; the splits are divided among instances
    source = CsvFileSource(data, header=False, column_names=["a", "b", "c"], delimiter=";",
                           column_types={"a": "string", "b": "string", "c": "string"})
    assert read_all(source, 0, 2) == [("a", "b", "c"), ("1", "x", "2"), ("3", "y", "4")]
    assert read_all(source, 1, 2) == [("5", "z", "6")]


def test_counts_match_a_batch_computation_for_each_city(tmp_path):
    """The default records (tuples of the columns) equal what the csv module reads."""
    path = tmp_path / "sales.csv"
    path.write_text(HEADER + "".join(sales_rows(500, 9)))
    rows = read_all(CsvFileSource(path, column_types=TYPES, block_size=100))
    with open(path, newline="", encoding="utf-8") as f:
        expected = [(int(r["id"]), r["city"], float(r["amount"]), r["note"])
                    for r in csv.DictReader(f)]
    assert rows == expected
    assert collections.Counter(r[1] for r in rows) == collections.Counter(
        r[1] for r in expected)
