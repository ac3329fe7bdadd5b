"""Reading a RocksDB snapshot handle without a running backend: its entries as stored, or its
key groups as a neutral key-group stream (:mod:`reactive.state.key_group_stream`).

The one reader of the ``rocksdb-v1`` format: the handle's files are laid out in a scratch
directory (SST files hard-linked), opened read-only, and only the key range of the wanted key
groups is iterated (:mod:`.keys`). :func:`iter_rocksdb_key_groups` is registered as the
``"rocksdb"`` key-group reader (by ``backends/__init__.py``): the heap backend restores RocksDB
snapshots with it, and the PySpark bridge and tests read checkpoints with it.
"""

from __future__ import annotations

import pickle
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

from reactive.errors import RestoreError
from reactive.key_encoding import KEY_ENCODING, decode_key
from reactive.keygroups import KeyGroupRange
from reactive.state.key_group_stream import KeyDecoder, KeyGroupState, KeyGroupStream

from .db import BACKEND, check_handle, materialize, open_db, options
from .keys import KEY_GROUP_BYTES, PREFIX_BYTES, key_group_bounds, key_group_of, state_id

__all__ = ["iter_rocksdb_entries", "iter_rocksdb_key_groups", "read_rocksdb_snapshot"]


def _key_decoder(handle: dict[str, Any],
                 key_decoder: Callable[[bytes], Any] | None) -> Callable[[bytes], Any]:
    """``key_decoder``, else the canonical decoder for canonical handles and raw bytes for
    handles whose keys a ``key_by`` key serializer wrote; errors become RestoreError."""
    if key_decoder is None:
        if handle.get("key_encoding", KEY_ENCODING) != KEY_ENCODING:
            return bytes
        key_decoder = decode_key
    decode = key_decoder

    def checked(data: bytes) -> Any:
        try:
            return decode(data)
        except Exception as exc:
            raise RestoreError(f"cannot decode the RocksDB key {data[:40]!r}: {exc}") from exc

    return checked


def iter_rocksdb_entries(
    handle: dict[str, Any], job_dir: Path, scratch: Path,
    key_group_range: KeyGroupRange | None = None,
) -> Iterator[tuple[int, str, bytes, bytes]]:
    """Yield ``(key group, state name, key bytes, value bytes)`` for every entry of a RocksDB
    snapshot handle in ``key_group_range`` (all when None), in key-group order, as stored:
    keys in the handle's ``key_encoding`` (:func:`reactive.key_encoding.decode_key` reads
    canonical ones), values in the descriptor's serializer's bytes (pickle by default). Only
    the key range of the wanted key groups is iterated.

    Args:
        handle: a ``keyed_state`` handle of this backend.
        job_dir: the directory its paths are relative to.
        scratch: a directory that does not exist yet, used (and removed) to open the files.
        key_group_range: the key groups to read.

    Raises:
        RestoreError: if the handle is not a RocksDB snapshot or its files are unreadable.
    """
    check_handle(handle)
    names = {state_id(name): name for name in handle.get("states", {})}
    old_start, old_end = handle["key_group_range"]
    start, end = old_start, old_end
    if key_group_range is not None:
        start, end = max(start, key_group_range.start), min(end, key_group_range.end)
    if start > end:
        return
    materialize(handle, job_dir, scratch)
    try:
        try:
            db = open_db(scratch, options(4 << 20, None), read_only=True)
        except Exception as exc:
            raise RestoreError(f"cannot open the RocksDB snapshot: {exc}") from exc
        try:
            lower, upper = key_group_bounds(start, end)
            for k, v in db.items(from_key=lower):
                k = cast(bytes, k)  # raw mode: keys are bytes
                if upper is not None and k >= upper:
                    break
                name = names.get(k[KEY_GROUP_BYTES:PREFIX_BYTES])
                if name is not None:
                    yield key_group_of(k), name, k[PREFIX_BYTES:], cast(bytes, v)
        finally:
            db.close()
            del db
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def read_rocksdb_snapshot(handle: dict[str, Any], job_dir: Path, scratch: Path,
                          key_decoder: Callable[[bytes], Any] | None = None,
                          ) -> dict[str, dict[Any, bytes]]:
    """Read a RocksDB snapshot handle into ``{state name: {key: value bytes}}``.

    Values stay as the descriptor's serializer wrote them (pickle by default). Used by tools
    that inspect checkpoints and by tests.

    Args:
        handle: a ``keyed_state`` handle from a checkpoint's metadata.
        job_dir: the job directory its paths are relative to.
        scratch: a directory that does not exist yet, used (and removed) to open the files.
        key_decoder: key bytes -> key (e.g. the ``key_by`` key serializer's
            ``deserialize``); None decodes canonical keys and leaves keys that a key
            serializer wrote as bytes.

    Raises:
        RestoreError: if the handle is not a RocksDB snapshot, its files are unreadable, or
            a key cannot be decoded.
    """
    decode = _key_decoder(handle, key_decoder)
    out: dict[str, dict[Any, bytes]] = {}
    for _, name, key, value in iter_rocksdb_entries(handle, job_dir, scratch):
        out.setdefault(name, {})[decode(key)] = value
    return out


def iter_rocksdb_key_groups(
    handle: dict[str, Any], job_dir: Path, scratch: Path | None = None,
    key_group_range: KeyGroupRange | None = None,
    key_decoder: KeyDecoder | None = None,
) -> KeyGroupStream:
    """Read a RocksDB snapshot handle as a key-group stream (one key group in memory at a
    time, in order), reading only the key range of the key groups in ``key_group_range``.

    Values of the states the handle lists in ``custom_serializers`` stay that serializer's
    bytes (they are the key groups' ``serialized`` names); the others are unpickled. The
    stream's ``kinds`` are the handle's ``states``.

    Args:
        handle: a ``keyed_state`` handle of this backend.
        job_dir: the directory its paths are relative to.
        scratch: a directory that does not exist yet, used (and removed) to open the files;
            None: a new temporary directory.
        key_group_range: the key groups to read (all when None).
        key_decoder: key bytes -> key (the ``key_by`` key serializer's ``deserialize``);
            None decodes canonical keys and leaves keys that a key serializer wrote as bytes.

    Raises:
        RestoreError: if the handle is not a RocksDB snapshot (at once); if its files are
            unreadable or a key cannot be decoded (while iterating).
    """
    check_handle(handle)
    custom = frozenset(handle.get("custom_serializers", ()))
    decode = _key_decoder(handle, key_decoder)

    def key_groups() -> Iterator[KeyGroupState]:
        temp = None
        where = scratch
        if where is None:
            temp = Path(tempfile.mkdtemp(prefix="reactive-rocksdb-read-"))
            where = temp / "db"
        try:
            current = -1
            data: dict[str, dict[Any, Any]] = {}
            for kg, name, key, v in iter_rocksdb_entries(handle, job_dir, where,
                                                         key_group_range):
                if kg != current:
                    if data:
                        yield KeyGroupState(current, custom, data)
                    current, data = kg, {}
                data.setdefault(name, {})[decode(key)] = v if name in custom else pickle.loads(v)
            if data:
                yield KeyGroupState(current, custom, data)
        finally:
            if temp is not None:
                shutil.rmtree(temp, ignore_errors=True)

    kinds = {name: kind for name, kind in handle.get("states", {}).items() if kind is not None}
    return KeyGroupStream(key_groups(), backend=BACKEND,
                          key_encoding=handle.get("key_encoding", KEY_ENCODING), kinds=kinds)
