"""Pacing of a heap snapshot's asynchronous part (backends/heap/pacing.py): the share of the
loop it takes while other tasks are busy, idle loops, growing shares, cancellation. The
clock is a manual one, advanced by the simulated work: nothing depends on real time."""

from __future__ import annotations

import asyncio

import pytest

from reactive.backends.heap import pacing


class Clock:
    """A manual ``time`` stand-in: ``perf_counter`` returns what the work advanced it to."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(pacing, "time", c)
    return c


async def run(clock: Clock, pacer: pacing.LoopShare, pieces: int, task_step: float | None,
              ) -> tuple[float, float]:
    """``pieces`` pieces of 1 ms of paced work against a task doing ``task_step`` seconds
    per loop round (None: no task); returns (work seconds, task seconds) meanwhile."""
    done = False
    task_time = 0.0

    async def task() -> None:
        nonlocal task_time
        while not done:
            clock.now += task_step  # type: ignore[operator]
            task_time += task_step  # type: ignore[operator]
            await asyncio.sleep(0)

    t = asyncio.ensure_future(task()) if task_step is not None else None
    pacer.start()
    for _ in range(pieces):
        clock.now += 0.001
        assert pacer.due()
        await pacer.pause()
    done = True
    if t is not None:
        await t
    return pacer.busy, task_time


@pytest.mark.parametrize("share", [0.1, 0.15, 0.5])
async def test_busy_tasks_keep_one_minus_share_of_the_loop(clock: Clock, share: float) -> None:
    busy, task_time = await run(clock, pacing.LoopShare(share, 0.0009), 200, 0.0005)
    assert busy == pytest.approx(0.2)
    # the task may get up to one round (0.5 ms) more per piece than owed
    got = busy / (busy + task_time)
    assert share * 0.8 <= got <= share * 1.01


async def test_an_idle_loop_runs_the_work_at_full_speed(clock: Clock) -> None:
    pacer = pacing.LoopShare(0.1, 0.0009)
    busy, _ = await run(clock, pacer, 100, None)
    assert busy == pytest.approx(0.1)
    assert clock.now == pytest.approx(0.1)  # no waiting: only the work advanced the clock


async def test_the_share_doubles_after_each_patience(clock: Clock) -> None:
    pacer = pacing.LoopShare(0.1, 0.001, patience=1.0)
    pacer.start()
    assert pacer.current_share(0.5) == pytest.approx(0.1)
    assert pacer.current_share(1.5) == pytest.approx(0.2)
    assert pacer.current_share(2.5) == pytest.approx(0.4)
    assert pacer.current_share(100.0) == 1.0
    # and the work itself ends sooner than without patience
    slow, fast = pacing.LoopShare(0.1, 0.0009), pacing.LoopShare(0.1, 0.0009, patience=0.5)
    await run(clock, slow, 300, 0.002)
    t_slow = slow.busy + slow.paused
    await run(clock, fast, 300, 0.002)
    assert fast.busy + fast.paused < 0.6 * t_slow


async def test_a_cancelled_pause_stops_the_work(clock: Clock) -> None:
    async def spin() -> None:
        while True:
            clock.now += 0.002
            await asyncio.sleep(0)

    spinner = asyncio.ensure_future(spin())
    pacer = pacing.LoopShare(0.01, 0.001)
    pacer.start()
    clock.now += 0.05

    worker = asyncio.ensure_future(pacer.pause())  # owes the spinner ~5 s of rounds
    for _ in range(10):
        await asyncio.sleep(0)
    assert not worker.done()
    worker.cancel()
    with pytest.raises(asyncio.CancelledError):
        await worker
    spinner.cancel()


def test_bad_shares_are_refused() -> None:
    for share in (0.0, -1.0, 1.5):
        with pytest.raises(ValueError):
            pacing.LoopShare(share, 0.001)
