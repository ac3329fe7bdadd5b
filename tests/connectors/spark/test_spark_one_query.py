"""One Spark query for several sinks: the steps the sinks' paths share run once per record
(the step tree), and which dataflows take one query."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reactive import Dataflow, KeyedProcessFunction
from reactive.connectors.files import CommittingFileSink
from reactive.connectors.spark.one_query import StepTree, one_query_refusal
from reactive.connectors.spark.translation import translate


class Echo(KeyedProcessFunction):
    def process_element(self, value: Any, ctx: Any) -> Any:
        return [value]


def two_sinks(out: Path, keyed_both: bool = False) -> Dataflow:
    flow = Dataflow("tree")
    parsed = (flow.from_collection(["1", "x", "2"]).map(str.strip, name="strip").uid("strip")
              .flat_map(lambda s: [s, s], name="twice").uid("twice"))
    bad = parsed.filter(lambda s: not s.isdigit(), name="bad").uid("bad")
    if keyed_both:
        bad = bad.key_by(str).process(Echo(), name="echo-bad").uid("echo-bad")
    bad.sink(CommittingFileSink(out / "bad")).uid("bad-sink")
    (parsed.filter(str.isdigit, name="good").uid("good").map(int, name="int").uid("int")
           .key_by(lambda n: n % 2).process(Echo(), name="echo").uid("echo")
           .sink(CommittingFileSink(out / "good")).uid("good-sink"))
    return flow


def test_the_step_tree_runs_shared_steps_once_per_branch_point(tmp_path: Path) -> None:
    plans = translate(two_sinks(tmp_path))
    tree = StepTree.of([p.before_key for p in plans])
    # the root chain holds the shared steps; each branch continues in a node of its own
    assert [s.uid for s in tree.steps] == ["strip", "twice"]
    assert [[s.uid for s in c.steps] for c in tree.children] == [["bad"], ["good", "int"]]
    assert [c.ends for c in tree.children] == [[0], [1]]
    assert tree.ends == []


def test_one_query_takes_one_source_and_one_keyed_operator(tmp_path: Path) -> None:
    assert one_query_refusal(translate(two_sinks(tmp_path))) is None
    why = one_query_refusal(translate(two_sinks(tmp_path, keyed_both=True)))
    assert why is not None and "one watermark" in why and "echo-bad" in why
    flow = Dataflow("two-sources")
    flow.from_collection([1]).sink(CommittingFileSink(tmp_path / "a")).uid("a")
    flow.from_collection([2]).sink(CommittingFileSink(tmp_path / "b")).uid("b")
    assert one_query_refusal(translate(flow)) == "the sinks read different sources"


def test_columnar_operators_other_than_map_batches_are_refused_naming_them(
        tmp_path: Path) -> None:
    import pyarrow as pa
    import pytest

    from reactive.connectors.spark import SparkRunner, TranslationError

    table = pa.table({"n": [1, 2, 3]})
    flow = Dataflow("columnar")
    (flow.from_arrow(table).map_batches(lambda b: b, table.schema, name="identity")
         .select("n", name="just-n").to_records().sink(CommittingFileSink(tmp_path / "out")))
    with pytest.raises(TranslationError) as info:
        SparkRunner(None, tmp_path / "chk").start(flow)  # type: ignore[arg-type]
    assert info.value.operator == "just-n"
    assert "map_batches" in str(info.value)
