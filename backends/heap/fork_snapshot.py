"""Heap snapshots written by a forked child process, on another core (``snapshot="fork"``).

The paced snapshot (:mod:`.snapshot`) serializes on the event loop thread: serializing Python
objects needs the GIL, so a worker thread would compete with the tasks as much, and on a
saturated loop a large state's snapshot takes its share of the one core the job runs on.
Redis' ``BGSAVE`` answers the same problem for an in-memory store: ``fork()`` gives a child
process a copy-on-write image of the whole heap in the time the kernel takes to copy the
page tables, and the child serializes on another core, with its own GIL, while the parent
keeps serving. The SDG paper (Fernandez et al., "Making State Explicit for Imperative Big Data
Processing", USENIX ATC 2014, section 5) measures the value of such asynchronous
checkpoints for large state.

- *synchronous part* (:func:`fork_snapshot`): the same O(key groups) planning as the paced
  snapshot, then ``gc.freeze()`` and ``os.fork()``. The child's image is the state as of the
  barrier: no copy-on-write per key, the records of the parent pay nothing per key;
- *the child* (:func:`_run_child`) runs the paced snapshot's own writer
  (:meth:`.snapshot.HeapSnapshot.write`) at full speed on an event loop of its own: the same
  files, format, checksums and chains (full or incremental) as the paced strategy, so
  restores, reference counting of shared files and the PySpark bridge see no difference.
  It reports the handle (or the error) over a pipe and leaves with ``os._exit``;
- *asynchronous part* (:meth:`ForkedSnapshot.write`): the parent awaits the report on its
  loop (the pipe is read by the loop, not a thread), reaps the child, and returns the
  handle. A child that dies fails the checkpoint (never the job); an aborted checkpoint
  (:meth:`ForkedSnapshot.discard`, e.g. its timeout) or a cancelled attempt kills and reaps
  the child.

What the child may touch (the rest of the process's image is there, but it belongs to threads
and objects that do not exist or must not run in the child):

- only the frozen state (the tables), the snapshot's plan, and the files it writes (and
  reads: the previous checkpoint's file, whose unchanged ranges it copies);
- not the parent's event loop (its epoll instance is shared with the parent: closing or
  changing it in the child would change the parent's), nor logging (a handler's lock may be
  held by another thread at the fork), nor RocksDB, nor a Kafka client, nor the metrics
  server: the child closes every inherited descriptor but the pipe and stdio before it runs
  (the objects wrapping them are never used: it exits without unwinding);
- the writer's worker thread is started anew in the child (:func:`.file_writer._worker`),
  the collector is disabled (a collection would touch every tracked object's header and
  copy its page), SIGINT is ignored (a terminal's Ctrl-C goes to the parent, which stops the
  job and kills the child), and the child exits with ``os._exit`` (no atexit handlers, no
  second flush of the parent's buffers).

Memory: the parent's writes to the state copy the pages they touch while a child lives, and
so do the child's reference-count updates of the objects it serializes: the child's extra
memory is at most about the state's size (one copy of the pages it reads), freed when it
exits. ``gc.freeze()`` at the fork moves the objects alive then into the permanent
generation, so the parent's collections do not walk (and copy) the state's pages either; as
with :func:`reactive.runtime.gc_tuning.throughput_gc`, reference counting still frees them,
and only reference cycles among them wait until the freeze is given back: by
``throughput_gc`` when the job owns its process, else (a job embedded in an application) by
the last child reaped, so the application is left with nothing frozen.

Where ``fork()`` is unavailable or unsafe (not Linux or macOS, or a free-threaded build),
:func:`fork_supported` says why and the backend falls back to the paced strategy with a log
line.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import pickle
import signal
import struct
import sys
import sysconfig
from typing import Any

from reactive.errors import StateSerializationError
from reactive.state.backend import KeyedStateSnapshot

from .changelog import GroupChain
from .snapshot import HeapSnapshot

__all__ = ["ForkedSnapshot", "fork_snapshot", "fork_supported"]

log = logging.getLogger(__name__)

_LENGTH = struct.Struct("!Q")

#: live children whose fork took the freeze this module owns: the first fork made while
#: nothing was frozen owns it, and the last of those children to be reaped gives it back
#: (``gc.unfreeze``), so an embedded job leaves no objects frozen in the application. An
#: application's or ``throughput_gc``'s own freeze is never undone here.
_freeze_holders = 0


def _take_freeze() -> bool:
    """Before a fork: freeze every tracked object (the collectors of both processes then
    skip them, so neither copies their pages). Returns whether this child holds the
    module's own freeze (to give back with :func:`_give_back_freeze`)."""
    global _freeze_holders
    owned = _freeze_holders > 0 or gc.get_freeze_count() == 0
    gc.freeze()
    if owned:
        _freeze_holders += 1
    return owned


def _give_back_freeze() -> None:
    global _freeze_holders
    _freeze_holders -= 1
    if _freeze_holders == 0:
        gc.unfreeze()


def fork_supported() -> str | None:
    """Return why forked snapshots cannot run in this process, or None when they can.

    ``fork()`` needs a POSIX system whose semantics we rely on (Linux, macOS), and a build
    with a GIL: in a free-threaded build other threads may hold any object's lock at the
    fork.
    """
    if not hasattr(os, "fork") or sys.platform not in ("linux", "darwin"):
        return f"os.fork() is not available on {sys.platform}"
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        return "this is a free-threaded build (objects' locks may be held at the fork)"
    return None


class _ChildError(OSError):
    """The child process died or could not report: the checkpoint is declined."""


class ForkedSnapshot(KeyedStateSnapshot):
    """A heap snapshot whose asynchronous part runs in a forked child process.

    Args:
        pid: the child's process id.
        read_fd: the parent's end of the pipe the child reports on.
        snapshot: the child's writer, as planned by the synchronous part (the parent keeps it
            only for its context and callbacks).

    Attributes:
        serialized_bytes: bytes the child serialized (not copied from the previous file),
            once :meth:`write` returned.
        child_private_bytes: the child's private dirty memory when it had written the
            snapshot (Linux ``Private_Dirty``: the pages it copied or allocated, its extra
            memory over the parent's image), once :meth:`write` returned; 0 where unknown.
    """

    def __init__(self, pid: int, read_fd: int, snapshot: HeapSnapshot,
                 holds_freeze: bool = False) -> None:
        self.pid = pid
        self._holds_freeze = holds_freeze
        self._fd: int | None = read_fd
        self._snapshot = snapshot
        self._reaped = False
        self._reading = False
        self._discarded = False
        self.serialized_bytes = 0
        self.child_private_bytes = 0

    @property
    def ended(self) -> bool:
        """The child was reaped."""
        return self._reaped

    async def write(self) -> dict[str, Any]:
        """Asynchronous part: wait for the child's report and return its handle.

        Raises:
            StateSerializationError: if the child met a value or key it cannot serialize.
            OSError: if the child failed to write, died (its exit status is named) or the
                snapshot was discarded.
        """
        snap = self._snapshot
        if self._discarded:
            raise OSError(f"snapshot {snap.ctx.checkpoint_id} was discarded")
        try:
            self._reading = True
            data = await self._read_report()
            status = await self._reap()
        except BaseException:
            self._reading = False
            self.discard()
            raise
        self._reading = False
        if self._discarded:
            raise OSError(f"snapshot {snap.ctx.checkpoint_id} was discarded (its checkpoint "
                          "was aborted) and its process killed")
        if len(data) < _LENGTH.size or len(data) != _LENGTH.size + _LENGTH.unpack_from(data)[0]:
            raise _ChildError(
                f"the snapshot process of {snap.ctx.operator_uid!r} (checkpoint "
                f"{snap.ctx.checkpoint_id}) ended without a report ({_describe(status)})")
        report = pickle.loads(data[_LENGTH.size:])
        if report[0] == "unserializable":
            # deterministic: raised as the paced strategy raises it, so the job fails at once
            _, operator, state_name, key, cause_type, cause = report
            raise StateSerializationError(operator, state_name, key,
                                          type(cause_type, (Exception,), {})(cause))
        if report[0] == "error":
            _, kind, message, base_unusable = report
            if base_unusable and snap._on_failed is not None:
                snap._on_failed()
            raise _ChildError(f"the snapshot process of {snap.ctx.operator_uid!r} "
                              f"(checkpoint {snap.ctx.checkpoint_id}) failed: {kind}: {message}")
        _, handle, chains, self.serialized_bytes, self.child_private_bytes = report
        if snap._on_written is not None:
            snap._on_written(snap.ctx.checkpoint_id, chains)
        return dict(handle)

    async def _read_report(self) -> bytes:
        """All the child writes on the pipe, until it closes its end (by exiting)."""
        loop = asyncio.get_running_loop()
        fd = self._fd
        assert fd is not None
        os.set_blocking(fd, False)
        chunks: list[bytes] = []
        done: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            try:
                while True:
                    chunk = os.read(fd, 1 << 16)
                    if not chunk:
                        if not done.done():
                            done.set_result(None)
                        return
                    chunks.append(chunk)
            except BlockingIOError:
                return
            except OSError as exc:
                if not done.done():
                    done.set_exception(exc)

        loop.add_reader(fd, readable)
        try:
            await done
        finally:
            loop.remove_reader(fd)
            self._close_fd()
        return b"".join(chunks)

    async def _reap(self) -> int:
        """Wait for the child's exit (it exits right after closing the pipe)."""
        while True:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self._mark_reaped()
                return status
            await asyncio.sleep(0.001)

    def _mark_reaped(self) -> None:
        self._reaped = True
        if self._holds_freeze:
            self._holds_freeze = False
            _give_back_freeze()

    def _close_fd(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def discard(self) -> None:
        """Kill and reap the child (the checkpoint was aborted, or its part cancelled).

        While :meth:`write` waits for the report, the child is killed only: its death
        closes the pipe, and :meth:`write` reaps it and fails."""
        self._discarded = True
        if self._reading:
            if not self._reaped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
            return
        self._close_fd()
        if not self._reaped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            self._mark_reaped()


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    if os.WIFEXITED(status):
        return f"exit code {os.WEXITSTATUS(status)}"
    return f"wait status {status}"


def fork_snapshot(snapshot: HeapSnapshot) -> ForkedSnapshot:
    """Synchronous part: fork a child that writes ``snapshot`` (planned, not yet started).

    Raises:
        OSError: if the process cannot fork (the checkpoint is then declined).
    """
    read_fd, write_fd = os.pipe()
    parent = os.getpid()
    holds_freeze = _take_freeze()
    try:
        pid = os.fork()
    except BaseException:
        os.close(read_fd)
        os.close(write_fd)
        if holds_freeze:
            _give_back_freeze()
        raise
    if pid == 0:  # pragma: no cover - the child; its effects are what the tests check
        try:
            os.close(read_fd)
            _die_with(parent)
            _isolate(write_fd)
            _run_child(snapshot, write_fd, parent)
        finally:
            os._exit(0)
    os.close(write_fd)
    return ForkedSnapshot(pid, read_fd, snapshot, holds_freeze)


def _isolate(write_fd: int) -> None:  # pragma: no cover - child
    """Cut the child off from what belongs to the parent's threads and loop."""
    gc.disable()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(ValueError, OSError):
        signal.set_wakeup_fd(-1)
    # every inherited descriptor but stdio and the pipe: the parent's loop, sockets, files
    os.closerange(3, write_fd)
    os.closerange(write_fd + 1, _max_fd())


def _run_child(snapshot: HeapSnapshot, write_fd: int,
               parent: int) -> None:  # pragma: no cover - child
    """Write ``snapshot`` and report on ``write_fd``; never returns to the caller's code."""
    chains: list[GroupChain] = []
    failed: list[bool] = []
    snapshot._on_written = lambda _cid, written: chains.extend(written)
    snapshot._on_failed = lambda: failed.append(True)
    snapshot._release = lambda _snap: None
    snapshot.pacer.share = 1.0  # its own core: no pauses
    try:
        # the forking thread's running loop is inherited: forget it, never close it
        asyncio.events._set_running_loop(None)
        loop = asyncio.SelectorEventLoop()
        handle = loop.run_until_complete(snapshot.write())
        report: tuple[Any, ...] = ("ok", handle, chains, snapshot.serialized_bytes,
                                   _private_bytes())
    except StateSerializationError as exc:
        cause = exc.__cause__
        key = exc.key
        try:
            pickle.dumps(key)
        except Exception:
            key = repr(key)
        report = ("unserializable", exc.operator, exc.state_name, key,
                  type(cause).__name__, str(cause))
    except BaseException as exc:
        report = ("error", type(exc).__name__, str(exc), bool(failed))
    try:
        blob = pickle.dumps(report, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        blob = pickle.dumps(("error", "OSError", f"cannot report the snapshot: {exc}", False))
    view = memoryview(_LENGTH.pack(len(blob)) + blob)
    while view:
        view = view[os.write(write_fd, view):]


def _die_with(parent: int) -> None:  # pragma: no cover - child
    """End this child when its parent dies (Linux: ``PR_SET_PDEATHSIG``): an orphan would go
    on writing into a checkpoint directory that a resumed job cleans up."""
    if sys.platform == "linux":
        with contextlib.suppress(Exception):
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def _private_bytes() -> int:  # pragma: no cover - child
    """This process's private dirty memory in bytes (0 where /proc does not say)."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("Private_Dirty:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _max_fd() -> int:  # pragma: no cover - child
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return soft if 0 < soft < 1 << 20 else 1 << 16
    except Exception:
        return 1 << 16
