"""The heap backend's forked snapshots (``HeapStateBackend(snapshot="fork")``): a child
process writes each snapshot while the job runs on; the state is exact, a child that dies or
hangs fails only its checkpoint and is reaped, and the fork is safe beside the threads the
runtime and its neighbours run (RocksDB, the metrics server, the snapshot file writer).
The kill -9 of a job while its children write runs in ``tests/checkpoint/test_lineage_faults.py``
(backend ``heap-fork``)."""

from __future__ import annotations

import collections
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from reactive import CheckpointConfig, CheckpointStorage, Dataflow, RestartStrategy
from reactive.backends.heap import HeapStateBackend, fork_snapshot
from reactive.backends.heap import backend as heap_backend
from reactive.connectors.collections import ListSink
from tests.support import Count, checkpoint_state, final_counts, paced, zipf_words

pytestmark = [pytest.mark.e2e,  # each snapshot forks a child process
              pytest.mark.skipif(fork_snapshot.fork_supported() is not None,
                                 reason="os.fork() is not usable here")]


@pytest.fixture
def words() -> list[str]:
    return zipf_words(40_000, 2_000, seed=5)


@pytest.fixture
def truth(words: list[str]) -> dict[str, int]:
    return dict(collections.Counter(words))


def _children(directory: Path) -> list[tuple[int, int]]:
    """(pid, checkpoint id) of every snapshot child the job forked, as the children wrote."""
    out = []
    for line in (directory / "children").read_text().splitlines():
        pid, cid = line.split()
        out.append((int(pid), int(cid)))
    return out


def _gone(pid: int) -> bool:
    """The process is not alive and was reaped (a zombie still answers signal 0)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def child_hook(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Wrap the child's entry point (the child runs what the module held at the fork): each
    child appends its pid and checkpoint id to ``tmp_path/children``, then behaves as
    ``behaviour[checkpoint id]`` says ("die": SIGKILL itself; "hang": block for ever),
    else writes the snapshot."""
    behaviour: dict[int, str] = {}
    original = fork_snapshot._run_child
    log = tmp_path / "children"
    log.touch()

    def hooked(snapshot: Any, write_fd: int, parent: int) -> None:
        cid = snapshot.ctx.checkpoint_id
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {cid}\n")
        what = behaviour.get(cid)
        if what == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        if what == "hang":
            r, _w = os.pipe()
            os.read(r, 1)  # nobody ever writes: blocks until the parent kills it
        original(snapshot, write_fd, parent)

    monkeypatch.setattr(fork_snapshot, "_run_child", hooked)
    return behaviour


def _count_job(words: list[str], sink: ListSink, every: int = 4_000) -> Dataflow:
    flow = Dataflow("fork", parallelism=2, max_parallelism=64, batch_size=256)
    (flow.source(paced(words, every=every)).uid("words")
         .key_by(lambda w: w)
         .process(Count()).uid("count")
         .sink(sink))
    return flow


@pytest.mark.parametrize("incremental", [False, True])
async def test_forked_checkpoints_hold_the_exact_state(words, truth, tmp_path, child_hook,
                                                       incremental):
    sink = ListSink()
    job = await _count_job(words, sink).run(
        checkpoints=CheckpointConfig(interval=0.05, directory=tmp_path),
        state_backend=HeapStateBackend(incremental=incremental, snapshot="fork"))
    assert final_counts(sink.records) == truth
    # the final checkpoint (written by children, read here through the usual format reader)
    # holds the exact counts
    assert checkpoint_state(tmp_path, "fork", "count", "count") == truth
    children = _children(tmp_path)
    completed = CheckpointStorage(tmp_path, "fork").completed()
    assert completed and len(children) >= 2 * len(completed)
    assert all(pid != os.getpid() for pid, _ in children)
    assert all(_gone(pid) for pid, _ in children)
    assert job.metrics.restarts == 0


async def test_an_embedded_job_leaves_nothing_frozen_in_the_application(words, truth, tmp_path,
                                                                         child_hook):
    """Each fork freezes the parent's objects (so neither collector copies their pages);
    in an application's own loop (no ``throughput_gc``) the last child reaped unfreezes
    them, and an application's own freeze is left alone."""
    import gc

    gc.unfreeze()
    sink = ListSink()
    await _count_job(words, sink).run(
        checkpoints=CheckpointConfig(interval=0.05, directory=tmp_path),
        state_backend=HeapStateBackend(snapshot="fork"))
    assert final_counts(sink.records) == truth and len(_children(tmp_path)) >= 2
    assert gc.get_freeze_count() == 0
    gc.freeze()  # the application's own freeze
    try:
        await _count_job(words, ListSink()).run(
            checkpoints=CheckpointConfig(interval=0.05, directory=tmp_path / "again"),
            state_backend=HeapStateBackend(snapshot="fork"))
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


async def test_a_child_that_dies_fails_only_its_checkpoint(words, truth, tmp_path,
                                                           child_hook):
    child_hook.update({1: "die", 2: "die"})
    sink = ListSink()
    job = await _count_job(words, sink).run(
        checkpoints=CheckpointConfig(interval=0.05, directory=tmp_path,
                                     tolerable_failed_checkpoints=5),
        state_backend=HeapStateBackend(snapshot="fork"),
        restart=RestartStrategy.none())
    assert job.metrics.restarts == 0
    assert final_counts(sink.records) == truth
    assert checkpoint_state(tmp_path, "fork", "count", "count") == truth
    ids = {c.checkpoint_id for c in CheckpointStorage(tmp_path, "fork").completed()}
    died = [pid for pid, cid in _children(tmp_path) if cid in (1, 2)]
    assert died and not ids & {1, 2}
    assert all(_gone(pid) for pid in died)


async def test_a_hung_child_is_killed_when_its_checkpoint_times_out(words, truth, tmp_path,
                                                                    child_hook):
    child_hook.update({1: "hang"})
    sink = ListSink()
    job = await _count_job(words, sink).run(
        # a loaded machine may time out more forks than the hung one; none of them may fail
        # the job, whose counts are what is checked
        checkpoints=CheckpointConfig(interval=0.05, timeout=0.5, directory=tmp_path,
                                     tolerable_failed_checkpoints=1_000),
        state_backend=HeapStateBackend(snapshot="fork"),
        restart=RestartStrategy.none())
    assert job.metrics.restarts == 0
    assert final_counts(sink.records) == truth
    hung = [pid for pid, cid in _children(tmp_path) if cid == 1]
    assert hung and all(_gone(pid) for pid in hung)
    assert 1 not in {c.checkpoint_id for c in CheckpointStorage(tmp_path, "fork").completed()}


async def test_forks_beside_rocksdb_and_metrics_server_threads(words, truth, tmp_path,
                                                               child_hook):
    """Threads that hold locks of their own at any moment (a RocksDB writer, the metrics
    HTTP server, the heap writer's worker) do not stop a child: it touches none of them."""
    rocksdict = pytest.importorskip("rocksdict")
    prometheus = pytest.importorskip("prometheus_client")
    db = rocksdict.Rdict(str(tmp_path / "neighbour"))
    stop = threading.Event()
    written = collections.Counter[str]()

    def neighbour() -> None:
        i = 0
        while not stop.is_set():
            db[f"k{i % 1000}".encode()] = os.urandom(64)
            written["puts"] += 1
            i += 1

    thread = threading.Thread(target=neighbour, daemon=True)
    thread.start()
    server, server_thread = prometheus.start_http_server(0, addr="127.0.0.1")
    try:
        sink = ListSink()
        await _count_job(words, sink).run(
            checkpoints=CheckpointConfig(interval=0.02, directory=tmp_path),
            state_backend=HeapStateBackend(incremental=True, snapshot="fork"))
    finally:
        stop.set()
        thread.join()
        server.shutdown()
        server_thread.join()
        db.close()
    assert final_counts(sink.records) == truth
    assert checkpoint_state(tmp_path, "fork", "count", "count") == truth
    assert written["puts"] > 0 and len(_children(tmp_path)) >= 2


def test_falls_back_to_paced_snapshots_where_fork_is_unusable(monkeypatch, caplog):
    monkeypatch.setattr(heap_backend, "fork_supported", lambda: "no fork on this system")
    with caplog.at_level(logging.WARNING, logger=heap_backend.__name__):
        backend = HeapStateBackend(snapshot="fork")
    assert backend.snapshot == "paced"
    assert "no fork on this system" in caplog.text


def test_an_unknown_strategy_is_refused():
    from reactive.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="'paced' or 'fork'"):
        HeapStateBackend(snapshot="threads")  # type: ignore[arg-type]


CHILD_OUTLIVES = """
import os, signal, sys
from pathlib import Path
from reactive import KeyGroupRange, ValueStateDescriptor
from reactive.backends.heap import HeapStateBackend, fork_snapshot
from reactive.state.backend import SnapshotContext

out = Path(sys.argv[1])

def blocked(snapshot, write_fd, parent):
    # written whole, then renamed: the parent kills itself once the name exists, and the
    # child dies with it, maybe before a plain write_text had written the pid
    (out / "child.tmp").write_text(str(os.getpid()))
    (out / "child.tmp").rename(out / "child")
    r, _w = os.pipe()
    os.read(r, 1)

fork_snapshot._run_child = blocked
kb = HeapStateBackend(snapshot="fork").create_keyed_backend(
    job_name="j", operator_uid="op", subtask=0, key_group_range=KeyGroupRange(0, 7),
    max_parallelism=8)
state = kb.get_state(ValueStateDescriptor("v"))
for k in range(100):
    kb.set_current_key(k)
    state.update(k)
ctx = SnapshotContext(1, out, out / "chk-1", out / "shared", "op", 0)
kb.snapshot(ctx)
while not (out / "child").exists():
    pass
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_child_dies_with_its_parent(tmp_path):
    """kill -9 of the job's process while a child writes: the child does not go on writing
    into a checkpoint directory that the next run cleans up (it dies with its parent)."""
    import select
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", CHILD_OUTLIVES, str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    child = int((tmp_path / "child").read_text())
    # wait for the child's end on a pidfd (it is not our child: no waitpid), at most 10 s
    try:
        pidfd = os.pidfd_open(child)
    except ProcessLookupError:
        return  # gone already
    try:
        ended, _, _ = select.select([pidfd], [], [], 10.0)
    finally:
        os.close(pidfd)
    if not ended:
        os.kill(child, signal.SIGKILL)
        pytest.fail(f"the snapshot child {child} outlived its killed parent")
