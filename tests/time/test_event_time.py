"""Timestamps and watermarks: bounded out-of-orderness, records unchanged, watermarks that
fire windows before the end of input, and idle source instances that do not stall it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from reactive import (
    ConfigurationError,
    Dataflow,
    KeyedProcessFunction,
    ManualClock,
    TumblingEventTimeWindows,
)
from reactive.connectors.collections import ListSink
from reactive.sources import Source, SourceReader
from reactive.time import BoundedOutOfOrdernessWatermarks
from tests.windowing.test_windows import SumAmount


def test_bounded_out_of_orderness_generator():
    gen = BoundedOutOfOrdernessWatermarks(5.0)
    assert gen.current_watermark() == float("-inf")
    gen.on_max_timestamp(100.0)
    gen.on_max_timestamp(90.0)  # an older record does not move the watermark back
    assert gen.current_watermark() == 95.0
    with pytest.raises(ConfigurationError):
        BoundedOutOfOrdernessWatermarks(-1)


class WatermarkProbe(KeyedProcessFunction):
    """Emits ``(record, watermark seen when it arrived)``."""

    def process_element(self, value: Any, ctx: Any) -> Any:
        yield (value, ctx.timer_service.current_watermark())


async def test_records_pass_unchanged_and_watermarks_trail_by_the_bound():
    data = [{"ts": float(i), "v": i} for i in range(2_000)]
    sink = ListSink()
    flow = Dataflow("wm", batch_size=50, buffer_timeout=0)
    (flow.from_collection(data).assign_timestamps(lambda r: r["ts"], 10.0)
         .key_by(lambda r: 0).process(WatermarkProbe()).sink(sink))
    await flow.run()
    assert [r for r, _ in sink.records] == data
    wms = [w for _, w in sink.records]
    assert wms == sorted(wms)  # monotonic
    assert wms[-1] > 1_000  # watermarks flowed during the run, not only at the end
    assert all(w <= r["ts"] - 10.0 or w == float("-inf") for r, w in sink.records)


# Hand-written: two instances, one moving a manual clock per batch and one staying open
# until results appear; a TestingSource is not parallel and has no per-batch hook.
class PacedSource(Source):
    """Instance 0 emits ``records`` one per batch, moving a manual clock 1 s each time;
    instance 1 emits nothing and ends only once the sink shows results (or gives up)."""

    def __init__(self, records: list[Any], clock: ManualClock, sink: ListSink) -> None:
        self.records = records
        self.clock = clock
        self.sink = sink
        self.results_while_other_open = False

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        return _PacedReader(self, subtask)


class _PacedReader(SourceReader):
    def __init__(self, src: PacedSource, subtask: int) -> None:
        self.src = src
        self.subtask = subtask
        self.i = 0

    async def read_batch(self, max_records: int) -> list[Any] | None:
        src = self.src
        if self.subtask == 0:
            if self.i >= len(src.records):
                return None
            self.i += 1
            src.clock.advance(1.0)
            return [src.records[self.i - 1]]
        # the quiet instance: wait (bounded) for window results to reach the sink
        self.i += 1
        if src.sink.records:
            src.results_while_other_open = True
            return None
        if self.i > 20_000:
            return None
        await asyncio.sleep(0)
        return []

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        return [self.i]

    def restore_state(self, entries: list[Any]) -> None:
        self.i = entries[0]


@pytest.mark.parametrize("idleness", [5.0, None])
async def test_idle_instance_does_not_stall_event_time(idleness):
    clock = ManualClock()
    sink = ListSink()
    records = [("k", float(t), 1) for t in range(60)]
    src = PacedSource(records, clock, sink)
    flow = Dataflow("idle", parallelism=2, batch_size=1, buffer_timeout=0)
    flow.processing_clock = clock
    (flow.source(src).assign_timestamps(lambda r: r[1], 0.0, idleness=idleness)
         .key_by(lambda r: r[0]).window(TumblingEventTimeWindows.of(10))
         .aggregate(SumAmount()).sink(sink))
    await flow.run()
    # with idleness the quiet instance is ignored and windows fire while it is open;
    # without, event time waits for it until its end
    assert src.results_while_other_open is (idleness is not None)
    assert sorted((r.start, r.value) for r in sink.records) == [
        (float(s), (10, 10)) for s in range(0, 60, 10)]


def test_idleness_must_be_positive():
    flow = Dataflow("bad")
    with pytest.raises(ConfigurationError):
        flow.from_collection([1]).assign_timestamps(float, idleness=0)
