"""The user-facing API: configuration errors, error reports, embedding, backpressure."""

from __future__ import annotations

import asyncio
import collections

import pytest

from reactive import (
    AggregateFunction,
    AggregatingStateDescriptor,
    CheckpointConfig,
    CheckpointError,
    ConfigurationError,
    Dataflow,
    JobFailedError,
    KeyedProcessFunction,
    RestartStrategy,
    Sink,
    SinkWriter,
    UserFunctionError,
    ValueStateDescriptor,
)
from reactive.connectors.collections import ListSink
from reactive.testing import TestingSource
from tests.support import Count, final_counts


def test_bad_configuration_is_refused_before_start():
    with pytest.raises(ConfigurationError, match="interval"):
        CheckpointConfig(interval=0)
    with pytest.raises(ConfigurationError, match="parallelism"):
        Dataflow("x", parallelism=0)

    flow = Dataflow("x", parallelism=4, max_parallelism=2)
    flow.from_collection([1]).key_by(lambda r: r).process(Count()).sink(ListSink())
    with pytest.raises(ConfigurationError, match="max_parallelism"):
        flow.execute()

    flow = Dataflow("y")
    s = flow.from_collection([1]).map(lambda r: r).uid("same")
    s.map(lambda r: r).uid("same").sink(ListSink())
    with pytest.raises(ConfigurationError, match="duplicate uid 'same'"):
        flow.execute()

    flow = Dataflow("z")
    flow.from_collection([1]).map(lambda r: r)
    with pytest.raises(ConfigurationError, match="no sink"):
        flow.execute()

    flow = Dataflow("w")
    with pytest.raises(ConfigurationError, match="supports parallelism <= 1"):
        flow.from_collection([1]).set_parallelism(2)


async def test_user_function_error_names_operator_subtask_and_record():
    flow = Dataflow("errors", parallelism=2)
    (flow.from_collection(list(range(1000)))
         .map(lambda x: 10 // (x - 737), name="divide")
         .sink(ListSink()))
    with pytest.raises(JobFailedError) as info:
        await flow.run(restart=RestartStrategy.none())
    cause = info.value.__cause__
    assert isinstance(cause, UserFunctionError)
    assert cause.operator == "divide"
    assert cause.record == 737
    assert isinstance(cause.__cause__, ZeroDivisionError)
    assert "operator 'divide'" in str(cause) and "record 737" in str(cause)
    assert "ZeroDivisionError" in str(info.value)


async def test_key_selector_error_is_reported_with_the_record():
    flow = Dataflow("keys", parallelism=2)
    (flow.from_collection([{"k": 1}, {"k": 2}, {"x": 3}])
         .key_by(lambda r: r["k"]).process(Count()).sink(ListSink()))
    with pytest.raises(JobFailedError) as info:
        await flow.run(restart=RestartStrategy.none())
    cause = info.value.__cause__
    assert isinstance(cause, UserFunctionError)
    assert cause.record == {"x": 3}
    assert "key_by" in cause.operator


async def test_embedded_job_runs_beside_the_application(tmp_path):
    words = [f"w{i % 100}" for i in range(300_000)]
    sink = ListSink()
    flow = Dataflow("embedded", parallelism=2, batch_size=256)
    flow.from_collection(words).key_by(lambda w: w).process(Count()).uid("count").sink(sink)
    ticks = 0

    async def application() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    app = asyncio.create_task(application())
    job = await flow.start(checkpoints=CheckpointConfig(interval=None, directory=tmp_path))
    done = await job.checkpoint()
    assert (done.path / "_metadata").exists()
    assert done.path.name == f"chk-{done.checkpoint_id}"
    await job.wait()
    app.cancel()
    assert ticks > 10, "the application's task did not run while the job ran"
    assert job.status == "finished"
    assert final_counts(sink.records) == dict(collections.Counter(words))
    metrics = job.metrics
    assert metrics.by_name()["Count"]["records_in"] == len(words)
    # the on-demand checkpoint and the final one, with their costs recorded
    assert [c.status for c in metrics.checkpoints] == ["completed", "completed"]
    assert all(c.size > 0 and c.sync >= 0 and c.async_ > 0 for c in metrics.checkpoints)


async def test_cancel_stops_every_task(tmp_path):
    sink = ListSink()
    flow = Dataflow("forever")
    flow.source(TestingSource([*range(1_000), TestingSource.HOLD])).map(lambda x: x).sink(sink)
    job = await flow.start(checkpoints=CheckpointConfig(interval=None, directory=tmp_path))
    first = await job.checkpoint()
    await job.cancel()
    assert job.status == "cancelled"
    assert first.checkpoint_id == 1
    with pytest.raises(CheckpointError):
        await job.checkpoint()


class SlowSink(Sink):
    """Slow writer that records how far the source ran ahead of it."""

    def __init__(self, job_box: list, delay: float) -> None:
        self.job_box = job_box
        self.delay = delay
        self.received = 0
        self.max_ahead = 0

    def create_writer(self, subtask, parallelism):
        sink = self

        class W(SinkWriter):
            async def write(self, batch):
                sink.received += len(batch)
                produced = sink.job_box[0].metrics.by_name()["collection"]["records_out"]
                sink.max_ahead = max(sink.max_ahead, produced - sink.received)
                await asyncio.sleep(sink.delay)

        return W()


async def test_backpressure_bounds_every_channel():
    box: list = []
    sink = SlowSink(box, delay=0.002)
    flow = Dataflow("slow", parallelism=2, batch_size=100, channel_capacity=4)
    (flow.from_collection(range(60_000)).map(lambda x: x).set_parallelism(1)
         .key_by(lambda x: x % 10).reduce(lambda a, b: b).sink(sink))
    job = await flow.start()
    box.append(job)
    await job.wait()
    assert sink.received == 60_000
    assert 0 < job.metrics.max_channel_length <= 4
    # what can be in flight: 2 channels x 4 batches x 100 records, plus one batch being
    # partitioned and one per task being processed; far below the 60,000 produced
    assert sink.max_ahead <= 2 * 4 * 100 + 4 * 1024


async def test_a_union_of_sources_with_the_same_name_keeps_every_record():
    """Two ``from_collection`` sources share the display name "collection": the job must
    still wait for both to end (it once took the first one's end for both and cut the
    other short)."""
    flow = Dataflow("same-names", batch_size=16, channel_capacity=2)
    sink = ListSink()
    flow.from_collection(range(20_000)).union(
        flow.from_collection(range(20_000, 21_000))).sink(sink)
    await flow.run()
    assert sorted(sink.records) == list(range(21_000))


class _Mean(AggregateFunction[float, tuple[float, int], float]):
    def create_accumulator(self) -> tuple[float, int]:
        return 0.0, 0

    def add(self, value: float, accumulator: tuple[float, int]) -> tuple[float, int]:
        return accumulator[0] + value, accumulator[1] + 1

    def get_result(self, accumulator: tuple[float, int]) -> float:
        return accumulator[0] / accumulator[1]

    def merge(self, a: tuple[float, int], b: tuple[float, int]) -> tuple[float, int]:
        return a[0] + b[0], a[1] + b[1]


class _RunningMean(KeyedProcessFunction[str, tuple[str, float], tuple[str, float]]):
    def open(self, ctx):
        self.mean = ctx.get_state(AggregatingStateDescriptor("mean", _Mean()))

    def process_element(self, value, ctx):
        assert self.mean.get() is None or isinstance(self.mean.get(), float)
        self.mean.add(value[1])
        yield value[0], self.mean.get()


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
async def test_aggregating_state_survives_a_snapshot_and_restore(tmp_path, backend):
    """An ``AggregatingState`` keeps the accumulator per key (stored as a value state), so
    the running means after a restore equal those of one uninterrupted pass."""
    from reactive.testing import OperatorTestHarness

    if backend == "rocksdb":
        rocksdb = pytest.importorskip("reactive.backends.rocksdb")
        state_backend = rocksdb.RocksDBStateBackend(path=str(tmp_path / "work"))
    else:
        state_backend = None
    records = [(k, float(i)) for i, k in enumerate("abcabcaab" * 3)]
    half = len(records) // 2
    options = {"state_backend": state_backend, "directory": tmp_path / "chk"}
    with OperatorTestHarness.for_keyed_process(_RunningMean(), lambda r: r[0],
                                               **options) as first:
        before = first.process_elements(records[:half])
        snapshot = await first.snapshot()
    with OperatorTestHarness.for_keyed_process(_RunningMean(), lambda r: r[0],
                                               **options).open(snapshot) as second:
        after = second.process_elements(records[half:])
        accumulator = second.get_state(ValueStateDescriptor("mean"), "a").value()
    sums: dict[str, list[float]] = collections.defaultdict(list)
    expected = []
    for key, value in records:
        sums[key].append(value)
        expected.append((key, sum(sums[key]) / len(sums[key])))
    assert before + after == expected
    assert accumulator == (sum(sums["a"]), len(sums["a"]))
