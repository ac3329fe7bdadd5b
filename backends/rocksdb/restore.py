"""Restoring (and rescaling) the RocksDB backend from snapshot handles of any backend.

Into a fresh instance (Carbone 2018 (PhD thesis), section 4.2, Flink's
``RocksDBIncrementalRestoreOperation``): the RocksDB handle whose key-group range overlaps this
instance's the most is installed as the initial database (SST files hard-linked, other files
copied) and the key groups outside this instance's range are removed with range deletions
(``delete_range``: a tombstone, no data is read); with exactly this instance's range (same
parallelism) nothing is deleted and its shared files become the base of the next incremental
checkpoint. Every other RocksDB handle is opened read-only and only the key range of the key
groups this instance needs is iterated and copied. So no instance reads the whole state.

Handles of other backends (heap) are read as key-group streams from the reader registered for
their ``backend`` (:func:`reactive.state.key_group_stream.read_key_groups`), again only the
key groups of this instance's range, and written key by key: values of custom-serialized
states are that serializer's bytes already, the others are pickled.

Last, when the restored state fits in the write-back cache, it is staged for the cache (one
sequential scan of the range, :meth:`RocksDBRestoreOperation._warm_cache`): each state's
``staged`` dict maps the decoded keys to their stored bytes, and a key's first access takes
its value from there instead of a random RocksDB read (a few us each, against a fresh job's
cheap miss on an empty database: a restarted job ran at 0.7 of a fresh one). Staging rather
than filling the cache keeps the cache in first-access order, hot keys first, as a fresh
job's (filled in key order, the restored cache's lookups ran measurably slower). For the
same reason the scan leaves the key-group memo of ``set_current_key`` to fill on first
access, as a fresh job's does: filling it during the scan took 40% of the restore (82 k
keys: 214-246 ms with, 119-137 ms without). Restore runs in a worker thread (the
runtime's ``in_thread``), so the scan does not hold the event loop beyond the GIL's switch
interval.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from rocksdict import Options, WriteBatch

from reactive.errors import RestoreError
from reactive.key_encoding import check_key_encoding, decode_key
from reactive.keygroups import KeyGroupRange
from reactive.serialization import Serializer
from reactive.state.key_group_stream import (
    KeyGroupStream,
    find_key_group_reader,
    read_key_groups,
)

from .db import BACKEND, check_handle, materialize, open_db
from .keys import key_group_bounds, key_group_prefix, key_group_upper_bound
from .state import StateTable, WriteBackCache, pickle_dumps

__all__ = ["RocksDBRestoreOperation"]

_RESTORE_BATCH = 10_000  # entries per WriteBatch when copying key groups on restore


class RocksDBRestoreOperation:
    """Restores one instance's key groups from snapshot handles.

    Args:
        states: the instance's states (their tables and database, replaced when a handle is
            installed as the database).
        db_dir: the instance's database directory.
        opts: the instance's RocksDB options.
        scratch_dir: where to open other handles' files (``restore-<i>`` under it).
        key_group_range: the instance's key groups.
        key_serializer: the ``key_by`` key serializer (None: canonical key encoding).
        operator_uid: the operator's uid, named in errors.

    Attributes:
        base: after :meth:`run`, the incremental base (SST file name -> shared file ref) of
            the handle installed as the database, or None when none was installed.
    """

    def __init__(self, states: WriteBackCache, *, db_dir: Path, opts: Options,
                 scratch_dir: Path, key_group_range: KeyGroupRange,
                 key_serializer: Serializer | None, operator_uid: str | None) -> None:
        self.states = states
        self.db_dir = db_dir
        self.opts = opts
        self.scratch_dir = scratch_dir
        self.key_group_range = key_group_range
        self.key_serializer = key_serializer
        self.operator_uid = operator_uid
        self.base: dict[str, dict[str, Any]] | None = None

    def run(self, handles: list[dict[str, Any]], job_dir: Path) -> None:
        """Load the key groups of this instance's range from ``handles``.

        Raises:
            RestoreError: for a handle of another backend that no key-group reader is
                registered for, another format, another key encoding, an unreadable file,
                or a state whose kind differs between snapshots.
        """
        foreign: list[dict[str, Any]] = []  # read through another backend's reader
        native: list[dict[str, Any]] = []
        for handle in handles:
            backend = handle.get("backend")
            if backend != BACKEND and find_key_group_reader(str(backend)) is not None:
                foreign.append(handle)
            else:
                check_handle(handle)
                native.append(handle)
        ser = self.key_serializer
        for handle in foreign + native:
            check_key_encoding(handle, ser, self.operator_uid)
        decoder = decode_key if ser is None else ser.deserialize
        for handle in foreign:
            self._write_key_groups(read_key_groups(
                handle, job_dir, key_group_range=self.key_group_range, key_decoder=decoder))
        if not native:
            return
        s = self.states
        fresh = not s._tables and next(iter(s._db.keys()), None) is None
        rest = list(native)
        if fresh:
            # the largest overlap becomes the initial database: only the other handles are
            # read key by key
            base = max(native, key=self._overlap)
            if self._overlap(base) > 0:
                rest.remove(base)
                self._install(base, job_dir)
                self._clip(base)
        for i, handle in enumerate(rest):
            self._copy_key_groups(handle, job_dir, self.scratch_dir / f"restore-{i}")
        for handle in native:
            custom = set(handle.get("custom_serializers", ()))
            for name, kind in handle.get("states", {}).items():
                table = s._table(name, kind)
                if table.kind is None:
                    table.kind = kind
                elif kind is not None and table.kind != kind:
                    raise RestoreError(
                        f"state {name!r} is {kind} state in one snapshot and {table.kind} "
                        "state in another"
                    )
                if table.descriptor is None:
                    table.custom = name in custom
        self._warm_cache(decoder)

    def _warm_cache(self, decode: Callable[[bytes], Any]) -> None:
        """Stage the restored entries of this instance's range for the write-back cache
        (:attr:`.state.StateTable.staged`, values as stored: a custom serializer's
        deserializer is known only once a descriptor binds the state), if the database
        holds at most as many as the caches of its states do (RocksDB's key-count
        estimate); else leave them in RocksDB: a sample of a larger state in key order
        would mostly miss the hot keys.
        """
        s = self.states
        tables: dict[bytes, StateTable] = {t.sid: t for t in s._tables.values()
                                           if not t.cache and not t.staged}
        if not tables:
            return
        db = s._db
        estimate = db.property_int_value("rocksdb.estimate-num-keys")
        if estimate is None or estimate > s.cache_entries * len(tables):
            return
        lower, upper = key_group_bounds(self.key_group_range.start, self.key_group_range.end)
        limit = s.cache_entries
        # the estimate may be off (overwrites, range deletions): never scan past twice the
        # capacity
        budget = 2 * limit * len(tables)
        try:
            for n, (k, v) in enumerate(db.items(from_key=lower)):
                k = cast(bytes, k)  # raw mode: keys and values are bytes
                if n >= budget or (upper is not None and k >= upper):
                    break
                table = tables.get(k[2:6])
                if table is None or len(table.staged) >= limit:
                    continue
                key = decode(k[6:])
                table.staged[key] = cast(bytes, v)
        except Exception:
            # a value that does not load here (its class not importable yet ...) fails
            # when the task reads it, if ever: warming is only an optimization
            for table in tables.values():
                table.staged.clear()

    def _overlap(self, handle: dict[str, Any]) -> int:
        """Number of key groups ``handle`` holds that this instance owns."""
        old_start, old_end = (int(x) for x in handle["key_group_range"])
        kgr = self.key_group_range
        return max(0, min(old_end, kgr.end) - max(old_start, kgr.start) + 1)

    def _install(self, handle: dict[str, Any], job_dir: Path) -> None:
        """Use the snapshot's files as this instance's database (same key-group range)."""
        s = self.states
        s._db.close()
        shutil.rmtree(self.db_dir)
        materialize(handle, job_dir, self.db_dir)
        try:
            s._db = open_db(self.db_dir, self.opts)
        except Exception as exc:
            raise RestoreError(f"cannot open the RocksDB snapshot: {exc}") from exc
        # the restored SST files keep their names and bytes: the next incremental checkpoint
        # references the shared copies instead of uploading them again
        shared = {ref["path"] for ref in handle.get("shared", [])}
        by_path = {ref["path"]: ref for ref in handle["files"]}
        self.base = {name: by_path[rel] for name, rel in handle["db_files"].items()
                     if rel in shared}

    def _clip(self, handle: dict[str, Any]) -> None:
        """Delete the key groups of an installed ``handle`` outside this instance's range."""
        db = self.states._db
        start, end = self.key_group_range.start, self.key_group_range.end
        old_start, old_end = handle["key_group_range"]
        if old_start < start:
            db.delete_range(key_group_prefix(old_start), key_group_prefix(start))
        if old_end > end:
            db.delete_range(key_group_prefix(end + 1), key_group_upper_bound(old_end))
        # the installed SST files keep the other key groups until compaction, hidden by the
        # range tombstones (flushed into the next checkpoint's files): referencing them as
        # the incremental base stays correct, and a later restore reads only its range

    def _copy_key_groups(self, handle: dict[str, Any], job_dir: Path, tmp: Path) -> None:
        """Copy the key groups of this instance's range out of ``handle`` (range iteration)."""
        db = self.states._db
        old_start, old_end = handle["key_group_range"]
        start = max(old_start, self.key_group_range.start)
        end = min(old_end, self.key_group_range.end)
        if start > end:
            return
        materialize(handle, job_dir, tmp)
        try:
            try:
                src = open_db(tmp, self.opts, read_only=True)
            except Exception as exc:
                raise RestoreError(f"cannot open the RocksDB snapshot: {exc}") from exc
            try:
                lower, upper = key_group_bounds(start, end)
                wb = WriteBatch(raw_mode=True)
                n = 0
                for k, v in src.items(from_key=lower):
                    k = cast(bytes, k)  # raw mode: keys are bytes
                    if upper is not None and k >= upper:
                        break
                    wb.put(k, v)
                    n += 1
                    if n >= _RESTORE_BATCH:
                        db.write(wb)
                        wb = WriteBatch(raw_mode=True)
                        n = 0
                if n:
                    db.write(wb)
            finally:
                src.close()
                del src
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _write_key_groups(self, stream: KeyGroupStream) -> None:
        """Write the key groups of another backend's snapshot, key by key."""
        s = self.states
        db = s._db
        encode = s._encode_key
        wb = WriteBatch(raw_mode=True)
        n = 0
        with stream:
            for kg, serialized, states in stream:
                kgb = key_group_prefix(kg)
                for name, entries in states.items():
                    table = s._table(name, stream.kinds.get(name))
                    custom = name in serialized
                    if table.descriptor is None:
                        table.custom = custom
                    prefix = kgb + table.sid
                    for key, value in entries.items():
                        # values of custom-serialized states are that serializer's bytes
                        wb.put(prefix + encode(key), value if custom else pickle_dumps(value))
                        n += 1
                        if n >= _RESTORE_BATCH:
                            db.write(wb)
                            wb = WriteBatch(raw_mode=True)
                            n = 0
        if n:
            db.write(wb)
