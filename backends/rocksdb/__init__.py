"""The RocksDB state backend: keyed state in an embedded RocksDB (rocksdict), with
asynchronous and incremental snapshots (Carbone 2018 (PhD thesis), sections 4.2, 4.5.1 and
4.5.2; Flink's ``EmbeddedRocksDBStateBackend``).

``from reactive.backends.rocksdb import RocksDBStateBackend`` is the public entry point. The package's
modules, one job each:

- :mod:`.keys`: the RocksDB key layout ``key group | state id | key bytes``;
- :mod:`.db`: RocksDB options and opening databases (working ones, and snapshot files laid
  out as one); the identity of this backend's handles;
- :mod:`.state`: the write-back cache in front of RocksDB and the state objects;
- :mod:`.generations`: the cache generations a snapshot freezes, and the local phase that
  writes them to RocksDB and takes the local RocksDB checkpoint off the task;
- :mod:`.snapshot`: full and incremental snapshots (frozen generation, local RocksDB
  checkpoint, upload of SST files in worker threads, shared files reused across checkpoints);
- :mod:`.restore`: restore and rescaling from any number of handles, RocksDB ones by
  installing and clipping or range-copying their files, other backends' through their
  key-group readers;
- :mod:`.reader`: the one reader of this format for tools and other backends (entries as
  stored, or a neutral key-group stream, :mod:`reactive.state.key_group_stream`);
- :mod:`.backend`: the keyed backend of one instance (the pieces put together) and the
  :class:`RocksDBStateBackend` factory;
- :mod:`.columnar`: the columnar operators' keyed state (rows per key, read and written
  per record batch), installed as the factory's columnar backend on import.

Heap snapshots are restored through the key-group reader registry (``backends`` registers the
built-in readers), so this package never imports another backend.
"""

from reactive.extras import require as _require

_require("rocksdict", "rocksdb", "the RocksDB state backend")

from .backend import RocksDBKeyedStateBackend, RocksDBStateBackend  # noqa: E402
from .columnar import COLUMNAR_STATE as _COLUMNAR_STATE  # noqa: E402,F401  (installs it)
from .db import FORMAT  # noqa: E402
from .keys import state_id  # noqa: E402
from .reader import iter_rocksdb_entries, iter_rocksdb_key_groups, read_rocksdb_snapshot  # noqa: E402

__all__ = [
    "FORMAT",
    "RocksDBKeyedStateBackend",
    "RocksDBStateBackend",
    "iter_rocksdb_entries",
    "iter_rocksdb_key_groups",
    "read_rocksdb_snapshot",
    "state_id",
]
