"""The RocksDB keyed state backend of one operator instance, and its factory.

:class:`RocksDBKeyedStateBackend` owns one embedded RocksDB (:mod:`.db`) in a private working
directory and puts the pieces together: the current key's key group (:mod:`.keys`), the
write-back cache and state objects (:mod:`.state`, its base class), snapshots (:mod:`.snapshot`)
and restore (:mod:`.restore`). Flink's ``RocksDBKeyedStateBackend`` /
``EmbeddedRocksDBStateBackend``.
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

from rocksdict import Options, Rdict

from reactive.errors import ConfigurationError, StateAccessError, UnsupportedKeyError
from reactive.key_encoding import decode_key, encode_key, key_encoding_name
from reactive.keygroups import KeyGroupAssigner, KeyGroupRange
from reactive.serialization import Serializer
from reactive.state.api import State, ValueState
from reactive.state.backend import (
    KeyedStateBackend,
    KeyedStateSnapshot,
    SnapshotContext,
    StateBackend,
    file_name_component,
)
from reactive.state.descriptors import StateDescriptor, ValueStateDescriptor
from reactive.state.ttl import IncrementalCleanup, backend_descriptor, ttl_state
from reactive.state.ttl_clock import TtlClock
from reactive.state.ttl_config import StateTtlConfig

from .db import BACKEND, open_db, options
from .generations import Generation
from .keys import MAX_KEY_GROUPS, key_group_prefix
from .restore import RocksDBRestoreOperation
from .snapshot import RocksDBSnapshot
from .state import WriteBackCache, create_state
from .ttl_state import RocksDBTtlValueState, RocksDBTtlValueStateOnRead
from .ttl_sweep import RocksDBTtlSweep

__all__ = ["RocksDBKeyedStateBackend", "RocksDBStateBackend"]


class RocksDBKeyedStateBackend(WriteBackCache, KeyedStateBackend):
    """Keyed state of one operator instance in its own RocksDB (see :mod:`reactive.backends.rocksdb`).

    Args:
        directory: a fresh working directory for this instance (created; removed by
            :meth:`dispose`).
        key_group_range: the key groups this instance owns.
        max_parallelism: the job's number of key groups (at most 65536).
        incremental: incremental snapshots (else full ones).
        cache_entries: cached keys per state before the oldest are evicted (also what a
            restore loads into the cache, when the restored state fits).
        write_batch_entries: dirty keys per state past which they are written to RocksDB,
            the oldest first, in steps of a few ms.
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
        write_batch_entries: int = 50_000,
        write_buffer_size: int = 4 << 20,
        options_factory: Callable[[Options], None] | None = None,
        operator_uid: str | None = None,
    ) -> None:
        if max_parallelism > MAX_KEY_GROUPS:
            raise ConfigurationError("the RocksDB backend supports max_parallelism <= 65536")
        self.key_group_range = key_group_range
        self.max_parallelism = max_parallelism
        self.incremental = incremental
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=False)
        self._opts = options(write_buffer_size, options_factory)
        self._db_dir = directory / "db"
        db: Rdict = open_db(self._db_dir, self._opts)
        super().__init__(db, cache_entries, write_batch_entries, encode_key, operator_uid)
        self._start = key_group_range.start
        self._end = key_group_range.end
        self._key_serializer: Serializer | None = None
        self._decode_key: Callable[[bytes], Any] = decode_key
        self._assign = KeyGroupAssigner(max_parallelism)
        self._kg = [key_group_prefix(kg) for kg in range(max_parallelism)]
        # (self._kgb_memo, from WriteBackCache: key -> key-group prefix of keys checked to
        # be in range; the hot path of set_current_key is one hit in it)
        # local SST file name -> handle file ref, from the last completed checkpoint
        self._base: dict[str, dict[str, Any]] = {}
        self._uploaded: dict[int, dict[str, dict[str, Any]]] = {}
        self._snapshots: set[RocksDBSnapshot] = set()
        self._disposed = False
        self._db_closed = False

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
        self._kgb_memo = {}

    def set_current_key(self, key: Any) -> None:
        """Scope state calls to ``key``.

        Raises:
            UnsupportedKeyError: if ``key`` is not hashable, or has no canonical encoding
                and no key serializer was set (naming the operator).
            StateAccessError: if ``key`` belongs to another instance's key groups.
        """
        try:
            kgb = self._kgb_memo.get(key)
        except TypeError:
            kgb = None  # unhashable: the assigner raises the error naming the operator
        if kgb is None:
            kgb = self._key_group_prefix(key)
        self.current_key = key
        self._kgb = kgb

    def _key_group_prefix(self, key: Any) -> bytes:
        """The memo miss of :meth:`set_current_key`: ``key``'s key group, checked against
        this instance's range, as its 2-byte prefix (memoized; the memo is emptied when
        it holds as many keys as the assigner's own cache)."""
        try:
            kg = self._assign(key)
        except UnsupportedKeyError as exc:
            raise exc.for_operator(self.operator_uid) from None
        if not self._start <= kg <= self._end:
            raise StateAccessError(
                f"key {key!r} belongs to key group {kg}, outside this instance's range "
                f"{self.key_group_range.to_list()}: is the key selector deterministic?"
            )
        kgb = self._kg[kg]
        memo = self._kgb_memo
        if len(memo) >= self.kgb_memo_size:
            memo.clear()
        memo[key] = kgb
        return kgb

    # ------------------------------------------------------------------ states
    def get_state(self, descriptor: StateDescriptor) -> State:
        table = self._table(descriptor.name, descriptor.kind)
        if table.kind is not None and table.kind != descriptor.kind:
            raise StateAccessError(
                f"state {descriptor.name!r} is registered as {table.kind} state, "
                f"requested as {descriptor.kind}"
            )
        table.bind(descriptor)
        return create_state(self, table, descriptor)

    def get_ttl_state(self, descriptor: StateDescriptor, config: StateTtlConfig,
                      clock: TtlClock) -> State | None:
        # a value state reads the write-back cache directly (.ttl_state); the other kinds
        # get the runtime's decorators over this backend's state. The clock is kept so that
        # a checkpoint's local phase leaves out what expired by its TTL time (:mod:`.ttl`)
        stored = backend_descriptor(descriptor, config)
        inner = self.get_state(stored)
        self._ttl_times[stored.name] = (stored.kind, clock.now)
        if not isinstance(descriptor, ValueStateDescriptor):
            return ttl_state(descriptor, config, inner, clock.now)
        assert isinstance(inner, ValueState)
        cls = RocksDBTtlValueStateOnRead if config.update_type == "on_read_and_write" \
            else RocksDBTtlValueState
        return cls(inner, self, self._table(stored.name, stored.kind), descriptor.default,
                   config, clock)

    def ttl_cleanup(self) -> IncrementalCleanup:
        """The sweep of the stored TTL entries (:class:`.ttl_sweep.RocksDBTtlSweep`): reads
        RocksDB from a cursor, without writing every dirty entry out first as
        :meth:`keys_in_key_group` does."""
        return RocksDBTtlSweep(self, lambda: self._decode_key)

    def keys(self, state_name: str) -> Iterator[Any]:
        table = self._tables.get(state_name)
        if table is None:
            return iter(())
        self._flush_dirty()
        out: list[Any] = []
        for kg in range(self._start, self._end + 1):
            self._key_group_keys(table.sid, kg, out)
        return iter(out)

    def approximate_entries(self) -> int:
        """RocksDB's estimate of its keys (``rocksdb.estimate-num-keys``: deletes not yet
        compacted away may still count) plus the cached entries not yet written to it."""
        try:
            stored = int(self._db.property_int_value("rocksdb.estimate-num-keys") or 0)
        except Exception:  # a closed database (between attempts): nothing to estimate
            return 0
        return stored + sum(len(t.dirty) for t in self._tables.values())

    def keys_in_key_group(self, state_name: str, key_group: int) -> list[Any]:
        table = self._tables.get(state_name)
        if table is None or not self._start <= key_group <= self._end:
            return []
        self._flush_dirty()
        out: list[Any] = []
        self._key_group_keys(table.sid, key_group, out)
        return out

    def _key_group_keys(self, sid: bytes, kg: int, out: list[Any]) -> None:
        """Append the keys of state ``sid`` in key group ``kg`` (one prefix scan)."""
        prefix = self._kg[kg] + sid
        n = len(prefix)
        for k in self._db.keys(from_key=prefix):
            k = cast(bytes, k)  # raw mode: keys are bytes
            if k[:n] != prefix:
                break
            out.append(self._decode_key(k[n:]))

    # ------------------------------------------------------------------ snapshots
    def snapshot(self, ctx: SnapshotContext) -> KeyedStateSnapshot:
        """Synchronous part: freeze the write-back cache (O(number of states), see
        :mod:`.generations`) and mark the checkpoint in flight in checkpoint storage; the
        returned snapshot's ``write`` writes the frozen generation to RocksDB, creates the
        local RocksDB checkpoint and uploads it (:mod:`.snapshot`).

        Raises:
            OSError: if the checkpoint's directory cannot be created.
        """
        local = self.directory / f"chk-{ctx.checkpoint_id}-{uuid.uuid4().hex[:8]}"
        # marks the checkpoint as in flight for checkpoint storage before any shared file of
        # it exists (CheckpointStorage never collects shared files while one is in flight)
        ctx.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        gen = self._freeze(ctx.checkpoint_id, local)
        incremental = self.incremental and not ctx.savepoint
        snap = RocksDBSnapshot(
            ctx, gen, make_local=self._make_local, discard_gen=self._gens.discard,
            incremental=incremental,
            base=dict(self._base) if incremental else {},
            states={n: t.kind for n, t in self._tables.items()},
            custom=sorted(n for n, t in self._tables.items() if t.custom),
            key_group_range=self.key_group_range.to_list(),
            max_parallelism=self.max_parallelism,
            key_encoding=key_encoding_name(self._key_serializer),
            on_uploaded=self._uploaded.__setitem__,
            on_done=self._snapshot_done,
        )
        self._snapshots.add(snap)
        return snap

    async def _make_local(self, gen: Generation) -> Path:
        """The local phase of ``gen``'s snapshot: refill the cache from it (the hot keys),
        then write it to RocksDB and create its local checkpoint (:mod:`.generations`)."""
        await self._refill(gen)
        return await self._gens.make_local(gen)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        uploaded = self._uploaded.pop(checkpoint_id, None)
        if uploaded is not None:
            self._base = uploaded
        for cid in [c for c in self._uploaded if c < checkpoint_id]:
            del self._uploaded[cid]

    def _snapshot_done(self, snap: RocksDBSnapshot) -> None:
        self._snapshots.discard(snap)
        if self._db_closed and not self._snapshots:
            shutil.rmtree(self.directory, ignore_errors=True)

    # ------------------------------------------------------------------ restore
    def restore(self, handles: list[dict[str, Any]], job_dir: Path) -> None:
        """Load the key groups of this instance's range from ``handles`` (see
        :mod:`.restore`): RocksDB snapshots of any parallelism, and any backend's whose
        key-group reader is registered (heap).

        Raises:
            RestoreError: for a handle of an unreadable backend or format, another key
                encoding, an unreadable file, or conflicting state kinds.
        """
        op = RocksDBRestoreOperation(
            self, db_dir=self._db_dir, opts=self._opts, scratch_dir=self.directory,
            key_group_range=self.key_group_range, key_serializer=self._key_serializer,
            operator_uid=self.operator_uid)
        op.run(handles, job_dir)
        if op.base is not None:
            self._base = op.base

    def dispose(self) -> None:
        """Close the database and remove the working directory (once no asynchronous part
        and no flush-and-checkpoint job in a worker thread uses them any more)."""
        if self._disposed:
            return
        self._disposed = True
        job = self._gens.running_job()
        self._gens.close()
        self._clear_cache()
        # an asynchronous part that never started (its task was cancelled with the failed
        # attempt) would never remove its local checkpoint; one that runs cleans up itself
        for snap in [s for s in self._snapshots if not s.started]:
            snap.discard()
        if job is None:
            self._close_db()
        else:
            # a thread is flushing or checkpointing this database: closing it now would
            # pull it from under that call
            job.add_done_callback(lambda _: self._close_db())

    def _close_db(self) -> None:
        self._db.close()
        self._db_closed = True
        shutil.rmtree(self._db_dir, ignore_errors=True)
        if not self._snapshots:
            shutil.rmtree(self.directory, ignore_errors=True)


class RocksDBStateBackend(StateBackend):
    """Keyed state in RocksDB (rocksdict): state larger than memory, asynchronous and
    incremental snapshots (see :mod:`reactive.backends.rocksdb`; Carbone 2018 (PhD thesis),
    sections 4.5.1 and 4.5.2; Flink's ``EmbeddedRocksDBStateBackend``).

    Values go through the descriptors' serializers: change state only through
    ``update``/``add``/``put`` (an object mutated in place without ``update`` is lost when
    its cache entry is evicted).

    Args:
        path: the local working directory; each operator instance gets a fresh
            ``<path>/<job>/<uid>-<subtask>-<random>/`` that is removed when it is disposed.
            By default ``reactive-rocksdb`` in the system's temporary directory
            (``tempfile.gettempdir()``), as Flink's RocksDB local directories default to
            the task manager's temporary directories: a job touches nothing in its working
            directory but its checkpoint directory.
        incremental: upload only the SST files the last completed checkpoint did not hold
            (shared between checkpoints); ``False`` copies every file on each checkpoint.
        cache_entries: keys cached per state and instance (write-back cache) before the
            oldest are evicted (written out first if dirty); a snapshot keeps the cache warm,
            and a restore fills it when the restored state fits.
        write_batch_entries: dirty keys per state past which the oldest are written to
            RocksDB, in ``WriteBatch`` es of a few ms each (every step of this backend on
            the event loop is bounded by time, not by entry count). A larger window
            writes a hot key fewer times between checkpoints (W1: 1.3x the records/s at
            50,000 than at 20,000) but makes each checkpoint's frozen generation, written
            in the asynchronous part, larger (up to this many entries per state).
        write_buffer_size: RocksDB memtable size in bytes; the asynchronous part flushes at
            most about one memtable (in a worker thread).
        options_factory: called with each instance's ``rocksdict.Options`` to tune RocksDB.

    Raises:
        ConfigurationError: on a non-positive cache, batch or buffer size.
    """

    name = BACKEND
    #: the class of the instances' keyed backends
    keyed_backend_class: type[RocksDBKeyedStateBackend] = RocksDBKeyedStateBackend
    #: the class of the columnar operators' keyed backends (:mod:`.columnar` sets it when
    #: the package is imported)
    columnar_keyed_backend_class: type[RocksDBKeyedStateBackend] | None = None

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        incremental: bool = True,
        cache_entries: int = 100_000,
        write_batch_entries: int = 50_000,
        write_buffer_size: int = 4 << 20,
        options_factory: Callable[[Options], None] | None = None,
    ) -> None:
        if cache_entries < 1 or write_batch_entries < 1 or write_buffer_size < 1:
            raise ConfigurationError(
                "cache_entries, write_batch_entries and write_buffer_size must be >= 1"
            )
        self.path = Path(tempfile.gettempdir()) / "reactive-rocksdb" if path is None \
            else Path(path)
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
        directory = (self.path / file_name_component(job_name) /
                     f"{file_name_component(operator_uid)}-{subtask}-{uuid.uuid4().hex[:12]}")
        return self.keyed_backend_class(
            directory, key_group_range, max_parallelism,
            incremental=self.incremental,
            cache_entries=self.cache_entries,
            write_batch_entries=self.write_batch_entries,
            write_buffer_size=self.write_buffer_size,
            options_factory=self.options_factory,
            operator_uid=operator_uid,
        )

    def columnar_state_backend(self) -> StateBackend | None:
        """The backend of the columnar operators' keyed state: rows in RocksDB
        (:mod:`.columnar`), configured as this one."""
        cls = self.columnar_keyed_backend_class
        if cls is None:
            return None
        columnar = copy.copy(self)
        columnar.keyed_backend_class = cls
        return columnar
