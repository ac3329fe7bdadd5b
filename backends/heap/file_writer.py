"""Writing a snapshot file off the event loop: the loop hands bytes over, a worker thread
writes, hashes and syncs them.

The heap backend serializes live state on the event loop thread (in pieces, between which
the tasks run); the system calls (write, fsync, rename) and the SHA-256 of the bytes, which
all release the GIL, run in a worker thread so the loop never blocks on the disk. One worker
thread per process serves every file, in the order the jobs were handed over, so the chunks
of a file are written in order; :meth:`SnapshotFileWriter.drain` bounds the bytes waiting in
memory. The file appears under its final name only when :meth:`SnapshotFileWriter.close` has
written and synced it (temporary file, fsync, atomic rename, directory fsync), like
:func:`reactive.checkpoint.durable_files.write_atomic`.

A file may also take byte ranges of earlier files (:meth:`SnapshotFileWriter.copy`): the
worker reads and writes them with ``pread``/``write``, which release the GIL, so a heap
snapshot carries the unchanged part of its state over from the previous checkpoint's file
without serializing it again on the loop.

Each hand-over to the worker costs a GIL round trip (up to the interpreter's switch interval
while the tasks keep the loop thread busy), so the loop awaits only the final job of a file,
and intermediate ones only when too many bytes are waiting; :class:`SnapshotOutput` buffers
the frames a snapshot serializes and merges adjacent copied ranges before handing them over.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
import uuid
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from reactive.checkpoint.durable_files import fsync_dir
from reactive.checkpoint.off_loop import through_cancellation

from .changelog import Entry
from .format import encode_frame

__all__ = ["SnapshotFileWriter", "SnapshotOutput"]

_FLUSH = 1 << 20  # bytes buffered on the loop before they go to the writer thread

_COPY_CHUNK = 1 << 20  # bytes read per pread of a copy
_pool: ThreadPoolExecutor | None = None
_pool_pid = 0
_pool_lock = threading.Lock()


def _worker() -> ThreadPoolExecutor:
    """The process's writer thread (a new one in a forked child, whose copy has none)."""
    global _pool, _pool_pid
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid():
            _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="heap-snapshot-writer")
            _pool_pid = os.getpid()
        return _pool


class SnapshotFileWriter:
    """One file written through the worker thread.

    Args:
        path: the file's final path (its directory is created).
        max_pending: bytes handed over but not yet written after which :meth:`drain` waits.

    Attributes:
        size: bytes handed over so far (the offset of the next chunk).
    """

    def __init__(self, path: Path, max_pending: int = 8 << 20) -> None:
        self.path = path
        self.max_pending = max_pending
        self.size = 0
        self._tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        self._sha = hashlib.sha256()
        self._fd: int | None = None
        self._error: BaseException | None = None
        self._pending: deque[tuple[Future[None], int]] = deque()
        self._pending_bytes = 0
        self._used = False
        self._sources: dict[Path, int] = {}  # worker side: open source files of copies

    # ------------------------------------------------------------------ worker side
    def _write(self, data: bytes) -> None:
        if self._error is not None:
            return
        try:
            if self._fd is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
            self._sha.update(data)
        except BaseException as exc:
            self._error = exc
            raise

    def _copy(self, src: Path, offset: int, length: int) -> None:
        if self._error is not None:
            return
        try:
            fd = self._sources.get(src)
            if fd is None:
                fd = self._sources[src] = os.open(src, os.O_RDONLY)
            end = offset + length
            while offset < end:
                data = os.pread(fd, min(end - offset, _COPY_CHUNK), offset)
                if not data:
                    raise OSError(f"{src}: {end - offset} bytes missing at offset {offset}")
                offset += len(data)
                self._write(data)
        except BaseException as exc:
            if self._error is None:
                self._error = exc
            raise

    def _close_sources(self) -> None:
        for fd in self._sources.values():
            os.close(fd)
        self._sources.clear()

    def _finish(self) -> str:
        self._close_sources()
        if self._error is not None:
            raise self._error
        assert self._fd is not None
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = None
        os.replace(self._tmp, self.path)
        fsync_dir(self.path.parent)
        return self._sha.hexdigest()

    def _abort(self) -> None:
        self._close_sources()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._tmp.unlink(missing_ok=True)

    # ------------------------------------------------------------------ loop side
    def write(self, data: bytes) -> None:
        """Hand ``data`` over for writing (returns at once; errors surface in :meth:`drain`
        or :meth:`close`)."""
        if not data:
            return
        self.size += len(data)
        self._used = True
        self._pending.append((_worker().submit(self._write, data), len(data)))
        self._pending_bytes += len(data)

    def copy(self, src: Path, offset: int, length: int) -> None:
        """Hand over a copy of ``length`` bytes at ``offset`` (bytes) of file ``src``
        (returns at once; errors, e.g. a missing source, surface in :meth:`drain` or
        :meth:`close` as :class:`OSError`)."""
        if length <= 0:
            return
        self.size += length
        self._used = True
        self._pending.append((_worker().submit(self._copy, src, offset, length), length))
        self._pending_bytes += length

    async def drain(self) -> None:
        """Forget the writes done; wait while more than ``max_pending`` bytes wait.

        Raises:
            OSError: if a write failed.
        """
        pending = self._pending
        while pending and (self._pending_bytes > self.max_pending or pending[0][0].done()):
            fut, n = pending.popleft()
            self._pending_bytes -= n
            if fut.done():
                fut.result()
            else:
                await asyncio.wrap_future(fut)

    async def close(self) -> tuple[int, str]:
        """Sync the file and move it to its final name (after the writes handed over).

        Returns:
            (size in bytes, SHA-256 hex digest) of the file.

        Raises:
            OSError: if writing failed (the temporary file is removed).
        """
        if not self._used:  # an empty file still exists
            self._used = True
            _worker().submit(self._write, b"")
        try:
            sha = await through_cancellation(asyncio.wrap_future(_worker().submit(self._finish)))
        except BaseException:
            await self.discard()
            raise
        self._pending.clear()
        return self.size, sha

    async def discard(self) -> None:
        """Drop the file and wait until the worker has removed it (after the jobs handed over
        before): the caller's task, and so the job attempt, ends only once no file of the
        snapshot is still being written or deleted (as ``reactive.checkpoint.off_loop``
        requires of the runtime's own file work). Safe to call more than once.

        Raises:
            asyncio.CancelledError: when the caller was cancelled meanwhile (after that).
        """
        self._pending.clear()
        if not self._used:
            return
        try:
            fut = _worker().submit(self._abort)
        except RuntimeError:  # the interpreter is shutting down
            return
        self._used = False  # a second call (close() failed, then its caller discards) is a no-op
        await through_cancellation(asyncio.wrap_future(fut))


class SnapshotOutput:
    """The snapshot file as blobs: frames are buffered on the loop and handed to the writer
    thread in pieces of about ``_FLUSH`` bytes; byte ranges of earlier files are copied by
    the writer thread, adjacent ranges of one file in one copy."""

    def __init__(self, writer: SnapshotFileWriter, ref: dict[str, Any]) -> None:
        self.writer = writer
        self.ref = ref
        self._buf: list[bytes] = []
        self._buffered = 0
        self._start = 0
        self.serialized = 0  # bytes serialized on the loop (not copied from earlier files)
        # a copy not handed over yet, [source, offset, length]; never together with _buf
        self._copy: list[Any] | None = None

    @property
    def offset(self) -> int:
        return self.writer.size + self._buffered + (self._copy[2] if self._copy else 0)

    def begin(self, header: tuple[Any, ...]) -> None:
        self._start = self.offset
        self.add(encode_frame(header))

    def add(self, data: bytes) -> None:
        if self._copy is not None:
            self.flush()
        self._buf.append(data)
        self._buffered += len(data)
        self.serialized += len(data)
        if self._buffered >= _FLUSH:
            self.flush()

    def copy(self, src: Path, offset: int, length: int) -> None:
        """Append ``length`` bytes at ``offset`` of file ``src``."""
        c = self._copy
        if c is not None and c[0] == src and c[1] + c[2] == offset:
            c[2] += length
            return
        self.flush()
        self._copy = [src, offset, length]

    def flush(self) -> None:
        if self._copy is not None:
            self.writer.copy(*self._copy)
            self._copy = None
        if self._buf:
            self.writer.write(b"".join(self._buf))
            self._buf = []
            self._buffered = 0

    def end(self, kind: str) -> Entry:
        return (self.ref, self._start, self.offset - self._start, kind)
