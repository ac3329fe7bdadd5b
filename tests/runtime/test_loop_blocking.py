"""The runtime's checkpoint file work never blocks the event loop (the application's loop too).

Two kinds of evidence, neither a wall-clock measurement:

- every blocking file call (``open``, ``fsync``, ``replace``, ``unlink``, ``rmtree``,
  directory listings) that the runtime makes while checkpointing, retaining and restoring is
  recorded with its thread: none may run on the loop's thread (the backends' own snapshot
  writes are theirs and are left out; their *restores*, which the runtime calls, are not);
- each step (metadata write, retention, run record, restore selection, a backend's restore;
  the small operator-state file is written on the loop on purpose) is wrapped to wait until
  the loop has run a callback: on the loop thread that callback could never run while the
  step waits, so the step would report it was blocking (after a guard timeout, not a timing
  assumption).

Each run is a crash-and-recover run whose final counts equal a batch count of the input.
"""

from __future__ import annotations

import asyncio
import builtins
import collections
import io
import os
import shutil
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import reactive.checkpoint.completed_checkpoint_store as store_module
import reactive.checkpoint.storage as storage_module
from reactive import CheckpointConfig, Dataflow, RestartStrategy
from reactive.backends.heap import HeapStateBackend
from reactive.connectors.collections import ListSink
from reactive.testing import TestingSource
from tests.support import Count, final_counts

REPO = Path(__file__).resolve().parents[2]
RUNTIME = str(REPO / "reactive") + os.sep
THEIRS = (str(REPO / "backends") + os.sep, str(REPO / "connectors") + os.sep,
          str(REPO / "reactive" / "testing") + os.sep)
# how long a wrapped step waits for the loop before it reports that it blocked it: a guard
# against a hang when the step does run on the loop (then the wait always runs out)
GUARD = 10.0


class LoopThreadFileCalls:
    """Records the blocking file calls the runtime makes on the event loop's thread."""

    def __init__(self, loop_thread: threading.Thread) -> None:
        self.loop_thread = loop_thread
        self.calls: list[str] = []
        self.off_loop = 0

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def recorded(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread() is not self.loop_thread:
                self.off_loop += 1
            else:
                where = self._runtime_caller(sys._getframe(1))
                if where is not None:
                    self.calls.append(f"{name}({args[0] if args else ''!s}) from {where}")
            return fn(*args, **kwargs)
        return recorded

    @staticmethod
    def _runtime_caller(frame: Any) -> str | None:
        """Where in the runtime the call comes from, or None when it is not the runtime's
        (a backend's own snapshot write or clean-up, a connector, an import, the test)."""
        runtime = theirs = restore = None
        while frame is not None:
            path, name = frame.f_code.co_filename, frame.f_code.co_name
            if "importlib" in path:
                return None
            if path.endswith("subtask_checkpoint_coordinator.py") and name == "_async_part":
                # the operator-state file stays on the loop on purpose (see that module): in
                # a worker thread, which first waits for the GIL a busy loop holds, it made
                # each checkpoint complete later, and a loop's checkpoints then no longer
                # caught records on the back edge (tests/runtime/test_iterations.py)
                return None
            if path.startswith(THEIRS):
                theirs = True
                if name.startswith("restore"):
                    restore = restore or f"{path}:{frame.f_lineno} {name}"
            elif path.startswith(RUNTIME) and runtime is None:
                runtime = f"{path}:{frame.f_lineno} {name}"
            frame = frame.f_back
        if restore is not None:
            return restore  # the runtime calls a backend's restore: off the loop too
        return None if theirs else runtime


@pytest.fixture
def loop_file_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[LoopThreadFileCalls]:
    recorder = LoopThreadFileCalls(threading.current_thread())
    for module, names in ((os, ("fsync", "replace", "rename", "unlink", "remove", "rmdir",
                                "scandir", "listdir")),
                          (shutil, ("rmtree", "copyfile", "copytree")),
                          (io, ("open",)), (builtins, ("open",))):
        for name in names:
            monkeypatch.setattr(module, name, recorder.wrap(name, getattr(module, name)))
    yield recorder


class BlockingSteps:
    """Wraps named steps so each reports whether it ran while the loop was blocked."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.ran: collections.Counter[str] = collections.Counter()
        self.blocked: list[str] = []

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def step(*args: Any, **kwargs: Any) -> Any:
            loop_ran = threading.Event()
            self.loop.call_soon_threadsafe(loop_ran.set)
            if not loop_ran.wait(GUARD):
                self.blocked.append(name)
            self.ran[name] += 1
            return fn(*args, **kwargs)
        return step


def _keys(n: int = 6000, vocabulary: int = 300) -> list[str]:
    return [f"k{(i * 7919) % vocabulary}" for i in range(n)]


async def _crash_and_recover(tmp_path: Path, backend: Any) -> tuple[list[Any], list[str], Any]:
    keys = _keys()
    flow = Dataflow("loop-blocking", parallelism=2, max_parallelism=16, batch_size=64)
    sink = ListSink()
    half = len(keys) // 2
    # half the keys, then three completed checkpoints, then one injected failure
    items = [*keys[:half], *[TestingSource.CHECKPOINT] * 3, TestingSource.ABORT, *keys[half:]]
    (flow.source(TestingSource(items, batch_size=50), uid="src")
         .key_by(lambda k: k).process(Count()).uid("count").sink(sink))
    job = await flow.run(
        checkpoints=CheckpointConfig(interval=0.01, directory=tmp_path, retained=1),
        restart=RestartStrategy.fixed(1, 0.0), state_backend=backend)
    return sink.records, keys, job


def _backends(tmp_path: Path) -> dict[str, Any]:
    from reactive.backends.rocksdb import RocksDBStateBackend

    return {"heap": HeapStateBackend(),
            "rocksdb-incremental": RocksDBStateBackend(path=tmp_path / "db", incremental=True)}


@pytest.mark.parametrize("backend", ["heap", "rocksdb-incremental"])
async def test_no_checkpoint_or_restore_file_call_runs_on_the_loop_thread(
        tmp_path: Path, backend: str, loop_file_calls: LoopThreadFileCalls) -> None:
    records, keys, job = await _crash_and_recover(tmp_path / "chk",
                                                  _backends(tmp_path)[backend])
    assert job.metrics.restarts == 1 and job.metrics.restored_checkpoints
    # exactly the batch counts, after a crash and a restore of the newest checkpoint
    assert final_counts(records) == collections.Counter(keys)
    assert loop_file_calls.off_loop > 0  # the recorder sees the work: it just runs elsewhere
    assert loop_file_calls.calls == []


@pytest.mark.parametrize("backend", ["heap", "rocksdb-incremental"])
async def test_the_loop_runs_while_each_file_step_runs(
        tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from reactive.backends.heap import backend as heap_backend
    from reactive.backends.rocksdb import backend as rocksdb_backend

    steps = BlockingSteps(asyncio.get_running_loop())
    for owner, name in ((storage_module, "write_metadata"), (storage_module, "write_atomic"),
                        (storage_module, "verify_file"),
                        (store_module, "remove_checkpoint_dir"),
                        (heap_backend.HeapKeyedStateBackend, "restore"),
                        (rocksdb_backend.RocksDBKeyedStateBackend, "restore")):
        label = f"{getattr(owner, '__name__', owner)}.{name}"
        monkeypatch.setattr(owner, name, steps.wrap(label, getattr(owner, name)))
    records, keys, job = await _crash_and_recover(tmp_path / "chk",
                                                  _backends(tmp_path)[backend])
    assert job.metrics.restarts == 1 and job.metrics.restored_checkpoints
    assert final_counts(records) == collections.Counter(keys)
    restore = "RocksDBKeyedStateBackend" if backend.startswith("rocksdb") else \
        "HeapKeyedStateBackend"
    expected = {"reactive.checkpoint.storage.write_metadata",  # completes each checkpoint
                "reactive.checkpoint.storage.write_atomic",  # the run record
                "reactive.checkpoint.storage.verify_file",  # the failover's checks
                "reactive.checkpoint.completed_checkpoint_store.remove_checkpoint_dir",
                f"{restore}.restore"}
    assert expected <= {name for name, n in steps.ran.items() if n}
    assert steps.blocked == []
