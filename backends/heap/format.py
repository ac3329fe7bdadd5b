"""The heap snapshot formats ``heap-v1`` and ``heap-v2``: their writers' encodings and their one
reader.

Both split keyed state by key group (the heap backend's form of Flink's
``KeyGroupsStateHandle``: key group -> where its bytes are). In both, the states of a key
group are ``{state name: {key: value}}`` with keys as the Python objects themselves and values
as stored by the backend, except for the states listed as *serialized*, whose values are their
descriptor's custom serializer's bytes: exactly the neutral
:class:`~reactive.state.key_group_stream.KeyGroupState`.

``heap-v1``: one file, one blob per key group (written by :func:`write_heap_snapshot`, e.g. by
the PySpark bridge's savepoint writer)::

    file:    blob(kg a) | blob(kg b) | ...   each blob = pickle((serialized names, states))
    handle:  {"backend": "heap", "format": "heap-v1",
              "files": [{"path", "size", "sha256"}],
              "key_groups": {"<kg>": [offset, length]},
              "key_encoding": "canonical-v1" | "custom"}

``heap-v2`` (the backend's snapshots): each key group is a *chain* of blobs, replayed in order
(Flink's changelog state backend, FLIP-158: a materialized base plus the changes since; SDG
paper section 5, "dirty state")::

    handle:  {"backend": "heap", "format": "heap-v2", "mode": "full" | "incremental",
              "files": [{"path", "size", "sha256"}, ...],   every file a chain names
              "shared": [...], "shared_reused": [...],       (incremental: under shared/)
              "key_groups": {"<kg>": [[file index, offset, length, "f" | "d"], ...]},
              "key_encoding": ...}

A blob is a sequence of pickles (*frames*) so that the writer can serialize a large key group
in pieces: a header ``(kind, serialized names)``, then any of

- ``("p", state, {key: value})`` / ``("pk", state, [keys], [values])``: put entries;
- ``("k", [keys], {state: {key: value}})``: replace every state of these keys by the given
  values (a listed key missing from a state's dict no longer holds it there: a tombstone);
  the keys are distinct and the dicts name listed keys only.

A *full* blob (kind ``"f"``) starts from an empty key group, a *delta* (``"d"``) applies to
what the chain built so far; a chain may start with a delta (the key group was empty before).
:func:`iter_heap_key_groups` reads both formats, one key group in memory at a time. Used by the
heap backend (its snapshots and restores), by any backend restoring a heap snapshot (through
the key-group reader registry, see ``backends/__init__.py``), by the PySpark bridge (reading
checkpoints, writing savepoints) and by tests.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from reactive.checkpoint.durable_files import resolve_under, write_atomic
from reactive.errors import CorruptCheckpointError, RestoreError
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
    "DELTA",
    "FORMAT",
    "FORMAT_V2",
    "FULL",
    "apply_blob",
    "encode_frame",
    "encode_key_group",
    "heap_handle",
    "heap_v2_handle",
    "is_heap_handle",
    "iter_heap_key_groups",
    "read_heap_snapshot",
    "write_heap_snapshot",
]

#: the ``"backend"`` of heap snapshot handles
BACKEND = "heap"
#: the ``"format"`` of single-file heap snapshot handles (one blob per key group)
FORMAT = "heap-v1"
#: the ``"format"`` of chained heap snapshot handles (full blobs and deltas per key group)
FORMAT_V2 = "heap-v2"
#: chain entry kind: a full key group (replay starts from empty)
FULL = "f"
#: chain entry kind: the changes to a key group since the previous entry
DELTA = "d"

_PROTOCOL = pickle.HIGHEST_PROTOCOL


def encode_key_group(serialized: list[str], states: dict[str, dict[Any, Any]]) -> bytes:
    """Return the ``heap-v1`` blob of one key group (pickle, at C speed).

    Args:
        serialized: the names of the states whose values are custom serializer bytes.
        states: ``{state name: {key: value}}``.

    Raises:
        Exception: whatever pickle raises for an entry it cannot serialize.
    """
    return pickle.dumps((serialized, states), protocol=_PROTOCOL)


def encode_frame(frame: tuple[Any, ...], memo: bool = False) -> bytes:
    """Return one ``heap-v2`` frame (a header or an operation, see the module docstring),
    pickled without the memo (``Pickler.fast``) unless ``memo``.

    The memo (a dict of every object pickled so far) is most of pickle's cost on a large
    key group (7x at a million small entries); without it an object referenced twice in a
    frame is written twice and comes back as two equal objects (state values are copies,
    as in Flink's serializers). A cyclic value makes fast mode fail: that frame is pickled
    again with the memo. ``memo=True`` suits the ``"k"`` frames, which name each key twice.

    Raises:
        Exception: whatever pickle raises for an entry it cannot serialize.
    """
    if memo:
        return pickle.dumps(frame, protocol=_PROTOCOL)
    buf = io.BytesIO()
    pickler = pickle.Pickler(buf, _PROTOCOL)
    pickler.fast = True
    try:
        pickler.dump(frame)
    except ValueError:  # "fast mode: can't pickle cyclic objects": the memo handles cycles
        return pickle.dumps(frame, protocol=_PROTOCOL)
    return buf.getvalue()


def apply_blob(blob: bytes, states: dict[str, dict[Any, Any]], serialized: set[str]) -> None:
    """Replay one ``heap-v2`` blob onto a key group's ``states`` (in place).

    Args:
        blob: a full or delta blob.
        states: ``{state name: {key: value}}`` built by the chain so far (emptied first by
            a full blob); may keep empty dicts.
        serialized: names of the states whose values are custom serializer bytes (updated).

    Raises:
        pickle.UnpicklingError, EOFError, ValueError: for a damaged blob.
    """
    f = io.BytesIO(blob)
    kind, names = pickle.load(f)
    if kind == FULL:
        states.clear()
        serialized.clear()
    elif kind != DELTA:
        raise ValueError(f"unknown heap-v2 blob kind {kind!r}")
    serialized.update(names)
    end = len(blob)
    while f.tell() < end:
        frame = pickle.load(f)
        op = frame[0]
        # the unpickled dicts are fresh: a state seen for the first time adopts them rather
        # than copying (a full blob's frame becomes the key group's dict as it is)
        if op == "p":
            d = states.get(frame[1])
            if d:
                d.update(frame[2])
            else:
                states[frame[1]] = frame[2]
        elif op == "pk":
            states.setdefault(frame[1], {}).update(zip(frame[2], frame[3], strict=True))
        elif op == "k":
            # only the tombstones need a Python loop: the rest is C-speed set and dict work
            keys = frame[1]
            puts: dict[str, dict[Any, Any]] = frame[2]
            listed: set[Any] | None = None
            for name, d in states.items():
                if not d:
                    continue
                entries = puts.get(name)
                if entries is not None and len(entries) == len(keys):
                    # puts name listed keys only: as many as listed means no tombstone
                    # here (the common case, which then builds no set at all)
                    continue
                if listed is None:
                    listed = set(keys)
                gone = listed if entries is None else listed.difference(entries)
                if gone:
                    pop = d.pop
                    for key in gone.intersection(d):
                        pop(key)
            for name, entries in puts.items():
                d = states.get(name)
                if d:
                    d.update(entries)
                else:
                    states[name] = entries
        else:
            raise ValueError(f"unknown heap-v2 frame {op!r}")


def heap_handle(path: str, size: int, sha256: str, key_groups: dict[str, list[int]],
                key_encoding: str) -> dict[str, Any]:
    """Return the ``heap-v1`` handle of a heap snapshot file.

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


def heap_v2_handle(*, mode: str, files: list[dict[str, Any]], shared: list[dict[str, Any]],
                   reused: list[dict[str, Any]], key_groups: dict[str, list[list[Any]]],
                   key_encoding: str) -> dict[str, Any]:
    """Return a ``heap-v2`` handle.

    Args:
        mode: ``"full"`` (self-contained: every chain is one full blob in this checkpoint's
            own file) or ``"incremental"`` (chains over files under ``shared/``).
        files: every file the chains name, ``{"path", "size" (bytes), "sha256"}``, in the
            order the chains' file indexes refer to.
        shared: the refs of ``files`` under the job's ``shared/`` folder (reference counted
            by the runtime).
        reused: the refs of ``shared`` written by earlier checkpoints (not counted in this
            checkpoint's size).
        key_groups: ``{"<key group>": [[file index, offset, length, kind], ...]}``, offsets
            and lengths in bytes, kind :data:`FULL` or :data:`DELTA`, in replay order.
        key_encoding: how the keys' key groups were computed (the handle's marker).
    """
    return {
        "backend": BACKEND,
        "format": FORMAT_V2,
        "mode": mode,
        "files": files,
        "shared": shared,
        "shared_reused": reused,
        "key_groups": key_groups,
        "key_encoding": key_encoding,
    }


def is_heap_handle(handle: dict[str, Any]) -> bool:
    """Whether ``handle`` is a heap snapshot of a format this module reads."""
    return handle.get("backend") == BACKEND and handle.get("format") in (FORMAT, FORMAT_V2)


def iter_heap_key_groups(
    handle: dict[str, Any], job_dir: Path, key_group_range: KeyGroupRange | None = None,
    *, key_decoder: KeyDecoder | None = None,
) -> KeyGroupStream:
    """Read a heap snapshot handle (``heap-v1`` or ``heap-v2``) as a key-group stream: one key
    group in memory at a time (a ``heap-v2`` chain is replayed: full blob, then deltas with
    their tombstones); key groups outside ``key_group_range`` are not read.

    The reader the heap backend restores with, registered as the ``"heap"`` key-group reader.

    Args:
        handle: a heap snapshot handle.
        job_dir: the job directory its paths are relative to.
        key_group_range: only these key groups; None: all.
        key_decoder: ignored (heap snapshots store the keys themselves).

    Returns:
        the non-empty key groups, in the handle's order (ascending for the backend's
        snapshots).

    Raises:
        RestoreError: if the handle is not a heap snapshot (at once), or a file cannot be
            read or a blob is damaged (while iterating).
    """
    if not is_heap_handle(handle):
        raise RestoreError(f"not a heap snapshot handle: {handle.get('backend')!r} "
                           f"({handle.get('format')})")
    groups = _iter_v1(handle, job_dir, key_group_range) if handle["format"] == FORMAT \
        else _iter_v2(handle, job_dir, key_group_range)
    return KeyGroupStream(groups, backend=BACKEND,
                          key_encoding=handle.get("key_encoding", KEY_ENCODING))


def _iter_v1(handle: dict[str, Any], job_dir: Path,
             key_group_range: KeyGroupRange | None) -> Iterator[KeyGroupState]:
    path = job_dir / handle["files"][0]["path"]
    index: dict[str, list[int]] = handle["key_groups"]
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


def _iter_v2(handle: dict[str, Any], job_dir: Path,
             key_group_range: KeyGroupRange | None) -> Iterator[KeyGroupState]:
    refs: list[dict[str, Any]] = handle["files"]
    index: dict[str, list[list[Any]]] = handle["key_groups"]
    opened: dict[int, IO[bytes]] = {}
    path: Path | str = "?"
    try:
        for kg_str, chain in index.items():
            kg = int(kg_str)
            if key_group_range is not None and kg not in key_group_range:
                continue
            states: dict[str, dict[Any, Any]] = {}
            serialized: set[str] = set()
            for file_index, offset, length, _kind in chain:
                f = opened.get(file_index)
                if f is None:
                    path = resolve_under(job_dir, refs[file_index]["path"])
                    f = opened[file_index] = open(path, "rb")  # noqa: SIM115 - closed below
                path = f.name
                f.seek(offset)
                blob = f.read(length)
                if len(blob) != length:
                    raise EOFError(f"key group {kg}: {length} bytes at {offset} expected, "
                                   f"{len(blob)} read")
                apply_blob(blob, states, serialized)
            states = {name: d for name, d in states.items() if d}
            if states:
                yield KeyGroupState(kg, frozenset(serialized & states.keys()), states)
    except (OSError, pickle.UnpicklingError, EOFError, ValueError, IndexError,
            CorruptCheckpointError) as exc:
        raise RestoreError(f"cannot read heap snapshot {path}: {exc}") from exc
    finally:
        for f in opened.values():
            f.close()


def read_heap_snapshot(handle: dict[str, Any], job_dir: Path) -> dict[str, dict[Any, Any]]:
    """Read a heap snapshot handle into ``{state name: {key: value}}`` (all key groups).

    Values written with a descriptor's custom serializer stay bytes. Used by tools that
    inspect checkpoints (and tests that compare a checkpoint with the expected state).

    Raises:
        RestoreError: if the handle is not a heap snapshot or a file is unreadable.
    """
    return merge_key_groups(iter_heap_key_groups(handle, job_dir))


def write_heap_snapshot(
    path: Path, job_dir: Path, key_groups: Iterable[tuple[int, dict[str, dict[Any, Any]]]],
    key_encoding: str = KEY_ENCODING,
) -> dict[str, Any]:
    """Write keyed state as a ``heap-v1`` snapshot file (atomically) and return its handle, a
    ``keyed_state`` handle the heap backend restores (for savepoints written outside a
    running job, e.g. the PySpark bridge's ``SavepointWriter``).

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
