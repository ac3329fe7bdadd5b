"""Garbage-collector settings for the duration of a job that owns its process.

A dataflow allocates a few short-lived objects per record (records, output lists, tuples,
batches) while holding millions of long-lived ones (state, input buffers). With CPython's
default thresholds (a young collection every 700 net allocations) the collector runs every
few hundred records and its full collections walk the whole long-lived heap; on the flights
job that was ~2.3 us of ~12 us per record. :func:`throughput_gc` raises the young
generation's threshold and moves the objects alive at the start into the permanent
generation (``gc.freeze()``), the settings Instagram described for its Python servers and
CPython documents for ``gc.freeze``. Reference counting still frees every acyclic object at
once; only cyclic garbage waits longer (at most ``threshold0`` allocations).

It changes process-wide settings, so the runtime applies it only where it owns the process
(:meth:`reactive.Dataflow.execute`, the ``reactive`` command line, ``run_coroutine``); an
application embedding a job on its own loop may wrap its ``await flow.run(...)`` in it.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["THRESHOLD0", "throughput_gc"]

THRESHOLD0 = 50_000
"""Net allocations between two young-generation collections while a job runs (CPython's
default is 700)."""


@contextlib.contextmanager
def throughput_gc(threshold0: int = THRESHOLD0) -> Iterator[None]:
    """Run the block with the young generation collected every ``threshold0`` net
    allocations and the objects alive at entry frozen; restore both on exit.

    The freeze is skipped (and nothing unfrozen on exit) when objects are frozen already:
    ``gc.unfreeze`` cannot tell the application's frozen objects from ours. With the
    collector disabled (``gc.disable()``) nothing is changed.

    Args:
        threshold0: the young generation's threshold (net allocations, >= 1).

    Raises:
        ValueError: if ``threshold0 < 1``.
    """
    if threshold0 < 1:
        raise ValueError(f"threshold0 must be >= 1, not {threshold0}")
    if not gc.isenabled():
        yield
        return
    old = gc.get_threshold()
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.collect()  # what is garbage now is not frozen with the rest
        gc.freeze()
    gc.set_threshold(max(threshold0, old[0]), *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)
        if freeze:
            gc.unfreeze()
