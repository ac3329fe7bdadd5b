"""Reading the keyed state of one snapshot handle, whatever backend wrote it.

A checkpoint's metadata holds, per operator instance, a ``keyed_state`` handle whose
``backend`` field names the state backend that wrote it. A *state reader* turns a handle into
``(key group, state name, key, value)`` entries; this module dispatches on ``backend`` to one
of the registered readers (``heap`` and ``rocksdb`` are built in), so a new backend plugs in
with :func:`register_state_reader` without touching the checkpoint reader. Source: Flink's
State Processor API, which reads savepoints of any state backend through the backend's own
restore path.

Keys come back as the program's ``key_by`` returned them (heap) or in their canonical form
(RocksDB stores :func:`reactive.key_encoding.encode_key` bytes: ``True`` reads back as ``1``,
a ``NamedTuple`` as a tuple); keys that a ``key_by`` key serializer wrote into a RocksDB
snapshot stay bytes.
"""

from __future__ import annotations

import pickle
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from reactive.errors import RestoreError
from reactive.key_encoding import KEY_ENCODING, decode_key
from reactive.keygroups import KeyGroupRange
from reactive.serialization import Serializer

__all__ = ["StateEntry", "StateReader", "read_keyed_state", "register_state_reader",
           "supported_backends"]

#: ``(key group, state name, key, value)``
StateEntry = tuple[int, str, Any, Any]

#: ``reader(handle, job_dir, max_parallelism, deserializer)`` yields the handle's entries
StateReader = Callable[[dict[str, Any], Path, int, Serializer | None], Iterator[StateEntry]]

_READERS: dict[str, StateReader] = {}


def register_state_reader(backend: str, reader: StateReader) -> None:
    """Make handles whose ``backend`` field is ``backend`` readable (replaces an earlier one).

    Args:
        backend: the value of the handle's ``backend`` field (the backend's ``name``).
        reader: yields ``(key group, state name, key, value)``; values deserialized when the
            backend stores bytes (with the given serializer, else the backend's default).
    """
    _READERS[backend] = reader


def supported_backends() -> list[str]:
    """The backends whose snapshots can be read."""
    return sorted(_READERS)


def read_keyed_state(handle: dict[str, Any], job_dir: Path, max_parallelism: int,
                     key_group_range: KeyGroupRange | None = None,
                     deserializer: Serializer | None = None) -> Iterator[StateEntry]:
    """Yield the ``(key group, state name, key, value)`` entries of a ``keyed_state`` handle.

    Args:
        handle: the handle from a checkpoint's metadata.
        job_dir: the directory the handle's paths are relative to.
        max_parallelism: the checkpoint's (to compute key groups where the format does not
            store them).
        key_group_range: only entries of these key groups (the instance's own range).
        deserializer: for values the backend stores as bytes (custom serializers; every
            RocksDB value): how to decode them; None = the backend's default (heap: leave
            custom-serialized values as bytes; RocksDB: pickle).

    Raises:
        RestoreError: for a backend no reader is registered for ("unsupported backend"),
            or a file that cannot be read.
    """
    backend = handle.get("backend")
    reader = _READERS.get(str(backend))
    if reader is None:
        raise RestoreError(
            f"unsupported backend {backend!r} (format {handle.get('format')!r}): the PySpark "
            f"bridge reads {supported_backends()}; register a reader with "
            "connectors.spark.register_state_reader"
        )
    for entry in reader(handle, job_dir, max_parallelism, deserializer):
        if key_group_range is None or entry[0] in key_group_range:
            yield entry


def _read_heap(handle: dict[str, Any], job_dir: Path, max_parallelism: int,
               deserializer: Serializer | None) -> Iterator[StateEntry]:
    from backends.heap import iter_heap_key_groups

    for kg, serialized, data in iter_heap_key_groups(handle, job_dir):
        for name, entries in data.items():
            decode = deserializer.deserialize if (deserializer and name in serialized) else None
            for key, value in entries.items():
                yield kg, name, key, decode(value) if decode else value


def _read_rocksdb(handle: dict[str, Any], job_dir: Path, max_parallelism: int,
                  deserializer: Serializer | None) -> Iterator[StateEntry]:
    try:
        from backends.rocksdb import iter_rocksdb_entries
    except ImportError as exc:  # rocksdict missing
        raise RestoreError(f"reading a RocksDB snapshot needs rocksdict: {exc}") from exc
    decode = deserializer.deserialize if deserializer is not None else pickle.loads
    # keys a key_by key serializer wrote cannot be decoded here: they stay bytes
    canonical = handle.get("key_encoding", KEY_ENCODING) == KEY_ENCODING
    scratch_root = Path(tempfile.mkdtemp(prefix="reactive-spark-rocksdb-"))
    try:
        # the RocksDB reader materializes the files under a directory that must not exist
        for kg, name, key, value in iter_rocksdb_entries(handle, job_dir, scratch_root / "db"):
            try:
                plain_key = decode_key(key) if canonical else key
            except ValueError as exc:
                raise RestoreError(f"state {name!r}: cannot decode a RocksDB key: {exc}") from exc
            yield kg, name, plain_key, decode(value)
    finally:
        shutil.rmtree(scratch_root, ignore_errors=True)


register_state_reader("heap", _read_heap)
register_state_reader("rocksdb", _read_rocksdb)
