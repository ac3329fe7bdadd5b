"""While jobs run, the GIL switch interval is short enough for worker threads (snapshot
writers, RocksDB flushes) to get the GIL from a busy event loop; the application's interval
comes back when the last job ends."""

from __future__ import annotations

import asyncio
import sys

import pytest

from reactive import Dataflow
from reactive.connectors.collections import ListSink
from reactive.runtime.switch_interval import SWITCH_INTERVAL, short_switch_interval


@pytest.fixture(autouse=True)
def _default_interval():
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    yield
    sys.setswitchinterval(before)


def _job(name: str, gate: asyncio.Event, seen: list[float]) -> tuple[Dataflow, ListSink]:
    async def look(x: int) -> int:
        seen.append(sys.getswitchinterval())
        await gate.wait()
        return x

    sink = ListSink()
    flow = Dataflow(name, parallelism=1)
    flow.from_collection(range(3)).map_async(look).sink(sink)
    return flow, sink


async def test_two_jobs_share_the_short_interval_until_the_last_one_ends():
    first_gate, second_gate = asyncio.Event(), asyncio.Event()
    seen1: list[float] = []
    seen2: list[float] = []
    flow1, sink1 = _job("one", first_gate, seen1)
    flow2, sink2 = _job("two", second_gate, seen2)
    job1 = await flow1.start()
    job2 = await flow2.start()
    while not (seen1 and seen2):
        await asyncio.sleep(0)
    first_gate.set()
    await job1.wait()
    assert sys.getswitchinterval() == SWITCH_INTERVAL  # job two still runs
    second_gate.set()
    await job2.wait()
    assert sys.getswitchinterval() == 0.005
    assert set(seen1) == set(seen2) == {SWITCH_INTERVAL}
    assert sink1.records == sink2.records == [0, 1, 2]


async def test_the_interval_comes_back_when_a_job_fails():
    async def boom(x: int) -> int:
        assert sys.getswitchinterval() == SWITCH_INTERVAL
        raise ValueError("boom")

    flow = Dataflow("fails", parallelism=1)
    flow.from_collection([1]).map_async(boom).sink(ListSink())
    with pytest.raises(Exception, match="boom"):
        await flow.run()
    assert sys.getswitchinterval() == 0.005


def test_a_shorter_interval_of_the_application_is_kept():
    sys.setswitchinterval(0.0001)
    mine = sys.getswitchinterval()  # stored in microseconds: read back what was kept
    with short_switch_interval():
        assert sys.getswitchinterval() == mine
    assert sys.getswitchinterval() == mine


def test_the_interval_must_be_positive():
    with pytest.raises(ValueError, match="> 0"), short_switch_interval(0):
        pass
