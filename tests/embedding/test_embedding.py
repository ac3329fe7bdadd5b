"""Embedding from the application's side: it pushes records into a running job while
failures are injected, reads the committed results as they come, and queries keyed state,
committed and live. Every accepted record is counted exactly once."""

from __future__ import annotations

import asyncio
import collections
import random
from typing import Any

import pytest

from reactive import CheckpointConfig, Dataflow, PushSource, RestartStrategy, StateQueryError
from reactive.connectors.collections import ListSink
from reactive.errors import ConfigurationError
from tests.support import FailureInjector, failing_count, zipf_words


def _flow(source: PushSource, injector: FailureInjector, out: ListSink) -> Dataflow:
    flow = Dataflow("embedded-count", parallelism=2)
    (flow.source(source).uid("pushed")
         .key_by(lambda w: w)
         .process(failing_count(injector)).uid("count")
         .sink(out).uid("counts"))
    return flow


def _expected(words: list[str]) -> collections.Counter[tuple[str, int]]:
    counts = collections.Counter(words)
    return collections.Counter((w, i) for w, c in counts.items() for i in range(1, c + 1))


async def _push_with_failures(tmp_path, seed: int) -> None:
    words = zipf_words(6_000, 300, seed=seed)
    rnd = random.Random(seed)
    injector = FailureInjector(sorted(rnd.sample(range(500, 5_500), 3)))
    source = PushSource(capacity=500)
    out = ListSink()
    flow = _flow(source, injector, out)
    job = await flow.start(checkpoints=CheckpointConfig(interval=0.02, directory=str(tmp_path)),
                           restart=RestartStrategy.fixed(5, 0.0))
    committed = job.results("counts")
    uncommitted = job.results(out, committed=False)

    async def push() -> None:
        for i, w in enumerate(words):
            await source.send(w)
            if i % 100 == 0:
                await asyncio.sleep(0)  # let the pipeline run between bursts, as an app would
        source.close()

    async def collect(results) -> collections.Counter[tuple[str, int]]:
        seen: collections.Counter[tuple[str, int]] = collections.Counter()
        async for record in results:
            seen[record] += 1
        return seen

    pusher = asyncio.create_task(push())
    seen, raw = await asyncio.gather(collect(committed), collect(uncommitted))
    await pusher
    await job.wait()
    assert injector.failures == 3 and job.metrics.restarts == 3
    # read committed: every record once, although failures took output back
    assert seen == _expected(words)
    # read uncommitted saw the retracted output too (the failures did take some back)
    assert raw - seen and not seen - raw
    # committed state at the final checkpoint equals the batch count
    truth = collections.Counter(words)
    for word in list(truth)[:50]:
        assert await job.query_state("count", "count", word) == truth[word]
    assert await job.query_state("count", "count", "never-pushed") is None


async def test_pushed_records_are_counted_exactly_once_through_failures(tmp_path):
    await _push_with_failures(tmp_path, seed=3)


def test_the_same_under_uvloop(tmp_path):
    uvloop = pytest.importorskip("uvloop", reason="uvloop is not available on this platform")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_push_with_failures(tmp_path, seed=4))


async def test_durable_send_and_state_queries_at_a_checkpoint(tmp_path):
    source = PushSource(capacity=100)
    out = ListSink()
    flow = _flow(source, FailureInjector([]), out)
    job = await flow.start(checkpoints=CheckpointConfig(interval=0.02, directory=str(tmp_path)))
    words = zipf_words(1_000, 50, seed=5)
    try:
        for w in words[:-1]:
            await source.send(w)
        # durable: returns once a completed checkpoint covers the record
        seq = await source.send(words[-1], durable=True)
        assert seq == len(words) - 1 and source.durable >= len(words)
        truth = collections.Counter(words)
        # the committed state is the state of a completed checkpoint that covers every
        # record: it equals the batch count
        checkpoint = await job.checkpoint()
        assert checkpoint.checkpoint_id > 0
        for word in truth:
            assert await job.query_state("count", "count", word) == truth[word]
            # live state has processed at least as much (here: everything)
            assert await job.query_state("count", "count", word, committed=False) == truth[word]
        with pytest.raises(StateQueryError, match="no keyed state 'missing'"):
            await job.query_state("count", "missing", "w0", committed=False)
        with pytest.raises(StateQueryError, match="no running operator"):
            await job.query_state("nope", "count", "w0", committed=False)
    finally:
        source.close()
        await job.wait()
    with pytest.raises(ConfigurationError, match="closed"):
        await source.send("late")


async def test_the_buffer_holds_what_no_checkpoint_covers_and_bounds_send():
    """``send`` waits while ``capacity`` records are not covered by a completed checkpoint;
    a completed checkpoint releases what it covers; a restore reads from its position."""
    source = PushSource(capacity=3)
    reader = source.create_reader(0, 1)
    reader.open(checkpointing=True)
    for i in range(3):
        await source.send(i)
    fourth = asyncio.create_task(source.send(3))
    for _ in range(5):
        await asyncio.sleep(0)  # nothing can release the buffer here: no race to wait out
    assert not fourth.done()
    assert await reader.read_batch(10) == [0, 1, 2]
    entries = reader.snapshot_state(7)
    assert not fourth.done()  # read, but not yet covered: still buffered for a replay
    reader.notify_checkpoint_complete(7)
    assert await fourth == 3 and source.durable == 3
    # a failure before the next checkpoint: the restored reader replays from position 3
    again = source.create_reader(0, 1)
    again.restore_state(entries)
    again.open(checkpointing=True)
    assert await again.read_batch(10) == [3]
    # a checkpoint of another process's source: its records are gone; read this one's
    other = PushSource().create_reader(0, 1)
    other.restore_state(entries)
    assert other.position == 0


def test_configuration_errors():
    with pytest.raises(ConfigurationError, match="capacity"):
        PushSource(capacity=0)


async def test_a_live_query_pending_when_an_attempt_fails_fails_instead_of_hanging(tmp_path):
    """A live lookup posted to a task that dies before answering gets a StateQueryError
    when the attempt ends; lookups after the restart are answered."""
    from reactive import KeyedProcessFunction, ValueStateDescriptor
    from reactive.connectors.collections import DiscardingSink

    pending: list[asyncio.Task] = []
    handle: dict[str, Any] = {}

    class Total(KeyedProcessFunction):
        failed = [False]

        def open(self, ctx):
            self.total = ctx.get_state(ValueStateDescriptor("total", default=0))

        def process_element(self, e, ctx):
            if e == "boom" and not Total.failed[0]:
                Total.failed[0] = True
                pending.append(asyncio.get_running_loop().create_task(
                    handle["job"].query_state("totals", "total", "a", committed=False)))
                raise RuntimeError("injected")
            self.total.update(self.total.value() + 1)

    source = PushSource()
    flow = Dataflow("live-query-failure")
    flow.source(source).key_by(lambda e: e).process(Total()).uid("totals").sink(DiscardingSink())
    handle["job"] = job = await flow.start(
        checkpoints=CheckpointConfig(interval=0.05, directory=str(tmp_path)),
        restart=RestartStrategy.fixed(3, 0.0))
    await source.send("a")
    await source.send("boom", durable=True)
    assert await job.query_state("totals", "total", "a", committed=False) == 1
    with pytest.raises(StateQueryError, match="attempt ended"):
        await asyncio.wait_for(pending[0], timeout=30)
    source.close()
    await job.wait()
