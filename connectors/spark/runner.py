"""The Spark runner: the same :class:`~reactive.Dataflow` run as Spark Structured Streaming
queries with their checkpoint locations (Spark's offset and commit logs and its
state store) and Spark's file sink (exactly once through its ``_spark_metadata`` log,
readable by :class:`~.result_log.ResultLog`): one query for the whole dataflow where its
sinks allow it (:mod:`.one_query`), else one per sink.

```python
from reactive.connectors.spark import SparkRunner, local_session
runner = SparkRunner(local_session("local[2]"), checkpoint_location="chk/spark")
job = runner.run(flow)           # to the end of the input; job.progress() per query
```

A query reads its source in micro-batches (``max_records_per_batch``) under
``Trigger.AvailableNow`` and stops once the input, and the end-of-input marker that fires
the last timers, are processed. Started again on the same checkpoint location (after a
crash of the driver, say), it continues after the last committed micro-batch: Spark's
checkpoint plays the part of the embedded runtime's checkpoints.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reactive.graph import LogicalGraph

from .errors import SparkJobError
from .translation import JOIN_KINDS, QueryPlan, SourceStep, translate

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = ["TRANSIENT_FAILURES", "SparkJob", "SparkRunner", "batch_records", "is_transient",
           "shuffle_partitions_for"]

log = logging.getLogger(__name__)

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
STATE_STORE_PROVIDER = "spark.sql.streaming.stateStore.providerClass"
WATERMARK_POLICY = "spark.sql.streaming.multipleWatermarkPolicy"
NO_DATA_MICRO_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"
"""Spark's micro-batches without input rows, run when the watermark moved (to fire timers
and emit windows): a key-group query has no timers, so it starts with them off."""
#: the shuffle partitions :func:`~.session.local_session` set when its caller chose none:
#: while the session still has that value, the runner sizes the queries as in a session
#: where nobody set them
SIZED_BY_DEFAULT = "spark.reactive.shufflePartitions.default"


@dataclass
class SparkJob:
    """The running (or finished) queries of a dataflow on Spark.

    Attributes:
        queries: the streaming query of each sink, by the sink's uid (sinks written by one
            query share it).
        plans: the translated plans, in the same order.
        settings: the Spark SQL settings the runner gave the queries (by configuration key),
            which differ from the session's; the session itself is left as it was.
        shapes: how each query runs, by sink uid: ``"native window aggregation"`` (Spark
            SQL, :mod:`.native_plan`), ``"transformWithState"`` (the keyed operator in
            Python, per key), ``"key groups (transformWithStateInPandas)"`` (in Python, per
            key group: :mod:`.key_group_plan`), ``"stream-stream join"``
            (:mod:`.spark_joins`) or ``"per-record"`` (no keyed operator).
    """

    queries: dict[str, StreamingQuery]
    plans: list[QueryPlan]
    settings: dict[str, str] = field(default_factory=dict)
    shapes: dict[str, str] = field(default_factory=dict)

    def wait(self) -> None:
        """Wait until every query has processed its whole input.

        Raises:
            SparkJobError: when a query failed, naming its sink and carrying Spark's error
                (a failing user function is named there with its operator and record).
        """
        for uid, q in self.queries.items():
            try:
                q.awaitTermination()
            except Exception as exc:
                raise SparkJobError(f"the Spark query of sink {uid!r} failed: {exc}") from exc
            error = q.exception()
            if error is not None:
                raise SparkJobError(f"the Spark query of sink {uid!r} failed: {error}")

    def stop(self) -> None:
        """Stop every query (what they committed stays; a later run continues from it)."""
        for q in self.queries.values():
            q.stop()

    def progress(self) -> dict[str, list[dict[str, Any]]]:
        """Spark's progress reports of each query's recent micro-batches, by sink uid."""
        return {uid: list(q.recentProgress) for uid, q in self.queries.items()}

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per query (by sink uid), from Spark's progress reports: ``micro_batches`` run,
        ``input_rows`` (the source records the recent micro-batches read, by their offsets,
        and the end-of-input marker: :func:`batch_records`) and ``rows_per_second`` (those
        over the micro-batches' trigger execution time), ``state_rows`` and ``state_bytes``
        (memory used) of the stateful operators after the last micro-batch, and
        ``shape``."""
        out: dict[str, dict[str, Any]] = {}
        for uid, q in self.queries.items():
            reports = [json.loads(p.json) for p in q.recentProgress]
            last: dict[str, Any] = reports[-1] if reports else {}
            rows = sum(batch_records(p) for p in reports)
            millis = sum(int(p.get("durationMs", {}).get("triggerExecution", 0))
                         for p in reports)
            operators = last.get("stateOperators") or []
            out[uid] = {
                "shape": self.shapes.get(uid, ""),
                "micro_batches": int(last.get("batchId", -1)) + 1,
                "input_rows": rows,
                "rows_per_second": rows / (millis / 1000) if millis else 0.0,
                "state_rows": sum(int(o.get("numRowsTotal", 0)) for o in operators),
                "state_bytes": sum(int(o.get("memoryUsedBytes", 0)) for o in operators),
            }
        return out

    def records_read(self) -> dict[str, int]:
        """Source records (and the end-of-input marker) each query read over its recent
        micro-batches, by sink uid (:func:`batch_records`)."""
        return {uid: sum(batch_records(json.loads(p.json)) for p in q.recentProgress)
                for uid, q in self.queries.items()}


#: what Spark says when a Python worker it started did not connect back in time
TRANSIENT_FAILURES = ("Python worker failed to connect back",
                      "waiting for the Python worker to connect back")


def is_transient(error: BaseException) -> bool:
    """True when ``error`` (or an error it was raised from) says a Python worker did not
    connect back to Spark in time: a start-up too slow on a loaded machine, which a
    restart from the checkpoint gets past (:meth:`SparkRunner.run`)."""
    seen: BaseException | None = error
    while seen is not None:
        if any(text in str(seen) for text in TRANSIENT_FAILURES):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def batch_records(progress: dict[str, Any]) -> int:
    """The source records one micro-batch read, from its progress report's offsets (the
    reader hands Spark what its first chain of steps makes, so Spark's ``numInputRows``
    counts those rows, not the records): the positions between the start and end offsets
    (records; lines for the CSV source), plus one for the end-of-input marker in the
    micro-batch that carries it.

    Args:
        progress: a ``StreamingQueryProgress`` as a dict (its ``json`` parsed).

    Returns:
        the count; a source without the reactive offsets counts its ``numInputRows``.
    """
    total = 0
    for source in progress.get("sources") or []:
        start, end = (_offset(source.get(k)) for k in ("startOffset", "endOffset"))
        if end is None or not ({"seq", "index"} & end.keys()):
            total += int(source.get("numInputRows", 0))
            continue
        where = "seq" if "seq" in end else "index"
        first = 0 if start is None else int(start[where])
        total += int(end[where]) - first
        total += bool(end.get("done")) and not (start or {}).get("done", False)
    return total


def _offset(value: Any) -> dict[str, Any] | None:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


class SparkRunner:
    """Runs dataflows on Spark Structured Streaming.

    Args:
        spark: the session (``local_session()`` for one machine, or a cluster's).
        checkpoint_location: a directory; the query of a sink of dataflow ``job`` keeps its
            Spark checkpoint in ``<checkpoint_location>/<job>/<sink uid>``, the one query of
            several sinks in ``<checkpoint_location>/<job>/<uid>+<uid>...`` (in sink order).
        max_records_per_batch: source records per micro-batch at most.
        state_store: ``"rocksdb"`` (Spark's RocksDB state store provider), ``"default"``
            (the session's, HDFS-backed unless configured otherwise: the state in the JVM's
            memory, a delta file per commit) or ``"auto"`` (the default): RocksDB where a
            keyed operator runs in Python (``transformWithState`` needs it), else the
            session's: the state of a native window or a join is bounded by the watermark,
            and the in-memory store commits it faster (``bench.spark_speed
            --state-stores``). A query keeps the provider it started with in its
            checkpoint.
        shuffle_partitions: ``spark.sql.shuffle.partitions`` of the queries (Spark's number
            of state store partitions of a stateful query: its keyed parallelism). None: the
            session's value when someone set it, else the dataflow's parallelism (see
            :func:`shuffle_partitions_for`).
        native: run what is relational as Spark SQL (:mod:`.native_plan`: windows with
            built-in aggregations); False keeps every keyed operator in Python.
        key_groups: run a keyed operator without timers (``process`` without ``on_timer``,
            ``reduce``) grouped by key group (:mod:`.key_group_plan`); False: per key.
        read_partitions: Spark tasks each micro-batch's records are read and run through
            the per-record functions in (consecutive ranges of the source; 1: one task, in
            source order). More use more cores for parsing; a keyed operator still sees
            each key's records in source order, but late records are judged as embedded
            only with 1 (see :mod:`.native_plan`). None (the default): a CSV or line file
            source is read in as many tasks as the dataflow's parallelism (each task reads a
            consecutive range of the file, so ``local[2]`` reads and parses on both cores),
            any other source in one.
        one_query: run a dataflow with several sinks as one query (:mod:`.one_query`: the
            source read and the shared steps run once, every sink written from each
            micro-batch) where it has one source and at most one keyed operator; False (the
            default): one query per sink, each reading the source. One query does half the
            Python work of two, but in one chain of stages (its extra shuffle, per-branch
            tasks and one write job per sink cost seconds per micro-batch), where two
            queries run side by side on two cores: measure both (``bench.spark_speed``).
        restart_attempts: how many times :meth:`run` restarts the queries from their
            checkpoints after a Python worker did not connect back to Spark in time.
        restart_delay: seconds before the first such restart (the n-th waits n times as
            long).

    Sizing: a stateful streaming query runs one task per shuffle partition in every
    micro-batch, and fixes that number in its checkpoint for good. Spark's default of 200
    partitions makes a small keyed query on a laptop run 200 tiny tasks per micro-batch, so
    the runner gives the queries the dataflow's parallelism unless the user chose a value
    (here, or in the session's configuration). The session is not changed: the settings
    apply to the queries this runner starts (a streaming query keeps a copy of the session's
    configuration from its start), are logged, and are listed in ``SparkJob.settings``.
    Adaptive query execution (``spark.sql.adaptive.*``) does not apply to streaming
    queries: Spark turns it off for them, so it cannot coalesce these partitions either.

    Raises:
        ValueError: on a non-positive ``max_records_per_batch``, ``shuffle_partitions`` or
            ``read_partitions``, a negative ``restart_attempts``, or an unknown state store.
    """

    def __init__(self, spark: SparkSession, checkpoint_location: str | Path,
                 max_records_per_batch: int = 100_000, state_store: str = "auto",
                 shuffle_partitions: int | None = None, native: bool = True,
                 read_partitions: int | None = None, one_query: bool = False,
                 restart_attempts: int = 3, restart_delay: float = 5.0,
                 key_groups: bool = True) -> None:
        if max_records_per_batch < 1:
            raise ValueError(f"max_records_per_batch must be >= 1, got {max_records_per_batch}")
        if state_store not in ("rocksdb", "default", "auto"):
            raise ValueError("state_store must be 'rocksdb', 'default' or 'auto', got "
                             f"{state_store!r}")
        if shuffle_partitions is not None and shuffle_partitions < 1:
            raise ValueError(f"shuffle_partitions must be >= 1, got {shuffle_partitions}")
        self.spark = spark
        self.checkpoint_location = Path(checkpoint_location)
        self.max_records_per_batch = max_records_per_batch
        self.state_store = state_store
        self.shuffle_partitions = shuffle_partitions
        self.native, self.key_groups = native, key_groups
        self.one_query = one_query
        if read_partitions is not None and read_partitions < 1:
            raise ValueError(f"read_partitions must be >= 1, got {read_partitions}")
        self.read_partitions = read_partitions
        if restart_attempts < 0:
            raise ValueError(f"restart_attempts must be >= 0, got {restart_attempts}")
        self.restart_attempts = restart_attempts
        self.restart_delay = max(0.0, restart_delay)
        self._flow: LogicalGraph | None = None  # the dataflow start() runs

    def translate(self, flow: LogicalGraph) -> list[QueryPlan]:
        """The query plans of ``flow`` (see :func:`~.translation.translate`).

        Raises:
            TranslationError: naming an operator without a Spark translation.
        """
        return translate(flow)

    def start(self, flow: LogicalGraph) -> SparkJob:
        """Translate ``flow`` and start its queries; returns at once.

        Raises:
            TranslationError: before any query starts, naming an operator that cannot run
                on Spark and why.
        """
        plans = translate(flow)
        from .stream_source import ReactiveSource

        self._flow = flow

        _export_python_path(self.spark)

        self._source_format = _register_source(self.spark, ReactiveSource)
        settings = self.query_settings(flow)
        queries: dict[str, StreamingQuery] = {}
        shapes: dict[str, str] = {}
        from .one_query import one_query_refusal

        why_not = one_query_refusal(plans) if self.one_query else "one_query=False"
        with _session_conf(self.spark, settings):
            if why_not is None:
                names = [p.sink.uid for p in plans if p.sink is not None]
                query, shapes = self._start_one_query(
                    plans, self.checkpoint_location / flow.name / "+".join(names))
                return SparkJob(dict.fromkeys(names, query), plans, settings, shapes)
            if len(plans) > 1:
                log.info("the sinks of dataflow %r run as one query each: %s", flow.name,
                         why_not)
            try:
                for plan in plans:
                    assert plan.sink is not None
                    location = self.checkpoint_location / flow.name / plan.sink.uid
                    queries[plan.sink.uid], shapes[plan.sink.uid] = self._start_query(
                        plan, location)
            except BaseException:
                for q in queries.values():
                    q.stop()
                raise
        return SparkJob(queries, plans, settings, shapes)

    def query_settings(self, flow: LogicalGraph) -> dict[str, str]:
        """The Spark SQL settings the queries of ``flow`` get where the session's differ:
        the shuffle partitions (see the class docstring) and the RocksDB state store
        provider (see ``state_store``); each change is logged with the session's value it
        replaces."""
        conf = self.spark.conf
        wanted: dict[str, str] = {}
        chosen = self.shuffle_partitions
        current = conf.get(SHUFFLE_PARTITIONS, None)
        if chosen is None and (current is None or conf.get(SIZED_BY_DEFAULT, None) == current):
            chosen = shuffle_partitions_for(flow)
        if chosen is not None:
            wanted[SHUFFLE_PARTITIONS] = str(chosen)
        if self.state_store == "rocksdb" or (self.state_store == "auto"
                                             and self._python_state(flow)):
            wanted[STATE_STORE_PROVIDER] = ROCKSDB_PROVIDER
        if any(t.kind in ("union", *JOIN_KINDS) for t in flow.transformations):
            # a union's or a join's query has a watermark per input; only their minimum
            # holds a timer (or a join's state) until every input has passed it (the
            # embedded union's and join's watermark)
            wanted[WATERMARK_POLICY] = "min"
        settings: dict[str, str] = {}
        for key, value in wanted.items():
            had = conf.get(key, None)
            if had == value:
                continue
            settings[key] = value
            log.info("the Spark queries of dataflow %r run with %s=%s (the session has %s)",
                     flow.name, key, value,
                     "Spark's default" if had is None else f"{had!r}")
        return settings

    def _python_state(self, flow: LogicalGraph) -> bool:
        """Whether a query of ``flow`` keeps a keyed operator's state in Python
        (``transformWithState`` and its pandas form, which need the RocksDB store)."""
        from .native_plan import native_window

        return any(p.keyed is not None and (bool(p.branches) or not self.native
                                             or native_window(p)[0] is None)
                   for p in translate(flow))

    def run(self, flow: LogicalGraph) -> SparkJob:
        """``start`` then ``wait``: run ``flow`` to the end of its input.

        A query that fails because a Python worker Spark started did not connect back in
        time (Spark waits a fixed 10 s for the workers it starts to plan and read a Python
        data source; a loaded machine can take longer to start an interpreter) is
        restarted from its checkpoint location, up to ``restart_attempts`` times, the n-th
        restart ``n * restart_delay`` seconds after the failure (Flink's restart strategies
        with a growing delay, to let a load spike pass): Spark's offset and commit logs
        make the restarted queries continue after their last committed micro-batch, so the
        output stays exactly once. Any other failure ends the run.

        Raises:
            TranslationError: as :meth:`start`.
            SparkJobError: when a query failed (for a worker that did not connect back:
                ``restart_attempts + 1`` times in a row).
        """
        attempt = 0
        while True:
            job: SparkJob | None = None
            try:  # a worker planning a source's read may fail the start itself
                job = self.start(flow)
                job.wait()
                return job
            except Exception as exc:
                if attempt >= self.restart_attempts or not is_transient(exc):
                    raise
                attempt += 1
                log.warning("restarting the Spark queries of dataflow %r from their "
                            "checkpoints in %.0f s (restart %d of at most %d): %s", flow.name,
                            attempt * self.restart_delay, attempt, self.restart_attempts,
                            _first_line(exc))
            finally:
                if job is not None:
                    job.stop()
            time.sleep(attempt * self.restart_delay)

    def read_partitions_for(self, flow: LogicalGraph, source: SourceStep) -> int:
        """The Spark tasks each micro-batch of ``source`` is read in.

        Args:
            flow: the dataflow.
            source: one of its translated sources (``QueryPlan.source``).

        Returns:
            ``read_partitions`` when given, else the dataflow's parallelism for a CSV or
            line file source and 1 for the others (see the class docstring).
        """
        if self.read_partitions is not None:
            return self.read_partitions
        return flow.parallelism if source.kind in ("csv", "lines") else 1

    def _partitions_of(self, source: SourceStep) -> int:
        assert self._flow is not None, "start() sets the dataflow"
        return self.read_partitions_for(self._flow, source)

    # ------------------------------------------------------------------ one query
    def _source_frame(self, plan: QueryPlan, then: Any, schema: Any) -> DataFrame:
        """The source of ``plan`` read with ``then`` as its first chain of steps (see
        :func:`~.stream_source.source_options`): a DataFrame of ``schema``."""
        from .stream_source import SOURCE_FORMAT, source_options

        return (self.spark.readStream.format(getattr(self, "_source_format", SOURCE_FORMAT))
                .options(**source_options(plan.source.kind, plan.source.source,
                                          self.max_records_per_batch,
                                          self._partitions_of(plan.source), then, schema))
                .load())

    def _columnar_frame(self, plan: QueryPlan, encoder: Any) -> DataFrame:
        """A columnar plan's rows: the Arrow source's record batches through each
        ``map_batches`` step as Spark's ``mapInArrow`` (Arrow batches in and out of the
        Python workers, the embedded operator's schema check on every result), then the
        sink's rows."""
        from pyspark.sql.pandas.types import from_arrow_schema

        from .stream_source import SOURCE_FORMAT, source_options

        frame = (self.spark.readStream.format(getattr(self, "_source_format", SOURCE_FORMAT))
                 .options(**source_options("arrow", plan.source.source,
                                           self.max_records_per_batch,
                                           self._partitions_of(plan.source)))
                 .load())
        columnar = [s for s in plan.before_key if s.kind == "map_batches"]
        for step in columnar:
            frame = frame.mapInArrow(_map_batches(step), from_arrow_schema(step.schema))
        records = [s for s in plan.before_key if s.kind not in ("map_batches", "to_records")]
        return frame.mapInArrow(_batches_to_sink(records, encoder), encoder.spark_schema())

    def _start_one_query(self, plans: list[QueryPlan], location: Path
                         ) -> tuple[StreamingQuery, dict[str, str]]:
        from .one_query import start_one_query

        partitions = int(self.spark.conf.get(SHUFFLE_PARTITIONS, "200") or 200)
        query, shapes = start_one_query(
            self.spark, lambda then, schema: self._source_frame(plans[0], then, schema),
            plans, location, self.native, partitions)
        log.info("starting the one Spark query of sinks %s (%s; checkpoint location %s)",
                 ", ".join(shapes), ", ".join(f"{u}: {s}" for u, s in shapes.items()),
                 location)
        return query, shapes

    def _start_query(self, plan: QueryPlan, location: Path) -> tuple[StreamingQuery, str]:
        from .key_group_plan import (
            KEY_GROUP_SCHEMA,
            KEY_GROUP_SHAPE,
            key_group_frame,
            key_group_records,
            key_group_refusal,
        )
        from .keyed_processor import KEYED_INPUT_SCHEMA, keyed_from, records_to_keyed
        from .native_plan import native_aggregate, native_columns, native_window
        from .record_chain import SinkEncoder

        assert plan.sink is not None
        encoder = SinkEncoder(plan.sink)
        # the source's reader runs the steps before the keyed operator (or the sink)
        if plan.join is not None:
            from .spark_joins import join_frame

            shape = "stream-stream join"
            out = join_frame(lambda source, then, schema: self._source_frame(
                QueryPlan(source), then, schema), plan.join, plan.after_key, encoder)
        elif plan.source.kind == "arrow":
            shape = "columnar (mapInArrow)"
            out = self._columnar_frame(plan, encoder)
        elif plan.keyed is None:
            shape = "per-record"
            out = _union([self._source_frame(p, _records_to_sink(p, encoder),
                                             encoder.spark_schema()) for p in plan.inputs()])
        elif plan.branches:
            shape = "transformWithState"
            log.info("operator %r runs in Python (transformWithState): its input is a union, "
                     "with a watermark per input", plan.keyed.name)
            # one watermark per input, each with its own bound: the query's is their minimum
            # (Spark's multipleWatermarkPolicy "min"), so one input's end-of-input marker
            # fires no timer while another still has records
            out = keyed_from(_union([
                self._source_frame(p, records_to_keyed(p), KEYED_INPUT_SCHEMA).withWatermark(
                    "ts", f"{int((p.watermark_delay or 0.0) * 1000)} milliseconds")
                for p in plan.inputs()]), plan, encoder, watermarked=True)
        else:
            window, why_not = native_window(plan) if self.native else (None, "native=False")
            if window is not None:
                shape = "native window aggregation"
                out = native_aggregate(self._source_frame(plan, *native_columns(plan, window)),
                                       plan, window, encoder)
            elif (refused := key_group_refusal(plan) if self.key_groups
                  else "key_groups=False") is None:
                shape = KEY_GROUP_SHAPE  # one Python call and state value per key group
                out = key_group_frame(self._source_frame(
                    plan, key_group_records(plan), KEY_GROUP_SCHEMA), plan, encoder)
            else:
                shape = "transformWithState"
                log.info("operator %r runs in Python (transformWithState): %s",
                         plan.keyed.name, f"{why_not}; {refused}")
                out = keyed_from(self._source_frame(plan, records_to_keyed(plan),
                                                    KEYED_INPUT_SCHEMA), plan, encoder)
        writer = (out.writeStream.format(encoder.spark_format)
                  .outputMode("append")
                  .option("path", plan.sink.directory)
                  .option("checkpointLocation", str(location))
                  .queryName(f"{plan.sink.uid}")
                  .trigger(availableNow=True))
        log.info("starting the Spark query of sink %r (%s; checkpoint location %s)",
                 plan.sink.uid, shape, location)
        # a key-group query keeps no timers: after its last micro-batch with records, the
        # watermark the end-of-input marker moved has nothing left to fire or emit
        with _session_conf(self.spark, {NO_DATA_MICRO_BATCHES: "false"}
                           if shape == KEY_GROUP_SHAPE else {}):
            return writer.start(), shape


def _map_batches(step: Any) -> Any:
    """A ``map_batches`` step as a ``mapInArrow`` function: the embedded runtime's operator
    runs each batch (a result of another schema, or a raising function, fails the query
    naming the operator)."""

    def run(batches: Any) -> Any:
        from reactive.columnar.operators import MapBatchesOperator

        from .record_chain import _subtask

        op = MapBatchesOperator(step.name, step.uid, step.fn, step.schema)
        op.subtask = _subtask()
        for batch in batches:
            yield from op.process_batch([batch])

    return run


def _batches_to_sink(steps: list[Any], encoder: Any) -> Any:
    """A columnar stream's record batches as the sink's rows (a ``mapInArrow`` function):
    each row as the ``dict`` of its columns (as the embedded sink, or ``to_records``, hands
    it on), through the per-record ``steps`` after ``to_records``."""

    def run(batches: Any) -> Any:
        from .record_chain import run_steps

        row = encoder.row
        for batch in batches:
            rows = [row(r) for d in batch.to_pylist()
                    for r, _ in run_steps(steps, d, None)] if steps else \
                [row(d) for d in batch.to_pylist()]
            if rows:
                yield encoder.batch(rows)

    return run


def _union(frames: list[DataFrame]) -> DataFrame:
    """The rows of every frame (of one schema) in one stream (Spark's ``union``)."""
    out = frames[0]
    for frame in frames[1:]:
        out = out.union(frame)
    return out


def shuffle_partitions_for(flow: LogicalGraph) -> int:
    """The shuffle partitions a dataflow's queries get when nobody chose them: the largest
    parallelism of its keyed operators (the dataflow's default where an operator has
    none), at most its max parallelism (its number of key groups).

    Args:
        flow: the dataflow.

    Returns:
        a partition count >= 1.
    """
    keyed = [t.parallelism or flow.parallelism for t in flow.transformations
             if any(e.partitioning == "hash" for e in t.inputs)]
    return max(1, min(max(keyed, default=flow.parallelism), flow.max_parallelism))


@contextmanager
def _session_conf(spark: SparkSession, settings: dict[str, str]) -> Iterator[None]:
    """Apply ``settings`` to the session while queries start (each streaming query keeps a
    copy of the configuration it started with), then restore the session's own values."""
    conf = spark.conf
    before = {key: conf.get(key, None) for key in settings}
    for key, value in settings.items():
        conf.set(key, value)
    try:
        yield
    finally:
        for key, had in before.items():
            if had is None:
                conf.unset(key)
            else:
                conf.set(key, had)


def _export_python_path(spark: SparkSession) -> None:
    """Give the Python workers the driver's import path (``PYTHONPATH`` of the UDFs created
    from now on), so that the modules of the pipeline's functions and record types import
    there as they do in the driver, as with the embedded runtime (on a cluster the paths
    must exist on the workers, or the modules be shipped with ``addPyFile``)."""
    import os
    import sys

    env = spark.sparkContext.environment
    have = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    extra = [p for p in sys.path if p and os.path.isdir(p) and p not in have]
    if extra:
        env["PYTHONPATH"] = os.pathsep.join([*have, *extra])


def _records_to_sink(plan: QueryPlan, encoder: Any) -> Any:
    """The source reader's chain of a query without a keyed operator: source records
    (:data:`~.record_chain.Chunk` s) through the steps to the sink's rows."""
    steps = plan.before_key

    def run(chunks: Any) -> Any:
        from .record_chain import END_OF_INPUT, run_chunk

        row = encoder.row
        for records, _, seqs in chunks:
            if records and records[-1] is END_OF_INPUT:  # the reader's last row: no
                records, seqs = records[:-1], seqs[:-1]  # watermark to move here
            outs, _, _ = run_chunk(steps, records, seqs)
            if outs:
                yield encoder.batch(list(map(row, outs)))

    return run


def _register_source(spark: Any, source: Any) -> str:
    """Register the dataflow source with ``spark`` and return the format name to read it by.

    A session made by ``newSession()`` after its parent registered the source inherits the
    registration's name but cannot look it up (Spark 4: registering again raises
    DATA_SOURCE_ALREADY_EXISTS, reading raises DATA_SOURCE_NOT_FOUND); such a session gets
    the source under a name of its own."""
    try:
        spark.dataSource.register(source)
        return str(source.name())
    except Exception as exc:
        if "DATA_SOURCE_ALREADY_EXISTS" not in str(exc):
            raise
    own = f"{source.name()}-{uuid.uuid4().hex[:8]}"
    renamed = type(f"{source.__name__}OfSession", (source,),
                   {"name": classmethod(lambda cls: own)})
    spark.dataSource.register(renamed)
    return own
