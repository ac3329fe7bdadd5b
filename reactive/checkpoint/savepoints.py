"""Savepoints: self-contained, movable checkpoints (Flink's savepoints; Carbone 2018
(PhD thesis), section 4.2).

A savepoint's metadata says ``"self_contained": true``; it references no shared file, and
its handle paths are relative to the savepoint directory itself (``uid-0.heap``, not
``chk-7/uid-0.heap``), so the directory can be moved or copied anywhere and still be passed
to ``restore_from``. Retention never deletes a checkpoint of kind ``savepoint``.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import replace
from pathlib import Path

from ..errors import CheckpointError
from .contract import CheckpointMetadata, FileRef, KeyedStateHandle, OperatorSubtaskState
from .durable_files import fsync_dir, fsync_tree, make_dirs, resolve_under, verify_file
from .metadata import CompletedCheckpoint, write_metadata
from .storage import CheckpointStorage

__all__ = ["export_savepoint", "move_savepoint", "rebase_savepoint_paths"]

_CHK = re.compile(r"^chk-\d+$")


def rebase_savepoint_paths(metadata: CheckpointMetadata, checkpoint_dir_name: str
                           ) -> CheckpointMetadata:
    """Make the handles of a savepoint relative to the savepoint directory.

    Tasks write every snapshot file under ``<job_dir>/chk-<n>/`` and record paths relative to
    the job directory; a savepoint must not depend on where it lives, so each path
    ``chk-<n>/x`` becomes ``x``. Every path a handle holds is listed in its ``files`` (the
    backend protocol, ``reactive.state.backend``); any other string of a keyed handle equal
    to such a path (e.g. RocksDB's ``db_files``) is rewritten the same way.

    Args:
        metadata: the savepoint's metadata, paths relative to the job directory.
        checkpoint_dir_name: ``chk-<n>``.

    Returns:
        a rewritten copy of ``metadata``, ``self_contained``.

    Raises:
        CheckpointError: if a handle references a file outside ``chk-<n>`` (a shared file
            of an incremental snapshot: the backend ignored ``SnapshotContext.savepoint``).
    """
    prefix = checkpoint_dir_name + "/"
    mapping: dict[str, str] = {}
    for uid, _, sub in metadata.subtask_states():
        keyed = sub.keyed_state
        handles: list[tuple[str, tuple[FileRef, ...]]] = []
        if keyed is not None:
            handles.append((keyed.backend, (*keyed.files, *(keyed.shared or ()),
                                            *(keyed.shared_reused or ()))))
        if sub.operator_state is not None:
            handles.append(("operator_state", sub.operator_state.files))
        for what, refs in handles:
            for ref in refs:
                if not ref.path.startswith(prefix):
                    raise CheckpointError(
                        f"savepoint state of operator {uid!r} ({what}) references "
                        f"{ref.path}, outside {checkpoint_dir_name}: a savepoint must be "
                        "self-contained (does the backend honour SnapshotContext.savepoint?)"
                    )
                mapping[ref.path] = ref.path[len(prefix):]
    return replace(metadata.with_paths(mapping), self_contained=True)


def move_savepoint(savepoint: CompletedCheckpoint, dest: str | Path) -> CompletedCheckpoint:
    """Move a completed self-contained savepoint to ``dest`` (the new savepoint directory).

    A rename when ``dest`` is on the same filesystem (atomic); else a copy, verified against
    the metadata's checksums, then the removal of the original. Nothing inside the directory
    changes: its paths are relative to itself.

    Args:
        savepoint: a savepoint whose metadata has ``self_contained``.
        dest: a directory that does not exist, or an empty one.

    Returns:
        the savepoint at its new place.

    A savepoint moved out of checkpoint storage keeps its id reserved there (in its run's
    record): no later run of the job reuses it.

    Raises:
        CheckpointError: if it is not self-contained or ``dest`` is not empty.
        OSError: if moving fails (the original stays).
    """
    if not savepoint.metadata.self_contained:
        raise CheckpointError(f"{savepoint.path} is not a self-contained savepoint")
    target = Path(dest)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise CheckpointError(f"savepoint target {target} exists and is not an empty directory")
    _reserve_id(savepoint)
    make_dirs(target.parent)
    try:
        os.replace(savepoint.path, target)
    except OSError:  # another filesystem (EXDEV) or an existing empty dir on some systems
        if target.exists():
            target.rmdir()
        tmp = target.with_name(f".{target.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(savepoint.path, tmp)
        for ref in savepoint.metadata.file_refs():
            verify_file(tmp, ref)
        fsync_tree(tmp)  # the copy is durable before its name is
        os.replace(tmp, target)
        shutil.rmtree(savepoint.path, ignore_errors=True)
    fsync_dir(target.parent)
    return CompletedCheckpoint(savepoint.checkpoint_id, target, savepoint.metadata)


def _reserve_id(savepoint: CompletedCheckpoint) -> None:
    """Before a savepoint leaves the ``chk-<n>`` directory of a job's checkpoint storage,
    record its id in the record of the run that took it: ids never repeat within a
    checkpoint directory, and the next run would otherwise see ``n`` as free.

    Raises:
        CheckpointError: if the run that took it has no record there.
        OSError: if the record cannot be written (the savepoint is not moved then).
    """
    path, run_id = savepoint.path, savepoint.metadata.run_id
    if not _CHK.match(path.name) or run_id is None:
        return  # not in checkpoint storage (already moved, or exported)
    storage = CheckpointStorage(path.parent.parent, path.parent.name)
    storage.reserve_savepoint(run_id, savepoint.checkpoint_id)


def export_savepoint(checkpoint: CompletedCheckpoint, dest: str | Path) -> CompletedCheckpoint:
    """Copy a completed checkpoint (incremental or not) into a self-contained savepoint.

    Every referenced file, shared ones included, is copied under ``dest`` (``chk-<n>/x``
    becomes ``x``, ``shared/...`` stays ``shared/...``) and verified; the handles then list
    no shared file, and the metadata gets kind ``savepoint`` and ``self_contained``. Used by
    ``reactive savepoint`` to turn the latest checkpoint of a stopped job into a savepoint.

    Args:
        checkpoint: the completed checkpoint or savepoint to copy.
        dest: a directory that does not exist, or an empty one.

    Returns:
        the savepoint.

    Raises:
        CheckpointError: if ``dest`` is not empty.
        CorruptCheckpointError: if a file is missing or fails its checksum.
    """
    target = Path(dest)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise CheckpointError(f"savepoint target {target} exists and is not an empty directory")
    prefix = checkpoint.path.relative_to(checkpoint.job_dir).as_posix() + "/" \
        if not checkpoint.metadata.self_contained else ""
    mapping: dict[str, str] = {}
    make_dirs(target)
    for ref in checkpoint.metadata.file_refs():
        verify_file(checkpoint.job_dir, ref)
        old = ref.path
        new = old[len(prefix):] if prefix and old.startswith(prefix) else old
        mapping[old] = new
        dest_file = resolve_under(target, new)
        dest_file.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(resolve_under(checkpoint.job_dir, old), dest_file)
    moved = checkpoint.metadata.with_paths(mapping)
    metadata = replace(moved, kind="savepoint", self_contained=True, operators={
        # the copies are owned by the savepoint alone: no shared files
        uid: replace(op, subtasks={i: _unshared(sub) for i, sub in op.subtasks.items()})
        for uid, op in moved.operators.items()})
    fsync_tree(target)  # every copied file and directory, before the metadata names them
    write_metadata(target, metadata)
    return CheckpointStorage.load(target)


def _unshared(sub: OperatorSubtaskState) -> OperatorSubtaskState:
    keyed: KeyedStateHandle | None = sub.keyed_state
    if keyed is None:
        return sub
    return replace(sub, keyed_state=replace(keyed, shared=(), shared_reused=()))
