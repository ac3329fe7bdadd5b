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
from pathlib import Path
from typing import Any

from ..errors import CheckpointError
from .durable_files import fsync_dir, fsync_tree, make_dirs, resolve_under, verify_file
from .metadata import CompletedCheckpoint, iter_file_refs, write_metadata
from .storage import CheckpointStorage

__all__ = ["export_savepoint", "move_savepoint", "rebase_savepoint_paths"]

_CHK = re.compile(r"^chk-\d+$")


def _rebase(value: Any, mapping: dict[str, str]) -> Any:
    if isinstance(value, str):
        return mapping.get(value, value)
    if isinstance(value, list):
        return [_rebase(v, mapping) for v in value]
    if isinstance(value, dict):
        return {k: _rebase(v, mapping) for k, v in value.items()}
    return value


def rebase_savepoint_paths(operators: dict[str, Any], checkpoint_dir_name: str
                           ) -> dict[str, Any]:
    """Make the handles of a savepoint relative to the savepoint directory.

    Tasks write every snapshot file under ``<job_dir>/chk-<n>/`` and record paths relative to
    the job directory; a savepoint must not depend on where it lives, so each path
    ``chk-<n>/x`` becomes ``x``. Every path a handle holds is listed in its ``files`` (the
    backend protocol, ``reactive.state.backend``); any other string equal to such a path
    (e.g. RocksDB's ``db_files``) is rewritten the same way.

    Args:
        operators: the ``operators`` section of the metadata (not modified).
        checkpoint_dir_name: ``chk-<n>``.

    Returns:
        a rewritten copy of ``operators``.

    Raises:
        CheckpointError: if a handle references a file outside ``chk-<n>`` (a shared file
            of an incremental snapshot: the backend ignored ``SnapshotContext.savepoint``).
    """
    prefix = checkpoint_dir_name + "/"
    mapping: dict[str, str] = {}
    for uid, op in operators.items():
        for sub in op.get("subtasks", {}).values():
            for key in ("keyed_state", "operator_state"):
                handle = sub.get(key) or {}
                refs = [*handle.get("files", []), *handle.get("shared", []),
                        *handle.get("shared_reused", [])]
                for ref in refs:
                    path = ref["path"]
                    if not path.startswith(prefix):
                        raise CheckpointError(
                            f"savepoint state of operator {uid!r} ({handle.get('backend', key)})"
                            f" references {path}, outside {checkpoint_dir_name}: a savepoint "
                            "must be self-contained (does the backend honour "
                            "SnapshotContext.savepoint?)"
                        )
                    mapping[path] = path[len(prefix):]
    return _rebase(operators, mapping)  # type: ignore[no-any-return]


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
    if not savepoint.metadata.get("self_contained"):
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
        for ref in iter_file_refs(savepoint.metadata):
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
    path, run_id = savepoint.path, savepoint.metadata.get("run_id")
    if not _CHK.match(path.name) or run_id is None:
        return  # not in checkpoint storage (already moved, or exported)
    storage = CheckpointStorage(path.parent.parent, path.parent.name)
    storage.reserve_savepoint(str(run_id), savepoint.checkpoint_id)


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
        if not checkpoint.metadata.get("self_contained") else ""
    mapping: dict[str, str] = {}
    make_dirs(target)
    for ref in iter_file_refs(checkpoint.metadata):
        verify_file(checkpoint.job_dir, ref)
        old = ref["path"]
        new = old[len(prefix):] if prefix and old.startswith(prefix) else old
        mapping[old] = new
        dest_file = resolve_under(target, new)
        dest_file.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(resolve_under(checkpoint.job_dir, old), dest_file)
    body = dict(_rebase(checkpoint.metadata, mapping))
    for op in body.get("operators", {}).values():
        for sub in op.get("subtasks", {}).values():
            handle = sub.get("keyed_state")
            if handle:
                # copies now, owned by the savepoint alone
                handle["shared"] = []
                handle["shared_reused"] = []
    body["kind"] = "savepoint"
    body["self_contained"] = True
    body.pop("format", None)
    fsync_tree(target)  # every copied file and directory, before the metadata names them
    write_metadata(target, body)
    return CheckpointStorage.load(target)
