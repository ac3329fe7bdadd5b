"""The sources of a dataflow as Spark streaming sources: a Python data source (PySpark 4's
``DataSourceStreamReader``) whose offsets are the positions the embedded runtime
checkpoints, followed by one end-of-input marker.

- a line-file source is read by byte offset, file by file (the files sorted by name, as
  the embedded source reads them), giving the same records: the line, ``(byte offset,
  line)`` with ``with_offsets``, or an ``InvalidLine`` for a line that is not UTF-8 with
  ``errors="dead_letter"`` (Spark's own text source knows no byte offsets);
- a collection is read by index.

Given a first chain of steps (``source_options(then=...)``), the reader runs it on the
records it reads and hands Spark that chain's Arrow batches (the source's schema is then the
chain's): the records are never pickled, and the first stage of every plan is the read
itself. Without one, it hands Spark the records pickled (:data:`SOURCE_SCHEMA`).

The offsets live in Spark's offset log, so a query restarted on its checkpoint location
continues after the last committed micro-batch. ``max_records_per_batch`` caps a
micro-batch (Spark's ``ReadMaxRows``), also under ``Trigger.AvailableNow``. The end-of-input
marker (see :mod:`.record_chain`) follows the last record in the micro-batch that reads it:
an offset is ``done`` as soon as it reaches the end of the input, so a bounded source costs
no micro-batch of its own for the marker. The input must not change while a query reads
it.
"""

from __future__ import annotations

import base64
import itertools
import os
import pickle
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from reactive.connectors.files.line_source import decode_block

from .record_chain import _CHUNK_ROWS, END_OF_INPUT, END_OF_INPUT_TIME, Chunk, ChunkedRead, row_chunks

__all__ = ["SOURCE_FORMAT", "SOURCE_SCHEMA", "ReactiveSource", "source_options"]

SOURCE_FORMAT = "reactive-source"
SOURCE_SCHEMA = "record binary, ts timestamp, seq bigint"


def source_options(kind: str, source: Any, max_records_per_batch: int,
                   read_partitions: int = 1,
                   then: Callable[[Iterator[Chunk]], Iterator[Any]] | None = None,
                   schema: Any = None) -> dict[str, str]:
    """The options of a :class:`ReactiveSource` reading ``source``.

    Args:
        kind: ``"lines"``, ``"csv"``, ``"collection"`` or ``"arrow"``.
        source: the ``LineFileSource``, ``CsvFileSource``, ``CollectionSource`` or
            ``ArrowSource`` (read as its table's record batches, by row index; ``then``
            does not apply).
        max_records_per_batch: records per micro-batch at most.
        read_partitions: Spark partitions (tasks) each micro-batch is read and processed in,
            by consecutive ranges of records.
        then: the first chain of steps, run by the reader in each task: from the
            records' :data:`~.record_chain.Chunk` s (the last task's ends with the
            end-of-input marker) to ``pyarrow.RecordBatch`` es of ``schema``; None: the
            records pickled, :data:`SOURCE_SCHEMA`.
        schema: the Spark schema of ``then``'s batches (a DDL string or a ``StructType``).

    Raises:
        ValueError: when only one of ``then`` and ``schema`` is given.
    """
    if kind == "csv":
        spec: dict[str, Any] = {"kind": kind, "source": source}
    elif kind == "lines":
        spec = {"kind": kind, "files": source.splits(),
                "with_offsets": source.with_offsets, "errors": source.errors}
    elif kind == "arrow":
        spec = {"kind": kind, "table": source.table, "batch_size": source.batch_size}
    else:
        spec = {"kind": kind, "items": list(source.items)}
    data = pickle.dumps(spec, protocol=pickle.HIGHEST_PROTOCOL)
    options = {"spec": base64.b64encode(data).decode("ascii"),
               "maxRecordsPerBatch": str(max_records_per_batch),
               "readPartitions": str(read_partitions)}
    if kind == "arrow":  # the table's own batches, in its schema
        from pyspark.sql.pandas.types import from_arrow_schema

        options["schema"] = "json:" + from_arrow_schema(source.table.schema).json()
        return options
    if (then is None) != (schema is None):
        raise ValueError("source_options takes both of then= and schema=, or neither")
    if then is not None:
        from pyspark import cloudpickle  # the user functions in it may be lambdas

        data = cloudpickle.dumps(then)  # type: ignore[no-untyped-call]
        options["then"] = base64.b64encode(data).decode("ascii")
        options["schema"] = schema if isinstance(schema, str) else "json:" + schema.json()
    return options


class ReactiveSource(DataSource):
    """A dataflow's line-file, CSV file or collection source for Spark (options from
    :func:`source_options`)."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_FORMAT

    def schema(self) -> Any:
        given = self.options.get("schema", SOURCE_SCHEMA)
        if given.startswith("json:"):
            import json

            from pyspark.sql.types import StructType

            return StructType.fromJson(json.loads(given[5:]))
        return given

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        spec = pickle.loads(base64.b64decode(self.options["spec"]))
        limit = int(self.options.get("maxRecordsPerBatch", "100000"))
        parts = int(self.options.get("readPartitions", "1"))
        emit = _as_arrow
        then = None
        if "then" in self.options:
            then = pickle.loads(base64.b64decode(self.options["then"]))

            def emit(rows: Iterator[tuple[Any, ...]]) -> Iterator[Any]:
                return then(row_chunks(rows))  # type: ignore[no-any-return]

        if spec["kind"] == "lines":
            # the line reader hands the chain whole chunks of lines (no tuple per line)
            return _LinesReader(spec, limit, parts, emit, then)
        if spec["kind"] == "arrow":
            return _ArrowTableReader(spec, limit, parts)
        if spec["kind"] == "csv":
            from .csv_stream import CsvStreamReader

            # the CSV reader hands the chain whole blocks of records
            return CsvStreamReader(spec["source"], limit, parts, emit, then)
        return _CollectionReader(spec, limit, parts, emit)


_ARROW_ROWS = 8192  # rows per Arrow batch handed to Spark


def _as_arrow(rows: Iterator[tuple[Any, ...]]) -> Iterator[Any]:
    """``(record, ts, seq)`` rows as Arrow record batches of :data:`SOURCE_SCHEMA`, the
    records pickled and the end-of-input marker's null (Spark takes the batches as they
    are; rows given one by one are checked and converted field by field, which costs more
    than reading the line)."""
    import pyarrow as pa

    schema = pa.schema([("record", pa.binary()), ("ts", pa.timestamp("us", tz="UTC")),
                        ("seq", pa.int64())])
    dumps, proto = pickle.dumps, pickle.HIGHEST_PROTOCOL
    while True:
        chunk = list(itertools.islice(rows, _ARROW_ROWS))
        if not chunk:
            return
        records, tss, seqs = zip(*chunk, strict=True)
        yield pa.RecordBatch.from_arrays(
            [pa.array([None if r is END_OF_INPUT else dumps(r, protocol=proto)
                       for r in records], pa.binary()),
             pa.array(tss, schema.field("ts").type), pa.array(seqs, pa.int64())],
            schema=schema)


#: turns a reader's ``(record, ts, seq)`` rows into the Arrow batches Spark gets
Emit = Callable[[Iterator[tuple[Any, ...]]], Iterator[Any]]


class _Span(InputPartition):
    """The records of one micro-batch: from offset ``start`` to ``end``."""

    def __init__(self, start: dict[str, Any], end: dict[str, Any]) -> None:
        super().__init__((start, end))
        self.start = start
        self.end = end


def _max_rows(limit: ReadLimit, default: int) -> int | None:
    if isinstance(limit, ReadAllAvailable):
        return None
    if isinstance(limit, ReadMaxRows):
        return limit.max_rows
    return default


class _CollectionReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets ``{"index": i, "done": bool}``: the next record, and whether the end marker
    was emitted."""

    def __init__(self, spec: dict[str, Any], limit: int, parts: int = 1,
                 emit: Emit = _as_arrow) -> None:
        self.items: list[Any] = spec["items"]
        self.limit = limit
        self.parts = parts
        self.emit = emit

    def initialOffset(self) -> dict[str, Any]:
        return {"index": 0, "done": False}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.limit)

    def prepareForTriggerAvailableNow(self) -> None:
        """The collection does not grow: its end is the target."""

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        if start["done"]:
            return start
        n = len(self.items)
        rows = _max_rows(limit, self.limit)
        end = n if rows is None else min(n, start["index"] + rows)
        return {"index": end, "done": end >= n}  # the marker rides with the last items

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        first, last = start["index"], end["index"]
        per = -(-(last - first) // self.parts) if last > first else 1
        cuts = [{"index": i, "done": False} for i in range(first + per, last, per)]
        bounds = [start, *cuts, end]
        return [_Span(a, b) for a, b in itertools.pairwise(bounds)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return self.emit(self._rows(partition))

    def _rows(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, _Span)
        start, end = partition.start, partition.end
        for i in range(start["index"], end["index"]):
            yield (self.items[i], None, i)
        if end["done"] and not start["done"]:
            yield (END_OF_INPUT, END_OF_INPUT_TIME, len(self.items))

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release."""


class _ArrowTableReader(_CollectionReader):
    """An Arrow table's rows as record batches of at most the source's ``batch_size`` rows
    (zero-copy slices), by row index (offsets as :class:`_CollectionReader`'s); no
    end-of-input marker (a columnar plan has no timers to fire)."""

    def __init__(self, spec: dict[str, Any], limit: int, parts: int = 1) -> None:
        super().__init__({"items": range(spec["table"].num_rows)}, limit, parts)
        self.table = spec["table"]
        self.batch_size: int = spec["batch_size"]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, _Span)
        first, last = partition.start["index"], partition.end["index"]
        if last > first:
            yield from self.table.slice(first, last - first).to_batches(
                max_chunksize=self.batch_size)


_READ_BYTES = 1 << 20
"""Bytes of whole lines a line reader takes from a file at a time (``readlines``' hint)."""


class _LinesReader(ChunkedRead, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets ``{"file": i, "pos": byte, "seq": lines before, "done": bool}``.

    Given ``then`` (the first chain of steps), a partition's lines reach it as
    :data:`~.record_chain.Chunk` s read a block of lines at a time; else as rows, through
    ``emit``.
    """

    def __init__(self, spec: dict[str, Any], limit: int, parts: int = 1,
                 emit: Emit = _as_arrow,
                 then: Callable[[Iterator[Chunk]], Iterator[Any]] | None = None) -> None:
        self.files: list[str] = spec["files"]
        self.with_offsets: bool = spec["with_offsets"]
        self.errors: str = spec["errors"]
        self.limit = limit
        self.parts = parts
        self.emit = emit
        self.then = then

    def initialOffset(self) -> dict[str, Any]:
        return {"file": 0, "pos": 0, "seq": 0, "done": False}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.limit)

    def prepareForTriggerAvailableNow(self) -> None:
        """The files do not grow: their ends are the target."""

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        if start["done"]:
            return start
        rows = _max_rows(limit, self.limit)
        f, pos, seq = start["file"], start["pos"], start["seq"]
        taken = 0
        while f < len(self.files) and (rows is None or taken < rows):
            with open(self.files[f], "rb") as fh:
                fh.seek(pos)
                for line in fh:
                    pos += len(line)
                    taken += 1
                    if rows is not None and taken >= rows:
                        break
                at_end = fh.read(1) == b""
            if at_end:
                f, pos = f + 1, 0
        while pos == 0 and f < len(self.files) and os.path.getsize(self.files[f]) == 0:
            f += 1  # empty files left: the input may end here already
        # at the end of the last file, the marker rides with the micro-batch's last line
        return {"file": f, "pos": pos, "seq": seq + taken, "done": f >= len(self.files)}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """The micro-batch's lines in ``parts`` consecutive ranges: the files are scanned
        once more for the byte positions of the cuts, which only the offsets' line counts
        fix, so a micro-batch replayed from the offset log is cut the same way."""
        total = end["seq"] - start["seq"]
        if self.parts == 1 or total < 2:
            return [_Span(start, end)]
        per = -(-total // self.parts)
        targets = list(range(start["seq"] + per, end["seq"], per))
        cuts: list[dict[str, Any]] = []
        f, pos, seq = start["file"], start["pos"], start["seq"]
        while len(cuts) < len(targets) and f < len(self.files):
            with open(self.files[f], "rb") as fh:
                fh.seek(pos)
                for line in fh:
                    pos += len(line)
                    seq += 1
                    if seq == targets[len(cuts)]:
                        cuts.append({"file": f, "pos": pos, "seq": seq, "done": False})
                        if len(cuts) == len(targets):
                            break
                else:  # the file is read to its end
                    f, pos = f + 1, 0
        bounds = [start, *cuts, end]
        return [_Span(a, b) for a, b in itertools.pairwise(bounds)]

    def _chunks(self, partition: InputPartition, size: int = _CHUNK_ROWS) -> Iterator[Chunk]:
        """The partition's records as :data:`~.record_chain.Chunk` s of at most ``size``,
        then the end-of-input marker in a chunk of its own when the partition ends the
        input. The lines are read as the embedded source reads them (``readlines``, each
        line without its line end, decoded as UTF-8), a block at a time."""
        assert isinstance(partition, _Span)
        start, end = partition.start, partition.end
        f, pos, seq = start["file"], start["pos"], start["seq"]
        while seq < end["seq"] and f < len(self.files):
            path = self.files[f]
            with open(path, "rb") as fh:
                fh.seek(pos)
                while seq < end["seq"] and (lines := fh.readlines(_READ_BYTES)):
                    del lines[end["seq"] - seq:]  # past the partition's last line
                    records, pos = decode_block(path, pos, lines, self.errors,
                                                self.with_offsets)
                    for i in range(0, len(records), size):
                        part = records[i:i + size]
                        yield part, [None] * len(part), list(range(seq + i, seq + i
                                                                   + len(part)))
                    seq += len(lines)
            f, pos = f + 1, 0
        if end["done"] and not start["done"]:
            yield [END_OF_INPUT], [END_OF_INPUT_TIME], [seq]

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release."""
