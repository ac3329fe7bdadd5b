"""``map_async``: a coroutine per record with bounded concurrency (Flink's async I/O).

Exactly-once through failures (the inputs of the calls in flight are in the snapshot and are
called again after a restore), input order when ordered, watermarks as fences when not,
timeouts and retries that fail the job naming the record or go to a dead-letter output,
the capacity bound and the backpressure it puts on the source.
"""

from __future__ import annotations

import asyncio
import collections
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from reactive import (
    CheckpointConfig,
    ConfigurationError,
    Dataflow,
    JobFailedError,
    KeyedProcessFunction,
    RestartStrategy,
    UserFunctionError,
)
from reactive.connectors.collections import ListSink
from reactive.runtime.operators import AsyncFailure, RetryPolicy
from tests.checkpoint.test_rescaling import Budget, SplitsSource, WaitableSink
from tests.support import Count, FailureInjector, checkpoint_state, final_counts

N = 3_000
KEYS = 31


def _delays(n: int, seed: int) -> list[float]:
    """Seeded random sleeps of 0-5 ms, one per record."""
    rnd = random.Random(seed)
    return [rnd.random() * 0.005 for _ in range(n)]


def _enrich(delays: list[float], injector: FailureInjector | None = None) -> Any:
    async def enrich(x: int) -> tuple[int, int]:
        if injector is not None:
            injector.tick()
        await asyncio.sleep(delays[x])
        return (x % KEYS, x)
    return enrich


# ------------------------------------------------------------------ (1) exactly once, order
@pytest.mark.parametrize("ordered", [True, False])
async def test_exactly_once_through_a_failure_inside_the_calls(ordered: bool, tmp_path: Path
                                                               ) -> None:
    records = list(range(N))
    truth = dict(collections.Counter(x % KEYS for x in records))
    budget = Budget(N // 2)
    # armed after a checkpoint taken with calls in flight: the failure is in the calls
    # themselves (a UserFunctionError from the operator's mailbox), and the restore re-issues
    # the inputs that checkpoint holds
    injector = FailureInjector([])
    sink = WaitableSink()
    flow = Dataflow("async-eo", parallelism=2, max_parallelism=16, batch_size=32)
    (flow.source(SplitsSource([records[0::2], records[1::2]], budget), uid="src")
         .map_async(_enrich(_delays(N, seed=3), injector), capacity=50, ordered=ordered)
         .uid("enrich")
         .key_by(lambda t: t[0])
         .process(Count()).uid("count")
         .sink(sink))
    job = await flow.start(checkpoints=CheckpointConfig(interval=0.05, directory=tmp_path),
                           restart=RestartStrategy.fixed(3, 0.0))
    await sink.wait_for(N // 4)
    await job.checkpoint()
    injector.fail_at = [injector.seen + 200]
    budget.allow(None)
    await job.wait()
    assert injector.failures == 1
    assert job.metrics.restarts == 1
    assert job.metrics.restored_checkpoints
    # the counts downstream of the async calls are exact: no input lost, none counted twice
    assert final_counts(sink.records) == truth
    assert checkpoint_state(tmp_path, "async-eo", "count", "count") == truth


@pytest.mark.parametrize("ordered", [True, False])
async def test_output_is_the_batch_result_and_ordered_keeps_input_order(ordered: bool,
                                                                       tmp_path: Path) -> None:
    records = list(range(N))
    sink = ListSink()
    flow = Dataflow("async-order", batch_size=64)
    (flow.from_collection(records)
         .map_async(_enrich(_delays(N, seed=5)), capacity=50, ordered=ordered).uid("enrich")
         .sink(sink))
    # checkpoints every 50 ms snapshot calls in flight without disturbing the output
    job = await flow.run(checkpoints=CheckpointConfig(interval=0.05, directory=tmp_path))
    expected = [(x % KEYS, x) for x in records]
    if ordered:
        assert sink.records == expected
    else:
        assert sorted(sink.records, key=lambda t: t[1]) == expected
        assert sink.records != expected  # the calls did complete out of order
    assert job.metrics.restarts == 0


# ------------------------------------------------------------------ (2) watermarks as fences
class WatermarkCheck(KeyedProcessFunction):
    """Emits ``(record, the watermark when it arrived)``."""

    def process_element(self, value: Any, ctx: Any) -> Iterable[Any]:
        yield (value, ctx.timer_service.current_watermark())


@pytest.mark.parametrize("ordered", [False, True])
async def test_watermarks_are_fences(ordered: bool) -> None:
    n = 2_000

    async def slow_every_fifth(x: int) -> int:
        # every fifth call takes 3 ms, the others complete at once: unordered results overtake
        await asyncio.sleep(0.003 if x % 5 == 0 else 0)
        return x

    sink = ListSink()
    flow = Dataflow("fences", batch_size=8)
    (flow.from_collection(range(n))
         .assign_timestamps(float)  # watermark = the largest timestamp seen, per batch
         .map_async(slow_every_fifth, capacity=20, ordered=ordered).uid("slow")
         .key_by(lambda x: 0)
         .process(WatermarkCheck()).uid("check")
         .sink(sink))
    await flow.run()
    seen = [x for x, _ in sink.records]
    assert sorted(seen) == list(range(n))
    watermarks = [wm for _, wm in sink.records if wm != float("inf")]
    assert len(set(watermarks)) > 10  # many watermarks went through the operator
    # a watermark w means no record with timestamp <= w follows: a result emitted after the
    # watermark that followed its input would arrive with a watermark >= its timestamp; the
    # final watermark too waits for the calls still in flight (StreamOperator.drain)
    late = [(x, wm) for x, wm in sink.records if x <= wm]
    assert late == []
    if ordered:
        assert seen == list(range(n))
    else:
        assert seen != list(range(n))


# ------------------------------------------------------------------ (3) timeouts and retries
async def _hang_on(x: int, bad: int) -> int:
    if x == bad:
        await asyncio.Event().wait()  # never completes
    return x * 10


async def test_a_timeout_fails_the_job_naming_the_record_and_the_operator() -> None:
    async def fn(x: int) -> int:
        return await _hang_on(x, 13)

    flow = Dataflow("timeout")
    flow.from_collection(range(50)).map_async(fn, timeout=0.05, name="lookup").sink(ListSink())
    with pytest.raises(JobFailedError) as info:
        await flow.run(restart=RestartStrategy.none())
    cause = info.value.__cause__
    assert isinstance(cause, UserFunctionError)
    assert cause.record == 13 and cause.operator == "lookup"
    assert "record 13" in str(cause) and "TimeoutError" in str(cause)
    assert isinstance(cause.__cause__, TimeoutError)


async def test_a_timed_out_record_goes_to_the_side_output_instead() -> None:
    async def fn(x: int) -> int:
        return await _hang_on(x, 13)

    results, failures = ListSink(), ListSink()
    flow = Dataflow("timeout-side")
    (flow.from_collection(range(50))
         .map_async(fn, timeout=0.05, on_failure=failures).uid("lookup")
         .sink(results))
    await flow.run()
    assert results.records == [x * 10 for x in range(50) if x != 13]
    assert failures.records == [AsyncFailure(13, "TimeoutError: no result within 0.05 s", 1)]


async def test_dead_letter_in_band_and_retries() -> None:
    attempts: collections.Counter[int] = collections.Counter()

    async def flaky(x: int) -> int:
        attempts[x] += 1
        if x % 10 == 3 and attempts[x] < 3:
            raise ValueError(f"flaky {x}")
        if x == 7:
            raise KeyError("always")
        return x

    out = ListSink()
    flow = Dataflow("retries")
    (flow.from_collection(range(30))
         .map_async(flaky, retry=RetryPolicy(attempts=3, backoff=0.001, retry_on=(ValueError,)),
                    on_failure="dead_letter")
         .sink(out))
    await flow.run()
    # 3, 13, 23 succeed at their third attempt; 7 is not retried (KeyError) and is emitted in
    # place of its result, in order
    assert out.records == [AsyncFailure(7, "KeyError: 'always' (attempt 1 of 3)", 1)
                           if x == 7 else x for x in range(30)]
    assert attempts[3] == attempts[13] == attempts[23] == 3 and attempts[7] == 1

    # retry=2: two attempts, and the job fails naming the record and the attempts
    attempts.clear()
    flow = Dataflow("retries-exhausted")
    flow.from_collection(range(30)).map_async(flaky, retry=2, name="flaky").sink(ListSink())
    with pytest.raises(JobFailedError) as info:
        await flow.run(restart=RestartStrategy.none())
    cause = info.value.__cause__
    assert isinstance(cause, UserFunctionError) and cause.record in (3, 7)
    assert "(attempt" in str(cause)


async def test_a_call_that_cancels_itself_is_a_failure_not_a_hang() -> None:
    async def cancels(x: int) -> int:
        if x == 4:
            raise asyncio.CancelledError("gave up")
        return x

    out = ListSink()
    flow = Dataflow("self-cancel")
    flow.from_collection(range(10)).map_async(cancels, on_failure="dead_letter").sink(out)
    await flow.run()
    failure = out.records[4]
    assert isinstance(failure, AsyncFailure) and failure.record == 4
    assert failure.reason.startswith("RuntimeError: the call was cancelled")
    assert out.records[:4] + out.records[5:] == [0, 1, 2, 3, 5, 6, 7, 8, 9]


def test_options_are_checked_when_the_dataflow_is_built() -> None:
    async def fn(x: int) -> int:
        return x

    stream = Dataflow("opts").from_collection([1])
    for bad in ({"capacity": 0}, {"timeout": 0}, {"retry": 0}, {"on_failure": "drop"},
                {"retry": RetryPolicy}, {"capacity": 1.5}):
        with pytest.raises(ConfigurationError):
            stream.map_async(fn, **bad)
    with pytest.raises(ConfigurationError):
        RetryPolicy(attempts=2, multiplier=0.5)


# ------------------------------------------------------------------ (4) capacity
@pytest.mark.parametrize("ordered", [True, False])
async def test_capacity_bounds_the_calls_and_backpressures_the_source(ordered: bool) -> None:
    capacity, batch = 7, 64
    budget = Budget()
    sink = ListSink()
    active = 0
    most = 0
    ahead: list[int] = []
    delays = _delays(1_000, seed=9)

    async def counted(x: int) -> int:
        nonlocal active, most
        active += 1
        most = max(most, active)
        # read by the source but not yet out of the operator: at most the calls it holds
        # and one batch waiting for them (the task reads no more input meanwhile)
        ahead.append(budget.taken - len(sink.records))
        try:
            await asyncio.sleep(delays[x])
        finally:
            active -= 1
        return x

    flow = Dataflow("capacity", batch_size=batch)
    (flow.source(SplitsSource([list(range(1_000))], budget))
         .map_async(counted, capacity=capacity, ordered=ordered)
         .sink(sink))
    await flow.run()
    assert sorted(sink.records) == list(range(1_000))
    assert most == capacity
    assert max(ahead) <= capacity + batch


# ------------------------------------------------------------------ (5) restore re-issues
@pytest.mark.parametrize("parallelism", [1, 2])
async def test_restore_calls_the_inputs_in_flight_at_the_checkpoint_again(
        parallelism: int, tmp_path: Path) -> None:
    blocked: list[int] = []
    all_blocked = asyncio.Event()
    never = asyncio.Event()

    async def stuck(x: int) -> int:
        blocked.append(x)
        if len(blocked) == 10:
            all_blocked.set()
        await never.wait()
        return x

    def build(fn: Any, budget: Budget, sink: ListSink, parallelism: int) -> Dataflow:
        flow = Dataflow("reissue", parallelism=parallelism, batch_size=4)
        (flow.source(SplitsSource([list(range(20))], budget), uid="src")
             .map_async(fn, timeout=None).uid("calls")
             .sink(sink))
        return flow

    first = ListSink()
    job = await build(stuck, Budget(10), first, 1).start(
        checkpoints=CheckpointConfig(interval=None, directory=tmp_path / "c"))
    await all_blocked.wait()
    # the source has read ten records (its position is 10): their inputs are only in the
    # async operator's state
    chk = await job.checkpoint()
    await job.cancel()
    assert blocked == list(range(10)) and first.records == []

    called: list[int] = []

    async def quick(x: int) -> int:
        called.append(x)
        return x * 2

    second = ListSink()
    # at parallelism 2 the inputs are dealt round robin over the two instances ("split")
    await build(quick, Budget(), second, parallelism).run(restore_from=chk.path)
    assert sorted(called) == list(range(20))
    if parallelism == 1:
        # the restored inputs are called again first, then the source goes on from 10
        assert called[:10] == list(range(10))
        assert second.records == [x * 2 for x in range(20)]
    else:
        assert sorted(second.records) == [x * 2 for x in range(20)]
