"""Built-in state backends: heap (Python dicts, :mod:`reactive.backends.heap`) and RocksDB
(:mod:`reactive.backends.rocksdb`).

The two never import each other: a restore of the other one's snapshot (heap <-> RocksDB,
through any checkpoint or savepoint) reads it as a neutral key-group stream
(:mod:`reactive.state.key_group_stream`) from the reader registered for the handle's
``"backend"``. Importing this package registers the built-in readers; each imports its
backend's reader module only when first called, so registering costs nothing and the RocksDB
reader needs rocksdict only when a RocksDB snapshot is read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reactive.errors import RestoreError
from reactive.keygroups import KeyGroupRange
from reactive.state.key_group_stream import (
    KeyDecoder,
    KeyGroupStream,
    register_key_group_reader,
)

__all__: list[str] = []


def _read_heap(handle: dict[str, Any], job_dir: Path, *,
               key_group_range: KeyGroupRange | None = None,
               key_decoder: KeyDecoder | None = None) -> KeyGroupStream:
    """The ``"heap"`` key-group reader: :func:`reactive.backends.heap.format.iter_heap_key_groups`."""
    from .heap.format import iter_heap_key_groups

    return iter_heap_key_groups(handle, job_dir, key_group_range, key_decoder=key_decoder)


def _read_rocksdb(handle: dict[str, Any], job_dir: Path, *,
                  key_group_range: KeyGroupRange | None = None,
                  key_decoder: KeyDecoder | None = None) -> KeyGroupStream:
    """The ``"rocksdb"`` key-group reader:
    :func:`reactive.backends.rocksdb.reader.iter_rocksdb_key_groups` (in a temporary directory).

    Raises:
        RestoreError: if rocksdict is not installed.
    """
    try:
        from .rocksdb.reader import iter_rocksdb_key_groups
    except ImportError as exc:  # rocksdict not installed
        raise RestoreError(f"reading a RocksDB snapshot needs rocksdict: {exc}") from exc
    return iter_rocksdb_key_groups(handle, job_dir, None, key_group_range, key_decoder)


def _read_columnar(handle: dict[str, Any], job_dir: Path, *,
                   key_group_range: KeyGroupRange | None = None,
                   key_decoder: KeyDecoder | None = None) -> KeyGroupStream:
    """The ``"columnar-heap"`` key-group reader (the columnar aggregates' state):
    :func:`reactive.columnar.state.iter_columnar_key_groups`, registered here too so that
    a process that reads checkpoints without building a columnar program reads it.

    Raises:
        RestoreError: if pyarrow is not installed.
    """
    try:
        from reactive.columnar.state import iter_columnar_key_groups
    except ImportError as exc:  # pyarrow not installed
        raise RestoreError(f"reading a columnar snapshot needs pyarrow: {exc}") from exc
    return iter_columnar_key_groups(handle, job_dir, key_group_range=key_group_range,
                                    key_decoder=key_decoder)


register_key_group_reader("heap", _read_heap)
register_key_group_reader("rocksdb", _read_rocksdb)
register_key_group_reader("columnar-heap", _read_columnar)
