"""The watermark valve (Flink's ``StatusWatermarkValve``): the output watermark is the
minimum over the active, aligned channels and never decreases; a channel that resumes after
being idle with a watermark behind the output stays out of the minimum until it catches up.

The unit cases follow the behaviour Flink documents and tests for its valve
(``StatusWatermarkValveTest``), except where this runtime keeps its own rules: a watermark
received while idle is recorded (Flink drops it), and flushed at once while every open
channel is idle. When every open channel is idle the largest watermark goes out, as in Flink.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from reactive import Dataflow, ManualClock, TumblingEventTimeWindows
from reactive.connectors.collections import ListSink
from reactive.runtime.watermark_valve import StatusWatermarkValve
from reactive.sources import Source, SourceReader
from tests.windowing.test_windows import SumAmount

INF = float("inf")
NEG_INF = float("-inf")


# ---------------------------------------------------------------------------- one channel
def test_single_channel_increasing_watermarks_go_out():
    valve = StatusWatermarkValve(1)
    assert valve.input_watermark(0, 0.0) == 0.0
    assert valve.input_watermark(0, 25.0) == 25.0
    assert valve.watermark == 25.0


def test_single_channel_decreasing_watermarks_yield_nothing():
    valve = StatusWatermarkValve(1)
    assert valve.input_watermark(0, 25.0) == 25.0
    assert valve.input_watermark(0, 18.0) is None
    assert valve.input_watermark(0, 25.0) is None
    assert valve.input_watermark(0, 42.0) == 42.0


def test_single_channel_status_toggling():
    valve = StatusWatermarkValve(1)
    assert not valve.all_idle()
    assert valve.input_watermark_status(0, True) is None
    assert valve.all_idle()
    assert valve.input_watermark_status(0, True) is None  # no change: nothing
    assert valve.input_watermark_status(0, False) is None
    assert not valve.all_idle()


def test_single_channel_watermark_is_kept_through_idleness():
    valve = StatusWatermarkValve(1)
    assert valve.input_watermark(0, 25.0) == 25.0
    valve.input_watermark_status(0, True)
    assert valve.input_watermark(0, 40.0) == 40.0  # idle, as every channel: flushed
    assert valve.input_watermark_status(0, False) is None  # back at 40: aligned
    assert valve.input_watermark(0, 50.0) == 50.0


# ---------------------------------------------------------------------------- many channels
def test_multiple_channels_output_the_minimum():
    valve = StatusWatermarkValve(3)
    assert valve.input_watermark(0, 12.0) is None
    assert valve.input_watermark(1, 8.0) is None
    assert valve.input_watermark(2, 10.0) == 8.0
    assert valve.input_watermark(1, 15.0) == 10.0
    assert valve.input_watermark(2, 17.0) == 12.0
    assert valve.input_watermark(0, 20.0) == 15.0
    assert valve.input_watermark(0, 19.0) is None  # decreasing on one channel: ignored
    assert valve.watermark == 15.0


def test_multiple_channels_advance_as_channels_become_idle_one_by_one():
    valve = StatusWatermarkValve(3)
    valve.input_watermark(0, 25.0)
    valve.input_watermark(1, 10.0)
    assert valve.input_watermark(2, 17.0) == 10.0
    assert valve.input_watermark_status(1, True) == 17.0
    assert valve.input_watermark_status(2, True) == 25.0
    assert not valve.all_idle()
    # the last active channel goes idle: its watermark, the largest, is already out
    assert valve.input_watermark_status(0, True) is None
    assert valve.all_idle() and valve.watermark == 25.0
    # a watermark on an idle channel while all are idle is flushed (the task sends a
    # channel's idle status before the watermark it flushes)
    assert valve.input_watermark(1, 40.0) == 40.0
    assert valve.input_watermark_status(2, False) is None  # back at 17 < 40: unaligned
    assert valve.input_watermark(1, 50.0) is None  # not all idle any more: recorded only


def test_partially_idle_channels_do_not_hold_the_minimum():
    valve = StatusWatermarkValve(3)
    valve.input_watermark(0, 15.0)
    assert valve.input_watermark(1, 10.0) is None  # channel 2 is at -inf
    assert valve.input_watermark_status(2, True) == 10.0
    assert valve.input_watermark(1, 18.0) == 15.0
    assert valve.input_watermark_status(0, True) == 18.0
    assert valve.input_watermark(1, 20.0) == 20.0


def test_resumed_channel_behind_the_output_is_left_out_until_it_catches_up():
    """The case this valve exists for: a stale watermark must not stall event time."""
    valve = StatusWatermarkValve(3)
    valve.input_watermark(0, 10.0)
    valve.input_watermark(1, 7.0)
    assert valve.input_watermark(2, 3.0) == 3.0
    assert valve.input_watermark_status(2, True) == 7.0
    assert valve.input_watermark_status(2, False) is None  # back at 3 < 7: unaligned
    assert valve.aligned == [True, True, False]
    assert valve.input_watermark(0, 12.0) is None  # channel 1 (7) holds the minimum
    assert valve.input_watermark(1, 11.0) == 11.0  # not held back by channel 2 at 3
    assert valve.input_watermark(2, 5.0) is None  # still behind: ignored for the minimum
    assert valve.input_watermark(1, 20.0) == 12.0
    assert valve.input_watermark(2, 13.0) is None  # caught up (13 >= 12): aligned again
    assert valve.aligned == [True, True, True]
    assert valve.input_watermark(0, 30.0) == 13.0  # channel 2 now holds the minimum
    assert valve.input_watermark(2, 40.0) == 20.0


def test_resumed_channel_at_or_ahead_of_the_output_is_aligned_at_once():
    valve = StatusWatermarkValve(2)
    valve.input_watermark(0, 10.0)
    assert valve.input_watermark(1, 10.0) == 10.0
    valve.input_watermark_status(1, True)
    assert valve.input_watermark(0, 30.0) == 30.0
    valve.input_watermark(1, 30.0)  # recorded while idle
    assert valve.input_watermark_status(1, False) is None
    assert valve.aligned == [True, True]
    assert valve.input_watermark(0, 35.0) is None  # channel 1 (30) holds it again


def test_only_unaligned_active_channels_means_no_output():
    valve = StatusWatermarkValve(2)
    valve.input_watermark(0, 10.0)
    assert valve.input_watermark(1, 7.0) == 7.0
    assert valve.input_watermark_status(1, True) == 10.0
    valve.input_watermark_status(0, True)
    assert valve.input_watermark_status(1, False) is None  # 7 < 10: unaligned
    assert not valve.all_idle()
    assert valve.input_watermark(1, 8.0) is None
    assert valve.watermark == 10.0
    assert valve.input_watermark(1, 12.0) == 12.0


def test_ended_channels_leave_the_minimum_and_all_ended_is_infinity():
    valve = StatusWatermarkValve(3)
    valve.input_watermark(0, 5.0)
    valve.input_watermark(1, 9.0)
    assert valve.input_watermark(2, 7.0) == 5.0
    assert valve.end_of_input(0) == 7.0
    assert valve.input_watermark(0, 100.0) is None  # an ended channel is ignored
    valve.input_watermark_status(1, True)
    assert valve.end_of_input(2) == 9.0  # the only open channel is idle: flush its 9
    assert valve.all_idle()
    assert valve.end_of_input(1) == INF


# ---------------------------------------------------------------------------- invariants
events = st.lists(
    st.one_of(
        st.tuples(st.just("wm"), st.integers(0, 3), st.integers(0, 30)),
        st.tuples(st.just("status"), st.integers(0, 3), st.booleans()),
        st.tuples(st.just("end"), st.integers(0, 3), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(events)
def test_output_is_monotonic_and_the_minimum_of_the_aligned_channels(
        script: list[tuple[str, int, Any]]) -> None:
    valve = StatusWatermarkValve(4)
    last = NEG_INF
    for kind, ch, arg in script:
        if kind == "wm":
            out = valve.input_watermark(ch, float(arg))
        elif kind == "status":
            out = valve.input_watermark_status(ch, arg)
        else:
            out = valve.end_of_input(ch)
        if out is not None:
            assert out > last
            last = out
        assert valve.watermark == last
        open_channels = [i for i in range(4) if not valve.finished[i]]
        for i in open_channels:
            if valve.aligned[i]:
                assert not valve.idle[i]
                assert valve.watermarks[i] >= valve.watermark
        aligned = [valve.watermarks[i] for i in open_channels if valve.aligned[i]]
        if aligned:  # the output is the minimum over the aligned channels
            assert valve.watermark == min(aligned)
        if not open_channels:
            assert valve.watermark == INF
        elif valve.all_idle():  # every open channel idle: the largest one was flushed
            assert valve.watermark >= max(valve.watermarks[i] for i in open_channels)


# ---------------------------------------------------------------------------- in a job
# Hand-written: two instances that coordinate (one waits until the other resumed with a
# stale watermark); a TestingSource is not parallel.
class StaleResumeSource(Source):
    """Two instances. Instance 0 emits ``("k", t, 1)`` for t = 0..59, one per batch, moving
    a manual clock 1 s each; at t = 15 it waits until instance 1 has resumed. Instance 1
    emits nothing (and goes idle), and once a window result reached the sink it resumes
    with records far behind event time (``("k", 3.0, 0)``, late), one per batch, so it is
    active with a stale watermark, until the sink shows three window results (or it gives
    up after 20,000 batches)."""

    def __init__(self, clock: ManualClock, sink: ListSink) -> None:
        self.clock = clock
        self.sink = sink
        self.resumed = False
        self.results_while_stale = False

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        return _StaleResumeReader(self, subtask)


class _StaleResumeReader(SourceReader):
    def __init__(self, src: StaleResumeSource, subtask: int) -> None:
        self.src = src
        self.subtask = subtask
        self.t = 0
        self.polls = 0
        self.stale_batches = 0

    async def read_batch(self, max_records: int) -> list[Any] | None:
        src = self.src
        self.polls += 1
        if self.subtask == 0:
            if self.t >= 60:
                return None
            if self.t == 15 and not src.resumed and self.polls < 20_000:
                return []
            src.clock.advance(1.0)
            self.t += 1
            return [("k", float(self.t - 1), 1)]
        if self.polls > 20_000:
            return None
        if not src.sink.records:
            return []  # quiet: idle after 5 s of the other instance's clock
        if len(src.sink.records) >= 3:
            src.results_while_stale = True
            return None
        # the ACTIVE status and the watermark 3.0 of the first stale batch go out from the
        # task's mailbox before this reader is polled again: only then may instance 0 go on
        src.resumed = self.stale_batches > 0
        self.stale_batches += 1
        return [("k", 3.0, 0)]

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        return [self.t]

    def restore_state(self, entries: list[Any]) -> None:
        self.t = entries[0]


async def test_channel_resuming_with_a_stale_watermark_does_not_stall_windows():
    clock = ManualClock()
    sink = ListSink()
    src = StaleResumeSource(clock, sink)
    flow = Dataflow("stale-resume", parallelism=2, batch_size=1, buffer_timeout=0)
    flow.processing_clock = clock
    (flow.source(src).assign_timestamps(lambda r: r[1], 0.0, idleness=5.0)
         .key_by(lambda r: r[0]).window(TumblingEventTimeWindows.of(10))
         .aggregate(SumAmount()).sink(sink))
    await flow.run()
    # windows kept firing while instance 1 was active but behind: it was left out of the
    # minimum (before the valve, its stale 3.0 held event time back until its end)
    assert src.results_while_stale
    assert sorted((r.start, r.value) for r in sink.records) == [
        (float(s), (10, 10)) for s in range(0, 60, 10)]
