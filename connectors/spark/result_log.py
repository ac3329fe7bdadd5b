"""Reading the committed result logs of a :class:`~reactive.connectors.files.CommittingFileSink` into
Spark.

The sink commits one file per subtask and checkpoint, ``part-<subtask>-<checkpoint>.<ext>``
(``ext`` is ``jsonl`` or ``parquet``), by an atomic rename when the checkpoint completes; its
in-progress and pending files start with ``.``. So the committed output is exactly the set of
files matching that name, and a consumer that remembers the last checkpoint it read can ingest
only newer files (incremental ingestion, as a Spark job that keeps up with the stream does).
Source: DESIGN.md, "Two-phase-commit sinks" and "The PySpark bridge"; Flink's ``FileSink``
part-file lifecycle (in-progress, pending, finished).

Before Spark reads anything, every selected file is opened and its head checked (the first
JSON line, or the parquet footer): a missing or unreadable file and a file whose fields differ
from the others fail here, with an error naming the file, instead of as a Spark task failure
deep in a later action.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ResultLogError
from .spark_sink_log import is_spark_sink_directory, spark_sink_files

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["PartFile", "ResultLog", "list_part_files"]

PART_FILE = re.compile(r"^part-(\d+)-(\d+)\.(jsonl|parquet)$")
_FORMATS = ("jsonl", "parquet")
#: the columns the reader adds; a record field with one of these names is refused
ADDED_COLUMNS = ("checkpoint_id", "subtask")
# a JSON value's kind; "integer" and "number" are compatible when comparing files
_KINDS: dict[type, str] = {bool: "boolean", int: "integer", float: "number", str: "string",
                           dict: "object", list: "array"}
_NUMERIC = {"integer", "number"}


@dataclass(frozen=True, order=True)
class PartFile:
    """One committed part file.

    Attributes:
        checkpoint_id: the checkpoint whose completion committed it.
        subtask: the sink subtask that wrote it.
        path: its path.
        format: ``jsonl`` or ``parquet`` (its extension).
    """

    checkpoint_id: int
    subtask: int
    path: Path
    format: str


def list_part_files(directory: str | Path) -> list[PartFile]:
    """Every committed part file in ``directory``, by checkpoint then subtask.

    Names starting with ``.`` (in-progress and pending files) and anything else that does
    not match ``part-<subtask>-<checkpoint>.<jsonl|parquet>`` are ignored. A directory
    written by Spark's file sink (the Spark runner's output) is read through its
    ``_spark_metadata`` log instead: its committed files, the micro-batch as checkpoint id
    and the partition as subtask (:mod:`.spark_sink_log`).

    Raises:
        ResultLogError: if ``directory`` does not exist or is not a directory.
    """
    d = Path(directory)
    if not d.is_dir():
        raise ResultLogError(f"result log directory {d} does not exist (or is not a directory)")
    if is_spark_sink_directory(d):
        return sorted(PartFile(f.batch_id, f.partition, f.path, f.format)
                      for f in spark_sink_files(d))
    out = []
    for p in d.iterdir():
        m = PART_FILE.match(p.name)
        if m and p.is_file():
            out.append(PartFile(int(m.group(2)), int(m.group(1)), p, m.group(3)))
    return sorted(out)


def _kind(value: Any) -> str | None:
    return None if value is None else _KINDS.get(type(value), "other")


def _first_json_record(path: Path) -> Any:
    """The first record of a JSON-lines file (None for an empty file).

    Raises:
        ResultLogError: naming the file, if it cannot be read or its first line is not JSON.
    """
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    return json.loads(line)
    except (OSError, UnicodeDecodeError) as exc:
        raise ResultLogError(f"cannot read part file {path}: {exc}") from exc
    except ValueError as exc:
        raise ResultLogError(f"part file {path} is not JSON lines: first record: {exc}") from exc
    return None


def _first_bad_json_line(path: Path) -> str | None:
    """``"line <n>: <error>"`` for the first line of ``path`` that is not JSON, else None."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    json.loads(line)
                except ValueError as exc:
                    return f"line {n}: {exc}"
    return None


class ResultLog:
    """The committed result log of a committing file sink, as a Spark DataFrame.

    ```python
    log = ResultLog(spark, "out/")
    df = log.read()                                    # everything committed so far
    new = log.read(after_checkpoint=last_seen)         # only parts committed later
    last_seen = log.checkpoints()[-1]
    ```

    Records are the sink's: JSON objects become columns by field name; JSON arrays (tuples)
    and parquet files written from tuples have positional columns ``f0, f1, ...`` (the
    sink's naming), unless ``schema`` names them. Every row gets the columns
    ``checkpoint_id`` (bigint) and ``subtask`` (int) of its part file.

    Args:
        spark: the session.
        directory: the sink's directory.
        format: ``"jsonl"`` or ``"parquet"``; None: from the files' extensions (an error if
            the directory holds both).
        schema: the records' schema (a ``StructType`` or a DDL string such as
            ``"word string, count bigint"``); None: inferred (JSON objects: by Spark over all
            selected rows; JSON arrays: from the first record of each file; parquet: the
            footer). Needed to read an empty selection when the directory has no part file.

    Raises:
        ResultLogError: on an unknown format.
    """

    def __init__(self, spark: SparkSession, directory: str | Path, format: str | None = None,
                 schema: StructType | str | None = None) -> None:
        if format is not None and format not in _FORMATS:
            raise ResultLogError(f"format must be 'jsonl' or 'parquet', got {format!r}")
        self.spark = spark
        self.directory = Path(directory)
        self.format = format
        self._schema_arg = schema

    # ------------------------------------------------------------------ listing
    def parts(self, after_checkpoint: int | None = None, up_to: int | None = None
              ) -> list[PartFile]:
        """The committed part files of the log's format with ``after_checkpoint <
        checkpoint_id <= up_to`` (bounds optional), by checkpoint then subtask.

        Raises:
            ResultLogError: if the directory is missing, or holds both formats and no
                ``format`` was given.
        """
        every = list_part_files(self.directory)
        fmt = self._format(every)
        return [p for p in every if p.format == fmt
                and (after_checkpoint is None or p.checkpoint_id > after_checkpoint)
                and (up_to is None or p.checkpoint_id <= up_to)]

    def checkpoints(self) -> list[int]:
        """The distinct checkpoint ids that committed part files, ascending (the last one is
        what to pass as ``after_checkpoint`` next time).

        Raises:
            ResultLogError: as :meth:`parts`.
        """
        return sorted({p.checkpoint_id for p in self.parts()})

    def _format(self, every: list[PartFile]) -> str | None:
        if self.format is not None:
            return self.format
        formats = sorted({p.format for p in every})
        if len(formats) > 1:
            raise ResultLogError(
                f"{self.directory} holds both jsonl and parquet part files: pass format="
            )
        return formats[0] if formats else None

    # ------------------------------------------------------------------ reading
    def read(self, after_checkpoint: int | None = None, up_to: int | None = None) -> DataFrame:
        """Read the committed records of checkpoints ``after_checkpoint < id <= up_to``.

        Args:
            after_checkpoint: only parts of later checkpoints (exclusive); None: from the start.
            up_to: only parts of checkpoints up to this one (inclusive); None: to the newest.

        Returns:
            the records plus ``checkpoint_id`` and ``subtask`` (lazily read by Spark; an
            empty selection gives an empty DataFrame with the log's columns).

        Raises:
            ResultLogError: naming the file, when the directory is missing, a selected part
                file cannot be read or is not valid JSON lines / parquet, its fields differ
                from the other files' (or from ``schema``), a record has a field named
                ``checkpoint_id`` or ``subtask``, or when there is nothing to take the
                columns of an empty selection from (no part file at all and no ``schema``).
        """
        every = list_part_files(self.directory)
        fmt = self._format(every)
        selected = [p for p in every if p.format == fmt
                    and (after_checkpoint is None or p.checkpoint_id > after_checkpoint)
                    and (up_to is None or p.checkpoint_id <= up_to)]
        if selected:
            return self._read(selected, fmt)
        schema = self._schema()
        if schema is None:
            candidates = [p for p in every if p.format == fmt]
            if not candidates:
                raise ResultLogError(
                    f"{self.directory} has no committed part files yet: pass schema= to get "
                    "an empty DataFrame"
                )
            # an empty selection still has the log's columns: take them from the newest file
            return self._read(candidates[-1:], fmt).limit(0)
        from pyspark.sql.types import IntegerType, LongType, StructField, StructType

        fields = [*schema.fields, StructField("checkpoint_id", LongType(), False),
                  StructField("subtask", IntegerType(), False)]
        return self.spark.createDataFrame([], StructType(fields))

    def _schema(self) -> StructType | None:
        s = self._schema_arg
        if s is None or not isinstance(s, str):
            return s
        # parses a DDL string on both Spark 3.5 and 4 (DataType.fromDDL is 4.0+)
        return self.spark.createDataFrame([], s).schema

    def _read(self, parts: list[PartFile], fmt: str | None) -> DataFrame:
        if fmt == "parquet":
            df = self._read_parquet(parts)
        else:
            df, with_source = self._read_jsonl(parts)
            if with_source:
                return df
        clash = [c for c in ADDED_COLUMNS if c in df.columns]
        if clash:
            raise ResultLogError(f"records in {parts[0].path} have fields {clash}, the columns "
                                 "the reader adds: rename them in the pipeline")
        return df.select("*", *_source_columns(parts))

    # ------------------------------------------------------------------ parquet
    def _read_parquet(self, parts: list[PartFile]) -> DataFrame:
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = self._schema()
        ref: tuple[Path, pa.Schema] | None = None
        for p in parts:
            try:
                # the footer only: cheap, and it is what a truncated or foreign file lacks
                s = pq.read_schema(p.path)
            except (OSError, pa.ArrowException) as exc:
                raise ResultLogError(f"cannot read part file {p.path} as parquet: {exc}") from exc
            if schema is not None:
                if s.names != schema.names:
                    raise ResultLogError(f"part file {p.path} has columns {s.names}, the schema "
                                         f"{schema.names}")
            elif ref is None:
                ref = (p.path, s)
            elif not s.equals(ref[1], check_metadata=False):
                raise ResultLogError(
                    f"schema mismatch: part file {p.path} has schema "
                    f"{_arrow_fields(s)}, {ref[0].name} has {_arrow_fields(ref[1])}"
                )
        reader = self.spark.read
        if schema is not None:
            reader = reader.schema(schema)
        return reader.parquet(*(str(p.path) for p in parts))

    # ------------------------------------------------------------------ JSON lines
    def _read_jsonl(self, parts: list[PartFile]) -> tuple[DataFrame, bool]:
        """The records of JSON-lines parts, and whether the source columns are already in."""
        schema = self._schema()
        ref: tuple[Path, Any] | None = None
        kinds: list[str | None] = []
        for p in parts:
            record = _first_json_record(p.path)
            if record is None:
                continue
            if not isinstance(record, dict | list):
                raise ResultLogError(f"part file {p.path} holds {type(record).__name__} "
                                     "records: the reader takes JSON objects or arrays")
            if ref is None:
                ref = (p.path, record)
                kinds = [_kind(v) for v in record] if isinstance(record, list) else []
                if schema is not None:
                    _check_against_schema(p.path, record, schema)
                continue
            _check_same_shape(p.path, record, ref)
            if isinstance(record, list):
                kinds = [_merge_kind(a, _kind(b)) for a, b in zip(kinds, record, strict=True)]
        if ref is not None and isinstance(ref[1], list):
            return self._read_json_arrays(parts, kinds, schema), True
        return self._read_json_objects(parts, schema), False

    def _read_json_objects(self, parts: list[PartFile], schema: StructType | None) -> DataFrame:
        paths = [str(p.path) for p in parts]
        if schema is None:
            # Spark infers over every row (one pass); a malformed line shows up as the
            # _corrupt_record column, which costs nothing to test for on the happy path
            inferred = self.spark.read.json(paths).schema
            if "_corrupt_record" in inferred.names:
                for p in parts:
                    bad = _first_bad_json_line(p.path)
                    if bad is not None:
                        raise ResultLogError(f"part file {p.path} is not JSON lines: {bad}")
                raise ResultLogError(f"Spark found malformed records in {self.directory}")
            schema = inferred
        # FAILFAST: a record that does not fit fails the read (Spark's error names the file)
        # rather than silently becoming nulls
        return self.spark.read.schema(schema).option("mode", "FAILFAST").json(paths)

    def _read_json_arrays(self, parts: list[PartFile], kinds: list[str | None],
                          schema: StructType | None) -> DataFrame:
        from pyspark.sql import functions as F

        paths = [str(p.path) for p in parts]

        if schema is not None:
            names = schema.names
            types = [f.dataType.simpleString() for f in schema.fields]
        else:
            names = [f"f{i}" for i in range(len(kinds))]
            types = [_SPARK_TYPE.get(k or "string", "string") for k in kinds]
        text = self.spark.read.text(paths)
        clash = [c for c in ADDED_COLUMNS if c in names]
        if clash:
            raise ResultLogError(f"the schema has fields {clash}, the columns the reader adds")
        cols: list[Column] = []
        for i, (name, typ) in enumerate(zip(names, types, strict=True)):
            value = F.get_json_object(F.col("value"), f"$[{i}]")
            cols.append((value if typ == "string" else value.cast(typ)).alias(name))
        # empty lines are not records (a JSON-lines file may end with one); the source
        # columns are added here, while the file's hidden _metadata column is in scope
        return text.where(F.length(F.trim(F.col("value"))) > 0).select(
            *cols, *_source_columns(parts))


def _source_columns(parts: list[PartFile]) -> list[Column]:
    """``checkpoint_id`` and ``subtask`` of each row, from its file's name (or, for the
    files of Spark's file sink, whose names hold neither, from its metadata log)."""
    from pyspark.sql import functions as F

    name = F.col("_metadata.file_name")
    if not all(PART_FILE.match(p.path.name) for p in parts):
        ids = F.create_map(*[x for p in parts for x in (F.lit(p.path.name),
                                                       F.lit(p.checkpoint_id))])
        subtasks = F.create_map(*[x for p in parts for x in (F.lit(p.path.name),
                                                            F.lit(p.subtask))])
        return [ids[name].cast("bigint").alias("checkpoint_id"),
                subtasks[name].cast("int").alias("subtask")]
    pattern = PART_FILE.pattern
    return [F.regexp_extract(name, pattern, 2).cast("bigint").alias("checkpoint_id"),
            F.regexp_extract(name, pattern, 1).cast("int").alias("subtask")]


_SPARK_TYPE = {"boolean": "boolean", "integer": "bigint", "number": "double", "string": "string",
               "object": "string", "array": "string", "other": "string"}


def _arrow_fields(schema: Any) -> str:
    return "(" + ", ".join(f"{f.name} {f.type}" for f in schema) + ")"


def _merge_kind(a: str | None, b: str | None) -> str | None:
    if a is None:
        return b
    if b is None or a == b:
        return a
    return "number" if {a, b} <= _NUMERIC else "string"


def _shape(record: Any) -> dict[str, str | None]:
    if isinstance(record, dict):
        return {k: _kind(v) for k, v in record.items()}
    return {f"f{i}": _kind(v) for i, v in enumerate(record)}


def _check_same_shape(path: Path, record: Any, ref: tuple[Path, Any]) -> None:
    """Refuse a file whose first record has other fields (or kinds) than the reference's.

    Raises:
        ResultLogError: naming both files and the difference.
    """
    ref_path, ref_record = ref
    if isinstance(record, dict) != isinstance(ref_record, dict):
        raise ResultLogError(
            f"schema mismatch: part file {path} holds JSON {_shape_word(record)}, "
            f"{ref_path.name} holds JSON {_shape_word(ref_record)}"
        )
    mine, theirs = _shape(record), _shape(ref_record)
    if mine.keys() != theirs.keys():
        raise ResultLogError(
            f"schema mismatch: part file {path} has fields {sorted(mine)}, "
            f"{ref_path.name} has {sorted(theirs)}"
        )
    for name, kind in mine.items():
        other = theirs[name]
        if kind is not None and other is not None and kind != other \
                and not {kind, other} <= _NUMERIC:
            raise ResultLogError(
                f"schema mismatch: field {name!r} holds {kind} values in part file {path} "
                f"and {other} values in {ref_path.name}"
            )


def _shape_word(record: Any) -> str:
    return "objects" if isinstance(record, dict) else "arrays"


def _check_against_schema(path: Path, record: Any, schema: StructType) -> None:
    names: Sequence[str] = list(record) if isinstance(record, dict) else []
    if isinstance(record, dict) and set(names) != set(schema.names):
        raise ResultLogError(f"part file {path} has fields {sorted(names)}, the schema "
                             f"{sorted(schema.names)}")
    if isinstance(record, list) and len(record) != len(schema.names):
        raise ResultLogError(f"part file {path} has records of {len(record)} fields, the "
                             f"schema {len(schema.names)}")
