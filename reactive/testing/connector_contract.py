"""The source and sink contract suites: pytest tests that a connector's own test module
subclasses, as :mod:`reactive.testing.backend_contract` for state backends.

A source returns its :class:`~reactive.sources.Source` and the records it emits::

    from reactive.testing.connector_contract import SourceContract

    class TestMySource(SourceContract):
        def create_source(self, tmp_path):
            return MySource(tmp_path / "input")

        def expected_records(self):
            return ["a", "b", "c"]

and a sink its :class:`~reactive.sinks.Sink` and what it published::

    from reactive.testing.connector_contract import SinkContract

    class TestMySink(SinkContract):
        def create_sink(self, tmp_path):
            return MySink(tmp_path / "out")

        def committed(self, sink):
            return read_my_output(sink)

The tests drive the readers and writers as the source and sink operators do, with no job:
``create_reader``/``create_writer`` per instance, ``restore_state`` (only when there are
entries, else ``start_fresh`` for writers), ``open``, ``read_batch``/``write``,
``snapshot_state(checkpoint_id)`` in a checkpoint, ``notify_checkpoint_complete`` /
``notify_checkpoint_aborted``, ``finish`` and ``close``, awaiting what they return; entries
travel through pickle and are redistributed as the runtime does (``split``: unchanged at the
same parallelism, else dealt round robin; ``union``: all to every instance). A source must
emit every record once, in batches of at most ``max_records``, and resume exactly at a
snapshotted position, at its parallelism and at another one. A sink must publish what was
written once its checkpoint completes; an exactly-once sink (``Sink.exactly_once``) must
publish nothing of a failed attempt past its last completed checkpoint, publish a
pre-committed checkpoint whose completion it never heard of when restored from it, stay
idempotent when restored twice, and commit an aborted checkpoint's records with the next
one (Flink's ``TwoPhaseCommitSinkFunction``). The module needs pytest and pytest-asyncio.
"""

from __future__ import annotations

import asyncio
import collections
import pickle
from abc import ABC, abstractmethod
from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..extras import require
from ..sinks import Sink, SinkWriter
from ..sources import Source, SourceReader

if TYPE_CHECKING:
    import pytest
else:
    pytest = require("pytest", "test", "the connector contract suites")
    require("pytest_asyncio", "test", "the connector contract suites")

__all__ = ["SinkContract", "SourceContract", "redistribute"]

X = TypeVar("X")

# read_batch calls that return [] in a row before a reader counts as stuck
_MAX_EMPTY_READS = 10_000


async def _settle(result: X | Awaitable[X]) -> X:
    if isinstance(result, Awaitable):
        return await result
    return result


def redistribute(entries: list[list[Any]], parallelism: int, mode: str) -> list[list[Any]]:
    """The operator-state entries each of ``parallelism`` new instances restores, from
    the entries of each old instance (the runtime's ``StateAssignmentOperation``): through
    pickle, unchanged at the same parallelism, else dealt round robin (``"split"``), or all
    of them to every instance (``"union"``)."""
    entries = [pickle.loads(pickle.dumps(e)) for e in entries]
    everything = [e for old in entries for e in old]
    if mode == "union":
        return [list(everything) for _ in range(parallelism)]
    if len(entries) == parallelism:
        return entries
    return [everything[i::parallelism] for i in range(parallelism)]


class SourceContract(ABC):
    """The tests every source passes; subclass it in a class named ``Test...``.

    Attributes:
        max_records: the ``max_records`` the tests read with (small, so that positions fall
            inside the source's own batches).
        ordered: whether one reader emits the records in ``expected_records`` order (the
            restore tests then check the order too).
        bounded_batches: whether ``read_batch(n)`` returns at most ``n`` records (a source
            that returns whole blocks of its input sets False).
    """

    max_records = 3
    ordered = True
    bounded_batches = True

    @abstractmethod
    def create_source(self, tmp_path: Path) -> Source[Any]:
        """A new source over the same input each time it is called."""

    @abstractmethod
    def expected_records(self) -> list[Any]:
        """Every record the source emits (at any parallelism), in order for one reader."""

    # ------------------------------------------------------------------ driving readers
    def _parallelisms(self, source: Source[Any]) -> list[int]:
        top = source.max_source_parallelism
        return [1] if top == 1 else [1, 2, 3]

    async def _readers(self, source: Source[Any], parallelism: int,
                       restored: list[list[Any]] | None = None) -> list[SourceReader[Any]]:
        readers = []
        for i in range(parallelism):
            reader = source.create_reader(i, parallelism)
            if restored is not None and restored[i]:
                reader.restore_state(restored[i])
            reader.open(True)
            readers.append(reader)
        return readers

    async def _read(self, readers: list[SourceReader[Any]], limit: int | None = None
                    ) -> list[list[Any]]:
        """Read the readers round robin until each returned None (or ``limit`` records
        in all); the records of each reader."""
        out: list[list[Any]] = [[] for _ in readers]
        live = set(range(len(readers)))
        empty = 0
        while live and (limit is None or sum(map(len, out)) < limit):
            for i in sorted(live):
                batch = await readers[i].read_batch(self.max_records)
                if batch is None:
                    live.discard(i)
                    continue
                assert len(batch) <= self.max_records or not self.bounded_batches, (
                    f"read_batch({self.max_records}) returned {len(batch)} records")
                empty = 0 if batch else empty + 1
                assert empty < _MAX_EMPTY_READS, "the reader returns [] and never ends"
                out[i].extend(batch)
                if limit is not None and sum(map(len, out)) >= limit:
                    break
            await asyncio.sleep(0)
        return out

    async def _close(self, readers: list[SourceReader[Any]]) -> None:
        for reader in readers:
            await _settle(reader.close())

    # ------------------------------------------------------------------ tests
    @pytest.mark.asyncio
    async def test_every_record_is_read_once(self, tmp_path: Path) -> None:
        expected = self.expected_records()
        source = self.create_source(tmp_path)
        for parallelism in self._parallelisms(source):
            readers = await self._readers(self.create_source(tmp_path), parallelism)
            out = await self._read(readers)
            await self._close(readers)
            merged = [r for part in out for r in part]
            assert collections.Counter(map(repr, merged)) == \
                collections.Counter(map(repr, expected)), f"parallelism {parallelism}"
            if parallelism == 1 and self.ordered:
                assert merged == expected

    @pytest.mark.asyncio
    async def test_a_restore_resumes_exactly_at_the_snapshot(self, tmp_path: Path) -> None:
        expected = self.expected_records()
        for cut in sorted({1, len(expected) // 2, max(len(expected) - 1, 1)}):
            source = self.create_source(tmp_path)
            readers = await self._readers(source, 1)
            before = (await self._read(readers, limit=cut))[0]
            entries = [readers[0].snapshot_state(1)]
            await _settle(readers[0].notify_checkpoint_complete(1))
            await self._close(readers)
            restored = redistribute(entries, 1, source.state_redistribution)
            resumed = await self._readers(self.create_source(tmp_path), 1, restored)
            after = (await self._read(resumed))[0]
            await self._close(resumed)
            if self.ordered:
                assert before + after == expected, f"cut after {len(before)} records"
            else:
                assert collections.Counter(map(repr, before + after)) == \
                    collections.Counter(map(repr, expected))

    @pytest.mark.asyncio
    async def test_a_restore_at_another_parallelism_reads_the_rest_once(
            self, tmp_path: Path) -> None:
        expected = self.expected_records()
        source = self.create_source(tmp_path)
        parallelisms = self._parallelisms(source)
        for old, new in [(a, b) for a in parallelisms for b in parallelisms if a != b]:
            readers = await self._readers(self.create_source(tmp_path), old)
            before = await self._read(readers, limit=len(expected) // 2)
            entries = [reader.snapshot_state(1) for reader in readers]
            await self._close(readers)
            restored = redistribute(entries, new, source.state_redistribution)
            resumed = await self._readers(self.create_source(tmp_path), new, restored)
            after = await self._read(resumed)
            await self._close(resumed)
            merged = [r for part in before + after for r in part]
            assert collections.Counter(map(repr, merged)) == \
                collections.Counter(map(repr, expected)), f"{old} -> {new} instances"


class SinkContract(ABC):
    """The tests every sink passes; subclass it in a class named ``Test...``.

    An at-least-once sink (``exactly_once = False``) is checked for publishing every
    record at least once; an exactly-once one for publishing each exactly once.
    """

    @abstractmethod
    def create_sink(self, tmp_path: Path) -> Sink[Any]:
        """A new sink writing to the same place each time it is called."""

    @abstractmethod
    def committed(self, sink: Sink[Any]) -> list[Any]:
        """What the sink has published so far (its committed output)."""

    def records(self, start: int, stop: int) -> list[Any]:
        """The records the tests write: ``{"n": i}`` for ``start <= i < stop``."""
        return [{"n": i} for i in range(start, stop)]

    # ------------------------------------------------------------------ driving writers
    async def _writers(self, sink: Sink[Any], parallelism: int,
                       restored: list[list[Any]] | None = None) -> list[SinkWriter[Any]]:
        writers = [sink.create_writer(i, parallelism) for i in range(parallelism)]
        for i, writer in enumerate(writers):
            if restored is not None and restored[i]:
                await _settle(writer.restore_state(restored[i]))
            else:
                await _settle(writer.start_fresh())
        return writers

    def _check(self, sink: Sink[Any], published: list[Any], written: list[Any]) -> None:
        got = collections.Counter(map(repr, published))
        want = collections.Counter(map(repr, written))
        if sink.exactly_once:
            assert got == want, f"published {sorted(got - want)} too many, " \
                                f"{sorted(want - got)} missing"
        else:
            assert set(got) == set(want), sorted(set(want) ^ set(got))

    # ------------------------------------------------------------------ tests
    @pytest.mark.asyncio
    async def test_a_completed_checkpoint_publishes_what_was_written(
            self, tmp_path: Path) -> None:
        sink = self.create_sink(tmp_path)
        writers = await self._writers(sink, 2)
        for i, writer in enumerate(writers):
            await _settle(writer.write(self.records(10 * i, 10 * i + 4)))
        for writer in writers:
            await _settle(writer.snapshot_state(1))
        for writer in writers:
            await _settle(writer.notify_checkpoint_complete(1))
        self._check(sink, self.committed(sink), self.records(0, 4) + self.records(10, 14))
        for i, writer in enumerate(writers):
            await _settle(writer.write(self.records(10 * i + 4, 10 * i + 6)))
            await _settle(writer.finish())
            await _settle(writer.close())
        self._check(sink, self.committed(sink), self.records(0, 6) + self.records(10, 16))

    @pytest.mark.asyncio
    async def test_a_failed_attempt_is_replayed_from_the_last_completed_checkpoint(
            self, tmp_path: Path) -> None:
        sink = self.create_sink(tmp_path)
        (writer,) = await self._writers(sink, 1)
        await _settle(writer.write(self.records(0, 5)))
        first = await _settle(writer.snapshot_state(1))
        await _settle(writer.notify_checkpoint_complete(1))
        await _settle(writer.write(self.records(5, 8)))
        await _settle(writer.snapshot_state(2))  # checkpoint 2 never completes
        await _settle(writer.write(self.records(8, 10)))
        await _settle(writer.close())  # the attempt fails
        if sink.exactly_once:
            self._check(sink, self.committed(sink), self.records(0, 5))
        # the restart restores checkpoint 1 and the source replays what came after it
        sink = self.create_sink(tmp_path)
        restored = redistribute([first], 1, sink.create_writer(0, 1).state_redistribution)
        (writer,) = await self._writers(sink, 1, restored)
        await _settle(writer.write(self.records(5, 10)))
        await _settle(writer.snapshot_state(3))
        await _settle(writer.notify_checkpoint_complete(3))
        await _settle(writer.finish())
        await _settle(writer.close())
        self._check(sink, self.committed(sink), self.records(0, 10))

    @pytest.mark.asyncio
    async def test_a_restore_publishes_a_checkpoint_whose_completion_was_not_heard(
            self, tmp_path: Path) -> None:
        """Checkpoint 1 completed but the writer failed before its notification: the
        restore from checkpoint 1 publishes it, once, even when the restore runs twice."""
        sink = self.create_sink(tmp_path)
        (writer,) = await self._writers(sink, 1)
        await _settle(writer.write(self.records(0, 5)))
        entries = await _settle(writer.snapshot_state(1))
        await _settle(writer.close())
        for _ in range(2):  # the first recovery fails too, after restoring
            sink = self.create_sink(tmp_path)
            mode = sink.create_writer(0, 1).state_redistribution
            (writer,) = await self._writers(sink, 1, redistribute([entries], 1, mode))
            await _settle(writer.close())
        self._check(sink, self.committed(sink), self.records(0, 5))

    @pytest.mark.asyncio
    async def test_an_aborted_checkpoint_is_published_with_the_next_one(
            self, tmp_path: Path) -> None:
        sink = self.create_sink(tmp_path)
        (writer,) = await self._writers(sink, 1)
        await _settle(writer.write(self.records(0, 3)))
        await _settle(writer.snapshot_state(1))
        await _settle(writer.notify_checkpoint_aborted(1))
        await _settle(writer.write(self.records(3, 6)))
        await _settle(writer.snapshot_state(2))
        await _settle(writer.notify_checkpoint_complete(2))
        self._check(sink, self.committed(sink), self.records(0, 6))
        await _settle(writer.finish())
        await _settle(writer.close())
