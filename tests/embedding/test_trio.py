"""A trio application runs pipelines: ``await flow.run()`` and ``await flow.start()`` under
``trio.run``, with the push source, the committed results iterator, state queries,
checkpoints, RocksDB and restarts (reactive.embedding.trio_host). The tests run under trio
itself."""

from __future__ import annotations

import collections
import random

import pytest

from reactive import CheckpointConfig, Dataflow, PushSource, RestartStrategy
from reactive.connectors.collections import ListSink
from tests.support import FailureInjector, failing_count, zipf_words

trio = pytest.importorskip("trio", reason="the trio tests need trio (pip install -e '.[test]')")


def test_flow_run_inside_trio_run(tmp_path):
    words = zipf_words(20_000, 500, seed=1)
    out = ListSink()
    flow = Dataflow("trio-run", parallelism=2)
    flow.from_collection(words).key_by(lambda w: w).reduce(
        lambda a, b: a).map(lambda w: w).sink(out)

    async def main():
        job = await flow.run(checkpoints=CheckpointConfig(interval=0.05,
                                                          directory=str(tmp_path)))
        return job.status, len(job.metrics.completed_checkpoints)

    status, checkpoints = trio.run(main)
    assert status == "finished" and checkpoints >= 1
    assert len(out.records) == len(words)


def test_push_source_results_and_queries_from_trio_with_rocksdb_and_restarts(tmp_path):
    from reactive.backends.rocksdb import RocksDBStateBackend

    words = zipf_words(4_000, 200, seed=2)
    injector = FailureInjector(sorted(random.Random(2).sample(range(300, 3_700), 2)))
    source = PushSource(capacity=300)
    flow = Dataflow("trio-push", parallelism=2)
    (flow.source(source).uid("pushed")
         .key_by(lambda w: w)
         .process(failing_count(injector)).uid("count")
         .sink(ListSink()).uid("counts"))

    async def main():
        job = await flow.start(
            checkpoints=CheckpointConfig(interval=0.02, directory=str(tmp_path / "chk")),
            restart=RestartStrategy.fixed(5, 0.0),
            state_backend=RocksDBStateBackend(str(tmp_path / "rocksdb")))
        results = job.results("counts")
        seen: collections.Counter[tuple[str, int]] = collections.Counter()

        async def collect():
            async for record in results:
                seen[tuple(record)] += 1

        async with trio.open_nursery() as nursery:
            nursery.start_soon(collect)
            for w in words[:-1]:
                await source.send(w)
            await source.send(words[-1], durable=True)
            assert source.durable == len(words)
            truth = collections.Counter(words)
            checkpoint = await job.checkpoint()
            assert checkpoint.checkpoint_id > 0
            for word in list(truth)[:20]:
                assert await job.query_state("count", "count", word) == truth[word]
            source.close()
            await job.wait()
        return seen, job.metrics.restarts

    seen, restarts = trio.run(main)
    counts = collections.Counter(words)
    assert restarts == 2 and injector.failures == 2
    assert seen == collections.Counter((w, i) for w, c in counts.items()
                                       for i in range(1, c + 1))


def test_cancelling_the_trio_scope_cancels_the_job(tmp_path):
    source = PushSource()
    flow = Dataflow("trio-cancel")
    flow.source(source).sink(ListSink())
    state = {}

    async def main():
        with trio.move_on_after(0.5) as scope:
            await flow.run(checkpoints=CheckpointConfig(interval=0.05, directory=str(tmp_path)))
        state["cancelled"] = scope.cancelled_caught

    trio.run(main)
    assert state["cancelled"]


def test_results_read_after_the_job_ended_are_all_there(tmp_path):
    """``wait()`` ends the job's loop thread; the application may still be iterating the
    results (or not have started): every record comes, then the end. The iterator used to
    fetch each record from the job's loop, so it hung or failed once that loop was gone."""
    words = zipf_words(3_000, 100, seed=4)
    flow = Dataflow("trio-late-results", parallelism=2)
    flow.from_collection(words).uid("src").key_by(lambda w: w).process(
        failing_count(FailureInjector([]))).uid("count").sink(ListSink()).uid("counts")

    async def main():
        job = await flow.start(checkpoints=CheckpointConfig(interval=0.05,
                                                            directory=str(tmp_path)))
        results = job.results("counts")
        first = await results.__anext__()  # one record while the job runs
        await job.wait()
        return [first] + [record async for record in results]

    seen = collections.Counter(tuple(r) for r in trio.run(main))
    counts = collections.Counter(words)
    assert seen == collections.Counter((w, i) for w, c in counts.items()
                                       for i in range(1, c + 1))


def test_results_iterated_from_trio_are_bounded_and_closable(tmp_path):
    """A trio reader slower than the job: what the sink received and trio did not read yet
    stays within the capacity plus what no completed checkpoint covers; a closed iterator
    no longer holds the job back."""
    from reactive.testing import TestingSource

    def flow_of(n: int, out: ListSink) -> Dataflow:
        items: list = []
        for i in range(n):
            items.append(i)
            if i % 500 == 499:
                items.append(TestingSource.CHECKPOINT)
        flow = Dataflow("trio-slow-reader", parallelism=1)
        (flow.source(TestingSource(items, batch_size=50)).uid("src")
             .map(lambda x: x).uid("m").sink(out).uid("out"))
        return flow

    async def main():
        out = ListSink()
        job = await flow_of(5_000, out).start(
            checkpoints=CheckpointConfig(interval=0.01, directory=str(tmp_path / "a")))
        seen, most_waiting = [], 0
        async for record in job.results("out", capacity=100):
            seen.append(record)
            most_waiting = max(most_waiting, len(out.records) - len(seen))
            if len(seen) % 10 == 0:
                await trio.sleep(0.001)  # a reader slower than the job
        await job.wait()
        assert seen == list(range(5_000))
        # capacity + two markers' worth not yet released + what trio has not reported
        assert most_waiting <= 100 + 2 * 500 + 50 + 256

        out = ListSink()
        job = await flow_of(5_000, out).start(
            checkpoints=CheckpointConfig(interval=0.01, directory=str(tmp_path / "b")))
        async with job.results("out", capacity=10) as results:
            async for first in results:
                assert first == 0
                break
        with trio.fail_after(60):  # a job held back would never end
            await job.wait()
        assert len(out.records) == 5_000

    trio.run(main)
