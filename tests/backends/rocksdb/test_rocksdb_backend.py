"""The RocksDB backend in real jobs: exactly-once under failures, incremental checkpoints
(bytes written, shared-file collection, restore), and a kill -9 between the synchronous and
the asynchronous part of a snapshot."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import pickle
import random
import signal
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from reactive import (
    CheckpointConfig,
    CheckpointStorage,
    CompletedCheckpoint,
    Dataflow,
    KeyGroupRange,
    RestartStrategy,
    Source,
    SourceReader,
    ValueStateDescriptor,
)
from reactive.backends.rocksdb import RocksDBStateBackend, read_rocksdb_snapshot
from reactive.connectors.collections import CallbackSink, ListSink
from reactive.testing import TestingSource
from tests.support import Count, FailureInjector, failing_count, final_counts, paced, zipf_words

MAX_PARALLELISM = 128


def rocksdb_state(chk: CompletedCheckpoint, uid: str, state: str, scratch: Path) -> dict[Any, Any]:
    """The keyed state ``state`` of operator ``uid`` in ``chk``, merged over all instances."""
    out: dict[Any, Any] = {}
    for i, sub in chk.metadata.operators[uid].subtasks.items():
        if sub.keyed_state is not None:
            data = read_rocksdb_snapshot(sub.keyed_state.to_json(), chk.job_dir,
                                         scratch / f"read-{i}")
            out.update({k: pickle.loads(v) for k, v in data.get(state, {}).items()})
    return out


def handles(chk: CompletedCheckpoint, uid: str) -> list[dict[str, Any]]:
    """The keyed-state handles of ``uid`` as the backend wrote them (its JSON)."""
    return [sub.keyed_state.to_json() for sub in chk.metadata.operators[uid].subtasks.values()
            if sub.keyed_state is not None]


def shared_refs(chk: CompletedCheckpoint) -> set[str]:
    return chk.metadata.shared_paths()


def files_under(path: Path, job_dir: Path) -> set[str]:
    return {p.relative_to(job_dir).as_posix() for p in path.rglob("*") if p.is_file()}


# ---------------------------------------------------------------------- exactly once
@pytest.mark.parametrize("incremental", [False, True], ids=["full", "incremental"])
async def test_keyed_count_is_exact_after_failures(tmp_path: Path, incremental: bool) -> None:
    # 20,000 keys through a 5,000-entry cache: reads and writes go through RocksDB
    words = zipf_words(60_000, 20_000, seed=3)
    truth = collections.Counter(words)
    rnd = random.Random(21 + incremental)
    # one pseudo-random point in each 13,500-record stretch: failures >= 6,000 records apart
    # each end a different attempt
    injector = FailureInjector([6_000 + 13_500 * i + rnd.randrange(3_000, 10_500)
                                for i in range(4)])
    sink = ListSink()
    flow = Dataflow("count", parallelism=2, max_parallelism=MAX_PARALLELISM, batch_size=256)
    # paced: a checkpoint completes every 6,000 records, so recovery restores real ones
    (flow.source(paced(words, every=6_000)).uid("words")
         .key_by(lambda w: w)
         .process(failing_count(injector)).uid("count")
         .sink(sink))
    backend = RocksDBStateBackend(path=tmp_path / "state", incremental=incremental,
                                  cache_entries=5_000, write_batch_entries=2_000)
    job = await flow.run(checkpoints=CheckpointConfig(interval=0.1, directory=tmp_path / "chk"),
                         restart=RestartStrategy.fixed(10, 0.0), state_backend=backend)
    assert injector.failures == 4
    assert job.metrics.restarts == 4
    assert job.metrics.restored_checkpoints  # recovery restored real checkpoints
    assert final_counts(sink.records) == truth
    chk = CheckpointStorage(tmp_path / "chk", "count").completed()[-1]
    assert {h["mode"] for h in handles(chk, "count")} == {
        "incremental" if incremental else "full"}
    assert rocksdb_state(chk, "count", "count", tmp_path) == truth
    # every attempt removed its working directories
    assert not list((tmp_path / "state").rglob("*.sst"))


# ---------------------------------------------------------------------- incremental
# Hand-written: the test feeds records while the job runs and a resumed job starts with a
# new, empty source whose restored position must not replay them; a TestingSource is a
# fixed list indexed by its position.
class PushSource(Source):
    """A source the test feeds: records pushed with :meth:`push` are emitted in order; it
    ends after :meth:`close`. Its position is the number of records emitted."""

    max_source_parallelism = 1

    def __init__(self) -> None:
        self.pending: collections.deque[Any] = collections.deque()
        self.emitted = 0
        self.closed = False
        self.ready = asyncio.Event()

    def push(self, records: list[Any]) -> None:
        self.pending.extend(records)
        self.ready.set()

    def close(self) -> None:
        self.closed = True
        self.ready.set()

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        return _PushReader(self)


class _PushReader(SourceReader):
    def __init__(self, source: PushSource) -> None:
        self.source = source

    async def read_batch(self, max_records: int) -> list[Any] | None:
        src = self.source
        if not src.pending:
            if src.closed:
                return None
            src.ready.clear()
            # wait for data, but return within 10 ms so barriers get injected
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(src.ready.wait(), 0.01)
            return []
        n = min(max_records, len(src.pending))
        src.emitted += n
        return [src.pending.popleft() for _ in range(n)]

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        return [self.source.emitted]

    def restore_state(self, entries: list[Any]) -> None:
        # a resumed job gets a new source: records fed before the checkpoint are not replayed
        self.source.emitted = int(entries[0])


class Pipeline:
    """A keyed count fed by a :class:`PushSource`; :meth:`feed` returns once every record
    fed so far went through the count."""

    def __init__(self, name: str) -> None:
        self.source = PushSource()
        self.truth: collections.Counter[Any] = collections.Counter()
        self._out = 0
        self._target = 0
        self._reached = asyncio.Event()
        self.flow = Dataflow(name, parallelism=2, max_parallelism=MAX_PARALLELISM)
        (self.flow.source(self.source).uid("src")
             .key_by(lambda w: w)
             .process(Count()).uid("count")
             .sink(CallbackSink(self._on_output)))

    def _on_output(self, record: Any) -> None:
        self._out += 1
        if self._out >= self._target:
            self._reached.set()

    async def feed(self, records: list[Any]) -> None:
        self.truth.update(records)
        self._target += len(records)
        self._reached.clear()
        self.source.push(records)
        await asyncio.wait_for(self._reached.wait(), 60)


def _eager_compaction(opts: Any) -> None:
    # compact as soon as two L0 files exist, so that SST files of older checkpoints go away
    opts.set_level_zero_file_num_compaction_trigger(2)


def _no_compaction(opts: Any) -> None:
    opts.set_disable_auto_compactions(True)


async def test_incremental_checkpoints_write_little_and_restore_exactly(tmp_path: Path) -> None:
    directory = tmp_path / "chk"
    pipe = Pipeline("inc")
    job = await pipe.flow.start(
        checkpoints=CheckpointConfig(interval=None, directory=directory, retained=1),
        state_backend=RocksDBStateBackend(path=tmp_path / "state", incremental=True),
    )
    await pipe.feed([f"key{i}" for i in range(60_000)])
    n = await job.checkpoint()
    truth_n = dict(pipe.truth)
    await pipe.feed([f"key{i}" for i in range(0, 60_000, 6_000)] * 2)  # 10 keys change
    n1 = await job.checkpoint()
    truth_n1 = dict(pipe.truth)
    assert n1.checkpoint_id == n.checkpoint_id + 1

    # bytes written by n+1 (metadata stats) vs a full snapshot of the same state
    assert n.metadata.metrics is not None and n1.metadata.metrics is not None
    size_n, size_n1 = n.metadata.metrics.size, n1.metadata.metrics.size
    assert size_n is not None and size_n1 is not None
    full_n1 = sum(ref["size"] for h in handles(n1, "count") for ref in h["files"])
    assert size_n1 < 0.1 * full_n1
    assert size_n1 < 0.1 * size_n
    reused = [ref for h in handles(n1, "count") for ref in h["shared_reused"]]
    assert reused and {r["path"] for r in reused} <= shared_refs(n)
    # the bytes n+1 reports are exactly the bytes of the files it wrote itself
    own = [ref.to_json() for ref in n1.metadata.file_refs() if ref.to_json() not in reused]
    assert size_n1 == sum(ref["size"] for ref in own)

    # checkpoint n+1 holds exactly the state at n+1 (and n held the state at n)
    assert rocksdb_state(n1, "count", "count", tmp_path) == truth_n1
    assert truth_n1 != truth_n
    # ... and restoring it (merging both instances into one) gives that state
    kb = RocksDBStateBackend(path=tmp_path / "restore").create_keyed_backend(
        job_name="inc", operator_uid="count", subtask=0,
        key_group_range=KeyGroupRange(0, MAX_PARALLELISM - 1), max_parallelism=MAX_PARALLELISM)
    try:
        kb.restore(handles(n1, "count"), n1.job_dir)
        count = kb.get_state(ValueStateDescriptor("count", default=0))
        restored = {}
        for key in kb.keys("count"):
            kb.set_current_key(key)
            restored[key] = count.value()  # type: ignore[attr-defined]
        assert restored == truth_n1
    finally:
        kb.dispose()

    pipe.source.close()
    await job.wait()


async def test_shared_files_are_deleted_exactly_when_unreferenced(tmp_path: Path) -> None:
    directory = tmp_path / "chk"
    job_dir = directory / "gc"
    ever_referenced: set[str] = set()
    dropped: set[str] = set()
    for attempt in range(2):  # the second attempt resumes: counts come from the metadata
        # the first attempt compacts eagerly, so files get replaced and dropped; the resumed
        # one does not compact, so the files it restored are still its files at its first
        # checkpoint (a background compaction could otherwise rewrite them all first)
        backend = RocksDBStateBackend(
            path=tmp_path / f"state-{attempt}", incremental=True,
            options_factory=_no_compaction if attempt else _eager_compaction)
        pipe = Pipeline("gc")
        job = await pipe.flow.start(
            checkpoints=CheckpointConfig(interval=None, directory=directory, retained=2),
            state_backend=backend, resume=attempt > 0,
        )
        first = True
        for round_ in range(30):
            await pipe.feed([f"a{attempt}-{round_}-{i}" for i in range(2_000)])
            chk = await job.checkpoint()
            refs = shared_refs(chk)
            if attempt and first:
                # a resumed instance references the shared files it restored from
                reused = [r for h in handles(chk, "count") for r in h["shared_reused"]]
                assert reused and {r["path"] for r in reused} <= ever_referenced
                first = False
            dropped |= ever_referenced - refs
            ever_referenced |= refs
            if dropped and round_ >= 3:
                break
        pipe.source.close()
        await job.wait()
        storage = CheckpointStorage(directory, "gc")
        retained = storage.completed()  # the last one is the job's final checkpoint
        assert len(retained) == 2
        live = set().union(*(shared_refs(c) for c in retained))
        dropped |= ever_referenced - live
        ever_referenced |= live
        # exactly the files retained checkpoints reference remain (no temporary files)
        assert files_under(job_dir / "shared", job_dir) == live
        # (and the records of the runs, which say where each run started, and the lock)
        assert {p.name for p in job_dir.iterdir()} == {
            "shared", "_runs", "_lock", *(c.path.name for c in retained)}
    # compaction replaced files during the run, and those files were deleted
    assert dropped
    assert not (dropped - live) & files_under(job_dir / "shared", job_dir)
    # the retained checkpoint restores the state that all attempts built
    chk = CheckpointStorage.load(retained[-1].path)
    counts = rocksdb_state(chk, "count", "count", tmp_path)
    assert len(counts) > 2_000 and set(counts.values()) == {1}


async def test_full_checkpoints_share_nothing(tmp_path: Path) -> None:
    pipe = Pipeline("full")
    job = await pipe.flow.start(
        checkpoints=CheckpointConfig(interval=None, directory=tmp_path / "chk", retained=1),
        state_backend=RocksDBStateBackend(path=tmp_path / "state", incremental=False),
    )
    await pipe.feed([f"k{i}" for i in range(5_000)])
    first = await job.checkpoint()
    await pipe.feed(["k1"])
    second = await job.checkpoint()
    for chk in (first, second):
        assert all(not h["shared"] and not h["shared_reused"] for h in handles(chk, "count"))
    # a full checkpoint writes the whole state again
    assert first.metadata.metrics is not None and second.metadata.metrics is not None
    assert (second.metadata.metrics.size or 0) > 0.5 * (first.metadata.metrics.size or 0)
    pipe.source.close()
    await job.wait()
    assert not (tmp_path / "chk" / "full" / "shared").exists()
    assert rocksdb_state(CheckpointStorage(tmp_path / "chk", "full").completed()[-1], "count",
                         "count", tmp_path) == pipe.truth


# ---------------------------------------------------------------------- kill -9
PIPELINE_SCRIPT = textwrap.dedent('''
    """Keyed count on RocksDB (incremental); the asynchronous part of checkpoint PAUSE_AT
    never starts: the script prints SYNC-DONE and waits to be killed."""
    import asyncio
    import sys

    import reactive.backends.rocksdb as rocksdb
    import reactive.backends.rocksdb.snapshot as rocksdb_snapshot
    from reactive.connectors.collections import ListSink
    from reactive import CheckpointConfig, Dataflow, KeyedProcessFunction, ValueStateDescriptor
    from reactive.testing import TestingSource

    directory, state, words_file, pause_at = sys.argv[1:5]
    PAUSE_AT = int(pause_at)
    words = open(words_file).read().split()


    class Count(KeyedProcessFunction):
        def open(self, ctx):
            self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

        def process_element(self, value, ctx):
            n = self.count.value() + 1
            self.count.update(n)
            yield (ctx.current_key, n)


    # the first half, then PAUSE_AT - 1 CHECKPOINT markers: checkpoints 1 .. PAUSE_AT - 1
    # complete with the second half unread however fast the job runs (the last marker may
    # wait for checkpoint PAUSE_AT, which never completes), then the rest and no end
    half = len(words) // 2
    WORDS = TestingSource([*words[:half], *[TestingSource.CHECKPOINT] * (PAUSE_AT - 1),
                           *words[half:], TestingSource.HOLD])


    original_write = rocksdb_snapshot.RocksDBSnapshot.write


    async def write(self):
        if self.ctx.checkpoint_id >= PAUSE_AT:
            print(f"SYNC-DONE {self.ctx.checkpoint_id}", flush=True)
            await asyncio.Event().wait()
        return await original_write(self)


    rocksdb_snapshot.RocksDBSnapshot.write = write


    async def main():
        flow = Dataflow("killed", parallelism=2, max_parallelism=128, batch_size=256)
        (flow.source(WORDS).uid("words").key_by(lambda w: w).process(Count()).uid("count")
             .sink(ListSink()))
        await flow.run(checkpoints=CheckpointConfig(interval=0.05, directory=directory),
                       state_backend=rocksdb.RocksDBStateBackend(path=state))


    asyncio.run(main())
''')


@pytest.mark.e2e
async def test_kill_between_sync_and_async_part_keeps_previous_checkpoint(
        tmp_path: Path) -> None:
    words = zipf_words(100_000, 10_000, seed=5)
    (tmp_path / "words.txt").write_text("\n".join(words))
    script = tmp_path / "pipeline.py"
    script.write_text(PIPELINE_SCRIPT)
    pause_at = 3
    repo = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(repo), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script), str(tmp_path / "chk"), str(tmp_path / "state"),
        str(tmp_path / "words.txt"), str(pause_at),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 120)
        if not line:
            pytest.fail(f"the pipeline exited early: {(await proc.stderr.read()).decode()}")
        assert line.decode().split() == ["SYNC-DONE", str(pause_at)]
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        await proc.wait()
    assert proc.returncode == -signal.SIGKILL

    storage = CheckpointStorage(tmp_path / "chk", "killed")
    # the synchronous part ran (the checkpoint directory exists) but nothing completed it
    assert storage.checkpoint_dir(pause_at).is_dir()
    assert not (storage.checkpoint_dir(pause_at) / "_metadata").exists()
    previous = storage.latest_restorable()
    assert previous is not None and previous.checkpoint_id == pause_at - 1
    assert any(h["shared"] for h in handles(previous, "count"))

    # resume from it: the counts continue exactly where checkpoint pause_at - 1 left them
    sink = ListSink()
    flow = Dataflow("killed", parallelism=2, max_parallelism=MAX_PARALLELISM, batch_size=256)
    # the killed run's input, ending here: the restored position is an index into it
    half = len(words) // 2
    resumed = TestingSource([*words[:half], *[TestingSource.CHECKPOINT] * (pause_at - 1),
                             *words[half:]])
    (flow.source(resumed).uid("words").key_by(lambda w: w)
         .process(Count()).uid("count").sink(sink))
    job = await flow.run(checkpoints=CheckpointConfig(interval=0.05, directory=tmp_path / "chk"),
                         state_backend=RocksDBStateBackend(path=tmp_path / "state2"),
                         resume=True)
    assert job.metrics.restored_checkpoints == [pause_at - 1]
    truth = collections.Counter(words)
    # the resumed run replays only the records after the checkpoint, and its counts continue
    # from the checkpoint's: the last count emitted per key is the key's true count
    emitted = final_counts(sink.records)
    assert 0 < len(sink.records) < len(words)
    assert emitted == {k: truth[k] for k in emitted}
    final = storage.completed()[-1]
    assert rocksdb_state(final, "count", "count", tmp_path) == truth
    # the killed checkpoint's files and its orphaned uploads are gone
    assert not storage.checkpoint_dir(pause_at).exists()
    job_dir = storage.job_dir
    live = set().union(*(shared_refs(c) for c in storage.completed()))
    assert files_under(job_dir / "shared", job_dir) == live
    json.dumps(final.metadata.to_json())  # the metadata stays plain JSON
