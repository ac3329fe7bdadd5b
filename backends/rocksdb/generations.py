"""Frozen generations of the write-back cache: what a snapshot's synchronous part captures in
O(1), and the local phase that writes them to RocksDB and takes the local RocksDB checkpoint
off the task's critical path.

The synchronous part of a snapshot (Carbone 2018 (PhD thesis), section 4.5.1, asynchronous
snapshot invocation) only *freezes* the current generation of every state's write-back cache: its
dict of cached values and its dict of dirty keys become a :class:`FrozenTable` of a
:class:`Generation`, and the state continues into new, empty dicts (O(number of states) at any
state size). This is Flink's copy-on-write idea (the heap backend's ``CopyOnWriteStateMap``
snapshots) applied to the cache in front of RocksDB:

- reads look in the current generation, then in the frozen ones (newest first), then in
  RocksDB. A dirty value of a mutable type taken from a frozen generation is first
  serialized there (:meth:`FrozenTable.promote`), because the task may change that object
  in place afterwards (list and map state do); so a frozen generation always holds the
  state as of its barrier;
- the hot keys do not go cold: the asynchronous part first copies the newest frozen
  generation's entries back into the new cache in time-bounded steps
  (:meth:`.state.WriteBackCache._refill`), except dirty values of mutable types, which only
  :meth:`FrozenTable.promote` hands over (and the retirement of the last pending generation
  returns as clean entries);
- the *local phase* (:meth:`GenerationQueue.make_local`, in the snapshot's asynchronous part)
  writes the frozen dirty entries to RocksDB on the event loop in steps of at most
  :data:`STEP_SECONDS` (serializing and ``WriteBatch`` building hold the GIL, so a worker
  thread would only take turns with the task; a step bounded by time, not by entry count,
  keeps the loop's other tasks' delays bounded whatever the values cost to serialize), then
  flushes the memtable and creates the RocksDB checkpoint in a worker thread
  (:func:`flush_and_checkpoint`: ``flush`` releases the GIL, ``create_checkpoint`` holds it
  but is short once the memtable is flushed). Generations are processed oldest first, one at a
  time, so checkpoint *n* holds every generation up to *n*'s and none after it;
- while a generation is not in RocksDB, the task writes nothing to RocksDB (a newer value
  would leak into the older checkpoint): the current generation grows in memory instead, up
  to ``pending_limit`` entries per state. Past that bound the task finishes the pending
  local phases itself (:meth:`GenerationQueue.drain`, a synchronous pause, as
  back-pressure), as it does before ``keys()``.

A discarded snapshot's generation is still written to RocksDB (it is live state), just
without a checkpoint. A retired generation's values that the task did not take back return
to the cache as clean entries (when it was the last pending one and the cache has room).
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from rocksdict import Checkpoint, Rdict, WriteBatch

from reactive.errors import StateSerializationError

from .ttl import DROP, dropped_count, live_value

__all__ = [
    "ABSENT",
    "CLOCK_EVERY",
    "IMMUTABLE",
    "MISS",
    "STEP_SECONDS",
    "FrozenRows",
    "FrozenTable",
    "Generation",
    "GenerationQueue",
    "clock",
    "raw_bytes",
    "run_in_worker",
    "step_budget",
]

#: a cache lookup found nothing (look further down: frozen generations, then RocksDB)
MISS: Any = object()
#: a cached "no value" (a known miss, or a cleared value: a delete when written out)
ABSENT: Any = object()

#: seconds of event-loop time one step of writing cached entries to RocksDB may take (a
#: local phase's step, or the task writing dirty entries out): an application task sharing
#: the loop then waits a few ms at most (the target: an application task's p99 delay under
#: 10 ms while a job runs)
STEP_SECONDS = 0.002
#: the clock that bounds the steps (seconds; a test may replace it with a fake one)
clock: Callable[[], float] = time.perf_counter
#: entries written between two looks at the clock within a step (a clock read costs ~50 ns,
#: an entry ~1 us to serialize and add to the batch)
CLOCK_EVERY = 64
#: value types nobody changes in place: a frozen dirty value of one of these types may be
#: shared with the current generation as it is (no serialized copy first)
IMMUTABLE: frozenset[type] = frozenset({int, float, str, bytes, bool, type(None)})

# RocksDB flush/checkpoint work and snapshot file work of every instance; two threads: the
# machine this targets has two cores, and these calls wait mostly on the disk, without the
# GIL (``flush``, file copies and hashes, fsync)
_WORKERS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="rocksdb-snapshot")


def raw_bytes(value: bytes) -> bytes:
    """The serializer of a state whose cached values are the stored bytes already (a
    columnar operator's pickled rows): written as they are, without a call per entry."""
    return value


def step_budget() -> tuple[Callable[[], float], float, int]:
    """(:data:`clock`, :data:`STEP_SECONDS`, :data:`CLOCK_EVERY`) as they are now (read at
    each step, so that a test may replace them)."""
    return clock, STEP_SECONDS, CLOCK_EVERY


def run_in_worker(fn: Callable[..., Any], *args: Any) -> Future[Any]:
    """Run ``fn(*args)`` in the backend's worker threads; return its concurrent future."""
    return _WORKERS.submit(fn, *args)


def flush_and_checkpoint(db: Rdict, local: Path) -> None:
    """Blocking (worker thread): flush the memtable of ``db`` and create a RocksDB checkpoint
    in ``local`` (hard links of the immutable SST files, copies of MANIFEST, OPTIONS, CURRENT).

    Measured (``python -m bench.rocksdict_gil``): rocksdict's ``flush`` releases the GIL while
    RocksDB writes the memtable out, but ``create_checkpoint`` (like ``write`` and
    ``compact_range``) holds it for the whole call: 2-6 ms after the flush, and ~200 ms on a
    memtable of 300,000 entries, which it would flush itself with the event loop stopped. So
    the flush comes first, in its own call; the task writes nothing to RocksDB while a
    generation is pending, so the memtable is still empty when the checkpoint is created.

    Raises:
        Exception: rocksdict's error when RocksDB cannot flush or create the checkpoint.
    """
    db.flush()
    Checkpoint(db).create_checkpoint(str(local))


class CacheTable(Protocol):
    """What freezing needs of a state's table (:class:`.state.StateTable`)."""

    name: str
    sid: bytes
    dumps: Callable[[Any], bytes]
    cache: dict[Any, Any]
    dirty: dict[Any, bytes]
    staged: dict[Any, bytes]


class FrozenRows(Protocol):
    """Serialized rows of one state that a generation holds beside its frozen tables,
    written to RocksDB by the rows' own code (a columnar cache's changed slots at the
    barrier, :mod:`.columnar`)."""

    #: the state's name
    name: str

    def persist(self, db: Rdict, encode: Callable[[Any], bytes], budget: float) -> bool:
        """Write more rows to ``db`` for about ``budget`` seconds; return whether all are
        written."""

    def lookup(self, key: Any) -> Any:
        """The stored bytes of ``key`` here (``ABSENT``: deleted; ``MISS``: not here)."""

    def waiting(self) -> Future[Any] | None:
        """Work in a worker thread the next :meth:`persist` step needs done first (the
        local phase awaits it instead of polling), or None. :meth:`persist` with an
        infinite budget waits for it itself."""


class FrozenTable:
    """One state's write-back cache generation as of a barrier (read-only after freezing).

    Attributes:
        name: the state's name.
        sid: its 4-byte state id.
        dumps: its value serializer at freezing time.
        values: key -> cached value (``ABSENT``: no value).
        dirty: key -> key-group prefix, the keys not yet in RocksDB.
        serialized: key -> value bytes of dirty keys whose object the task took over.
        staged: the state's restored-but-unread entries (shared with the live state): a
            key written to RocksDB leaves it.
        ttl: a TTL state's kind and the checkpoint's TTL time (seconds), read in the
            synchronous part: a dirty entry expired by then is written as a delete, a
            list's or map's expired elements left out (:mod:`.ttl`); None: no TTL.
    """

    __slots__ = ("dirty", "dumps", "held_back", "name", "operator_uid", "serialized", "sid",
                 "staged", "ttl", "values")

    def __init__(self, table: CacheTable, operator_uid: str | None) -> None:
        self.name = table.name
        self.sid = table.sid
        self.dumps = table.dumps
        self.values = table.cache
        self.dirty = table.dirty
        self.staged = table.staged
        self.serialized: dict[Any, bytes] = {}
        self.operator_uid = operator_uid
        # dirty keys of mutable values the refill left here (None: refill not finished)
        self.held_back: list[Any] | None = None
        self.ttl: tuple[str, float] | None = None

    def serialize(self, key: Any, value: Any) -> bytes:
        """``value`` of ``key`` as bytes.

        Raises:
            StateSerializationError: if the serializer refuses it.
        """
        try:
            return self.dumps(value)
        except Exception as exc:
            raise StateSerializationError(self.operator_uid or "?", self.name, key,
                                          exc) from exc

    def promote(self, key: Any) -> Any:
        """Return the value of ``key`` here (``MISS`` if absent from this generation) for
        the current generation to own; a dirty one is serialized first, so that changing
        the object in place later cannot change this generation.

        Raises:
            StateSerializationError: if the serializer refuses the value.
        """
        value = self.values.get(key, MISS)
        if value is not MISS and value is not ABSENT and type(value) not in IMMUTABLE \
                and key in self.dirty and key not in self.serialized:
            self.serialized[key] = self.serialize(key, value)
        return value


class Generation:
    """The frozen write-back cache of every state of one instance at one barrier.

    Args:
        checkpoint_id: the checkpoint whose barrier froze it.
        tables: the frozen states.
        local: where to create the local RocksDB checkpoint (None: none wanted).

    Attributes:
        persisted: every dirty entry is in RocksDB.
        checkpointed: the local checkpoint exists (or failed: ``checkpoint_error``).
        retired: out of the read path (persisted, and checkpointed if wanted).
        discarded: its snapshot was discarded (a local checkpoint made anyway is removed).
        dropped: TTL entries left out because they had expired by the checkpoint's TTL
            time (:attr:`FrozenTable.ttl`; a list's elements and a map's entries one by
            one).
    """

    def __init__(self, checkpoint_id: int, tables: list[FrozenTable],
                 local: Path | None) -> None:
        self.checkpoint_id = checkpoint_id
        self.tables = {ft.name: ft for ft in tables}
        self.local = local
        self.persisted = not any(ft.dirty for ft in tables)
        self.checkpointed = False
        self.retired = False
        self.discarded = False
        self.error: BaseException | None = None
        self.checkpoint_error: BaseException | None = None
        self.job: Future[None] | None = None
        self.dropped = 0
        #: rows beside the frozen tables that the generation writes after their entries
        #: (a columnar cache's barrier rows: newer than its table's frozen entries)
        self.rows: FrozenRows | None = None
        self._entries = self._iter_entries()
        self._entries_done = False

    def _iter_entries(self) -> Iterator[tuple[FrozenTable, Any, bytes]]:
        for ft in self.tables.values():
            for key, kgb in ft.dirty.items():
                yield ft, key, kgb

    def persist(self, db: Rdict, encode: Callable[[Any], bytes], budget: float) -> bool:
        """Write more dirty entries to ``db`` in one ``WriteBatch``, for about ``budget``
        seconds (at least :data:`CLOCK_EVERY` entries); return whether all are written.

        Raises:
            StateSerializationError: if a serializer refuses a value; the generation then
                stays unwritten and every later call raises the same error (its state can
                never reach RocksDB, so the task must fail).
        """
        if self.error is not None:
            raise self.error
        if self.persisted:
            return True
        if self._entries_done:
            assert self.rows is not None
            try:
                self.persisted = self.rows.persist(db, encode, budget)
            except BaseException as exc:
                self.error = exc
                raise
            return self.persisted
        wb = WriteBatch(raw_mode=True)
        n = 0
        now = clock
        # writing the batch costs about as much as building it (memtable inserts, ~1 us per
        # entry, holding the GIL): half the budget for each
        deadline = now() + budget / 2
        every = CLOCK_EVERY
        try:
            for ft, key, kgb in self._entries:
                if ft.staged:
                    ft.staged.pop(key, None)  # RocksDB gets a newer value
                data = ft.serialized.get(key)
                if data is None:
                    value = ft.values[key]
                    if ft.ttl is not None and value is not ABSENT:
                        # cleanup in the checkpoint: what expired by its TTL time is not
                        # written (a delete replaces an older value RocksDB may hold). A
                        # value the task took over (``serialized``, its bytes) is written
                        # as it is: the sweep or an access removes it later
                        kind, t = ft.ttl
                        live = live_value(kind, value, t)
                        if live is not value:
                            self.dropped += dropped_count(kind, value, live)
                            value = ABSENT if live is DROP else live
                    if value is ABSENT:
                        wb.delete(kgb + ft.sid + encode(key))
                        n += 1
                        if not n % every and now() >= deadline:
                            break
                        continue
                    data = value if ft.dumps is raw_bytes else ft.serialize(key, value)
                wb.put(kgb + ft.sid + encode(key), data)
                n += 1
                if not n % every and now() >= deadline:
                    break
            else:
                self._entries_done = True
                self.persisted = self.rows is None
            if n:
                db.write(wb)
        except BaseException as exc:
            self.error = exc
            raise
        return self.persisted

    def waiting(self) -> Future[Any] | None:
        """The worker-thread work of its rows the next :meth:`persist` step waits for
        (:meth:`FrozenRows.waiting`), or None."""
        return self.rows.waiting() if self.rows is not None and self._entries_done else None

    def lookup(self, name: str, key: Any) -> Any:
        """The value of ``key`` in state ``name`` here, promoted (``MISS`` if absent)."""
        rows = self.rows
        if rows is not None and rows.name == name:
            value = rows.lookup(key)
            if value is not MISS:
                return value
        ft = self.tables.get(name)
        return MISS if ft is None else ft.promote(key)


class GenerationQueue:
    """The frozen generations of one instance, oldest first, and their local phases.

    Args:
        db: returns the instance's current database.
        encode: key -> stored key bytes (returns the instance's current encoder).
        on_retired: called with a generation leaving the read path (to merge its values
            back into the cache).
    """

    def __init__(self, db: Callable[[], Rdict], encode: Callable[[], Callable[[Any], bytes]],
                 on_retired: Callable[[Generation, bool], None]) -> None:
        self.pending: list[Generation] = []
        self.closed = False
        self._db = db
        self._encode = encode
        self._on_retired = on_retired
        self._lock = asyncio.Lock()

    def close(self) -> None:
        """The instance is disposed: pending generations are dropped, local phases fail."""
        self.closed = True
        self.pending.clear()

    def add(self, gen: Generation) -> None:
        """Append a newly frozen generation (the newest)."""
        self.pending.append(gen)

    def running_job(self) -> Future[None] | None:
        """The flush-and-checkpoint job running in a worker thread, if any."""
        for g in self.pending:
            if g.job is not None and not g.job.done():
                return g.job
        return None

    async def make_local(self, gen: Generation) -> Path:
        """Asynchronous part, first step: write every generation up to ``gen`` to RocksDB
        (oldest first) and create ``gen``'s local checkpoint; return its directory.

        Raises:
            StateSerializationError: if a frozen value cannot be serialized.
            OSError: if the local checkpoint could not be created, or ``gen`` was discarded.
        """
        async with self._lock:
            while not gen.retired:
                if self.closed:
                    raise OSError(f"snapshot {gen.checkpoint_id}: the backend was disposed")
                await self._complete(self.pending[0])
        if self.closed:
            raise OSError(f"snapshot {gen.checkpoint_id}: the backend was disposed")
        if gen.checkpoint_error is not None:
            raise OSError(f"cannot create the local RocksDB checkpoint of checkpoint "
                          f"{gen.checkpoint_id}: {gen.checkpoint_error}")
        if gen.local is None or gen.discarded:
            raise OSError(f"snapshot {gen.checkpoint_id} was discarded")
        return gen.local

    async def _complete(self, g: Generation) -> None:
        """Local phase of ``g``: chunks of writes on the event loop, then the thread job."""
        while not g.retired and not g.persist(self._db(), self._encode(), STEP_SECONDS):
            work = g.waiting()
            if work is not None:
                # asyncio.wait: neither raises the work's error (the next step does) nor
                # cancels it
                await asyncio.wait({asyncio.wrap_future(work)})
            else:
                await asyncio.sleep(0)  # the task runs between two steps
        if g.retired:  # the task drained it meanwhile
            return
        if g.local is not None and g.job is None:
            g.job = run_in_worker(flush_and_checkpoint, self._db(), g.local)
        if g.job is not None:
            # asyncio.wait neither raises the job's error nor cancels the job when this
            # part is cancelled: a job running in a thread is always waited for (by the
            # next local phase, the drain, or dispose)
            await asyncio.wait({asyncio.wrap_future(g.job)})
        self._finish(g)

    def _finish(self, g: Generation) -> None:
        """``g`` is persisted and its job (if any) done: record the outcome, retire it."""
        if g.retired:
            return
        if g.job is not None:
            exc = g.job.exception()
            if exc is not None:
                g.checkpoint_error = exc
            g.checkpointed = True
            if g.discarded and g.local is not None:
                run_in_worker(shutil.rmtree, g.local, True)
        g.retired = True
        if g in self.pending:  # else the instance was disposed meanwhile
            self.pending.remove(g)
            self._on_retired(g, not self.pending)

    def discard(self, gen: Generation) -> None:
        """``gen``'s snapshot is abandoned: no checkpoint is created for it unless one is
        already being created (then it is removed when done); its entries still go to
        RocksDB."""
        gen.discarded = True
        if gen.job is None:
            gen.local = None

    def drain(self) -> None:
        """Blocking (on the task): finish every pending local phase now, in order.

        Raises:
            StateSerializationError: if a frozen value cannot be serialized.
        """
        for g in list(self.pending):
            while not g.persist(self._db(), self._encode(), float("inf")):
                pass
            if g.local is not None and g.job is None:
                done: Future[None] = Future()
                try:
                    flush_and_checkpoint(self._db(), g.local)
                    done.set_result(None)
                except Exception as exc:
                    done.set_exception(exc)
                g.job = done
            if g.job is not None:
                g.job.exception()  # waits (releasing the GIL) for a job in a thread
            self._finish(g)
