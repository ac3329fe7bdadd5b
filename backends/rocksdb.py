"""The RocksDB state backend: keyed state in an embedded RocksDB (rocksdict), with
asynchronous and incremental snapshots.

Layout (thesis section 4.2, Flink's ``RocksDBKeyedStateBackend``): every value lives under the
RocksDB key ``key_group (2 bytes, big-endian) | state id (4 bytes) | encoded key``, so the
state of a key-group range is one contiguous key range (iteration, deletion and rescaling by
range). The state id is derived from the state's name (a 4-byte BLAKE2b digest), so instances
that never met agree on it and a restore can merge their files without rewriting keys. Values
are bytes produced by the descriptor's serializer (pickle by default). List and map state are
stored as one value per key (the descriptors' serializers apply to the whole list or map); the
user-key suffix of Flink's layout is not used. The encoded key is its canonical encoding
(:mod:`reactive.key_encoding`: equal keys, equal bytes, in every process), or the ``key_by``
key serializer's bytes; handles record which as ``key_encoding``, and the key group is the
murmur3 hash of the same bytes.

Per-record cost: a RocksDB get + put per record costs microseconds from Python, so each
instance keeps a bounded *write-back cache* of deserialized values per state. Reads hit the
cache first; writes only mark the entry dirty. Dirty entries go to RocksDB in one
``WriteBatch`` when there are ``write_batch_entries`` of them, when the cache overflows
``cache_entries`` (it is then emptied), before ``keys()``, and before every snapshot. A value
its serializer refuses fails that write with :class:`~reactive.errors.StateSerializationError`
naming the operator, the state and the key (in a snapshot's synchronous part, or on the data
path when the cache writes out).

Snapshots (thesis 4.5.1 asynchronous snapshot invocation, 4.5.2 incremental snapshots, and
Flink's ``RocksIncrementalSnapshotStrategy`` / ``RocksFullSnapshotStrategy``):

- *synchronous part*: write the dirty cache entries in one batch, flush the memtable, create a
  RocksDB checkpoint (hard links of the immutable SST files, a copy of the small MANIFEST,
  OPTIONS and CURRENT files) in a private directory, and create the checkpoint's ``chk-<n>``
  directory (which tells checkpoint storage that a checkpoint is in flight);
- *asynchronous part* (on the event loop, in 1 MiB chunks that yield to the tasks): copy
  the files into checkpoint storage. Full mode copies everything into ``chk-<n>``. Incremental mode
  stores SST files under ``<job_dir>/shared/<operator>/`` named by their SHA-256, and an SST
  file that the last *completed* checkpoint already stored is referenced, not copied (listed
  in the handle's ``shared_reused``). Only completed checkpoints serve as the base, and every
  file a retained checkpoint references is live or newer, so checkpoint storage can delete a
  shared file exactly when no retained checkpoint lists it (reference counting derived from
  the metadata, hence correct across restarts).

Restore (into a fresh directory; rescaling as in thesis 4.2 and Flink's
``RocksDBIncrementalRestoreOperation``): the handle whose key-group range overlaps this
instance's the most is installed as the initial database (SST files hard-linked, other files
copied) and the key groups outside this instance's range are removed with range deletions
(``delete_range``: a tombstone, no data is read); with exactly this instance's range (same
parallelism) nothing is deleted and its shared files become the base of the next incremental
checkpoint. Every other handle is opened read-only and only the key range of the key groups
this instance needs is iterated and copied. So no instance reads the whole state.

Heap snapshot handles (``backends.heap``) are restored too, reading only the key groups of
this instance's range: with :func:`iter_rocksdb_key_groups` on the heap side this makes the
two built-in backends interchangeable across a restore (``heap <-> rocksdb``). Handles record
which states use a descriptor's custom serializer (``custom_serializers``); the values of the
others are pickles, which the heap backend unpickles.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import pickle
import shutil
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from rocksdict import (
    AccessType,
    BlockBasedOptions,
    Checkpoint,
    Options,
    Rdict,
    WriteBatch,
    WriteOptions,
)

from reactive.errors import (
    ConfigurationError,
    RestoreError,
    StateAccessError,
    StateSerializationError,
    UnsupportedKeyError,
)
from reactive.key_encoding import (
    KEY_ENCODING,
    check_key_encoding,
    decode_key,
    encode_key,
    key_encoding_name,
)
from reactive.keygroups import KeyGroupAssigner, KeyGroupRange
from reactive.serialization import Serializer
from reactive.state.api import ListState, MapState, ReducingState, State, ValueState
from reactive.state.backend import (
    KeyedStateBackend,
    KeyedStateSnapshot,
    SnapshotContext,
    StateBackend,
)
from reactive.state.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)

__all__ = [
    "RocksDBKeyedStateBackend",
    "RocksDBStateBackend",
    "iter_rocksdb_entries",
    "iter_rocksdb_key_groups",
    "read_rocksdb_snapshot",
    "state_id",
]

FORMAT = "rocksdb-v1"
_CHUNK = 1 << 20  # bytes per read when copying files
_RESTORE_BATCH = 10_000  # entries per WriteBatch when copying key groups on restore


def state_id(name: str) -> bytes:
    """Return the 4-byte id of state ``name`` in RocksDB keys (stable across processes)."""
    return hashlib.blake2b(name.encode(), digest_size=4).digest()


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


def _kg_bytes(kg: int) -> bytes:
    return kg.to_bytes(2, "big")


def _range_bounds(start: int, end: int) -> tuple[bytes, bytes | None]:
    """RocksDB key bounds ``[lower, upper)`` of key groups ``start..end``."""
    return _kg_bytes(start), (_kg_bytes(end + 1) if end + 1 < 1 << 16 else None)


# ---------------------------------------------------------------------- RocksDB setup
def _options(write_buffer_size: int, factory: Callable[[Options], None] | None) -> Options:
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    # small memtables: RocksDB flushes full ones in its background threads (no GIL), so the
    # synchronous part of a snapshot only flushes what changed since the last full memtable
    opts.set_write_buffer_size(write_buffer_size)
    opts.set_max_write_buffer_number(4)
    opts.set_max_background_jobs(2)
    table = BlockBasedOptions()
    # a Bloom filter per SST: a cache miss on a new key then costs ~1 us instead of a block
    # read in every L0 file (measured 5 us per get without it)
    table.set_bloom_filter(10, False)
    opts.set_block_based_table_factory(table)
    if factory is not None:
        factory(opts)
    return opts


def _write_options() -> WriteOptions:
    wo = WriteOptions()
    # no write-ahead log: durability comes from checkpoints (as in Flink's RocksDB backend);
    # the working directory is thrown away on failure
    wo.disable_wal = True  # type: ignore[method-assign,assignment]  # a property at runtime
    return wo


def _open(path: Path, opts: Options, read_only: bool = False) -> Rdict:
    if read_only:
        db = Rdict(str(path), opts, access_type=AccessType.read_only())
    else:
        db = Rdict(str(path), opts)
        db.set_write_options(_write_options())
    return db


# ---------------------------------------------------------------------- file helpers
async def _copy_hashed(src: Path, dest: Path) -> tuple[int, str]:
    """Copy ``src`` to ``dest`` (via a temporary file and an atomic rename), returning
    (size in bytes, sha256 hex digest).

    Runs on the event loop in chunks of ``_CHUNK`` bytes, yielding between them: in a worker
    thread every read, write and hash call would wait for the GIL held by the busy tasks
    (measured: 300 ms instead of 10 ms for a few small files under load).
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.tmp")
    h = hashlib.sha256()
    size = 0
    try:
        with open(src, "rb") as fin, open(tmp, "wb") as fout:
            while chunk := fin.read(_CHUNK):
                h.update(chunk)
                fout.write(chunk)
                size += len(chunk)
                if len(chunk) == _CHUNK:
                    await asyncio.sleep(0)
            fout.flush()
            os.fsync(fout.fileno())
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return size, h.hexdigest()


async def _hash_to_shared(src: Path, shared: Path) -> tuple[int, str, Path]:
    """Copy ``src`` into folder ``shared`` named by its content (``<sha256>.sst``)."""
    shared.mkdir(parents=True, exist_ok=True)
    tmp = shared / f".upload-{uuid.uuid4().hex}.tmp"
    size, sha = await _copy_hashed(src, tmp)
    dest = shared / f"{sha}.sst"
    # same name = same content: replacing an existing copy is harmless
    os.replace(tmp, dest)
    return size, sha, dest


def _link_or_copy(src: Path, dest: Path) -> None:
    """Hard-link an immutable SST file (RocksDB never writes to one), else copy it."""
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)


def _materialize(handle: dict[str, Any], job_dir: Path, dest: Path) -> None:
    """Lay the files of ``handle`` out in ``dest`` under their RocksDB names.

    Raises:
        RestoreError: if a file is missing or unreadable.
    """
    dest.mkdir(parents=True)
    try:
        for name, rel in handle["db_files"].items():
            src = job_dir / rel
            if name.endswith(".sst"):
                _link_or_copy(src, dest / name)
            else:
                # MANIFEST and friends are appended to when the DB opens: never share them
                shutil.copyfile(src, dest / name)
    except (OSError, KeyError) as exc:
        raise RestoreError(f"cannot read RocksDB snapshot files from {job_dir}: {exc}") from exc


def _check_handle(handle: dict[str, Any]) -> None:
    if handle.get("backend") != "rocksdb" or handle.get("format") != FORMAT:
        raise RestoreError(
            f"cannot restore a {handle.get('backend')!r} snapshot ({handle.get('format')}) "
            "into the RocksDB backend"
        )


# ---------------------------------------------------------------------- state tables
_MISS = object()  # not in the cache
_ABSENT = object()  # known to have no value (cached miss, or cleared)


class _Table:
    """One named state: its id, kind, serializer and write-back cache.

    ``kind`` is None for a state restored from a snapshot that does not record kinds (a heap
    snapshot) until a descriptor binds it; ``custom`` says whether its stored values are a
    custom serializer's bytes (else pickles), known from the descriptor or the snapshot.
    """

    __slots__ = ("cache", "custom", "descriptor", "dirty", "dumps", "kind", "loads", "name",
                 "sid")

    def __init__(self, name: str, kind: str | None) -> None:
        self.name = name
        self.kind = kind
        self.custom = False
        self.sid = state_id(name)
        self.descriptor: StateDescriptor | None = None
        self.cache: dict[Any, Any] = {}
        # dirty key -> its key group's 2 bytes (known when the entry was written)
        self.dirty: dict[Any, bytes] = {}
        self.dumps: Callable[[Any], bytes] = _pickle_dumps
        self.loads: Callable[[bytes], Any] = pickle.loads

    def bind(self, descriptor: StateDescriptor) -> None:
        self.descriptor = descriptor
        ser = getattr(descriptor, "serializer", None)
        self.custom = ser is not None
        if self.kind is None:
            self.kind = descriptor.kind
        if ser is None:
            self.dumps, self.loads = _pickle_dumps, pickle.loads
        else:
            self.dumps, self.loads = ser.serialize, ser.deserialize


def _pickle_dumps(value: Any) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


class RocksDBKeyedStateBackend(KeyedStateBackend):
    """Keyed state of one operator instance in its own RocksDB (see the module docstring).

    Args:
        directory: a fresh working directory for this instance (created; removed by
            :meth:`dispose`).
        key_group_range: the key groups this instance owns.
        max_parallelism: the job's number of key groups (at most 65536).
        incremental: incremental snapshots (else full ones).
        cache_entries: cached keys per state before the cache is emptied.
        write_batch_entries: dirty keys per state before they are written to RocksDB.
        write_buffer_size: RocksDB memtable size, bytes.
        options_factory: called with the RocksDB ``Options`` before the DB opens.
        operator_uid: the operator's uid, named in errors (None: unnamed).

    Raises:
        ConfigurationError: if ``max_parallelism`` exceeds 65536 (2-byte key groups).
    """

    def __init__(
        self,
        directory: Path,
        key_group_range: KeyGroupRange,
        max_parallelism: int,
        *,
        incremental: bool = True,
        cache_entries: int = 100_000,
        write_batch_entries: int = 20_000,
        write_buffer_size: int = 4 << 20,
        options_factory: Callable[[Options], None] | None = None,
        operator_uid: str | None = None,
    ) -> None:
        if max_parallelism > 1 << 16:
            raise ConfigurationError("the RocksDB backend supports max_parallelism <= 65536")
        self.key_group_range = key_group_range
        self.max_parallelism = max_parallelism
        self.incremental = incremental
        self.cache_entries = max(1, cache_entries)
        self.write_batch_entries = max(1, write_batch_entries)
        self.current_key: Any = None
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=False)
        self._opts = _options(write_buffer_size, options_factory)
        self._db_dir = directory / "db"
        self._db: Rdict = _open(self._db_dir, self._opts)
        self._start = key_group_range.start
        self._end = key_group_range.end
        self.operator_uid = operator_uid
        self._key_serializer: Serializer | None = None
        self._encode_key: Callable[[Any], bytes] = encode_key
        self._decode_key: Callable[[bytes], Any] = decode_key
        self._assign = KeyGroupAssigner(max_parallelism)
        self._kg = [_kg_bytes(kg) for kg in range(max_parallelism)]
        self._kgb: bytes | None = None  # the current key's key group, 2 bytes
        self._tables: dict[str, _Table] = {}
        # local SST file name -> handle file ref, from the last completed checkpoint
        self._base: dict[str, dict[str, Any]] = {}
        self._uploaded: dict[int, dict[str, dict[str, Any]]] = {}
        self._snapshots: set[_RocksDBSnapshot] = set()
        self._disposed = False

    # ------------------------------------------------------------------ keys
    def set_key_serializer(self, serializer: Serializer | None) -> None:
        """Store keys as ``serializer.serialize(key)`` (and compute key groups from those
        bytes) instead of the canonical key encoding (``key_by(selector,
        key_serializer=...)``); call before any key is set or state restored. None restores
        the canonical encoding."""
        self._key_serializer = serializer
        if serializer is None:
            self._encode_key, self._decode_key = encode_key, decode_key
        else:
            self._encode_key, self._decode_key = serializer.serialize, serializer.deserialize
        self._assign = KeyGroupAssigner(self.max_parallelism, key_serializer=serializer)

    def set_current_key(self, key: Any) -> None:
        """Scope state calls to ``key``.

        Raises:
            UnsupportedKeyError: if ``key`` is not hashable, or has no canonical encoding
                and no key serializer was set (naming the operator).
            StateAccessError: if ``key`` belongs to another instance's key groups.
        """
        try:
            kg = self._assign(key)
        except UnsupportedKeyError as exc:
            raise exc.for_operator(self.operator_uid) from None
        if not self._start <= kg <= self._end:
            raise StateAccessError(
                f"key {key!r} belongs to key group {kg}, outside this instance's range "
                f"{self.key_group_range.to_list()}: is the key selector deterministic?"
            )
        self.current_key = key
        self._kgb = self._kg[kg]

    def _require_key(self) -> bytes:
        kgb = self._kgb
        if kgb is None:
            raise StateAccessError("keyed state accessed without a current key (outside "
                                   "process_element of a keyed operator?)")
        return kgb

    def _table(self, name: str, kind: str | None) -> _Table:
        table = self._tables.get(name)
        if table is None:
            table = _Table(name, kind)
            for other in self._tables.values():
                if other.sid == table.sid:
                    raise StateAccessError(
                        f"state names {name!r} and {other.name!r} have the same RocksDB id; "
                        "rename one of them"
                    )
            self._tables[name] = table
        return table

    def get_state(self, descriptor: StateDescriptor) -> State:
        table = self._table(descriptor.name, descriptor.kind)
        if table.kind is not None and table.kind != descriptor.kind:
            raise StateAccessError(
                f"state {descriptor.name!r} is registered as {table.kind} state, "
                f"requested as {descriptor.kind}"
            )
        table.bind(descriptor)
        if isinstance(descriptor, ValueStateDescriptor):
            return _ValueState(self, table, descriptor.default)
        if isinstance(descriptor, ListStateDescriptor):
            return _ListState(self, table)
        if isinstance(descriptor, MapStateDescriptor):
            return _MapState(self, table)
        if isinstance(descriptor, ReducingStateDescriptor):
            return _ReducingState(self, table, descriptor.reduce_fn)
        raise StateAccessError(f"unsupported state descriptor {descriptor!r}")

    def keys(self, state_name: str) -> Iterator[Any]:
        table = self._tables.get(state_name)
        if table is None:
            return iter(())
        self._flush_dirty()
        out = []
        sid = table.sid
        for kg in range(self._start, self._end + 1):
            prefix = self._kg[kg] + sid
            n = len(prefix)
            for k in self._db.keys(from_key=prefix):
                k = cast(bytes, k)  # raw mode: keys are bytes
                if k[:n] != prefix:
                    break
                out.append(self._decode_key(k[n:]))
        return iter(out)

    # ------------------------------------------------------------------ cache
    def _load(self, table: _Table, key: Any) -> Any:
        """Cache miss: read ``key`` of ``table`` from RocksDB into the cache."""
        kgb = self._require_key()
        raw = self._db.get(kgb + table.sid + self._encode_key(key))
        value = _ABSENT if raw is None else table.loads(raw)
        cache = table.cache
        if len(cache) >= self.cache_entries:
            self._evict(table)
        cache[key] = value
        return value

    def _store(self, table: _Table, key: Any, value: Any) -> None:
        """Write-back: cache ``value`` (``_ABSENT`` deletes) and mark it dirty."""
        kgb = self._require_key()
        cache = table.cache
        if key not in cache and len(cache) >= self.cache_entries:
            self._evict(table)
        cache[key] = value
        dirty = table.dirty
        dirty[key] = kgb
        if len(dirty) >= self.write_batch_entries:
            self._flush_dirty(table)

    def _evict(self, table: _Table) -> None:
        self._flush_dirty(table)
        table.cache.clear()

    def _flush_dirty(self, only: _Table | None = None) -> None:
        """Write dirty cache entries to RocksDB in one WriteBatch (entries stay cached).

        Raises:
            StateSerializationError: if a value's serializer refuses it (nothing of the
                batch is written; the entries stay dirty).
        """
        tables = [only] if only is not None else list(self._tables.values())
        if not any(t.dirty for t in tables):
            return
        wb = WriteBatch(raw_mode=True)
        put = wb.put
        delete = wb.delete
        encode = self._encode_key
        for t in tables:
            if not t.dirty:
                continue
            sid = t.sid
            cache = t.cache
            dumps = t.dumps
            for key, kgb in t.dirty.items():
                value = cache.get(key, _ABSENT)
                if value is _ABSENT:
                    delete(kgb + sid + encode(key))
                else:
                    try:
                        data = dumps(value)
                    except Exception as exc:
                        raise StateSerializationError(
                            self.operator_uid or "?", t.name, key, exc) from exc
                    put(kgb + sid + encode(key), data)
        for t in tables:
            t.dirty.clear()
        self._db.write(wb)

    # ------------------------------------------------------------------ snapshots
    def snapshot(self, ctx: SnapshotContext) -> KeyedStateSnapshot:
        self._flush_dirty()
        self._db.flush()
        local = self.directory / f"chk-{ctx.checkpoint_id}-{uuid.uuid4().hex[:8]}"
        Checkpoint(self._db).create_checkpoint(str(local))
        # marks the checkpoint as in flight for checkpoint storage before any shared file of
        # it exists (CheckpointStorage never collects shared files while one is in flight)
        ctx.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        incremental = self.incremental and not ctx.savepoint
        snap = _RocksDBSnapshot(self, ctx, local, incremental,
                                dict(self._base) if incremental else {},
                                {n: t.kind for n, t in self._tables.items()},
                                sorted(n for n, t in self._tables.items() if t.custom))
        self._snapshots.add(snap)
        return snap

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        uploaded = self._uploaded.pop(checkpoint_id, None)
        if uploaded is not None:
            self._base = uploaded
        for cid in [c for c in self._uploaded if c < checkpoint_id]:
            del self._uploaded[cid]

    def _snapshot_done(self, snap: _RocksDBSnapshot) -> None:
        self._snapshots.discard(snap)
        if self._disposed and not self._snapshots:
            shutil.rmtree(self.directory, ignore_errors=True)

    # ------------------------------------------------------------------ restore
    def restore(self, handles: list[dict[str, Any]], job_dir: Path) -> None:
        heap = [h for h in handles if h.get("backend") == "heap"]
        handles = [h for h in handles if h.get("backend") != "heap"]
        for handle in handles:
            _check_handle(handle)
        for handle in heap + handles:
            check_key_encoding(handle, self._key_serializer, self.operator_uid)
        for handle in heap:
            self._restore_heap(handle, job_dir)
        if not handles:
            return
        fresh = not self._tables and next(iter(self._db.keys()), None) is None
        rest = list(handles)
        if fresh:
            # the largest overlap becomes the initial database: only the other handles are
            # read key by key (Flink's RocksDBIncrementalRestoreOperation)
            base = max(handles, key=self._overlap)
            if self._overlap(base) > 0:
                rest.remove(base)
                self._install(base, job_dir)
                self._clip(base)
        for i, handle in enumerate(rest):
            self._copy_key_groups(handle, job_dir, self.directory / f"restore-{i}")
        for handle in handles:
            custom = set(handle.get("custom_serializers", ()))
            for name, kind in handle.get("states", {}).items():
                table = self._table(name, kind)
                if table.kind is None:
                    table.kind = kind
                elif kind is not None and table.kind != kind:
                    raise RestoreError(
                        f"state {name!r} is {kind} state in one snapshot and {table.kind} "
                        "state in another"
                    )
                if table.descriptor is None:
                    table.custom = name in custom

    def _overlap(self, handle: dict[str, Any]) -> int:
        """Number of key groups ``handle`` holds that this instance owns."""
        old_start, old_end = (int(x) for x in handle["key_group_range"])
        return max(0, min(old_end, self._end) - max(old_start, self._start) + 1)

    def _clip(self, handle: dict[str, Any]) -> None:
        """Delete the key groups of an installed ``handle`` outside this instance's range."""
        old_start, old_end = handle["key_group_range"]
        if old_start < self._start:
            self._db.delete_range(_kg_bytes(old_start), _kg_bytes(self._start))
        if old_end > self._end:
            upper = _range_bounds(self._end + 1, old_end)[1]
            # the last key group of a 65536-wide range has no upper bound key: 3 bytes sort
            # after every 2-byte-prefixed key of it
            self._db.delete_range(_kg_bytes(self._end + 1),
                                  upper if upper is not None else b"\xff\xff\xff")
        # the installed SST files keep the other key groups until compaction, hidden by the
        # range tombstones (flushed into the next checkpoint's files): referencing them as
        # the incremental base stays correct, and a later restore reads only its range

    def _restore_heap(self, handle: dict[str, Any], job_dir: Path) -> None:
        """Write the key groups of this instance's range from a heap snapshot handle."""
        from backends.heap import iter_heap_key_groups

        wb = WriteBatch(raw_mode=True)
        n = 0
        for kg, serialized, data in iter_heap_key_groups(handle, job_dir, self.key_group_range):
            kgb = self._kg[kg]
            for name, entries in data.items():
                table = self._table(name, None)
                custom = name in serialized
                if table.descriptor is None:
                    table.custom = custom
                prefix = kgb + table.sid
                for key, value in entries.items():
                    # values of custom-serialized states are that serializer's bytes already
                    wb.put(prefix + self._encode_key(key),
                           value if custom else _pickle_dumps(value))
                    n += 1
                    if n >= _RESTORE_BATCH:
                        self._db.write(wb)
                        wb = WriteBatch(raw_mode=True)
                        n = 0
        if n:
            self._db.write(wb)

    def _install(self, handle: dict[str, Any], job_dir: Path) -> None:
        """Use the snapshot's files as this instance's database (same key-group range)."""
        self._db.close()
        shutil.rmtree(self._db_dir)
        _materialize(handle, job_dir, self._db_dir)
        try:
            self._db = _open(self._db_dir, self._opts)
        except Exception as exc:
            raise RestoreError(f"cannot open the RocksDB snapshot: {exc}") from exc
        # the restored SST files keep their names and bytes: the next incremental checkpoint
        # references the shared copies instead of uploading them again
        shared = {ref["path"] for ref in handle.get("shared", [])}
        by_path = {ref["path"]: ref for ref in handle["files"]}
        self._base = {name: by_path[rel] for name, rel in handle["db_files"].items()
                      if rel in shared}

    def _copy_key_groups(self, handle: dict[str, Any], job_dir: Path, tmp: Path) -> None:
        """Copy the key groups of this instance's range out of ``handle`` (range iteration)."""
        old_start, old_end = handle["key_group_range"]
        start, end = max(old_start, self._start), min(old_end, self._end)
        if start > end:
            return
        _materialize(handle, job_dir, tmp)
        try:
            try:
                src = _open(tmp, self._opts, read_only=True)
            except Exception as exc:
                raise RestoreError(f"cannot open the RocksDB snapshot: {exc}") from exc
            try:
                lower, upper = _range_bounds(start, end)
                wb = WriteBatch(raw_mode=True)
                n = 0
                for k, v in src.items(from_key=lower):
                    k = cast(bytes, k)  # raw mode: keys are bytes
                    if upper is not None and k >= upper:
                        break
                    wb.put(k, v)
                    n += 1
                    if n >= _RESTORE_BATCH:
                        self._db.write(wb)
                        wb = WriteBatch(raw_mode=True)
                        n = 0
                if n:
                    self._db.write(wb)
            finally:
                src.close()
                del src
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def dispose(self) -> None:
        if self._disposed:
            return
        self._disposed = True
        for t in self._tables.values():
            t.cache.clear()
            t.dirty.clear()
        self._db.close()
        shutil.rmtree(self._db_dir, ignore_errors=True)
        # an asynchronous part that never started (its task was cancelled with the failed
        # attempt) would never remove its local checkpoint; one that runs cleans up itself
        for snap in [s for s in self._snapshots if not s.started]:
            snap.discard()
        if not self._snapshots:
            shutil.rmtree(self.directory, ignore_errors=True)


@dataclass
class _Upload:
    files: list[dict[str, Any]]
    shared: list[dict[str, Any]]
    reused: list[dict[str, Any]]
    db_files: dict[str, str]
    sst: dict[str, dict[str, Any]]


class _RocksDBSnapshot(KeyedStateSnapshot):
    def __init__(self, backend: RocksDBKeyedStateBackend, ctx: SnapshotContext, local: Path,
                 incremental: bool, base: dict[str, dict[str, Any]],
                 states: dict[str, str | None], custom: list[str]) -> None:
        self.backend = backend
        self.ctx = ctx
        self.local = local
        self.incremental = incremental
        self.base = base
        self.states = states
        self.custom = custom
        self.started = False
        self.done = False

    async def _upload(self) -> _Upload:
        """Copy the local checkpoint into checkpoint storage."""
        ctx = self.ctx
        owner = f"{_safe(ctx.operator_uid)}-{ctx.subtask}"
        exclusive = ctx.checkpoint_dir / owner
        shared_dir = ctx.shared_dir / _safe(ctx.operator_uid)
        up = _Upload([], [], [], {}, {})
        for name in sorted(os.listdir(self.local)):
            src = self.local / name
            if self.incremental and name.endswith(".sst"):
                ref = self.base.get(name)
                # the base may come from a checkpoint of another job directory (restore_from):
                # reuse a file only if this storage holds it (names are content hashes)
                if ref is not None and ref["size"] == src.stat().st_size and \
                        (ctx.job_dir / ref["path"]).is_file():
                    up.reused.append(ref)
                else:
                    size, sha, dest = await _hash_to_shared(src, shared_dir)
                    ref = {"path": ctx.relative(dest), "size": size, "sha256": sha}
                up.shared.append(ref)
                up.sst[name] = ref
            else:
                dest = exclusive / name
                size, sha = await _copy_hashed(src, dest)
                ref = {"path": ctx.relative(dest), "size": size, "sha256": sha}
            up.files.append(ref)
            up.db_files[name] = ref["path"]
        return up

    async def write(self) -> dict[str, Any]:
        b = self.backend
        if self.done:
            raise OSError(f"snapshot {self.ctx.checkpoint_id} was discarded (the backend "
                          "was disposed before its asynchronous part ran)")
        self.started = True
        try:
            up = await self._upload()
        finally:
            self._release()
        if self.incremental:
            b._uploaded[self.ctx.checkpoint_id] = up.sst
        return {
            "backend": "rocksdb",
            "format": FORMAT,
            "mode": "incremental" if self.incremental else "full",
            "files": up.files,
            "shared": up.shared,
            "shared_reused": up.reused,
            "key_group_range": b.key_group_range.to_list(),
            "max_parallelism": b.max_parallelism,
            "states": self.states,
            "custom_serializers": self.custom,
            "key_encoding": key_encoding_name(b._key_serializer),
            "db_files": up.db_files,
        }

    def _release(self) -> None:
        if not self.done:
            self.done = True
            shutil.rmtree(self.local, ignore_errors=True)
            self.backend._snapshot_done(self)

    def discard(self) -> None:
        self._release()


# ---------------------------------------------------------------------- state objects
class _CachedState:
    """Every state kind stores one value per key: reads go through the write-back cache,
    then RocksDB; writes go to the cache (``_store``); clearing stores ``_ABSENT``."""

    __slots__ = ("_b", "_cache", "_t")

    def __init__(self, backend: RocksDBKeyedStateBackend, table: _Table) -> None:
        self._b = backend
        self._t = table
        self._cache = table.cache

    def _get(self) -> Any:
        key = self._b.current_key
        v = self._cache.get(key, _MISS)
        return self._b._load(self._t, key) if v is _MISS else v

    def clear(self) -> None:
        self._b._store(self._t, self._b.current_key, _ABSENT)


class _ValueState(_CachedState, ValueState):
    __slots__ = ("_default",)

    def __init__(self, backend: RocksDBKeyedStateBackend, table: _Table, default: Any) -> None:
        super().__init__(backend, table)
        self._default = default

    def value(self) -> Any:
        v = self._get()
        return self._default if v is _ABSENT else v

    def update(self, value: Any) -> None:
        self._b._store(self._t, self._b.current_key, value)


class _ListState(_CachedState, ListState):
    __slots__ = ()

    def get(self) -> list[Any]:
        v = self._get()
        return [] if v is _ABSENT else list(v)

    def add(self, value: Any) -> None:
        v = self._get()
        # appending in place is safe: a snapshot serialized the list in its synchronous part
        if v is _ABSENT:
            v = [value]
        else:
            v.append(value)
        self._b._store(self._t, self._b.current_key, v)

    def add_all(self, values: Any) -> None:
        new = list(values)
        if new:
            v = self._get()
            if v is _ABSENT:
                v = new
            else:
                v.extend(new)
            self._b._store(self._t, self._b.current_key, v)

    def update(self, values: Any) -> None:
        new = list(values)
        self._b._store(self._t, self._b.current_key, new if new else _ABSENT)


class _MapState(_CachedState, MapState):
    __slots__ = ()

    def get(self, user_key: Any, default: Any = None) -> Any:
        m = self._get()
        return default if m is _ABSENT else m.get(user_key, default)

    def put(self, user_key: Any, value: Any) -> None:
        m = self._get()
        m = {} if m is _ABSENT else m
        m[user_key] = value
        self._b._store(self._t, self._b.current_key, m)

    def remove(self, user_key: Any) -> None:
        m = self._get()
        if m is not _ABSENT and user_key in m:
            del m[user_key]
            self._b._store(self._t, self._b.current_key, m if m else _ABSENT)

    def contains(self, user_key: Any) -> bool:
        m = self._get()
        return m is not _ABSENT and user_key in m

    def items(self) -> Iterator[tuple[Any, Any]]:
        m = self._get()
        return iter([] if m is _ABSENT else list(m.items()))


class _ReducingState(_CachedState, ReducingState):
    __slots__ = ("_fn",)

    def __init__(self, backend: RocksDBKeyedStateBackend, table: _Table,
                 fn: Callable[[Any, Any], Any]) -> None:
        super().__init__(backend, table)
        self._fn = fn

    def get(self) -> Any:
        v = self._get()
        return None if v is _ABSENT else v

    def add(self, value: Any) -> None:
        v = self._get()
        self._b._store(self._t, self._b.current_key,
                       value if v is _ABSENT else self._fn(v, value))


# ---------------------------------------------------------------------- tools
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
    _check_handle(handle)
    names = {state_id(name): name for name in handle.get("states", {})}
    old_start, old_end = handle["key_group_range"]
    start, end = old_start, old_end
    if key_group_range is not None:
        start, end = max(start, key_group_range.start), min(end, key_group_range.end)
    if start > end:
        return
    _materialize(handle, job_dir, scratch)
    try:
        try:
            db = _open(scratch, _options(4 << 20, None), read_only=True)
        except Exception as exc:
            raise RestoreError(f"cannot open the RocksDB snapshot: {exc}") from exc
        try:
            lower, upper = _range_bounds(start, end)
            for k, v in db.items(from_key=lower):
                k = cast(bytes, k)  # raw mode: keys are bytes
                if upper is not None and k >= upper:
                    break
                name = names.get(k[2:6])
                if name is not None:
                    yield int.from_bytes(k[:2], "big"), name, k[6:], cast(bytes, v)
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
    handle: dict[str, Any], job_dir: Path, scratch: Path,
    key_group_range: KeyGroupRange | None = None,
    key_decoder: Callable[[bytes], Any] | None = None,
) -> Iterator[tuple[int, list[str], dict[str, dict[Any, Any]]]]:
    """Yield ``(key group, serialized state names, {state name: {key: value}})`` for each key
    group of a RocksDB snapshot handle in ``key_group_range`` (all when None), in order: the
    form :func:`backends.heap.iter_heap_key_groups` yields, so the heap backend restores
    RocksDB snapshots. Only the key range of the wanted key groups is iterated.

    Values of the states named in the second item are still a custom serializer's bytes
    (``custom_serializers`` of the handle); the others are unpickled. A handle written
    before ``custom_serializers`` existed is read as if every state used pickle.

    Args:
        handle: a ``keyed_state`` handle of this backend.
        job_dir: the directory its paths are relative to.
        scratch: a directory that does not exist yet, used (and removed) to open the files.
        key_group_range: the key groups to read.
        key_decoder: key bytes -> key (the ``key_by`` key serializer's ``deserialize``);
            None decodes canonical keys and leaves keys that a key serializer wrote as bytes.

    Raises:
        RestoreError: if the handle is not a RocksDB snapshot, its files are unreadable, or
            a key cannot be decoded.
    """
    custom = set(handle.get("custom_serializers", ()))
    serialized = sorted(custom)
    decode = _key_decoder(handle, key_decoder)
    current = -1
    data: dict[str, dict[Any, Any]] = {}
    for kg, name, key, v in iter_rocksdb_entries(handle, job_dir, scratch, key_group_range):
        if kg != current:
            if data:
                yield current, serialized, data
            current, data = kg, {}
        data.setdefault(name, {})[decode(key)] = v if name in custom else pickle.loads(v)
    if data:
        yield current, serialized, data


class RocksDBStateBackend(StateBackend):
    """Keyed state in RocksDB (rocksdict): state larger than memory, asynchronous and
    incremental snapshots (see the module docstring; thesis 4.5.1/4.5.2, Flink's
    ``EmbeddedRocksDBStateBackend``).

    Values go through the descriptors' serializers: change state only through
    ``update``/``add``/``put`` (an object mutated in place without ``update`` is lost when
    its cache entry is evicted).

    Args:
        path: the local working directory; each operator instance gets a fresh
            ``<path>/<job>/<uid>-<subtask>-<random>/`` that is removed when it is disposed.
        incremental: upload only the SST files the last completed checkpoint did not hold
            (shared between checkpoints); ``False`` copies every file on each checkpoint.
        cache_entries: keys cached per state and instance (write-back cache) before the
            cache is written out and emptied.
        write_batch_entries: dirty keys per state that trigger one ``WriteBatch`` to RocksDB;
            bounds the work of a snapshot's synchronous part.
        write_buffer_size: RocksDB memtable size in bytes; the synchronous part flushes at
            most about one memtable.
        options_factory: called with each instance's ``rocksdict.Options`` to tune RocksDB.

    Raises:
        ConfigurationError: on a non-positive cache, batch or buffer size.
    """

    name = "rocksdb"

    def __init__(
        self,
        path: str | os.PathLike[str] = "state",
        incremental: bool = True,
        cache_entries: int = 100_000,
        write_batch_entries: int = 20_000,
        write_buffer_size: int = 4 << 20,
        options_factory: Callable[[Options], None] | None = None,
    ) -> None:
        if cache_entries < 1 or write_batch_entries < 1 or write_buffer_size < 1:
            raise ConfigurationError(
                "cache_entries, write_batch_entries and write_buffer_size must be >= 1"
            )
        self.path = Path(path)
        self.incremental = incremental
        self.cache_entries = cache_entries
        self.write_batch_entries = write_batch_entries
        self.write_buffer_size = write_buffer_size
        self.options_factory = options_factory

    def create_keyed_backend(
        self,
        *,
        job_name: str,
        operator_uid: str,
        subtask: int,
        key_group_range: KeyGroupRange,
        max_parallelism: int,
    ) -> KeyedStateBackend:
        directory = (self.path / _safe(job_name) /
                     f"{_safe(operator_uid)}-{subtask}-{uuid.uuid4().hex[:12]}")
        return RocksDBKeyedStateBackend(
            directory, key_group_range, max_parallelism,
            incremental=self.incremental,
            cache_entries=self.cache_entries,
            write_batch_entries=self.write_batch_entries,
            write_buffer_size=self.write_buffer_size,
            options_factory=self.options_factory,
            operator_uid=operator_uid,
        )
