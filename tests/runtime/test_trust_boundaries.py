"""Checkpoint metadata is input: paths must stay under their root, job names are one path
component, and with a signing key only signed metadata is restored."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from reactive import CheckpointConfig, CheckpointStorage, Dataflow
from reactive.checkpoint.metadata import KEY_ENV
from reactive.checkpoint.savepoints import export_savepoint
from reactive.cli import main as cli
from reactive.connectors.collections import ListSink
from reactive.errors import ConfigurationError, CorruptCheckpointError
from tests.support import Count


def _flow(name: str = "trust") -> Dataflow:
    flow = Dataflow(name, parallelism=2)
    (flow.from_collection([f"w{i % 11}" for i in range(2_000)]).uid("src")
         .key_by(lambda w: w).process(Count()).uid("count").sink(ListSink()))
    return flow


async def _savepoint(tmp_path: Path) -> Path:
    await _flow().run(checkpoints=CheckpointConfig(interval=0.01, directory=tmp_path / "chk"))
    latest = CheckpointStorage(tmp_path / "chk", "trust").latest_restorable()
    return export_savepoint(latest, tmp_path / "sp").path


def _rewrite_metadata(directory: Path, edit) -> None:  # type: ignore[no-untyped-def]
    """Edit the metadata body and re-seal its plain checksum (what an attacker can do)."""
    doc = json.loads((directory / "_metadata").read_text())
    edit(doc["body"])
    canonical = json.dumps(doc["body"], sort_keys=True, separators=(",", ":")).encode()
    doc["sha256"] = hashlib.sha256(canonical).hexdigest()
    (directory / "_metadata").write_text(json.dumps(doc))


async def test_crafted_savepoint_paths_cannot_leave_the_savepoint(tmp_path):
    sp = await _savepoint(tmp_path)
    evil = tmp_path / "evil.bin"
    evil.write_bytes(b"attacker bytes")
    ref = {"path": "../evil.bin", "size": evil.stat().st_size,
           "sha256": hashlib.sha256(evil.read_bytes()).hexdigest()}

    def edit(body):  # type: ignore[no-untyped-def]
        handle = body["operators"]["count"]["subtasks"]["0"]["keyed_state"]
        handle["files"].append(ref)

    _rewrite_metadata(sp, edit)
    output = tmp_path / "exported" / "inner"
    assert cli(["savepoint", str(sp), "--output", str(output)]) == 2
    assert not (tmp_path / "exported" / "evil.bin").exists()
    with pytest.raises(CorruptCheckpointError, match="outside"):
        CheckpointStorage.load(sp)
    with pytest.raises(CorruptCheckpointError, match="outside"):  # before anything runs
        await _flow().start(checkpoints=CheckpointConfig(directory=tmp_path / "c2"),
                            restore_from=sp)


@pytest.mark.parametrize("name", ["a/b", "..", ".", "", "x\\y"])
def test_job_names_must_be_one_path_component(name):
    with pytest.raises(ConfigurationError, match="single path component"):
        Dataflow(name)


async def test_signed_metadata_is_checked_before_anything_is_read(tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "s3cret")
    sp = await _savepoint(tmp_path)
    doc = json.loads((sp / "_metadata").read_text())
    assert "hmac-sha256" in doc
    CheckpointStorage.load(sp)  # signed with the key in force: accepted

    # someone swaps in their own state file and fixes the plain checksums: refused
    def edit(body):  # type: ignore[no-untyped-def]
        handle = body["operators"]["count"]["subtasks"]["0"]["keyed_state"]
        handle["files"][0]["sha256"] = "0" * 64

    _rewrite_metadata(sp, edit)
    with pytest.raises(CorruptCheckpointError, match="signature"):
        CheckpointStorage.load(sp)

    # a checkpoint written without a key is refused while a key is set
    monkeypatch.delenv(KEY_ENV)
    unsigned = await _savepoint(tmp_path / "unsigned")
    assert "hmac-sha256" not in json.loads((unsigned / "_metadata").read_text())
    monkeypatch.setenv(KEY_ENV, "s3cret")
    with pytest.raises(CorruptCheckpointError, match="not signed"):
        CheckpointStorage.load(unsigned)
    # and one signed under another key too
    monkeypatch.setenv(KEY_ENV, "other")
    signed_elsewhere = await _savepoint(tmp_path / "elsewhere")
    monkeypatch.setenv(KEY_ENV, "s3cret")
    with pytest.raises(CorruptCheckpointError, match="signature"):
        CheckpointStorage.load(signed_elsewhere)
