"""What a failed job tells its user: a flat_map function returning text fails naming the
operator and the record (instead of emitting one record per character), and a failed job
suggests resume=True only when a completed checkpoint exists to resume from."""

from __future__ import annotations

from typing import Any

import pytest

from reactive import (
    CheckpointConfig,
    Dataflow,
    JobFailedError,
    RestartStrategy,
    UserFunctionError,
)
from reactive.connectors.collections import ListSink
from reactive.testing import TestingSource

LINES = ["to be", "or not"]
RESUME = "run again with resume=True"


@pytest.mark.parametrize(("kind", "fn"), [
    ("str", lambda line: line.upper()),
    ("bytes", lambda line: line.encode()),
    ("bytearray", lambda line: bytearray(line.encode())),
])
async def test_flat_map_returning_text_fails_naming_the_operator_and_record(kind, fn):
    flow = Dataflow("flat-map-text", parallelism=1)
    sink = ListSink()
    flow.from_collection(LINES).flat_map(fn, name="words").sink(sink)
    with pytest.raises(JobFailedError) as info:
        await flow.run()
    error = info.value.__cause__
    assert isinstance(error, UserFunctionError)
    assert (error.operator, error.record) == ("words", "to be")
    assert f"the flat_map function must return an iterable of records (or None), but it " \
           f"returned a {kind}:" in str(error)
    assert sink.records == []  # not one record per character


async def test_a_co_flat_map_returning_text_fails_naming_its_input():
    flow = Dataflow("co-flat-map-text", parallelism=1)
    sink = ListSink()
    a = flow.from_collection(LINES)
    b = flow.from_collection(["x"])
    a.connect(b).flat_map(lambda line: line.split(), lambda x: x, name="co").sink(sink)
    with pytest.raises(JobFailedError) as info:
        await flow.run()
    error = info.value.__cause__
    assert isinstance(error, UserFunctionError) and error.record == "x"
    assert "the flat_map function 2 must return" in str(error)
    assert "input 2" in str(error)


async def test_flat_map_may_return_lists_tuples_generators_and_none():
    flow = Dataflow("flat-map-ok", parallelism=1)
    sink = ListSink()
    (flow.from_collection(LINES)
     .flat_map(lambda line: tuple(line.split()))
     .flat_map(lambda w: None if w == "or" else (c for c in [w]))
     .flat_map(lambda w: [w, len(w)]).sink(sink))
    await flow.run()
    assert sink.records == ["to", 2, "be", 2, "not", 3]


def _failing_flow(items: list[Any]) -> Dataflow:
    flow = Dataflow("fails", parallelism=1)

    def check(x: Any) -> Any:
        if x == "bad":
            raise ValueError("bad record")
        return x

    flow.source(TestingSource(items), uid="src").map(check).uid("check").sink(ListSink())
    return flow


async def test_a_job_that_completed_no_checkpoint_does_not_suggest_resuming(tmp_path):
    flow = _failing_flow(["a", "bad", "b"])
    with pytest.raises(JobFailedError) as info:
        await flow.run(checkpoints=CheckpointConfig(interval=60.0, directory=tmp_path / "chk"),
                       restart=RestartStrategy.fixed(1, 0.0))
    assert info.value.attempts == 2 and not info.value.resumable
    assert RESUME not in str(info.value)
    assert "No checkpoint completed in this run" in str(info.value)


async def test_a_job_without_checkpointing_does_not_suggest_resuming():
    with pytest.raises(JobFailedError) as info:
        await _failing_flow(["a", "bad"]).run()
    assert not info.value.resumable and RESUME not in str(info.value)


async def test_a_job_with_a_completed_checkpoint_suggests_resuming(tmp_path):
    flow = _failing_flow(["a", TestingSource.CHECKPOINT, "bad", "b"])
    with pytest.raises(JobFailedError) as info:
        await flow.run(checkpoints=CheckpointConfig(interval=0.01, directory=tmp_path / "chk"),
                       restart=RestartStrategy.none())
    assert info.value.resumable and RESUME in str(info.value)


def test_the_spark_runner_refuses_flat_map_text_as_the_runtime_does():
    pytest.importorskip("pyspark", reason="the Spark runner needs pyspark")
    from reactive.connectors.spark.record_chain import run_steps
    from reactive.connectors.spark.translation import RecordStep

    steps = [RecordStep("words", "words", "flat_map", lambda line: line.upper())]
    with pytest.raises(UserFunctionError) as info:
        list(run_steps(steps, "to be", None, position=3))
    assert (info.value.operator, info.value.record, info.value.position) == ("words", "to be", 3)
    assert "returned a str" in str(info.value)
    ok = [RecordStep("words", "words", "flat_map", str.split)]
    assert [r for r, _ in run_steps(ok, "to be", None)] == ["to", "be"]
