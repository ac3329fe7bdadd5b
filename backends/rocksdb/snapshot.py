"""The RocksDB backend's snapshots, full and incremental: the write-back cache frozen in the
synchronous part; written to RocksDB, checkpointed locally and uploaded to checkpoint storage
in the asynchronous part.

Thesis 4.5.1 (asynchronous snapshot invocation) and 4.5.2 (incremental snapshots); Flink's
``RocksFullSnapshotStrategy`` / ``RocksIncrementalSnapshotStrategy``:

- *synchronous part* (the backend's ``snapshot``): freeze the write-back cache as a
  generation (:mod:`.generations`, O(number of states)) and create the checkpoint's
  ``chk-<n>`` directory (which tells checkpoint storage that a checkpoint is in flight);
- *asynchronous part* (:meth:`RocksDBSnapshot.write`): the *local phase* writes the frozen
  generation (and any older pending one) to RocksDB in chunks on the event loop, then
  flushes the memtable and creates a RocksDB checkpoint (hard links of the immutable SST
  files, a copy of the small MANIFEST, OPTIONS and CURRENT files) in a private directory, in
  a worker thread; then the *upload* copies the files into checkpoint storage: SST files in
  a worker thread (reads, SHA-256 and writes of 16 MiB chunks and ``fsync`` release the
  GIL), the few KiB of small files on the loop with their fsync in a thread. Full mode copies
  everything into ``chk-<n>``. Incremental mode stores SST files under
  ``<job_dir>/shared/<operator>/`` named by their SHA-256, and an SST file that the last
  *completed* checkpoint already stored is referenced, not copied (listed in the handle's
  ``shared_reused``). Only completed checkpoints serve as the base, and every file a retained
  checkpoint references is live or newer, so checkpoint storage can delete a shared file
  exactly when no retained checkpoint lists it (reference counting derived from the
  metadata, hence correct across restarts).

The handle (``format`` ``rocksdb-v1``) records the key-group range, the states with their
kinds, which states use a custom serializer (``custom_serializers``; the others' values are
pickles), the key encoding, and ``db_files``: RocksDB file name -> path in checkpoint storage;
with time-to-live state, ``ttl_dropped``: the entries its local phase wrote as deletes
because they had expired by the checkpoint's TTL time (:mod:`.ttl`; a metric).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reactive.checkpoint.off_loop import in_thread
from reactive.state.backend import KeyedStateSnapshot, SnapshotContext, file_name_component

from .db import BACKEND, FORMAT
from .generations import Generation, run_in_worker

__all__ = ["RocksDBSnapshot"]

_CHUNK = 16 << 20  # bytes per read when copying (read, hash, write each take the GIL back once)
_SMALL = 256 << 10  # bytes: a file up to this size is copied and hashed on the loop


def _copy_hashed(src: Path, dest: Path) -> tuple[int, str]:
    """Blocking (worker thread): copy ``src`` to ``dest`` via a temporary file, fsync and an
    atomic rename; return (size in bytes, sha256 hex digest)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.tmp")
    h = hashlib.sha256()
    size = 0
    try:
        with open(src, "rb") as fin, open(tmp, "wb") as fout:
            while chunk := fin.read(_CHUNK):
                h.update(chunk)
                fout.write(chunk)
                size += len(chunk)
            fout.flush()
            os.fsync(fout.fileno())
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return size, h.hexdigest()


def _hash_to_shared(src: Path, shared: Path) -> tuple[int, str, Path]:
    """Blocking: copy ``src`` into folder ``shared`` named by its content (``<sha256>.sst``)."""
    shared.mkdir(parents=True, exist_ok=True)
    tmp = shared / f".upload-{uuid.uuid4().hex}.tmp"
    size, sha = _copy_hashed(src, tmp)
    dest = shared / f"{sha}.sst"
    # same name = same content: replacing an existing copy is harmless
    os.replace(tmp, dest)
    return size, sha, dest


@dataclass
class _Upload:
    """What an upload stored: file refs ``{"path", "size", "sha256"}``."""

    files: list[dict[str, Any]] = field(default_factory=list)
    shared: list[dict[str, Any]] = field(default_factory=list)
    reused: list[dict[str, Any]] = field(default_factory=list)
    db_files: dict[str, str] = field(default_factory=dict)  # RocksDB name -> path
    sst: dict[str, dict[str, Any]] = field(default_factory=dict)  # SST name -> shared ref


def _copy_small(src: Path, dest: Path) -> tuple[int, str, Path, int]:
    """Copy a small file (at most :data:`_SMALL` bytes) to a temporary file next to
    ``dest`` on the event loop, without fsync; return (size, sha256, temporary path, its
    still open descriptor)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.tmp")
    data = src.read_bytes()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except BaseException:
        os.close(fd)
        raise
    return len(data), hashlib.sha256(data).hexdigest(), tmp, fd


def _fsync_all(fds: list[int]) -> None:
    """Blocking (worker thread): fsync each descriptor (one GIL hand-back per file)."""
    for fd in fds:
        os.fsync(fd)


async def _upload(ctx: SnapshotContext, local: Path, incremental: bool,
                  base: dict[str, dict[str, Any]]) -> _Upload:
    """Copy the local checkpoint ``local`` into checkpoint storage, reusing ``base``'s
    shared SST files in incremental mode.

    Under load a worker thread waits about one GIL switch interval (5 ms) each time it
    returns from a system call, so the thread calls are few: one per SST file to copy
    (read, hash, write and fsync in 16 MiB chunks), and one that fsyncs every small file
    (MANIFEST, OPTIONS, CURRENT ...), which the loop copies and hashes itself (a few KiB:
    microseconds). Reused SST files cost two ``stat`` calls on the loop.

    Raises:
        OSError: if a file cannot be read or written.
    """
    up = _Upload()
    exclusive = ctx.checkpoint_dir / f"{file_name_component(ctx.operator_uid)}-{ctx.subtask}"
    shared_dir = ctx.shared_dir / file_name_component(ctx.operator_uid)
    small: list[tuple[Path, Path, int]] = []  # temporary file, final name, open descriptor
    try:
        for name in sorted(os.listdir(local)):
            src = local / name
            size = src.stat().st_size
            if incremental and name.endswith(".sst"):
                ref = base.get(name)
                # the base may come from a checkpoint of another job directory
                # (restore_from): reuse a file only if this storage holds it (names are
                # content hashes)
                if ref is not None and ref["size"] == size and \
                        (ctx.job_dir / ref["path"]).is_file():
                    up.reused.append(ref)
                else:
                    size, sha, dest = await in_thread(_hash_to_shared, src, shared_dir)
                    ref = {"path": ctx.relative(dest), "size": size, "sha256": sha}
                up.shared.append(ref)
                up.sst[name] = ref
            else:
                dest = exclusive / name
                if size <= _SMALL:
                    size, sha, tmp, fd = _copy_small(src, dest)
                    small.append((tmp, dest, fd))
                else:
                    size, sha = await in_thread(_copy_hashed, src, dest)
                ref = {"path": ctx.relative(dest), "size": size, "sha256": sha}
            up.files.append(ref)
            up.db_files[name] = ref["path"]
        await in_thread(_fsync_all, [fd for _, _, fd in small])
        for tmp, dest, _ in small:
            os.replace(tmp, dest)
    finally:
        for tmp, _, fd in small:
            os.close(fd)
            tmp.unlink(missing_ok=True)  # renamed: gone already
    return up


class RocksDBSnapshot(KeyedStateSnapshot):
    """One snapshot between its synchronous part and the end of its asynchronous part.

    Args:
        ctx: where to write.
        gen: the write-back cache generation frozen at the barrier (:mod:`.generations`).
        make_local: writes the generations up to ``gen`` to RocksDB and creates ``gen``'s
            local checkpoint, returning its directory.
        discard_gen: gives up ``gen``'s local checkpoint (its entries still go to RocksDB).
        incremental: upload SST files to ``shared/`` and reuse ``base``'s (else copy all).
        base: local SST file name -> its ref in the last completed checkpoint.
        states: state name -> kind (None: unknown until a descriptor binds it).
        custom: names of the states whose values are custom serializer bytes.
        key_group_range: ``[start, end]`` of the instance.
        max_parallelism: the job's number of key groups.
        key_encoding: the handle's ``key_encoding``.
        on_uploaded: called with (checkpoint id, SST name -> shared ref) after an
            incremental upload (the candidate base of the next incremental snapshot).
        on_done: called once when the snapshot is written or discarded.

    Attributes:
        started: the asynchronous part started.
        done: the snapshot was written or discarded (its local checkpoint is being removed).
    """

    def __init__(self, ctx: SnapshotContext, gen: Generation, *,
                 make_local: Callable[[Generation], Awaitable[Path]],
                 discard_gen: Callable[[Generation], None], incremental: bool,
                 base: dict[str, dict[str, Any]], states: dict[str, str | None],
                 custom: list[str], key_group_range: list[int], max_parallelism: int,
                 key_encoding: str,
                 on_uploaded: Callable[[int, dict[str, dict[str, Any]]], None],
                 on_done: Callable[[RocksDBSnapshot], None]) -> None:
        self.ctx = ctx
        self.gen = gen
        self._make_local = make_local
        self._discard_gen = discard_gen
        self.incremental = incremental
        self.base = base
        self.states = states
        self.custom = custom
        self.key_group_range = key_group_range
        self.max_parallelism = max_parallelism
        self.key_encoding = key_encoding
        self._on_uploaded = on_uploaded
        self._on_done = on_done
        self.started = False
        self.done = False

    async def write(self) -> dict[str, Any]:
        """Asynchronous part: the local phase, then the upload; return the handle.

        Raises:
            OSError: if the snapshot was discarded, the local checkpoint could not be
                created, or a file cannot be copied.
            StateSerializationError: if a frozen value cannot be serialized.
        """
        if self.done:
            raise OSError(f"snapshot {self.ctx.checkpoint_id} was discarded (the backend "
                          "was disposed before its asynchronous part ran)")
        self.started = True
        try:
            local = await self._make_local(self.gen)
            up = await _upload(self.ctx, local, self.incremental, self.base)
        finally:
            self._release()
        if self.incremental:
            self._on_uploaded(self.ctx.checkpoint_id, up.sst)
        ttl = {"ttl_dropped": self.gen.dropped} if any(
            ft.ttl is not None for ft in self.gen.tables.values()) else {}
        return {
            "backend": BACKEND,
            "format": FORMAT,
            "mode": "incremental" if self.incremental else "full",
            "files": up.files,
            "shared": up.shared,
            "shared_reused": up.reused,
            "key_group_range": self.key_group_range,
            "max_parallelism": self.max_parallelism,
            "states": self.states,
            "custom_serializers": self.custom,
            "key_encoding": self.key_encoding,
            "db_files": up.db_files,
            **ttl,
        }

    def _release(self) -> None:
        if not self.done:
            self.done = True
            gen = self.gen
            if gen.checkpointed and gen.local is not None:
                run_in_worker(shutil.rmtree, gen.local, True)
            else:
                self._discard_gen(gen)
            self._on_done(self)

    def discard(self) -> None:
        self._release()
