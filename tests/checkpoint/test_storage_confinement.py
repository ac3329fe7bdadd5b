"""The runtime deletes, reads and writes only under the checkpoint directory: names read from
it (run records, ``shared`` lists, RocksDB ``db_files``) and links planted in it never make
it touch a file outside."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from reactive import CheckpointConfig, CheckpointStorage, Dataflow
from reactive.checkpoint.metadata import KEY_ENV
from reactive.checkpoint.paths import UnsafePathError, unlink_under
from reactive.connectors.collections import ListSink
from reactive.errors import JobFailedError, RestoreError
from reactive.testing import TestingSource
from tests.support import Count


def _flow(name: str = "conf", n: int = 300) -> Dataflow:
    flow = Dataflow(name, parallelism=1, max_parallelism=8)
    (flow.from_collection([f"w{i % 7}" for i in range(n)]).uid("src")
         .key_by(lambda w: w).process(Count()).uid("count").sink(ListSink()).uid("sink"))
    return flow


def _reseal(directory: Path, edit) -> None:  # type: ignore[no-untyped-def]
    """Edit a metadata body and recompute its plain checksum (what anyone can do)."""
    doc = json.loads((directory / "_metadata").read_text())
    edit(doc["body"])
    canonical = json.dumps(doc["body"], sort_keys=True, separators=(",", ":")).encode()
    doc["sha256"] = hashlib.sha256(canonical).hexdigest()
    doc.pop("hmac-sha256", None)
    (directory / "_metadata").write_text(json.dumps(doc))


def _outside(tmp_path: Path) -> list[Path]:
    home = tmp_path / "home"
    (home / "docs").mkdir(parents=True)
    files = [home / "thesis.tex", home / ".bashrc", home / "docs" / "notes.txt"]
    for f in files:
        f.write_text("precious\n")
    return files


async def test_a_symlinked_shared_dir_is_never_walked_for_deletion(tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "s3cret")
    files = _outside(tmp_path)
    job_dir = tmp_path / "chk" / "conf"
    job_dir.mkdir(parents=True)
    (job_dir / "shared").symlink_to(tmp_path / "home", target_is_directory=True)
    with pytest.raises(JobFailedError) as info:
        await _flow().run(checkpoints=CheckpointConfig(interval=None, directory=tmp_path / "chk"))
    cause = info.value.__cause__
    assert isinstance(cause, UnsafePathError)
    assert "shared is a symbolic link" in str(cause) and str(tmp_path / "home") in str(cause)
    assert all(f.read_text() == "precious\n" for f in files)


def test_deleting_through_a_link_unlinks_nothing_outside(tmp_path):
    files = _outside(tmp_path)
    root = tmp_path / "root"
    root.mkdir()
    (root / "shared").symlink_to(tmp_path / "home", target_is_directory=True)
    (root / "leaf").symlink_to(files[0])
    with pytest.raises(UnsafePathError, match="is a symbolic link"):
        unlink_under(root, "shared/thesis.tex")
    with pytest.raises(UnsafePathError):
        unlink_under(root, "../home/thesis.tex")
    assert unlink_under(root, "leaf")  # the link itself goes, its target stays
    assert not (root / "leaf").is_symlink()
    assert all(f.exists() for f in files)


async def test_forged_run_records_cannot_name_files_outside(tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "s3cret")
    victim = tmp_path / "config.json"
    victim.write_text('{"precious": true}')
    runs = tmp_path / "chk" / "conf" / "_runs"
    runs.mkdir(parents=True)
    for i in range(20):  # the oldest would be pruned: it names a file outside
        (runs / f"r{i}.json").write_text(json.dumps(
            {"run_id": "../../../config" if i == 0 else f"r{i}", "first_checkpoint_id": i,
             "restored_from": None}))
    await _flow().run(checkpoints=CheckpointConfig(interval=None, directory=tmp_path / "chk"))
    assert victim.read_text() == '{"precious": true}'
    storage = CheckpointStorage(tmp_path / "chk", "conf")
    # unsigned records are not trusted with a key set; the run's own signed one is
    records = storage.runs()
    assert len(records) == 1 and "hmac-sha256" in records[0]
    monkeypatch.setenv(KEY_ENV, "another key")
    assert storage.runs() == []


async def test_a_planted_shared_entry_is_never_deleted_by_retention(tmp_path, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious data\n")
    chk = tmp_path / "chk"
    await _flow().run(checkpoints=CheckpointConfig(interval=None, directory=chk))
    planted = CheckpointStorage(chk, "conf").completed()[-1]

    def edit(body):  # type: ignore[no-untyped-def]
        handle = body["operators"]["count"]["subtasks"]["0"]["keyed_state"]
        handle["shared"] = [{"path": "../../victim.txt", "size": 1, "sha256": "0" * 64}]

    _reseal(planted.path, edit)
    with pytest.raises(UnsafePathError, match="not under shared/"):
        CheckpointStorage.load(planted.path)
    # a fresh run that completes several checkpoints (retained=1) subsumes what it can
    flow = Dataflow("conf", parallelism=1, max_parallelism=8)
    items = [*range(50), TestingSource.CHECKPOINT, *range(50), TestingSource.CHECKPOINT]
    (flow.source(TestingSource(items)).uid("src").key_by(lambda x: x % 7)
         .process(Count()).uid("count").sink(ListSink()).uid("sink"))
    await flow.run(checkpoints=CheckpointConfig(interval=0.05, directory=chk, retained=1))
    assert victim.read_text() == "precious data\n"


@pytest.mark.parametrize("entry", [("../../../planted.sst", None), ("000009.sst", "../../x")])
async def test_rocksdb_restore_checks_db_file_names(tmp_path, monkeypatch, entry):
    pytest.importorskip("rocksdict")
    from reactive.backends.rocksdb import RocksDBStateBackend

    monkeypatch.delenv(KEY_ENV, raising=False)
    chk = tmp_path / "chk"
    await _flow().run(checkpoints=CheckpointConfig(interval=None, directory=chk),
                      state_backend=RocksDBStateBackend(tmp_path / "state"))
    latest = CheckpointStorage(chk, "conf").completed()[-1]
    (tmp_path / "x").write_text("outside\n")
    name, rel = entry

    def edit(body):  # type: ignore[no-untyped-def]
        handle = body["operators"]["count"]["subtasks"]["0"]["keyed_state"]
        files = handle["db_files"]
        handle["db_files"] = {name: rel or next(iter(files.values())), **files}

    _reseal(latest.path, edit)
    with pytest.raises(JobFailedError) as info:
        await _flow().run(checkpoints=CheckpointConfig(interval=None, directory=chk),
                          restore_from=latest.path,
                          state_backend=RocksDBStateBackend(tmp_path / "state2"))
    # the restore names the operator and phase (RestoreError), the unsafe name its cause
    restore = info.value.__cause__
    assert isinstance(restore, RestoreError) and restore.operator == "count", restore
    cause = restore.__cause__
    assert isinstance(cause, UnsafePathError), cause
    assert "db_files" in str(cause)
    assert not any(p.name == "planted.sst" for p in tmp_path.rglob("*"))
    assert (tmp_path / "x").read_text() == "outside\n"


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
async def test_a_job_writes_nothing_in_its_working_directory_but_its_checkpoints(
        tmp_path, monkeypatch, backend):
    """With the backends' defaults, the process's working directory ends up holding the
    checkpoint directory and nothing else (RocksDB's working files go to a temporary
    directory, as Flink's local directories do)."""
    from reactive.backends.heap import HeapStateBackend
    from reactive.backends.rocksdb import RocksDBStateBackend

    monkeypatch.chdir(tmp_path)
    state_backend = HeapStateBackend() if backend == "heap" else RocksDBStateBackend()
    await _flow().run(checkpoints=CheckpointConfig(interval=0.01, directory="chk"),
                      state_backend=state_backend)
    assert CheckpointStorage(tmp_path / "chk", "conf").completed()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chk"]
