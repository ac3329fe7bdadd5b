"""The heap snapshot format ``heap-v1``: its one writer of files and its one reader.

A heap snapshot is one file of pickled key groups plus an index in its handle (the heap
backend's form of Flink's ``KeyGroupsStateHandle``: key group -> offset in the file)::

    file:    blob(kg a) | blob(kg b) | ...   each blob = pickle((serialized names, states))
    handle:  {"backend": "heap", "format": "heap-v1",
              "files": [{"path", "size", "sha256"}],
              "key_groups": {"<kg>": [offset, length]},
              "key_encoding": "canonical-v1" | "custom"}

where ``states`` is ``{state name: {key: value}}`` with keys as the Python objects themselves
and values as stored by the backend, except for the states listed in ``serialized``, whose
values are their descriptor's custom serializer's bytes. This is exactly the neutral
:class:`~reactive.state.key_group_stream.KeyGroupState`, so reading needs no conversion.

Used by the heap backend (its snapshots and restores), by any backend restoring a heap
snapshot (through the key-group reader registry, see ``backends/__init__.py``), by the PySpark
bridge (reading checkpoints, writing savepoints) and by tests.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from reactive.checkpoint.durable_files import write_atomic
from reactive.errors import RestoreError
from reactive.key_encoding import KEY_ENCODING
from reactive.keygroups import KeyGroupRange
from reactive.state.key_group_stream import (
    KeyDecoder,
    KeyGroupState,
    KeyGroupStream,
    merge_key_groups,
)

__all__ = [
    "BACKEND",
    "FORMAT",
    "encode_key_group",
    "heap_handle",
    "is_heap_handle",
    "iter_heap_key_groups",
    "read_heap_snapshot",
    "write_heap_snapshot",
]

#: the ``"backend"`` of heap snapshot handles
BACKEND = "heap"
#: the ``"format"`` of heap snapshot handles
FORMAT = "heap-v1"


def encode_key_group(serialized: list[str], states: dict[str, dict[Any, Any]]) -> bytes:
    """Return the blob of one key group (pickle, at C speed).

    Args:
        serialized: the names of the states whose values are custom serializer bytes.
        states: ``{state name: {key: value}}``.

    Raises:
        Exception: whatever pickle raises for an entry it cannot serialize.
    """
    return pickle.dumps((serialized, states), protocol=pickle.HIGHEST_PROTOCOL)


def heap_handle(path: str, size: int, sha256: str, key_groups: dict[str, list[int]],
                key_encoding: str) -> dict[str, Any]:
    """Return the handle of a heap snapshot file.

    Args:
        path: the file's path relative to the job directory.
        size: its size in bytes.
        sha256: its SHA-256, hex.
        key_groups: ``{"<key group>": [offset, length]}`` of its blobs, offsets in bytes.
        key_encoding: how the keys' key groups were computed (the handle's marker).
    """
    return {
        "backend": BACKEND,
        "format": FORMAT,
        "files": [{"path": path, "size": size, "sha256": sha256}],
        "key_groups": key_groups,
        "key_encoding": key_encoding,
    }


def is_heap_handle(handle: dict[str, Any]) -> bool:
    """Whether ``handle`` is a snapshot of this format."""
    return handle.get("backend") == BACKEND and handle.get("format") == FORMAT


def iter_heap_key_groups(
    handle: dict[str, Any], job_dir: Path, key_group_range: KeyGroupRange | None = None,
    *, key_decoder: KeyDecoder | None = None,
) -> KeyGroupStream:
    """Read a heap snapshot handle as a key-group stream: one key group in memory at a time;
    key groups outside ``key_group_range`` are not read.

    The reader the heap backend restores with, registered as the ``"heap"`` key-group reader.

    Args:
        handle: a heap snapshot handle.
        job_dir: the job directory its paths are relative to.
        key_group_range: only these key groups; None: all.
        key_decoder: ignored (heap snapshots store the keys themselves).

    Returns:
        the key groups, in the file's order (ascending for the backend's snapshots).

    Raises:
        RestoreError: if the handle is not a heap snapshot (at once), or its file cannot be
            read (while iterating).
    """
    if not is_heap_handle(handle):
        raise RestoreError(f"not a heap snapshot handle: {handle.get('backend')!r} "
                           f"({handle.get('format')})")
    path = job_dir / handle["files"][0]["path"]
    index: dict[str, list[int]] = handle["key_groups"]

    def key_groups() -> Iterator[KeyGroupState]:
        try:
            with open(path, "rb") as f:
                for kg_str, (offset, length) in index.items():
                    kg = int(kg_str)
                    if key_group_range is not None and kg not in key_group_range:
                        continue
                    f.seek(offset)
                    serialized, states = pickle.loads(f.read(length))
                    yield KeyGroupState(kg, frozenset(serialized), states)
        except (OSError, pickle.UnpicklingError, EOFError, ValueError) as exc:
            raise RestoreError(f"cannot read heap snapshot {path}: {exc}") from exc

    return KeyGroupStream(key_groups(), backend=BACKEND,
                          key_encoding=handle.get("key_encoding", KEY_ENCODING))


def read_heap_snapshot(handle: dict[str, Any], job_dir: Path) -> dict[str, dict[Any, Any]]:
    """Read a heap snapshot handle into ``{state name: {key: value}}`` (all key groups).

    Values written with a descriptor's custom serializer stay bytes. Used by tools that
    inspect checkpoints (and tests that compare a checkpoint with the expected state).

    Raises:
        RestoreError: if the handle is not a heap snapshot or its file is unreadable.
    """
    return merge_key_groups(iter_heap_key_groups(handle, job_dir))


def write_heap_snapshot(
    path: Path, job_dir: Path, key_groups: Iterable[tuple[int, dict[str, dict[Any, Any]]]],
    key_encoding: str = KEY_ENCODING,
) -> dict[str, Any]:
    """Write keyed state as a heap snapshot file (atomically) and return its handle, the
    same ``keyed_state`` handle a checkpoint of the heap backend holds (for savepoints
    written outside a running job, e.g. the PySpark bridge's ``SavepointWriter``).

    Args:
        path: the file to write, inside ``job_dir`` (e.g. ``<job_dir>/chk-1/uid-0.heap``).
        job_dir: the job directory the handle's path is relative to.
        key_groups: ``(key group, {state name: {key: value}})`` pairs, each key group at most
            once; values are stored as given (restored as is, whatever the descriptor's
            serializer); key groups without entries are skipped.
        key_encoding: how the key groups were computed from the keys (see
            :func:`reactive.key_encoding.key_encoding_name`); a restore checks it.

    Returns:
        ``{"backend": "heap", "format": "heap-v1", "files": [{path, size, sha256}],
        "key_groups": {kg: [offset, length]}, "key_encoding": key_encoding}``.

    Raises:
        OSError: if the file cannot be written.
    """
    index: dict[str, list[int]] = {}

    def blobs() -> Iterator[bytes]:
        offset = 0
        for kg, data in key_groups:
            data = {name: d for name, d in data.items() if d}
            if not data:
                continue
            blob = encode_key_group([], data)
            index[str(kg)] = [offset, len(blob)]
            offset += len(blob)
            yield blob

    size, sha = write_atomic(path, blobs())
    return heap_handle(path.relative_to(job_dir).as_posix(), size, sha, index, key_encoding)
