"""Window semantics ported case by case from Flink's ``WindowOperatorTest``,
``EvictingWindowOperatorTest`` and ``StatusWatermarkValveTest`` (inputs and expected outputs
written here from Flink's documented semantics, in this runtime's watermark convention: a
watermark W promises no record older than W, so Flink's window ``maxTimestamp = end - 1``
fires here at ``W >= end``).

The first three groups are the cases issue 17 found wrong: session lateness tested after
merging, the valve's all-idle flush, and lambdas kept out of keyed state.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

from reactive import (
    CheckpointConfig,
    Dataflow,
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
)
from reactive.connectors.collections import ListSink
from reactive.runtime.watermark_valve import StatusWatermarkValve
from reactive.sources import Source, SourceReader
from reactive.testing import OperatorTestHarness
from reactive.windowing.window_operator import LateRecord
from tests.windowing.test_windows import SumAmount, as_dict, batch_windows, events


def results(out: list[Any]) -> list[tuple[Any, float, float, Any]]:
    return [(r.key, r.start, r.end, r.value) for r in out if not isinstance(r, LateRecord)]


def late(out: list[Any]) -> list[Any]:
    return [r.record for r in out if isinstance(r, LateRecord)]


# ------------------------------------------------------------------ wrong today (1)
def test_session_lateness_is_tested_on_the_merged_window():
    """Flink merges first, then tests lateness on the merged window: with gap 3 and allowed
    lateness 2, k@8.9 after k@10 and k@14 (watermark 14) joins the fired session [10, 13)
    (13 + 2 > 14), which fires again as [8.9, 13); nothing goes to the late output."""
    h = OperatorTestHarness.for_window(lambda r: r[0], EventTimeSessionWindows.with_gap(3),
                                       lambda r: r[1], aggregate=SumAmount(),
                                       allowed_lateness=2, late_side_output=True)
    h.open()
    h.process_element(("k", 10.0, 1))
    h.process_element(("k", 14.0, 1))
    assert results(h.process_watermark(14.0)) == [("k", 10.0, 13.0, (1, 1))]
    out = h.process_element(("k", 8.9, 5))
    assert late(out) == []
    assert results(out) == [("k", 8.9, 13.0, (6, 2))]
    # a record whose merged window is beyond the lateness is late (15 + 2 <= 20)
    h.process_watermark(20.0)
    out = h.process_element(("k", 12.0, 7))
    assert late(out) == [("k", 12.0, 7)]


# ------------------------------------------------------------------ wrong today (2)
def test_valve_flushes_the_largest_watermark_when_every_channel_is_idle():
    """Flink's StatusWatermarkValveTest: the last active channel going idle flushes the
    largest watermark over all channels."""
    valve = StatusWatermarkValve(3)
    valve.input_watermark(0, 25.0)
    valve.input_watermark(1, 10.0)
    assert valve.input_watermark(2, 17.0) == 10.0
    assert valve.input_watermark_status(0, True) is None  # channel 1 (10) holds it
    assert valve.input_watermark_status(2, True) is None
    assert valve.input_watermark_status(1, True) == 25.0  # all idle: flush the max
    assert valve.all_idle() and valve.watermark == 25.0


# Hand-written: the test is about a reader's own watermark and idleness
# (current_watermark, is_idle), which a TestingSource does not generate.
class _IdleFlushSource(Source):
    """One reader: records at t = 0..29 with a watermark 15 s behind, then it goes idle and
    its watermark moves to 29 (it knows it caught up). It stays idle, without ending, until
    the sink holds the window [10, 20) (or gives up after many polls)."""

    timestamp_fn = staticmethod(lambda r: r[1])

    def __init__(self, sink: ListSink) -> None:
        self.sink = sink
        self.fired_while_idle = False

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        return _IdleFlushReader(self)


class _IdleFlushReader(SourceReader):
    def __init__(self, src: _IdleFlushSource) -> None:
        self.src = src
        self.t = 0
        self.polls = 0

    async def read_batch(self, max_records: int) -> list[Any] | None:
        self.polls += 1
        if self.t < 30:
            self.t += 1
            return [("k", float(self.t - 1), 1)]
        if any(r.start == 10.0 for r in self.src.sink.records):
            self.src.fired_while_idle = True
            return None
        return None if self.polls > 5_000 else []

    def current_watermark(self) -> float | None:
        return None if self.t == 0 else (self.t - 1.0 if self.t >= 30 else self.t - 16.0)

    def is_idle(self) -> bool:
        return self.t >= 30

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        return [self.t]

    def restore_state(self, entries: list[Any]) -> None:
        self.t = entries[0]


async def test_windows_fire_when_every_input_is_idle():
    sink = ListSink()
    src = _IdleFlushSource(sink)
    flow = Dataflow("idle-flush", batch_size=1, buffer_timeout=0)
    (flow.source(src).key_by(lambda r: r[0]).window(TumblingEventTimeWindows.of(10))
         .aggregate(SumAmount()).sink(sink))
    await flow.run()
    assert src.fired_while_idle  # [10, 20) fired on the idle flush, not at the end
    assert sorted((r.start, r.value) for r in sink.records) == [
        (0.0, (10, 10)), (10.0, (10, 10)), (20.0, (10, 10))]


# ------------------------------------------------------------------ wrong today (3)
async def test_count_and_shared_windows_with_lambdas_checkpoint_and_restore(tmp_path: Path):
    data = events(4_000, 5, seed=17, disorder=4.0)
    counted, shared = ListSink(), ListSink()
    flow = Dataflow("lambdas", parallelism=2, batch_size=64)
    # one timestamp assigner: each key's records then reach its count window in input order
    # (over two, a rebalance would interleave them, and count windows follow arrival order)
    keyed = (flow.from_collection(data).assign_timestamps(lambda r: r[1], 4.0)
             .set_parallelism(1).key_by(lambda r: r[0]))
    keyed.count_window(7, 3).reduce(lambda a, b: (a[0], a[1], a[2] + b[2])).sink(counted)
    (keyed.windows([SlidingEventTimeWindows.of(60, 20), TumblingEventTimeWindows.of(40)])
          .reduce(lambda a, b: (a[0], a[1], a[2] + b[2])).sink(shared))
    job = await flow.run(checkpoints=CheckpointConfig(interval=0.01, directory=tmp_path))
    assert job.metrics.completed_checkpoints  # checkpoints complete (they failed before)
    per_key = collections.defaultdict(list)
    for k, _, amount in data:
        per_key[k].append(amount)
    assert {k: v[2] for k, v in as_dict(counted.records).items()} == {
        (k, s, s + 7): sum(v[s:s + 7]) for k, v in per_key.items()
        for s in range(0, len(v) - 6, 3)}
    for q, (size, slide) in enumerate([(60, 20), (40, 40)]):
        got = as_dict([r for r in shared.records if r.query == q])
        assert {k: v[2] for k, v in got.items()} == {
            k: v[0] for k, v in batch_windows(data, size, slide).items()}
