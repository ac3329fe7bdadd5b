"""One Spark streaming query for a dataflow with several sinks: the source is read and the
per-record steps the sinks' paths share (a parse step feeding the results and a dead-letter
output) run once per record, and every sink is written from the same micro-batch.

The plan (Spark SQL, one checkpoint location):

1. the source's reader runs the per-record steps on the records it reads (the first chain of
   :mod:`.stream_source`), walking the dataflow's tree of steps (:class:`StepTree`): a step
   two sinks share runs once, and each record that reaches a branch's end becomes a row of
   that branch, tagged with its number, in one wide Arrow batch (a branch's columns are null
   in the other branches' rows). A branch ends at a per-record sink (the sink's row), at a
   native window (:mod:`.native_plan`'s columns) or at a keyed operator run in Python (the
   pickled record, its event time and key bytes);
2. the rows are hash-partitioned by source position: one shuffle (Spark's ``Exchange``),
   which every branch reads; Spark plans it once and hands the same shuffle output to each
   branch (``ReusedExchange``), so nothing before it runs twice. A branch takes its rows in
   a ``mapInArrow`` of its own (a filter there would be pushed below the shuffle by Spark's
   optimizer, making the branches' shuffles differ and the source be read once per branch);
3. each branch continues as its one-sink query would (the native aggregation, or
   ``transformWithState``), and the sinks' rows are tagged with the sink and unioned;
4. ``foreachBatch`` writes each sink's rows of the micro-batch with Spark's own file sink
   (``FileStreamSink.addBatch``: its ``_spark_metadata`` log, with the micro-batch id as the
   commit id). A micro-batch replayed after a crash of the driver has the same id and the
   same rows (the same offsets from the offset log, the same state from the state store);
   a sink whose log already has that id skips it, so every sink's output is exactly once,
   as with one query per sink.

What it takes (:func:`one_query_refusal`): one source, and at most one keyed operator among
the sinks' paths, since one query has one watermark (Spark takes the minimum of its event-time
columns', which would judge a second keyed branch's late records by the other's bound).
"""

from __future__ import annotations

import datetime
import logging
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reactive.errors import UserFunctionError
from reactive.key_encoding import encode_key
from reactive.runtime.operators.base import refuse_text

from .translation import QueryPlan, RecordStep

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = ["StepTree", "one_query_refusal", "start_one_query"]

log = logging.getLogger(__name__)

#: where Spark keeps its file sink (the package moved between Spark 4 releases)
_FILE_SINK_CLASSES = ("org.apache.spark.sql.execution.streaming.sinks.FileStreamSink",
                      "org.apache.spark.sql.execution.streaming.FileStreamSink")
_FORMAT_CLASSES = {
    "parquet": "org.apache.spark.sql.execution.datasources.parquet.ParquetFileFormat",
    "text": "org.apache.spark.sql.execution.datasources.text.TextFileFormat",
}


def one_query_refusal(plans: list[QueryPlan]) -> str | None:
    """Why ``plans`` cannot run as one query, or None when they can.

    Args:
        plans: the translated plans of one dataflow (one per sink).
    """
    if len(plans) < 2:
        return "one sink"
    if len({p.source.uid for p in plans}) > 1:
        return "the sinks read different sources"
    if any(p.join is not None for p in plans):
        return "a sink's path has a join (one query reads one source)"
    if any(p.branches for p in plans):
        return "a sink's path has a union (one query reads one source)"
    keyed = [p.keyed.name for p in plans if p.keyed is not None]
    if len(keyed) > 1:
        return (f"keyed operators on {len(keyed)} sinks' paths ({', '.join(keyed)}): one "
                "query has one watermark")
    return None


@dataclass
class StepTree:
    """The per-record steps of several branches as a tree: a node's ``steps`` run in a
    chain, then its output goes to every child and to every branch ending there.

    Attributes:
        steps: the chain of this node (empty at the root).
        children: the nodes after it, in the order the branches were added.
        ends: the branches (indexes) that end after this node's chain.
    """

    steps: list[RecordStep] = field(default_factory=list)
    children: list[StepTree] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, chains: list[list[RecordStep]]) -> StepTree:
        """The tree of ``chains`` (branch ``i``'s steps from the source), sharing the
        steps (by operator uid) their paths have in common."""
        root = cls()
        for branch, chain in enumerate(chains):
            node = root
            for step in chain:
                nxt = next((c for c in node.children if c.steps[0].uid == step.uid), None)
                if nxt is None:
                    nxt = cls([step])
                    node.children.append(nxt)
                node = nxt
            node.ends.append(branch)
        return root._compressed()

    def _compressed(self) -> StepTree:
        """The same tree with each chain of single-child nodes merged into one node."""
        children = [c._compressed() for c in self.children]
        node = StepTree(list(self.steps), children, list(self.ends))
        while len(node.children) == 1 and not node.ends:
            only = node.children[0]
            node = StepTree(node.steps + only.steps, only.children, only.ends)
        return node


# --------------------------------------------------------------------------- branch ends
# each collects, inside a Python worker, the rows of one branch of a micro-batch


class _SinkEnd:
    """A per-record sink: each record is the sink's row."""

    def __init__(self, encoder: Any) -> None:
        self.encoder = encoder
        self.fields = [(f.name, f.type) for f in encoder.arrow_schema()]
        self.rows: list[tuple[Any, ...]] = []
        self.seqs: list[int] = []

    def begin(self) -> None:
        """A new source record."""

    def add(self, record: Any, ts: float | None, seq: int) -> None:
        self.rows.append(self.encoder.row(record))
        self.seqs.append(seq)

    def marker(self, seq: int) -> None:
        """The end-of-input marker: nothing for a sink."""

    def arrays(self) -> list[Any]:
        return list(self.encoder.batch(self.rows).columns)


class _KeyedEnd:
    """A keyed operator run in Python: the record pickled, its event time, its key's
    canonical bytes (as :func:`.keyed_processor.records_to_keyed`)."""

    def __init__(self, plan: QueryPlan) -> None:
        import pyarrow as pa

        assert plan.keyed is not None
        self.key_of = plan.keyed.key_selector
        serializer = plan.keyed.key_serializer
        self.encode = serializer.serialize if serializer is not None else encode_key
        self.name, self.uid = plan.keyed.name, plan.keyed.uid
        self.fields = [("record", pa.binary()), ("ts", pa.timestamp("us", tz="UTC")),
                       ("key", pa.binary())]
        self.records: list[bytes | None] = []
        self.tss: list[Any] = []
        self.keys: list[bytes | None] = []
        self.seqs: list[int] = []

    def begin(self) -> None:
        """A new source record."""

    def add(self, record: Any, ts: float | None, seq: int) -> None:
        try:
            key = self.encode(self.key_of(record))
        except Exception as exc:
            raise UserFunctionError(self.name, self.uid, 0, 1, record, exc,
                                    f"record {seq}") from exc
        self.records.append(pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL))
        self.tss.append(None if ts is None else
                        datetime.datetime.fromtimestamp(ts, datetime.UTC))
        self.keys.append(key)
        self.seqs.append(seq)

    def marker(self, seq: int) -> None:
        from .record_chain import END_OF_INPUT_TIME

        self.records.append(None)
        self.tss.append(END_OF_INPUT_TIME)
        self.keys.append(None)
        self.seqs.append(seq)

    def arrays(self) -> list[Any]:
        import pyarrow as pa

        return [pa.array(self.records, pa.binary()),
                pa.array(self.tss, self.fields[1][1]), pa.array(self.keys, pa.binary())]


class _NativeEnd:
    """A native window: key bytes, shifted event time, rank and aggregated values, records
    late against the branch's earlier records dropped (as
    :func:`.native_plan._records_to_columns`, whose module docstring says why)."""

    def __init__(self, plan: QueryPlan, window: Any) -> None:
        from .native_plan import native_row_fields, time_shift

        assert plan.keyed is not None
        self.key_of = plan.keyed.key_selector
        serializer = plan.keyed.key_serializer
        self.encode = serializer.serialize if serializer is not None else encode_key
        self.name, self.uid = plan.keyed.name, plan.keyed.uid
        self.extractors = [a.extractor() for a in window.aggregations]
        self.size, self.offset, self.delay = window.size, window.offset, window.delay
        self.shift = time_shift(window)
        self.fields = [f for f in native_row_fields(window) if f[0] != "seq"]
        self.watermark = float("-inf")
        self.sub = 0
        self.keys: list[bytes | None] = []
        self.tss: list[int] = []
        self.subs: list[int] = []
        self.seqs: list[int] = []
        self.cols: list[list[Any]] = [[] for _ in self.extractors]

    def begin(self) -> None:
        self.sub = 0

    def add(self, record: Any, ts: float | None, seq: int) -> None:
        assert ts is not None
        late = ts - (ts - self.offset) % self.size + self.size <= self.watermark
        if ts - self.delay > self.watermark:
            self.watermark = ts - self.delay
        if late:
            return
        try:
            key = self.encode(self.key_of(record))
            values = [None if get is None else get(record) for get in self.extractors]
        except Exception as exc:
            raise UserFunctionError(self.name, self.uid, 0, 1, record, exc,
                                    f"record {seq}") from exc
        self.keys.append(key)
        self.tss.append(round(ts * 1_000_000) + self.shift)
        self.subs.append(self.sub)
        self.sub += 1
        self.seqs.append(seq)
        for column, v in zip(self.cols, values, strict=True):
            column.append(v)

    def marker(self, seq: int) -> None:
        from .record_chain import END_OF_INPUT_TIME

        self.keys.append(None)
        self.tss.append(int(END_OF_INPUT_TIME.timestamp() * 1_000_000))
        self.subs.append(0)
        self.seqs.append(seq)
        for column in self.cols:
            column.append(None)

    def arrays(self) -> list[Any]:
        import pyarrow as pa

        types = [t for _, t in self.fields]
        return [pa.array(self.keys, pa.binary()),
                pa.array(self.tss, pa.int64()).cast(types[1]),
                pa.array(self.subs, pa.int32()),
                *[pa.array(c, t) for c, t in zip(self.cols, types[3:], strict=True)]]


@dataclass
class _Branch:
    """One branch: its plan, what ends it (``"sink"``, ``"native"``, ``"python"``), and
    the native window of a native branch."""

    plan: QueryPlan
    kind: str
    window: Any = None

    def end(self) -> Any:
        from .record_chain import SinkEncoder

        assert self.plan.sink is not None
        if self.kind == "sink":
            return _SinkEnd(SinkEncoder(self.plan.sink))
        if self.kind == "native":
            return _NativeEnd(self.plan, self.window)
        return _KeyedEnd(self.plan)


def _wide_fields(branches: list[_Branch]) -> list[tuple[str, Any]]:
    """The columns of the first chain's rows: ``branch``, ``seq``, then each
    branch's own columns as ``b<i>_<name>``."""
    import pyarrow as pa

    out: list[tuple[str, Any]] = [("branch", pa.int32()), ("seq", pa.int64())]
    for i, b in enumerate(branches):
        out += [(f"b{i}_{name}", t) for name, t in b.end().fields]
    return out


def _split_records(branches: list[_Branch]) -> Any:
    """The source reader's chain: runs the step tree on the source's records
    (:data:`~.record_chain.Chunk` s) and emits every branch's rows in one wide batch."""
    tree = StepTree.of([b.plan.before_key for b in branches])
    fields = _wide_fields(branches)

    def run(chunks: Any) -> Any:
        import pyarrow as pa

        from .record_chain import END_OF_INPUT

        schema = pa.schema(fields)
        position = [0]  # the source position of the record being run (for errors)

        for records, _, seqs in chunks:
            ends = [b.end() for b in branches]
            push = _compile(tree, ends, position)
            for record, seq in zip(records, seqs, strict=True):
                if record is END_OF_INPUT:
                    for e in ends:
                        e.marker(seq)
                    continue
                for e in ends:
                    e.begin()
                position[0] = seq
                push(record, None)
            sizes = [len(e.seqs) for e in ends]
            total = sum(sizes)
            columns: list[Any] = [
                pa.array([i for i, n in enumerate(sizes) for _ in range(n)], pa.int32()),
                pa.array([s for e in ends for s in e.seqs], pa.int64())]
            before = 0
            for e, n in zip(ends, sizes, strict=True):
                after = total - before - n
                for array in e.arrays():
                    columns.append(pa.concat_arrays([pa.nulls(before, array.type), array,
                                                     pa.nulls(after, array.type)]))
                before += n
            yield pa.RecordBatch.from_arrays(columns, schema=schema)

    return run


Push = Callable[[Any, "float | None"], None]


def _compile(node: StepTree, ends: list[Any], position: list[int]) -> Push:
    """The function that runs a record (and its event time) through ``node``'s chain and
    hands each output to the node's children and branch ends: one call per step, no
    generator per record. A user function that raises fails with a
    :class:`~reactive.errors.UserFunctionError` naming its operator, the record and its
    source position (``position[0]``), as :func:`.record_chain.run_steps`."""
    targets: list[Push] = [_compile(c, ends, position) for c in node.children]

    def ending(i: int) -> Push:
        end = ends[i]
        return lambda r, t: end.add(r, t, position[0])

    targets += [ending(i) for i in node.ends]
    def fan(r: Any, t: float | None) -> None:
        for target in targets:
            target(r, t)

    out = targets[0] if len(targets) == 1 else fan
    for step in reversed(node.steps):
        out = _step(step, out, position)
    return out


def _step(step: RecordStep, then: Push, position: list[int]) -> Push:
    """One per-record step before ``then``."""
    fn, kind = step.fn, step.kind

    def fail(record: Any, exc: Exception) -> UserFunctionError:
        from .record_chain import _subtask

        return UserFunctionError(step.name, step.uid, _subtask(), 1, record, exc,
                                 f"record {position[0]}")

    if kind == "map":
        def run(r: Any, t: float | None) -> None:
            try:
                out = fn(r)
            except Exception as exc:
                raise fail(r, exc) from exc
            then(out, t)
    elif kind == "filter":
        def run(r: Any, t: float | None) -> None:
            try:
                keep = fn(r)
            except Exception as exc:
                raise fail(r, exc) from exc
            if keep:
                then(r, t)
    elif kind == "timestamps":
        def run(r: Any, t: float | None) -> None:
            try:
                ts = float(fn(r))
            except Exception as exc:
                raise fail(r, exc) from exc
            then(r, ts)
    else:  # flat_map: every output goes on, in order
        def run(r: Any, t: float | None) -> None:
            try:
                outs = fn(r)
                refuse_text(outs, "the flat_map function")  # as the runtime does
                outs = () if outs is None else list(outs)
            except Exception as exc:
                raise fail(r, exc) from exc
            for o in outs:
                then(o, t)
    return run


def _take_branch(i: int, names: list[str]) -> Any:
    """The ``mapInArrow`` function giving branch ``i``'s rows, as ``seq`` and its own
    columns under their names."""

    def run(batches: Any) -> Any:
        import pyarrow as pa
        import pyarrow.compute as pc

        for batch in batches:
            mine = batch.filter(pc.equal(batch.column("branch"), pa.scalar(i, pa.int32())))
            if mine.num_rows:
                yield pa.RecordBatch.from_arrays(
                    [mine.column("seq"), *[mine.column(f"b{i}_{n}") for n in names]],
                    names=["seq", *names])

    return run


def start_one_query(spark: SparkSession, read: Callable[[Any, Any], DataFrame],
                    plans: list[QueryPlan], location: Path, native: bool, partitions: int
                    ) -> tuple[StreamingQuery, dict[str, str]]:
    """Start the one query of ``plans`` (see the module docstring).

    Args:
        spark: the session.
        read: ``(then, schema) ->`` the source's streaming DataFrame, its reader running
            ``then`` as its first chain (:func:`~.stream_source.source_options`).
        plans: the dataflow's plans (one per sink; :func:`one_query_refusal` is None).
        location: the query's checkpoint location.
        native: whether a window of built-in aggregations runs as Spark SQL.
        partitions: the partitions of the shuffle after the per-record steps.

    Returns:
        the query and how each sink's branch runs, by sink uid.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    from .keyed_processor import keyed_from
    from .native_plan import native_aggregate, native_window
    from .record_chain import SinkEncoder

    branches: list[_Branch] = []
    shapes: dict[str, str] = {}
    for plan in plans:
        assert plan.sink is not None
        if plan.keyed is None:
            branches.append(_Branch(plan, "sink"))
            shapes[plan.sink.uid] = "per-record"
            continue
        window, why_not = native_window(plan) if native else (None, "native=False")
        if window is not None:
            branches.append(_Branch(plan, "native", window))
            shapes[plan.sink.uid] = "native window aggregation"
        else:
            log.info("operator %r runs in Python (transformWithState): %s",
                     plan.keyed.name, why_not)
            branches.append(_Branch(plan, "python"))
            shapes[plan.sink.uid] = "transformWithState"
    import pyarrow as pa

    wide = read(_split_records(branches), from_arrow_schema(pa.schema(_wide_fields(branches))))
    shuffled = wide.repartition(partitions, "seq")
    encoders = [SinkEncoder(b.plan.sink) for b in branches]  # type: ignore[arg-type]
    sink_fields = [[(f"s{j}_{f.name}", f.type) for f in e.arrow_schema()]
                   for j, e in enumerate(encoders)]
    every = [f for fs in sink_fields for f in fs]
    union_schema = from_arrow_schema(pa.schema(every))
    outputs: list[DataFrame] = []
    for i, (branch, encoder) in enumerate(zip(branches, encoders, strict=True)):
        own = branch.end().fields
        names = [n for n, _ in own]
        schema = from_arrow_schema(pa.schema([("seq", pa.int64()), *own]))
        rows = shuffled.mapInArrow(_take_branch(i, names), schema)
        if branch.kind == "sink":
            out = rows.drop("seq")
        elif branch.kind == "native":
            out = native_aggregate(rows.select("key", "ts", "seq", "sub", *names[3:]),
                                   branch.plan, branch.window, encoder)
        else:
            out = keyed_from(rows.select("record", "ts", "seq", "key"), branch.plan,
                             encoder)
        mine = {f"s{i}_{f.name}": f.name for f in encoder.arrow_schema()}
        outputs.append(out.select(
            F.lit(i).alias("sink"),
            *[F.col(mine[f.name]).alias(f.name) if f.name in mine
              else F.lit(None).cast(f.dataType).alias(f.name) for f in union_schema.fields]))
    union = outputs[0]
    for other in outputs[1:]:
        union = union.unionByName(other)
    writer = _SinkWriter(branches, encoders, sink_fields)
    query = (union.writeStream.foreachBatch(writer)
             .option("checkpointLocation", str(location))
             .queryName("+".join(b.plan.sink.uid for b in branches))  # type: ignore[union-attr]
             .trigger(availableNow=True)
             .start())
    return query, shapes


class _SinkWriter:
    """The ``foreachBatch`` function: writes each sink's rows of a micro-batch with Spark's
    file sink, the micro-batch id as the commit id (a sink that committed it skips it)."""

    def __init__(self, branches: list[_Branch], encoders: list[Any],
                 sink_fields: list[list[tuple[str, Any]]]) -> None:
        self.directories = [str(b.plan.sink.directory) for b in branches]  # type: ignore[union-attr]
        self.formats = [e.spark_format for e in encoders]
        self.columns = [[(name, name.split("_", 1)[1]) for name, _ in fs]
                        for fs in sink_fields]
        self.sinks: list[Any] | None = None

    def _file_sinks(self, spark: SparkSession) -> list[Any]:
        from py4j.java_gateway import JavaClass

        jvm = spark.sparkContext._jvm
        assert jvm is not None

        def java_class(name: str) -> Any:
            found: Any = jvm
            for part in name.split("."):
                found = getattr(found, part)
            return found if isinstance(found, JavaClass) else None

        sink_class = next((c for c in map(java_class, _FILE_SINK_CLASSES) if c is not None),
                          None)
        if sink_class is None:
            raise RuntimeError(f"this Spark has none of {_FILE_SINK_CLASSES}")
        utils = jvm.org.apache.spark.api.python.PythonUtils
        out = []
        for directory, fmt in zip(self.directories, self.formats, strict=True):
            options = jvm.java.util.HashMap()
            options.put("path", directory)
            out.append(sink_class(spark._jsparkSession, directory,
                                  java_class(_FORMAT_CLASSES[fmt])(),
                                  utils.toSeq(jvm.java.util.ArrayList()),
                                  utils.toScalaMap(options)))
        return out

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        from pyspark.sql import functions as F

        if self.sinks is None:
            self.sinks = self._file_sinks(batch.sparkSession)
        batch.persist()
        try:
            for j, (sink, columns) in enumerate(zip(self.sinks, self.columns, strict=True)):
                rows = batch.where(F.col("sink") == j).select(
                    *[F.col(c).alias(name) for c, name in columns])
                sink.addBatch(batch_id, rows._jdf)
        finally:
            batch.unpersist()
