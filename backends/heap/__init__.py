"""The heap state backend: keyed state in Python dicts, one dict per (state, key group), with
asynchronous snapshots that copy on write per key, full or incremental.

``from reactive.backends.heap import HeapStateBackend`` is the public entry point
(``HeapStateBackend(incremental=True)`` for incremental checkpoints). The package's modules,
one job each:

- :mod:`.backend`: the keyed backend of one operator instance (key groups of keys, state
  tables, snapshot and restore orchestration) and the :class:`HeapStateBackend` factory;
- :mod:`.state`: the state tables and the value/list/map/reducing state objects;
- :mod:`.snapshot`: the snapshots (synchronous planning, per-key copy-on-write, asynchronous
  serialization in pieces);
- :mod:`.fork_snapshot`: snapshots written by a forked child process on another core
  (``HeapStateBackend(snapshot="fork")``);
- :mod:`.changelog`: dirty keys since the last completed checkpoint, chains of blobs per key
  group, and when a key group is materialized again;
- :mod:`.file_writer`: writing, hashing and syncing a snapshot file in a worker thread;
- :mod:`.pacing`: a snapshot's bounded share of the event loop thread;
- :mod:`.format`: the ``heap-v1`` and ``heap-v2`` formats: the encodings and the one reader
  (a key-group stream, :mod:`reactive.state.key_group_stream`), used by the backend, by the
  RocksDB backend's restore (through the key-group reader registry), the PySpark bridge and
  tests.

Snapshots of the RocksDB backend are restored through the registry too (``backends``
registers its readers), so this package never imports another backend.
"""

from .backend import HeapKeyedStateBackend, HeapStateBackend
from .format import (
    FORMAT,
    FORMAT_V2,
    iter_heap_key_groups,
    read_heap_snapshot,
    write_heap_snapshot,
)

__all__ = [
    "FORMAT",
    "FORMAT_V2",
    "HeapKeyedStateBackend",
    "HeapStateBackend",
    "iter_heap_key_groups",
    "read_heap_snapshot",
    "write_heap_snapshot",
]
