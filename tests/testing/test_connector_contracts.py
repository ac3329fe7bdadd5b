"""The built-in sources and sinks pass the connector contract suites
(:mod:`reactive.testing.connector_contract`): the collection, line-file, CSV, Nexmark,
testing and simple-polling sources; the list, callback and committing-file sinks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reactive import SimplePollingSource, Sink, Source
from reactive.connectors.collections import CallbackSink, CollectionSource, ListSink
from reactive.connectors.files import CommittingFileSink, CsvFileSource, LineFileSource
from reactive.testing import TestingSource
from reactive.testing.connector_contract import SinkContract, SourceContract

WORDS = [f"word-{i}" for i in range(23)]


class TestCollectionSource(SourceContract):
    def create_source(self, tmp_path: Path) -> Source[Any]:
        return CollectionSource(WORDS)

    def expected_records(self) -> list[Any]:
        return WORDS


class TestTestingSource(SourceContract):
    def create_source(self, tmp_path: Path) -> Source[Any]:
        return TestingSource(WORDS, batch_size=4)

    def expected_records(self) -> list[Any]:
        return WORDS


class TestLineFileSource(SourceContract):
    """Three files, read as splits by up to three instances."""

    def create_source(self, tmp_path: Path) -> Source[Any]:
        directory = tmp_path / "lines"
        if not directory.exists():
            directory.mkdir()
            for part in range(3):
                (directory / f"part-{part}.txt").write_text(
                    "".join(f"{w}\n" for w in WORDS[part::3]))
        return LineFileSource(directory, read_size=16)

    def expected_records(self) -> list[Any]:
        return [w for part in range(3) for w in WORDS[part::3]]


class TestCsvFileSource(SourceContract):
    """Each batch is a block of whole rows: ``max_records`` does not cut blocks."""

    bounded_batches = False

    def create_source(self, tmp_path: Path) -> Source[Any]:
        pytest.importorskip("pyarrow")
        directory = tmp_path / "csv"
        if not directory.exists():
            directory.mkdir()
            for part in range(2):
                (directory / f"part-{part}.csv").write_text(
                    "word,n\n" + "".join(f"{w},{i}\n" for i, w in enumerate(WORDS)
                                          if i % 2 == part))
        return CsvFileSource(directory, block_size=64)

    def expected_records(self) -> list[Any]:
        return [(w, i) for part in range(2)
                for i, w in enumerate(WORDS) if i % 2 == part]


def _pages(position: int) -> tuple[list[str], int] | None:
    """Pages of five words, as a cursor-paged API would serve them."""
    if position >= len(WORDS):
        return None
    return WORDS[position:position + 5], position + 5


class TestSimplePollingSource(SourceContract):
    def create_source(self, tmp_path: Path) -> Source[Any]:
        return SimplePollingSource(_pages, start=0, interval=0.0)

    def expected_records(self) -> list[Any]:
        return WORDS


class TestSimplePollingSourceWithEmptyPolls(SourceContract):
    """An asynchronous poll that finds nothing every other time."""

    def create_source(self, tmp_path: Path) -> Source[Any]:
        async def poll(position: tuple[int, bool]) -> tuple[list[str], tuple[int, bool]] | None:
            offset, ready = position
            if offset >= len(WORDS):
                return None
            if not ready:
                return [], (offset, True)
            return WORDS[offset:offset + 4], (offset + 4, False)

        return SimplePollingSource(poll, start=(0, False), interval=0.0)

    def expected_records(self) -> list[Any]:
        return WORDS


class _SharedSink(SinkContract):
    """In-memory sinks publish to the object itself: one per test, across "restarts"."""

    sink: Any = None

    @pytest.fixture(autouse=True)
    def _fresh(self) -> None:
        self.sink = None


class TestListSink(_SharedSink):
    def create_sink(self, tmp_path: Path) -> Sink[Any]:
        if self.sink is None:
            self.sink = ListSink()
        return self.sink

    def committed(self, sink: Sink[Any]) -> list[Any]:
        return list(self.sink.records)


class TestCallbackSink(_SharedSink):
    def create_sink(self, tmp_path: Path) -> Sink[Any]:
        if self.sink is None:
            self.published: list[Any] = []
            self.sink = CallbackSink(self.published.append)
        return self.sink

    def committed(self, sink: Sink[Any]) -> list[Any]:
        return list(self.published)


class TestCommittingFileSink(SinkContract):
    def create_sink(self, tmp_path: Path) -> Sink[Any]:
        return CommittingFileSink(tmp_path / "out", mode="append")

    def committed(self, sink: Sink[Any]) -> list[Any]:
        assert isinstance(sink, CommittingFileSink)
        return [json.loads(line) for part in sorted(sink.directory.glob("part-*.jsonl"))
                for line in part.read_text().splitlines()]


def test_the_file_sink_contract_catches_a_sink_that_publishes_before_the_commit(tmp_path):
    """The exactly-once checks fail for a sink that publishes at write time but says it
    is exactly once (the suite can fail)."""

    class EagerSink(ListSink):
        exactly_once = True

    class Eager(TestListSink):
        def create_sink(self, tmp_path: Path) -> Sink[Any]:
            if self.sink is None:
                self.sink = EagerSink()
            return self.sink

    import asyncio

    with pytest.raises(AssertionError, match="too many"):
        asyncio.run(Eager().test_a_failed_attempt_is_replayed_from_the_last_completed_checkpoint(
            tmp_path))


async def test_a_simple_polling_source_resumes_at_its_checkpointed_position(tmp_path):
    """A job over a polled cursor fails after a checkpoint taken mid-stream; the restart
    polls again from the checkpointed position, so the keyed counts equal a batch count
    (a position too early would count records twice, too late would miss them)."""
    import asyncio
    import collections

    from reactive import CheckpointConfig, Dataflow, RestartStrategy
    from tests.support import FailureInjector, failing_count, final_counts

    words = [f"w{i % 7}" for i in range(2000)]
    allowed = [1000]  # the poll serves records below this position only
    stalled = asyncio.Event()

    def poll(position: int) -> tuple[list[str], int] | None:
        if position >= len(words):
            return None
        if position == allowed[0]:
            stalled.set()
        end = min(position + 40, allowed[0], len(words))
        return words[position:end], end

    injector = FailureInjector([1500])
    sink: ListSink = ListSink()
    flow = Dataflow("polling", batch_size=16)
    (flow.source(SimplePollingSource(poll, start=0, interval=0.001), uid="poll")
         .key_by(lambda w: w).process(failing_count(injector)).uid("count").sink(sink))
    job = await flow.start(checkpoints=CheckpointConfig(interval=None, directory=tmp_path),
                           restart=RestartStrategy(attempts=1, delay=0.0))
    await asyncio.wait_for(stalled.wait(), timeout=60)
    done = await job.checkpoint()  # at position 1000
    allowed[0] = len(words)
    await job.wait()
    assert job.metrics.restarts == 1 and injector.failures == 1
    assert done.checkpoint_id >= 1
    assert final_counts(sink.records) == dict(collections.Counter(words))
