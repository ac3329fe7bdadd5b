"""Every directory entry a completed checkpoint, a savepoint or committed output depends on
is durable: its directory was fsynced after the entry appeared (a file's own fsync does not
make its name survive a power loss)."""

from __future__ import annotations

import os
import stat
from collections import defaultdict
from pathlib import Path

import pytest

from reactive import CheckpointConfig, CheckpointStorage, Dataflow
from reactive.checkpoint.metadata import METADATA
from reactive.connectors.files import CommittingFileSink
from reactive.testing import TestingSource
from tests.support import Count


class _DirSyncs:
    """Records, for each fsync of a directory, the names it held at that moment (by the
    directory's inode: a directory renamed after its fsync keeps its synced entries)."""

    def __init__(self) -> None:
        self.synced: dict[tuple[int, int], set[str]] = defaultdict(set)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        real = os.fsync

        def fsync(fd: int) -> None:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                path = os.readlink(f"/proc/self/fd/{fd}")
                self.synced[(st.st_dev, st.st_ino)].update(os.listdir(path))
            real(fd)

        monkeypatch.setattr(os, "fsync", fsync)

    def missing(self, path: Path, top: Path) -> list[str]:
        """Entries on the way from ``top`` down to ``path`` whose directory was never
        fsynced while it held them."""
        out = []
        p = path
        while p != top:
            st = p.parent.stat()
            if p.name not in self.synced.get((st.st_dev, st.st_ino), set()):
                out.append(str(p.relative_to(top)))
            p = p.parent
        return out


def _backend(name: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    if name == "rocksdb":
        pytest.importorskip("rocksdict")
        from reactive.backends.rocksdb import RocksDBStateBackend
        return RocksDBStateBackend(tmp_path / "rocks", incremental=True)
    from reactive.backends.heap import HeapStateBackend
    return HeapStateBackend(incremental=True)


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
async def test_a_completed_checkpoints_directories_are_synced(tmp_path, monkeypatch, backend):
    # the syncs are recognised by the directory each descriptor names (Linux's /proc)
    assert Path("/proc/self/fd").is_dir(), "this test needs /proc (Linux)"
    syncs = _DirSyncs()
    syncs.install(monkeypatch)
    base = tmp_path / "data"  # created by the run, like the storage root and the output
    chk, out = base / "chk", base / "out"
    items: list[object] = []
    for i in range(3):
        items += [*range(i * 500, (i + 1) * 500), TestingSource.CHECKPOINT]
    flow = Dataflow("durable", parallelism=1, max_parallelism=8)
    (flow.source(TestingSource(items, batch_size=100)).uid("src").key_by(lambda x: x % 50)
         .process(Count()).uid("count").sink(CommittingFileSink(out)).uid("out"))
    await flow.run(checkpoints=CheckpointConfig(interval=0.05, directory=chk, retained=2),
                   state_backend=_backend(backend, tmp_path))

    storage = CheckpointStorage(chk, "durable")
    retained = storage.completed()
    assert retained
    missing = []
    for c in retained:
        missing += syncs.missing(c.path / METADATA, tmp_path)
        for ref in c.metadata.file_refs():
            missing += syncs.missing(c.job_dir / ref.path, tmp_path)
    parts = [p for p in out.iterdir() if p.name.startswith("part-")]
    assert parts
    for part in parts:
        missing += syncs.missing(part, tmp_path)
    assert sorted(set(missing)) == []

    # a savepoint exported elsewhere is as durable
    from reactive.checkpoint.savepoints import export_savepoint
    savepoint = export_savepoint(retained[-1], tmp_path / "saved" / "sp-1")
    missing = syncs.missing(savepoint.path / METADATA, tmp_path)
    for ref in savepoint.metadata.file_refs():
        missing += syncs.missing(savepoint.path / ref.path, tmp_path)
    assert sorted(set(missing)) == []


async def test_a_moved_savepoint_is_durable_where_it_lands(tmp_path, monkeypatch):
    # the syncs are recognised by the directory each descriptor names (Linux's /proc)
    assert Path("/proc/self/fd").is_dir(), "this test needs /proc (Linux)"
    from reactive import PushSource

    syncs = _DirSyncs()
    syncs.install(monkeypatch)
    source = PushSource()
    flow = Dataflow("moved", parallelism=1)
    flow.source(source).uid("src").key_by(lambda x: x % 3).process(Count()).uid("count") \
        .sink(CommittingFileSink(tmp_path / "out")).uid("out")
    job = await flow.start(checkpoints=CheckpointConfig(interval=None, directory=tmp_path / "chk"))
    for i in range(30):
        await source.send(i)
    savepoint = await job.savepoint(tmp_path / "saved" / "sp-1")
    await job.cancel()
    missing = syncs.missing(savepoint.path / METADATA, tmp_path)
    for ref in savepoint.metadata.file_refs():
        missing += syncs.missing(savepoint.path / ref.path, tmp_path)
    assert sorted(set(missing)) == []
