"""Rescaling (thesis 4.2, Flink's rescalable state): a checkpoint or savepoint taken at
parallelism p restores at any p' <= max parallelism, keyed state following its key groups and
operator state redistributed (split / union), on the heap and RocksDB backends."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import pickle
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reactive import (
    CheckpointConfig,
    CheckpointStorage,
    CompletedCheckpoint,
    Dataflow,
    KeyGroupRange,
    RestartStrategy,
    RestoreError,
    assign_to_key_group,
)
from reactive.backends.heap import HeapStateBackend, iter_heap_key_groups
from reactive.backends.rocksdb import RocksDBStateBackend, iter_rocksdb_key_groups
from reactive.checkpoint.contract import (
    CheckpointMetadata,
    FileRef,
    OperatorState,
    OperatorSubtaskState,
    StateHandle,
)
from reactive.checkpoint.state_assignment_operation import StateAssignmentOperation
from reactive.connectors.collections import ListSink
from reactive.connectors.files import LineFileSource
from reactive.sinks import SinkWriter
from reactive.sources import Source, SourceReader
from reactive.state.backend import StateBackend
from tests.support import Count

MAXP = 8
BACKENDS = ["heap", "rocksdb"]


# ---------------------------------------------------------------------- test pieces
class Budget:
    """How many records the sources of one run may read in total (None: all)."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self.taken = 0
        self.changed = asyncio.Event()

    def allow(self, limit: int | None) -> None:
        self.limit = limit
        self.changed.set()

    def take(self, wanted: int) -> int:
        n = wanted if self.limit is None else max(0, min(wanted, self.limit - self.taken))
        self.taken += n
        return n

    async def idle(self) -> None:
        """Wait a little for more budget (a reader returns an empty batch meanwhile)."""
        self.changed.clear()
        # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation that
        # arrives as the inner wait completes, and the job's cancel would then hang
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.02):
                await self.changed.wait()


# Hand-written: a parallel source whose per-split positions are redistributed on a
# rescale (a TestingSource is not parallel).
class SplitsSource(Source):
    """A parallel source over in-memory splits; the position is ``[split, index]`` per split
    (operator state, redistributed round robin), and a :class:`Budget` bounds each run."""

    def __init__(self, splits: list[list[Any]], budget: Budget) -> None:
        self.splits = splits
        self.budget = budget

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        mine = [[i, 0] for i in range(len(self.splits))][subtask::parallelism]
        return _SplitsReader(self, mine)


class _SplitsReader(SourceReader):
    def __init__(self, source: SplitsSource, positions: list[list[int]]) -> None:
        self.source = source
        self.positions = positions

    async def read_batch(self, max_records: int) -> list[Any] | None:
        for pos in self.positions:
            data = self.source.splits[pos[0]]
            if pos[1] >= len(data):
                continue
            n = self.source.budget.take(min(max_records, len(data) - pos[1]))
            if n == 0:
                await self.source.budget.idle()
                return []
            batch = data[pos[1]:pos[1] + n]
            pos[1] += n
            return batch
        return None

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        return [list(p) for p in self.positions]

    def restore_state(self, entries: list[Any]) -> None:
        self.positions = [list(e) for e in entries]


# The line-file connector under the test's budget: the test is about that connector's
# split positions across a rescale.
class BudgetedLineFileSource(LineFileSource):
    """The line-file source (splits = files, position ``[path, offset]``) under a budget."""

    def __init__(self, path: Path, budget: Budget) -> None:
        super().__init__(path, read_size=256)
        self.budget = budget

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        return _BudgetedReader(super().create_reader(subtask, parallelism), self.budget)


class _BudgetedReader(SourceReader):
    def __init__(self, inner: SourceReader, budget: Budget) -> None:
        self.inner = inner
        self.budget = budget

    async def read_batch(self, max_records: int) -> list[Any] | None:
        if self.budget.limit is not None and self.budget.taken >= self.budget.limit:
            await self.budget.idle()
            return []
        batch = await self.inner.read_batch(max_records)
        if batch:
            self.budget.taken += len(batch)
        return batch

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        return self.inner.snapshot_state(checkpoint_id)

    def restore_state(self, entries: list[Any]) -> None:
        self.inner.restore_state(entries)

    def close(self) -> None:
        self.inner.close()


class WaitableSink(ListSink):
    """A list sink whose test can wait until it holds ``n`` records."""

    def __init__(self) -> None:
        super().__init__()
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    def create_writer(self, subtask: int, parallelism: int) -> SinkWriter:
        return _WaitableWriter(self)

    async def wait_for(self, n: int) -> None:
        if len(self.records) >= n:
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append((n, fut))
        await fut

    def _check(self) -> None:
        for n, fut in list(self._waiters):
            if len(self.records) >= n and not fut.done():
                fut.set_result(None)
                self._waiters.remove((n, fut))


class _WaitableWriter(SinkWriter):
    def __init__(self, sink: WaitableSink) -> None:
        self.sink = sink

    def write(self, batch: list[Any]) -> None:
        self.sink.records.extend(batch)
        self.sink._check()


def make_backend(name: str, work: Path) -> StateBackend:
    return HeapStateBackend() if name == "heap" else RocksDBStateBackend(path=work / "rocks")


def count_flow(source: Source, sink: ListSink, parallelism: int,
               name: str = "rescale") -> Dataflow:
    flow = Dataflow(name, parallelism=parallelism, max_parallelism=MAXP, batch_size=16,
                    buffer_timeout=0.01)
    (flow.source(source, uid="src").key_by(lambda k: k)
         .process(Count()).uid("count").sink(sink))
    return flow


def keyed_state(chk: CompletedCheckpoint, uid: str, state: str,
                scratch: Path) -> dict[int, dict[Any, Any]]:
    """``{subtask: {key: value}}`` of ``state`` in ``chk``, whichever backend wrote it;
    asserts every key lies in its subtask's key-group range."""
    out: dict[int, dict[Any, Any]] = {}
    for i, sub in chk.metadata.operators[uid].subtasks.items():
        kgr = sub.key_group_range
        assert kgr is not None
        values: dict[Any, Any] = {}
        if sub.keyed_state is not None:
            handle = sub.keyed_state.to_json()
            if handle["backend"] == "heap":
                groups = iter_heap_key_groups(handle, chk.job_dir)
            else:
                groups = iter_rocksdb_key_groups(handle, chk.job_dir, scratch / f"r{i}")
            for kg, _, data in groups:
                assert kg in kgr
                for key, value in data.get(state, {}).items():
                    assert assign_to_key_group(key, MAXP) in kgr
                    values[key] = value
        out[int(i)] = values
    return out


def assert_partition(chk: CompletedCheckpoint, uid: str, parallelism: int) -> None:
    """Every key group belongs to exactly one instance of ``uid``."""
    subtasks = chk.metadata.operators[uid].subtasks
    assert len(subtasks) == parallelism
    owners = collections.Counter(
        kg for sub in subtasks.values() for kg in sub.key_group_range or ())
    assert owners == collections.Counter(range(MAXP))


def assert_exactly_once(outputs: list[tuple[Any, int]], truth: dict[Any, int]) -> None:
    """Each key's counts 1..truth[key] were emitted once each, across all runs."""
    per_key: dict[Any, list[int]] = collections.defaultdict(list)
    for key, n in outputs:
        per_key[key].append(n)
    assert {k: sorted(v) for k, v in per_key.items()} == \
        {k: list(range(1, n + 1)) for k, n in truth.items()}


def final_checkpoint(directory: Path, name: str = "rescale") -> CompletedCheckpoint:
    return CheckpointStorage(directory, name).completed()[-1]


# ---------------------------------------------------------------------- property test
async def _crash_and_rescale(tmp: Path, backend: str, to_backend: str, keys: list[int],
                             p: int, p2: int, at: int, crash: int, savepoint: bool) -> None:
    splits = [keys[i::4] for i in range(4)]
    truth = dict(collections.Counter(keys))
    budget = Budget(at)
    sink = WaitableSink()
    job = await count_flow(SplitsSource(splits, budget), sink, p).start(
        checkpoints=CheckpointConfig(interval=None, directory=tmp / "c1"),
        state_backend=make_backend(backend, tmp), restart=RestartStrategy.none())
    await sink.wait_for(at)
    chk = await (job.savepoint(tmp / "sp") if savepoint else job.checkpoint())
    # the records after the checkpoint reach the state, then the job crashes: they must be
    # counted again from the restored offsets, exactly once
    budget.allow(crash)
    await sink.wait_for(crash)
    await job.cancel()
    restored = {k: v for part in keyed_state(chk, "count", "count", tmp / "s1").values()
                for k, v in part.items()}

    sink2 = WaitableSink()
    job2 = await count_flow(SplitsSource(splits, Budget()), sink2, p2).run(
        checkpoints=CheckpointConfig(interval=None, directory=tmp / "c2"),
        state_backend=make_backend(to_backend, tmp / "b2"), restore_from=chk.path)
    assert job2.metrics.restored_checkpoints == [chk.checkpoint_id]
    final = final_checkpoint(tmp / "c2")
    assert_partition(final, "count", p2)
    state = keyed_state(final, "count", "count", tmp / "s2")
    merged = {k: v for part in state.values() for k, v in part.items()}
    assert sum(len(part) for part in state.values()) == len(merged)  # no key twice
    assert merged == truth
    # the restored run emitted each count after the restored one exactly once
    expected = {k: list(range(restored.get(k, 0) + 1, n + 1)) for k, n in truth.items()
                if n > restored.get(k, 0)}
    got: dict[int, list[int]] = collections.defaultdict(list)
    for k, n in sink2.records:
        got[k].append(n)
    assert {k: sorted(v) for k, v in got.items()} == expected


#: each example runs a job, a crash and a rescaled restore: the default run tries a few,
#: ``-m slow`` more
RESCALE = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                        HealthCheck.too_slow])


@pytest.mark.parametrize("backend", BACKENDS)
@settings(RESCALE, max_examples=8)
@given(data=st.data())
def test_rescaled_keyed_count_equals_truth(backend: str, data: st.DataObject) -> None:
    _rescaled_keyed_count_equals_truth(backend, data)


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@settings(RESCALE, max_examples=40)
@given(data=st.data())
def test_rescaled_keyed_count_equals_truth_more_examples(backend: str,
                                                          data: st.DataObject) -> None:
    _rescaled_keyed_count_equals_truth(backend, data)


def _rescaled_keyed_count_equals_truth(backend: str, data: st.DataObject) -> None:
    keys = data.draw(st.lists(st.integers(0, 60), min_size=1, max_size=400), label="keys")
    p = data.draw(st.integers(1, MAXP), label="p")
    p2 = data.draw(st.integers(1, MAXP), label="p2")
    # before the end of input: a job that finished takes no more checkpoints
    at = data.draw(st.integers(0, len(keys) - 1), label="checkpoint after")
    crash = data.draw(st.integers(at, len(keys)), label="crash after")
    savepoint = data.draw(st.booleans(), label="savepoint")
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(_crash_and_rescale(Path(tmp), backend, backend, keys, p, p2, at, crash,
                                       savepoint))


# ---------------------------------------------------------------------- scale in sequence
async def _scale_in_sequence(tmp: Path, backends: list[str], parallelisms: list[int]) -> None:
    keys = [i * 7 % 97 for i in range(3_000)]
    splits = [keys[i::6] for i in range(6)]
    truth = dict(collections.Counter(keys))
    outputs: list[tuple[Any, int]] = []
    restore: Path | None = None
    chunk = len(keys) // len(parallelisms)
    for step, (backend, p) in enumerate(zip(backends, parallelisms, strict=True)):
        last = step == len(parallelisms) - 1
        budget = Budget(None if last else chunk)
        sink = WaitableSink()
        job = await count_flow(SplitsSource(splits, budget), sink, p).start(
            checkpoints=CheckpointConfig(interval=None, directory=tmp / f"c{step}"),
            state_backend=make_backend(backend, tmp / f"b{step}"), restore_from=restore,
            restart=RestartStrategy.none())
        if last:
            await job.wait()
            final = final_checkpoint(tmp / f"c{step}")
            assert_partition(final, "count", p)
            state = keyed_state(final, "count", "count", tmp / "s")
            assert {k: v for part in state.values() for k, v in part.items()} == truth
        else:
            # stop in the middle of the budget: the sources are parked right after the
            # savepoint's barrier, so nothing after it is processed (or emitted twice)
            await sink.wait_for(chunk // 2)
            sp = await job.stop(savepoint=True, path=tmp / f"sp{step}")
            assert sp is not None and job.status == "stopped"
            await job.wait()  # returns normally after stop
            assert_partition(sp, "count", p)
            restore = sp.path
        outputs.extend(sink.records)
    assert_exactly_once(outputs, truth)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_scale_4_1_3_8_exactly_once(backend: str, tmp_path: Path) -> None:
    await _scale_in_sequence(tmp_path, [backend] * 4, [4, 1, 3, 8])


async def test_heap_savepoint_to_rocksdb_and_back(tmp_path: Path) -> None:
    await _scale_in_sequence(tmp_path, ["heap", "rocksdb", "heap"], [2, 5, 3])


@pytest.mark.parametrize("backend", BACKENDS)
async def test_incremental_checkpoint_restores_at_other_parallelism_and_backend(
        backend: str, tmp_path: Path) -> None:
    # not only savepoints: a completed incremental checkpoint rescales too, into either backend
    other = "rocksdb" if backend == "heap" else "heap"
    await _crash_and_rescale(tmp_path, backend, other, [i % 50 for i in range(1_000)],
                             p=3, p2=5, at=600, crash=800, savepoint=False)


# ---------------------------------------------------------------------- operator state
@pytest.mark.parametrize("parallelisms", [[2, 3, 1], [3, 5, 2]])
async def test_file_source_splits_redistributed(tmp_path: Path, parallelisms: list[int]) -> None:
    data = tmp_path / "input"
    data.mkdir()
    lines = [f"line {i}" for i in range(4_000)]
    for f in range(5):
        (data / f"part-{f}.txt").write_text("\n".join(lines[f::5]) + "\n")
    outputs: list[tuple[Any, int]] = []
    restore: Path | None = None
    for step, p in enumerate(parallelisms):
        last = step == len(parallelisms) - 1
        budget = Budget(None if last else 1_000 * (step + 1))
        sink = WaitableSink()
        flow = Dataflow("files", parallelism=p, max_parallelism=MAXP, batch_size=32)
        (flow.source(BudgetedLineFileSource(data, budget), uid="lines").key_by(lambda s: s)
             .process(Count()).uid("count").sink(sink))
        job = await flow.start(
            checkpoints=CheckpointConfig(interval=None, directory=tmp_path / f"c{step}"),
            restore_from=restore, restart=RestartStrategy.none())
        if last:
            await job.wait()
        else:
            await sink.wait_for(500)
            sp = await job.stop(savepoint=True, path=tmp_path / f"sp{step}")
            assert sp is not None
            positions = _operator_entries(sp, "lines", "source-position")
            # one entry per file, whatever the parallelism that wrote it
            assert sorted(Path(e[0]).name for e in positions) == \
                [f"part-{f}.txt" for f in range(5)]
            restore = sp.path
        outputs.extend(sink.records)
    # every line read exactly once over the three runs: none twice, none skipped
    assert_exactly_once(outputs, {line: 1 for line in lines})


def _operator_entries(chk: CompletedCheckpoint, uid: str, name: str) -> list[Any]:
    out: list[Any] = []
    for sub in chk.metadata.operators[uid].subtasks.values():
        handle = sub.operator_state
        if handle is not None:
            states = pickle.loads((chk.job_dir / handle.files[0].path).read_bytes())
            out.extend(states.get(name, ("split", []))[1])
    return out


def _fake_checkpoint(tmp: Path, states: list[dict[str, tuple[str, list[Any]]]],
                     max_parallelism: int = MAXP) -> CompletedCheckpoint:
    """A checkpoint of operator ``op`` with the given operator state per old instance."""
    subtasks: dict[int, OperatorSubtaskState] = {}
    for i, opstate in enumerate(states):
        path = tmp / "chk-1" / f"op-{i}.opstate"
        path.parent.mkdir(parents=True, exist_ok=True)
        blob = pickle.dumps(opstate)
        path.write_bytes(blob)
        subtasks[i] = OperatorSubtaskState(operator_state=StateHandle(
            "pickle-v1", (FileRef(f"chk-1/op-{i}.opstate", len(blob), ""),)))
    meta = CheckpointMetadata(job="j", checkpoint_id=1, kind="checkpoint",
                              max_parallelism=max_parallelism, operators={
                                  "op": OperatorState("op", len(states), False, subtasks)})
    return CompletedCheckpoint(1, tmp / "chk-1", meta)


@pytest.mark.parametrize("p2", [1, 2, 4, 7])
def test_split_and_union_redistribution(tmp_path: Path, p2: int) -> None:
    old = [
        {"offsets": ("split", ["a", "b"]), "rules": ("union", ["r0"])},
        {"offsets": ("split", ["c"]), "rules": ("union", ["r1", "r2"])},
        {"offsets": ("split", ["d", "e", "f"])},
    ]
    assignment = StateAssignmentOperation(_fake_checkpoint(tmp_path, old), MAXP, {"op"})
    got = [assignment.for_subtask("op", i, p2, None).operator_state for i in range(p2)]
    split = [entries for g in got for entries in [g.get("offsets", ("split", []))[1]]]
    # split: every entry to exactly one instance, dealt round robin (sizes differ by <= 1)
    assert sorted(e for part in split for e in part) == ["a", "b", "c", "d", "e", "f"]
    assert max(map(len, split)) - min(map(len, split)) <= 1
    # union: every instance gets every entry
    assert all(g["rules"] == ("union", ["r0", "r1", "r2"]) for g in got)


def test_split_at_same_parallelism_keeps_each_instance_entries(tmp_path: Path) -> None:
    old = [{"offsets": ("split", ["a", "b"])}, {"offsets": ("split", [])},
           {"offsets": ("split", ["c"])}]
    assignment = StateAssignmentOperation(_fake_checkpoint(tmp_path, old), MAXP, {"op"})
    got = [assignment.for_subtask("op", i, 3, None).operator_state["offsets"][1]
           for i in range(3)]
    assert got == [["a", "b"], [], ["c"]]


# ---------------------------------------------------------------------- refusals
async def _savepoint_of_count_job(tmp: Path) -> CompletedCheckpoint:
    sink = WaitableSink()
    job = await count_flow(SplitsSource([list(range(100))], Budget(50)), sink, 2).start(
        checkpoints=CheckpointConfig(interval=None, directory=tmp / "c"))
    await sink.wait_for(50)
    sp = await job.stop(savepoint=True, path=tmp / "sp")
    assert sp is not None
    return sp


async def test_unknown_uid_is_refused_unless_allowed(tmp_path: Path) -> None:
    sp = await _savepoint_of_count_job(tmp_path)
    sink = WaitableSink()
    flow = Dataflow("rescale", parallelism=3, max_parallelism=MAXP)
    (flow.source(SplitsSource([list(range(100))], Budget()), uid="src").key_by(lambda k: k)
         .process(Count()).uid("count-v2").sink(sink))
    with pytest.raises(RestoreError, match=r"operators \['count'\].*allow_non_restored_state"):
        await flow.start(restore_from=sp.path)
    # allowed: the source offsets are restored, the old count state is dropped
    await flow.run(restore_from=sp.path, allow_non_restored_state=True)
    assert sorted(sink.records) == [(k, 1) for k in range(50, 100)]


async def test_other_max_parallelism_is_refused(tmp_path: Path) -> None:
    sp = await _savepoint_of_count_job(tmp_path)
    flow = Dataflow("rescale", parallelism=2, max_parallelism=MAXP * 2)
    (flow.source(SplitsSource([list(range(100))], Budget()), uid="src").key_by(lambda k: k)
         .process(Count()).uid("count").sink(ListSink()))
    with pytest.raises(RestoreError, match=f"max_parallelism {MAXP}.*program has {MAXP * 2}"):
        await flow.start(restore_from=sp.path)


def test_rocksdb_rescaling_reads_only_the_needed_key_groups(tmp_path: Path) -> None:
    """An instance owning half of each of two old instances' key groups: one handle is
    installed and clipped by range deletion, the other copied by range iteration; the
    instance ends with exactly its keys, and range iteration yields only its key groups."""
    from reactive import ValueStateDescriptor
    from reactive.state.backend import SnapshotContext

    def filled(rng: KeyGroupRange, tag: str) -> Any:
        b = RocksDBStateBackend(path=tmp_path / "w").create_keyed_backend(
            job_name="j", operator_uid=f"op{tag}", subtask=0, key_group_range=rng,
            max_parallelism=MAXP)
        state = b.get_state(ValueStateDescriptor("v"))
        for k in range(2_000):
            if assign_to_key_group(k, MAXP) in rng:
                b.set_current_key(k)
                state.update(k)
        ctx = SnapshotContext(1, tmp_path / "job", tmp_path / "job" / "chk-1",
                              tmp_path / "job" / "shared", f"op{tag}", 0, savepoint=True)
        handle = asyncio.run(b.snapshot(ctx).write())
        b.dispose()
        return handle

    left, right = filled(KeyGroupRange(0, 3), "a"), filled(KeyGroupRange(4, 7), "b")
    target = KeyGroupRange(2, 5)  # half of each old instance
    backend = RocksDBStateBackend(path=tmp_path / "w").create_keyed_backend(
        job_name="j", operator_uid="new", subtask=0, key_group_range=target,
        max_parallelism=MAXP)
    backend.restore([left, right], tmp_path / "job")
    state = backend.get_state(ValueStateDescriptor("v"))
    mine = {k for k in range(2_000) if assign_to_key_group(k, MAXP) in target}
    assert set(backend.keys("v")) == mine
    for k in sorted(mine)[:50]:
        backend.set_current_key(k)
        assert state.value() == k
    copied = list(iter_rocksdb_key_groups(right, tmp_path / "job", tmp_path / "x", target))
    assert {kg for kg, _, _ in copied} <= set(target)
    backend.dispose()
