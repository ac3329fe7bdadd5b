"""A job with a steady backlog shares the event loop with the application around it.

A task whose input channels never run dry used to process everything queued (up to the
channel capacity times the batch size) before the loop could run anything else; it now
yields after each time slice (``reactive.runtime.task.TIME_SLICE``).

The task's clock is a fake one (:class:`TaskClock`): the user functions advance it by the
work each record stands for, so what the tests check does not depend on how busy the
machine is, and no test asserts wall-clock time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from reactive import Dataflow, KeyedProcessFunction
from reactive.connectors.collections import ListSink
from reactive.runtime.task import TIME_SLICE
from tests.support import TaskClock

BATCH = 4


#: module level: the job runs a copy of each user function, so it cannot hold the clock
CLOCK = TaskClock()


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[TaskClock]:
    with CLOCK.installed(monkeypatch):
        yield CLOCK


class Ticks:
    """Records the keyed operator processed since the application last ran."""

    def __init__(self) -> None:
        self.since_tick = 0
        self.most_between_ticks = 0
        self.ticks = 0


#: module level: the job runs a copy of each user function, so it cannot hold the counter
TICKS = Ticks()


class Busy(KeyedProcessFunction):
    """Work of more than a time slice per batch (a user function that computes)."""

    def process_element(self, value: int, ctx: Any) -> list[int]:
        CLOCK.work(1.5 * TIME_SLICE / BATCH)
        t = TICKS
        t.since_tick += 1
        t.most_between_ticks = max(t.most_between_ticks, t.since_tick)
        return [value]


async def run_beside_application(flow: Dataflow, ticks: Ticks) -> None:
    """Run ``flow`` while an application task on the same loop takes every turn it gets,
    counting its turns and resetting ``ticks.since_tick`` at each."""
    done = False

    async def application() -> None:
        while not done:
            await asyncio.sleep(0)
            ticks.ticks += 1
            ticks.since_tick = 0

    app = asyncio.create_task(application())
    try:
        await flow.run()
    finally:
        done = True
        await app


async def test_the_application_runs_between_any_two_batches_of_a_backlogged_task() -> None:
    ticks = TICKS
    flow = Dataflow("busy", parallelism=1, batch_size=BATCH)
    sink = ListSink()
    # four source tasks each queue a batch for the keyed task per round of the loop: a
    # backlog the keyed task never fully drains while the sources run
    sources = [flow.from_collection(list(range(i, 200, 4))) for i in range(4)]
    (sources[0].union(*sources[1:])
         .key_by(lambda v: v % 7).process(Busy()).uid("busy").sink(sink))
    await run_beside_application(flow, ticks)
    assert sorted(sink.records) == list(range(200))
    # before the time slice, the keyed task drained its whole queue (one batch per source)
    # in one go
    assert ticks.most_between_ticks <= BATCH, ticks.most_between_ticks


#: records SlowPerRecord processed since the application last ran, once the keyed task has
#: measured its cost on two batches (WARM_UP records), and the most of them
SLOW = Ticks()
SLOW_RECORDS = [0]  # records SlowPerRecord processed in all
WARM_UP = 2 * 1024


class SlowPerRecord(KeyedProcessFunction):
    """Each record takes 1/100 of a time slice: a batch of 1024 takes about ten slices."""

    def process_element(self, value: int, ctx: Any) -> list[int]:
        CLOCK.work(TIME_SLICE / 100)
        t = SLOW
        SLOW_RECORDS[0] += 1
        t.since_tick += 1
        if SLOW_RECORDS[0] > WARM_UP:
            t.most_between_ticks = max(t.most_between_ticks, t.since_tick)
        return [value]


async def test_a_batch_that_takes_longer_than_a_time_slice_is_processed_in_slices() -> None:
    """A batch is sized by its producer, not by what the chain costs: the keyed task slices
    a batch whose records take longer than a time slice, and the application gets turns
    within it (it used to wait for the whole batch: 1024 records here)."""
    n = 8 * 1024
    flow = Dataflow("slow", parallelism=1, batch_size=1024)
    sink = ListSink()
    (flow.from_collection(list(range(n)))
         .key_by(lambda v: v % 7).process(SlowPerRecord()).uid("slow").sink(sink))
    await run_beside_application(flow, SLOW)
    assert sorted(sink.records) == list(range(n))
    assert SLOW_RECORDS[0] == n
    assert SLOW.most_between_ticks <= 1024 // 4, SLOW.most_between_ticks


class SlowSinkPerRecord(KeyedProcessFunction):
    """20 us of work per record: the tasks upstream wait for room in its input channel."""

    def process_element(self, value: int, ctx: Any) -> list[int]:
        CLOCK.work(20e-6)
        return [value]


async def test_a_task_waiting_for_room_downstream_keeps_its_batches_whole() -> None:
    """Waiting for room in a full output channel is not the chain's cost: a cheap task in
    front of a slow one keeps its batches whole (it used to count the wait as its own cost
    and cut its batches into slices of ~100 records, each paying the per-batch overheads)."""
    n = 20_000
    flow = Dataflow("behind", parallelism=1, batch_size=256)
    sink = ListSink()
    (flow.from_collection(list(range(n))).key_by(lambda v: v % 97).map(lambda v: v + 1)
         .key_by(lambda v: v % 13).process(SlowSinkPerRecord()).uid("slow").sink(sink))
    job = await flow.start()
    slices: list[int] = []
    while job.status in ("created", "running"):  # sample the cheap task's slice meanwhile
        slices += [task._slice for task in job._runner.tasks if task.name == "map"]
        await asyncio.sleep(0)
    await job.wait()
    assert sorted(sink.records) == list(range(1, n + 1))
    # on the task's clock the cheap task's own work costs nothing: every slice stays whole
    # (counting the waits as its cost cut them to ~100 records)
    small = [s for s in slices if s < 256]
    assert slices and not small, (len(small), len(slices), small[:20])
