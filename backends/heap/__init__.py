"""The heap state backend: keyed state in Python dicts, one dict per (state, key group), with
full asynchronous copy-on-write snapshots.

``from reactive.backends.heap import HeapStateBackend`` is the public entry point. The package's
modules, one job each:

- :mod:`.backend`: the keyed backend of one operator instance (key groups of keys, state
  tables, snapshot and restore orchestration) and the :class:`HeapStateBackend` factory;
- :mod:`.state`: the state tables and the value/list/map/reducing state objects;
- :mod:`.snapshot`: the copy-on-write snapshot (synchronous marking, asynchronous writing);
- :mod:`.format`: the ``heap-v1`` snapshot file: its writer and its one reader (a key-group
  stream, :mod:`reactive.state.key_group_stream`), used by the backend, by the RocksDB
  backend's restore (through the key-group reader registry), the PySpark bridge and tests.

Snapshots of the RocksDB backend are restored through the registry too (``backends``
registers its readers), so this package never imports another backend.
"""

from .backend import HeapKeyedStateBackend, HeapStateBackend
from .format import FORMAT, iter_heap_key_groups, read_heap_snapshot, write_heap_snapshot

__all__ = [
    "FORMAT",
    "HeapKeyedStateBackend",
    "HeapStateBackend",
    "iter_heap_key_groups",
    "read_heap_snapshot",
    "write_heap_snapshot",
]
