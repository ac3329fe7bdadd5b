"""Translating a dataflow's logical graph into Spark query plans: one plan per sink, a path
from a source (or the union of several) through per-record functions, at most one keyed
operator, to the sink.

Each sink of the dataflow becomes one Spark streaming query (Spark's unit of a checkpoint
location and of exactly-once output); a part of the graph two sinks share (a parse step
feeding the results and a dead-letter output) runs in both queries, reading the same
deterministic source. What a path may hold:

- a source: the line-file or CSV file source (read by byte offset) or a collection (by
  index);
- ``union``: the inputs' records in one stream (Spark's ``union`` of one read per
  source, each running its own per-record steps up to the union); inputs made of sources
  and per-record steps only, with a keyed operator after the union only where event time
  is assigned on each input before it (Spark keeps a watermark per input and the query's
  is their minimum, as the embedded runtime's union forwards the minimum of its inputs');
- ``map`` / ``filter`` / ``flat_map`` (and the runtime's own pass-through filters, such as
  the window operator's result and late-data outputs): run per record in Arrow batches;
- ``assign_timestamps``: gives records event time; its bound becomes the watermark delay
  (Spark's ``withWatermark``);
- one keyed operator after ``key_by``: ``process(KeyedProcessFunction)``, ``reduce`` or an
  event-time or count window, run by ``groupBy(key).transformWithState`` with its state and
  timers in Spark's state store (:mod:`.keyed_processor`);
- an event-time join (``interval_join``, or ``join(...).window(...)`` with tumbling or
  sliding windows) of two inputs made of a source and per-record steps each, event time
  assigned on each, as a Spark stream-stream inner join with a watermark per input
  (:mod:`.spark_joins`), per-record steps after it; not with ``late_data()`` or a
  ``ProcessJoinFunction.open`` (no Spark equivalent), nor with another keyed operator
  before or after it in the query;
- a committing file sink (Spark's file sink: JSON lines as text, or parquet);
- a columnar path instead: an Arrow source (``from_arrow``), ``map_batches`` steps (Spark's
  ``mapInArrow``), optionally ``to_records`` and per-record steps, a committing file sink.

Anything else -- an async operator, a loop, a two-input operator other than the above
(connect, broadcast state), a keyed operator before a union, a non-keyed process function
with operator state, a custom two-phase-commit or callback sink, the Kafka connectors -- is
refused by :func:`translate` before anything runs, with a :class:`~.errors.TranslationError`
naming the operator and why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from reactive.graph import LogicalGraph, Transformation
from reactive.runtime import operators as ops
from reactive.runtime.operators.event_time import EventTimeOperator
from reactive.serialization import Serializer

from .errors import TranslationError

__all__ = ["JOIN_KINDS", "Branch", "JoinStep", "KeyedStep", "QueryPlan", "RecordStep",
           "SinkStep", "SourceStep", "translate"]

# operators that call one user function per record, by their runtime class
_PER_RECORD: dict[type, str] = {ops.MapOperator: "map", ops.FilterOperator: "filter",
                                ops.FlatMapOperator: "flat_map"}

_TWO_INPUT_KINDS = {"co_map", "co_flat_map", "co_process", "broadcast_process", "join"}

#: the event-time joins, translated to Spark stream-stream joins (:mod:`.spark_joins`)
JOIN_KINDS = ("interval_join", "window_join")


@dataclass
class SourceStep:
    """Where a query's records come from.

    Attributes:
        name, uid: the source operator's.
        kind: ``"lines"`` (a line-file source), ``"csv"`` (a CSV file source) or
            ``"collection"``.
        source: the dataflow's source object (read again by the Spark data source).
    """

    name: str
    uid: str
    kind: str
    source: Any


@dataclass
class RecordStep:
    """One per-record operator (``map``, ``filter``, ``flat_map``), ``assign_timestamps``, or
    a columnar stream's ``map_batches``.

    Attributes:
        name, uid: the operator's.
        kind: ``"map"``, ``"filter"``, ``"flat_map"``, ``"timestamps"`` or ``"map_batches"``.
        fn: the user function (for ``"timestamps"``: record -> event time, seconds; for
            ``"map_batches"``: ``pyarrow.RecordBatch`` -> ``pyarrow.RecordBatch``).
        schema: the ``pyarrow.Schema`` of a ``"map_batches"`` step's results (else None).
    """

    name: str
    uid: str
    kind: str
    fn: Callable[[Any], Any]
    schema: Any = None


@dataclass
class KeyedStep:
    """The keyed operator of a query and how its records are keyed.

    Attributes:
        name, uid: the operator's.
        kind: the transformation's kind (``"process"``, ``"reduce"``, ``"window"``).
        operator: a fresh runtime operator (the same class the embedded runtime runs), to
            be opened inside Spark's stateful processor with Spark-backed state and timers.
        key_selector: record -> key.
        key_serializer: the ``key_by`` serializer, or None for the canonical key encoding.
        max_parallelism: the dataflow's number of key groups (``ctx.max_parallelism``).
    """

    name: str
    uid: str
    kind: str
    operator: ops.StreamOperator
    key_selector: Callable[[Any], Any]
    key_serializer: Serializer | None
    max_parallelism: int


@dataclass
class SinkStep:
    """A committing file sink, as Spark's file sink.

    Attributes:
        name, uid: the sink operator's.
        directory: the output directory (Spark's file sink writes it with its
            ``_spark_metadata`` log).
        format: ``"jsonl"`` (JSON lines, Spark's text format) or ``"parquet"``.
        schema: the parquet ``pyarrow.Schema`` (None for JSON lines).
    """

    name: str
    uid: str
    directory: str
    format: str
    schema: Any


@dataclass
class Branch:
    """One input of a union: a source and the per-record steps from it to the union.

    Attributes:
        source: the source.
        steps: its ``map`` / ``filter`` / ``flat_map`` / ``assign_timestamps`` steps, in order.
        watermark_delay: the bound of its ``assign_timestamps`` (seconds), or None.
    """

    source: SourceStep
    steps: list[RecordStep] = field(default_factory=list)
    watermark_delay: float | None = None


@dataclass
class JoinStep:
    """An event-time join of two keyed inputs (``interval_join`` or ``window_join``), run
    as a Spark stream-stream inner join (:mod:`.spark_joins`).

    Attributes:
        name, uid: the join operator's.
        kind: ``"interval_join"`` or ``"window_join"``.
        operator: a fresh runtime operator (``IntervalJoinOperator`` or
            ``WindowJoinOperator``): its function, bounds or window assigner.
        inputs: the left and the right input, each a source and its per-record steps
            (``watermark_delay`` is the bound of its ``assign_timestamps``).
        key_selectors: record -> key, of the left and the right input.
        key_serializers: their ``key_by`` serializers (None: the canonical key encoding).
    """

    name: str
    uid: str
    kind: str
    operator: ops.StreamOperator
    inputs: tuple[Branch, Branch]
    key_selectors: tuple[Callable[[Any], Any], Callable[[Any], Any]]
    key_serializers: tuple[Serializer | None, Serializer | None]


@dataclass
class QueryPlan:
    """One Spark streaming query: a source, per-record steps, at most one keyed step, more
    per-record steps, a sink.

    Attributes:
        source: the source.
        before_key: steps before the keyed operator (all of them when there is none).
        keyed: the keyed operator, or None.
        after_key: steps between the keyed operator and the sink.
        sink: the sink.
        watermark_delay: the bound of the ``assign_timestamps`` before the keyed operator
            (seconds), or None when the records have no event time (or, after a union,
            each input has its own: ``Branch.watermark_delay``).
        branches: the inputs of a union on the path, in the union's input order (empty
            without one); ``source`` is then the first's, and ``before_key`` holds the
            steps after the union.
        join: the event-time join the path starts with, or None; ``source`` is then its
            left input's, and ``after_key`` holds the steps after the join.
    """

    source: SourceStep
    before_key: list[RecordStep] = field(default_factory=list)
    keyed: KeyedStep | None = None
    after_key: list[RecordStep] = field(default_factory=list)
    sink: SinkStep | None = None
    watermark_delay: float | None = None
    branches: list[Branch] = field(default_factory=list)
    join: JoinStep | None = None

    def inputs(self) -> list[QueryPlan]:
        """The plan as one linear plan per source: each branch's steps followed by the steps
        after the union (``[self]`` without a union). Their reads, unioned, are the
        query's input."""
        if not self.branches:
            return [self]
        return [replace(self, source=b.source, before_key=[*b.steps, *self.before_key],
                        watermark_delay=b.watermark_delay, branches=[])
                for b in self.branches]


def _refuse(t: Transformation, reason: str) -> TranslationError:
    return TranslationError(t.name, t.resolved_uid, t.kind, reason)


def translate(flow: LogicalGraph) -> list[QueryPlan]:
    """Translate every sink's path of ``flow`` into a :class:`QueryPlan`.

    Every transformation of the dataflow is checked, also those on no path to a sink, so a
    program is refused as a whole, before any query starts.

    Args:
        flow: the dataflow (``reactive.Dataflow``).

    Returns:
        one plan per sink, in the order the sinks were added.

    Raises:
        TranslationError: naming the first operator without a Spark translation and why.
    """
    consumers: dict[int, list[Transformation]] = {}
    for t in flow.transformations:
        for e in t.inputs:
            consumers.setdefault(e.upstream.id, []).append(t)
    for t in flow.transformations:
        _check(t)
    plans = [_plan(flow, t) for t in flow.transformations if t.kind == "sink"]
    if not plans:
        raise TranslationError(flow.name, flow.name, "dataflow",
                               "it has no sink, so no Spark query would run")
    return plans


def _check(t: Transformation) -> None:
    """Refuse a transformation without a Spark translation (see the module docstring)."""
    if t.kind == "union":
        if any(e.partitioning in ("hash", "broadcast") for e in t.inputs):
            raise _refuse(t, "a union of keyed or broadcast streams is not translated; "
                             "key the stream after the union")
        return
    if t.kind in JOIN_KINDS:
        _check_join(t)
        return
    if t.kind in _TWO_INPUT_KINDS or len(t.inputs) > 1:
        raise _refuse(t, "operators with two inputs other than union and the event-time "
                         "joins (connect, broadcast state) are not translated; run the "
                         "program embedded")
    if t.kind == "map_async" or t.kind.startswith("map_async"):
        raise _refuse(t, "async operators (map_async) keep in-flight calls in the embedded "
                         "runtime's checkpoints, which Spark's micro-batches have no place for; "
                         "call the service from a map, or run the program embedded")
    if "iterat" in t.kind or "loop" in t.kind or "feedback" in t.kind:
        raise _refuse(t, "loops (iterate) need back-edges, which a Spark query (a directed "
                         "acyclic plan) cannot have")
    if any(e.partitioning == "broadcast" for e in t.inputs):
        raise _refuse(t, "broadcast partitioning has no Spark equivalent in a streaming query")
    if t.kind in ("source", "sink", "assign_timestamps"):
        return
    op = t.factory()
    if type(op) in _PER_RECORD or t.kind in ("map_batches", "to_records"):
        return
    if t.kind.startswith("columnar_"):
        raise _refuse(t, f"columnar operators of kind {t.kind!r} are not translated: a "
                         "columnar stream runs on Spark as map_batches steps (mapInArrow), "
                         "then optionally to_records and per-record steps")
    if t.kind in ("process", "reduce", "window"):
        if not (t.inputs and t.inputs[0].partitioning == "hash"):
            raise _refuse(t, "a process function without key_by(...) has operator state, "
                             "which Spark's per-key state store cannot hold; key the stream")
        return
    raise _refuse(t, f"no Spark translation for operators of kind {t.kind!r} "
                     f"({type(op).__name__})")


def _check_join(t: Transformation) -> None:
    """Refuse an event-time join whose semantics a Spark stream-stream join does not have
    (see :mod:`.spark_joins`)."""
    from reactive.two_input_functions import ProcessJoinFunction

    if len(t.inputs) != 2 or any(e.partitioning != "hash" for e in t.inputs):
        raise _refuse(t, "a join of Spark needs two keyed inputs (key_by on each)")
    op = t.factory()
    if op.late_output():  # type: ignore[attr-defined]
        raise _refuse(t, "late_data() is not translated: Spark's stream-stream join has no "
                         "output for late rows (it drops rows behind its watermark, and "
                         "joins a late row whose partners are still in its state); drop "
                         "late_data() and give assign_timestamps a bound the input keeps, "
                         "or run the program embedded")
    fn = getattr(op, "fn", None)
    if isinstance(fn, ProcessJoinFunction) and type(fn).open is not ProcessJoinFunction.open:
        raise _refuse(t, f"{type(fn).__name__}.open() is not translated: on Spark the join "
                         "function runs per matched pair after Spark's join, with no runtime "
                         "context (state, subtask) to open with; set it up in __init__, or "
                         "join with fn(left, right)")


def _path(end: Transformation) -> list[Transformation]:
    """The transformations from the source, the last union or the last join, to ``end``, in
    order."""
    path = [end]
    while path[-1].inputs and path[-1].kind != "union" and path[-1].kind not in JOIN_KINDS:
        path.append(path[-1].inputs[0].upstream)
    return path[::-1]


def _branches(union: Transformation) -> list[Branch]:
    """The inputs of ``union`` as branches: a source and per-record steps each (the inputs
    of a union feeding this one are its inputs too).

    Raises:
        TranslationError: naming a keyed operator before the union.
    """
    branches: list[Branch] = []
    for edge in union.inputs:
        path = _path(edge.upstream)
        steps: list[RecordStep] = []
        delay: float | None = None
        for t in path[1:]:
            if t.kind == "assign_timestamps":
                assert t.timestamp_fn is not None
                steps.append(RecordStep(t.name, t.resolved_uid, "timestamps", t.timestamp_fn))
                delay = float(t.factory().generator.delay)  # type: ignore[attr-defined]
                continue
            op = t.factory()
            kind = _PER_RECORD.get(type(op))
            if t.kind == "map_batches":
                raise _refuse(t, f"a union of columnar streams ({union.name!r}) is not "
                                 "translated")
            if kind is None:
                raise _refuse(t, f"a keyed operator before union {union.name!r} is not "
                                 "translated (a union's inputs are sources and per-record "
                                 "steps); key the stream after the union")
            steps.append(RecordStep(t.name, t.resolved_uid, kind, op.fn))  # type: ignore[attr-defined]
        if path[0].kind in JOIN_KINDS:
            raise _refuse(path[0], f"a join before union {union.name!r} is not translated "
                                   "(a union's inputs are sources and per-record steps)")
        if path[0].kind == "union":
            for inner in _branches(path[0]):
                branches.append(Branch(inner.source, [*inner.steps, *steps],
                                       delay if delay is not None else inner.watermark_delay))
        else:
            branches.append(Branch(_source_step(path[0]), steps, delay))
    return branches


def _plan(flow: LogicalGraph, sink: Transformation) -> QueryPlan:
    path = _path(sink)
    if path[0].kind in JOIN_KINDS:
        return _join_plan(path, sink)
    if path[0].kind == "union":
        branches = _branches(path[0])
        plan = QueryPlan(branches[0].source, branches=branches)
    else:
        plan = QueryPlan(_source_step(path[0]))
    if plan.source.kind == "arrow":
        return _columnar_plan(plan, path, sink)
    delay: float | None = None
    keyed_t: Transformation | None = None
    for t in path[1:-1]:
        steps = plan.before_key if plan.keyed is None else plan.after_key
        if t.kind == "assign_timestamps":
            if plan.keyed is not None:
                raise _refuse(t, "event time assigned after the keyed operator is not "
                                 "translated (one keyed operator per query)")
            op = t.factory()
            assert t.timestamp_fn is not None
            steps.append(RecordStep(t.name, t.resolved_uid, "timestamps", t.timestamp_fn))
            delay = float(op.generator.delay)  # type: ignore[attr-defined]
            continue
        op = t.factory()
        kind = _PER_RECORD.get(type(op))
        if kind is not None:
            steps.append(RecordStep(t.name, t.resolved_uid, kind, op.fn))  # type: ignore[attr-defined]
            continue
        if plan.keyed is not None:
            raise _refuse(t, f"a second keyed operator after {plan.keyed.name!r} on the path "
                             f"to sink {sink.name!r}: one keyed operator per Spark query is "
                             "translated")
        plan.keyed = _keyed_step(flow, t, op)
        keyed_t = t
    plan.watermark_delay = delay
    if keyed_t is not None and plan.branches:
        _check_union_event_time(plan, path[0], keyed_t)
    elif keyed_t is not None and plan.keyed is not None and _needs_event_time(plan.keyed) \
            and delay is None:
        raise _refuse(keyed_t, "event-time windows need assign_timestamps(...) before key_by on Spark "
                      "(its bound is the query's watermark delay)")
    plan.sink = _sink_step(sink)
    return plan


def _join_plan(path: list[Transformation], sink: Transformation) -> QueryPlan:
    """The plan of a path starting with an event-time join: its two inputs (a source and
    per-record steps each, event time assigned on each), per-record steps after it, a sink.

    Raises:
        TranslationError: naming a keyed operator before or after the join, a union before
            it, or an input without ``assign_timestamps``.
    """
    join = _join_step(path[0])
    plan = QueryPlan(join.inputs[0].source, join=join)
    for t in path[1:-1]:
        if t.kind == "assign_timestamps":
            assert t.timestamp_fn is not None
            plan.after_key.append(RecordStep(t.name, t.resolved_uid, "timestamps",
                                             t.timestamp_fn))
            continue
        op = t.factory()
        kind = _PER_RECORD.get(type(op))
        if kind is None:
            raise _refuse(t, f"a keyed operator after join {join.name!r} is not translated "
                             "(the join is the Spark query's one stateful operator); run the "
                             "program embedded")
        plan.after_key.append(RecordStep(t.name, t.resolved_uid, kind, op.fn))  # type: ignore[attr-defined]
    plan.sink = _sink_step(sink)
    return plan


def _join_step(t: Transformation) -> JoinStep:
    """The join ``t`` with its inputs as branches (a source and per-record steps each)."""
    op = t.factory()
    op.late_output = _Constant(False)  # type: ignore[attr-defined]  # refused if True
    timestamp_fns = op.timestamp_fns  # type: ignore[attr-defined]
    inputs: list[Branch] = []
    for i, (side, edge) in enumerate(zip(("left", "right"), t.inputs, strict=True)):
        path = _path(edge.upstream)
        if path[0].kind == "union" or path[0].kind in JOIN_KINDS:
            raise _refuse(t, f"its {side} input comes from {path[0].kind} {path[0].name!r}: "
                             "a join's inputs are translated when each is a source and "
                             "per-record steps")
        steps: list[RecordStep] = []
        delay: float | None = None
        for u in path[1:]:
            if u.kind == "assign_timestamps":
                assert u.timestamp_fn is not None
                steps.append(RecordStep(u.name, u.resolved_uid, "timestamps", u.timestamp_fn))
                delay = float(u.factory().generator.delay)  # type: ignore[attr-defined]
                continue
            kind = _PER_RECORD.get(type(u_op := u.factory()))
            if kind is None:
                raise _refuse(u, f"a keyed operator before join {t.name!r} is not translated "
                                 "(the join is the Spark query's one stateful operator)")
            steps.append(RecordStep(u.name, u.resolved_uid, kind, u_op.fn))  # type: ignore[attr-defined]
        timestamps = [s for s in steps if s.kind == "timestamps"]
        if delay is None or timestamps[-1].fn is not timestamp_fns[i]:
            raise _refuse(t, f"its {side} input needs assign_timestamps(...) before key_by on "
                             "Spark (its bound is the watermark delay of that side of "
                             "Spark's join)")
        inputs.append(Branch(_source_step(path[0]), steps, delay))
    left, right = t.inputs
    assert left.key_selector is not None and right.key_selector is not None
    return JoinStep(t.name, t.resolved_uid, t.kind, op, (inputs[0], inputs[1]),
                    (left.key_selector, right.key_selector),
                    (left.key_serializer, right.key_serializer))


def _columnar_plan(plan: QueryPlan, path: list[Transformation],
                   sink: Transformation) -> QueryPlan:
    """The plan of a columnar path: an Arrow source, ``map_batches`` steps (Spark's
    ``mapInArrow``), optionally ``to_records`` and per-record steps, a committing file sink.
    ``before_key`` holds them all, a ``"to_records"`` step between the columnar and the
    per-record ones.

    Raises:
        TranslationError: naming any other operator on the path.
    """
    if plan.branches:
        raise _refuse(path[0], "a union of columnar streams is not translated")
    records = False
    for t in path[1:-1]:
        op = t.factory()
        kind = _PER_RECORD.get(type(op))
        if records and kind is not None:
            plan.before_key.append(RecordStep(t.name, t.resolved_uid, kind, op.fn))  # type: ignore[attr-defined]
        elif t.kind == "to_records" and not records:
            records = True
            plan.before_key.append(RecordStep(t.name, t.resolved_uid, "to_records", _identity))
        elif t.kind == "map_batches" and not records:
            plan.before_key.append(RecordStep(t.name, t.resolved_uid, "map_batches",
                                              op.fn, op.schema))  # type: ignore[attr-defined]
        else:
            raise _refuse(t, f"operators of kind {t.kind!r} are not translated on a columnar "
                             "path: it runs on Spark as map_batches steps (mapInArrow), then "
                             "optionally to_records and map / filter / flat_map, to a "
                             "committing file sink")
    plan.sink = _sink_step(sink)
    return plan


def _check_union_event_time(plan: QueryPlan, union: Transformation,
                            keyed_t: Transformation) -> None:
    """Refuse a keyed operator after a union whose event time Spark cannot follow as the
    embedded runtime does: Spark keeps one watermark per input of a union (the query's is
    their minimum, as the embedded union forwards the minimum of its inputs'), so event time
    must be assigned on every input before the union, not once after it."""
    assert plan.keyed is not None
    timed = [b.watermark_delay is not None for b in plan.branches]
    if plan.watermark_delay is not None or (any(timed) and not all(timed)):
        raise _refuse(keyed_t, f"event time assigned after union {union.name!r}, or on some "
                               "of its inputs only, is not translated: assign_timestamps(...) "
                               "on each input before the union (Spark keeps a watermark per "
                               "input)")
    if _needs_event_time(plan.keyed) and not all(timed):
        raise _refuse(keyed_t, "event-time windows need assign_timestamps(...) on each input "
                               f"of union {union.name!r} on Spark (their bounds are the "
                               "query's watermark delays)")


def _needs_event_time(step: KeyedStep) -> bool:
    """True for window operators over event time (they never fire without a watermark)."""
    return step.kind == "window" and hasattr(step.operator, "timestamp_fn")


def _keyed_step(flow: LogicalGraph, t: Transformation, op: ops.StreamOperator) -> KeyedStep:
    edge = t.inputs[0]
    assert edge.key_selector is not None
    if isinstance(op, EventTimeOperator):
        # the callable reaches the whole fluent API (and every source and sink) through its
        # closure; what it answers is fixed once the program is built
        op.late_output = _Constant(bool(op.late_output()))
    return KeyedStep(t.name, t.resolved_uid, t.kind, op, edge.key_selector,
                     edge.key_serializer, flow.max_parallelism)


def _identity(value: Any) -> Any:
    return value


class _Constant:
    """A picklable function of no arguments returning ``value``."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __call__(self) -> Any:
        return self.value


def _source_step(t: Transformation) -> SourceStep:
    from reactive.columnar import ArrowSource
    from reactive.connectors.collections import CollectionSource
    from reactive.connectors.files import CsvFileSource, LineFileSource

    factory_source = t.factory()
    source = getattr(factory_source, "source", None)
    if isinstance(source, ArrowSource):
        return SourceStep(t.name, t.resolved_uid, "arrow", source)
    if isinstance(source, LineFileSource):
        return SourceStep(t.name, t.resolved_uid, "lines", source)
    if isinstance(source, CollectionSource):
        return SourceStep(t.name, t.resolved_uid, "collection", source)
    if isinstance(source, CsvFileSource):
        if source.columnar:
            raise _refuse(t, "the CSV source in columnar mode (record batches) is not "
                             "translated; read it with columnar=False")
        return SourceStep(t.name, t.resolved_uid, "csv", source)
    what = type(source).__name__
    if "Kafka" in what:
        raise _refuse(t, "the Kafka source is not translated yet (Spark's Kafka source needs "
                         "the spark-sql-kafka package on Spark's classpath); run it embedded")
    raise _refuse(t, f"no Spark translation for source {what}: the line-file and CSV "
                     "file sources and collections are translated")


def _sink_step(t: Transformation) -> SinkStep:
    from reactive.connectors.files import CommittingFileSink

    sink = t.sink
    if isinstance(sink, CommittingFileSink):
        if sink.format == "parquet" and sink.schema is None:
            raise _refuse(t, "a parquet CommittingFileSink needs schema= on Spark (a "
                             "streaming query's columns are fixed before it runs)")
        return SinkStep(t.name, t.resolved_uid, str(sink.directory), sink.format, sink.schema)
    what = type(sink).__name__
    if "Kafka" in what:
        raise _refuse(t, "the Kafka sink is not translated yet (Spark's Kafka sink needs the "
                         "spark-sql-kafka package on Spark's classpath); run it embedded")
    if hasattr(sink, "pre_commit"):
        raise _refuse(t, f"{what} is a custom two-phase-commit sink: Spark commits output "
                         "through its own sink protocol, which cannot drive the sink's "
                         "transactions; write to a CommittingFileSink")
    raise _refuse(t, f"{what} has no Spark translation (callbacks and in-memory sinks live "
                     "in one process); write to a CommittingFileSink")
