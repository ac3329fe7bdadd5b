"""Time-to-live on the RocksDB backend: expired entries are not written to RocksDB, and a
bounded sweep (:mod:`.ttl_sweep`) deletes the ones already there.

A TTL state stores ``(value, expires_at)`` pairs (:func:`reactive.state.ttl.
backend_descriptor`). Flink's RocksDB backend drops expired entries in a compaction filter;
rocksdict offers none, so this backend cleans up in two places instead:

- *in the local phase of a checkpoint*: the synchronous part reads each TTL state's clock
  once (the checkpoint's *TTL time*, :func:`barrier_times`), and a frozen dirty entry that
  has expired by then is written to RocksDB as a delete (a list's or map's expired elements
  are left out of the value written), so neither the working database nor the checkpoint's
  files hold it (:meth:`.generations.Generation.persist`);
- *in a sweep* (:class:`.ttl_sweep.RocksDBTtlSweep`, Flink's incremental cleanup driven
  like the heap backend's, :class:`reactive.state.ttl.IncrementalCleanup`): after each
  batch of records the operator processed, the next few stored entries of the TTL states
  are read from a cursor over the instance's key range, and the expired ones deleted in one
  ``WriteBatch``. A step checks at most :attr:`.ttl_sweep.RocksDBTtlSweep.STEP_ENTRIES`
  entries and ends after :data:`.generations.STEP_SECONDS` of the loop's time; the cursor
  wraps around at the end of the range, and walks each state's run of keys in a key group
  only up to the run's last key when it entered it (keys named in increasing order, all
  inserted past the cursor, are left to the next pass instead of being chased). An
  endlessly growing key space with TTL then keeps the database, and the SST files of
  incremental checkpoints, flat.

A key cached in the write-back cache is purged through its state instead (the cache holds
its newest value; the delete reaches RocksDB when the entry is written out). Nothing is
written to RocksDB while a frozen generation is pending (it would leak into an older
checkpoint), so a sweep step waits for the local phase to end. A restore never resurrects
an entry either way: the expiry time travels with every value, and an entry left in RocksDB
is still expired when read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from reactive.state.ttl import DROP, live_value

__all__ = ["DROP", "barrier_times", "dropped_count", "live_value"]

def dropped_count(kind: str, value: Any, live: Any) -> int:
    """The entries ``live`` (:func:`live_value`'s answer) left out of ``value``: a list's
    elements and a map's entries one by one, a value or reducing state's pair as one."""
    if kind == "list" or kind == "map":
        return len(value) - (0 if live is DROP else len(live))
    return 1 if live is DROP else 0


def barrier_times(times: dict[str, tuple[str, Callable[[], float]]]
                  ) -> dict[str, tuple[str, float]]:
    """Each TTL state's kind and TTL time, read now (a snapshot's synchronous part).

    Args:
        times: state name -> (kind, its clock's ``now``) of the instance's TTL states.
    """
    return {name: (kind, now()) for name, (kind, now) in times.items()}
