"""A short GIL switch interval while jobs run, so worker threads are not starved by a busy
event loop.

The runtime hands blocking work to threads (snapshot files, RocksDB flushes and
checkpoints, checkpoint metadata: :mod:`reactive.checkpoint.off_loop`). A thread that wants
the GIL waits ``sys.getswitchinterval()`` (5 ms by default) and then asks the holder to drop
it, but only if the GIL did not change hands meanwhile (CPython's ``take_gil``). A busy
event loop releases and retakes the GIL around every poll for I/O, i.e. after every task
time slice (:data:`reactive.runtime.task.TIME_SLICE`, 2 ms): each release resets the
waiting thread's clock, the loop thread retakes the GIL before the waiter wakes up, and the
waiter never gets to ask. Measured on W1: a thread doing a 1 MB file write waited 2.2 s for
the GIL (a snapshot whose work took 40 ms took 2.4 s), and a thread sleeping 1 ms woke up to
1.6 s late. With an interval shorter than the time slice the waiter asks before the next
release and gets the GIL within about one interval. 0.5 ms: a snapshot file's close (write,
fsync, rename) in the writer thread takes ~10 ms while W1 runs, against 0.27-1.7 s at 1 ms
(where the loop's polls still came often enough to starve it), and a probe thread's longest
wake-up delay is ~40 ms. A test that needs a slow checkpoint paces its input by snapshots,
never by how fast the input is read, so it holds at any interval.

The interval is process-wide: the first running job sets it (if it is longer), the last one
to end restores the previous value. A thread that wants the GIL costs the loop a switch per
interval (a few microseconds each); with no thread waiting there is no cost.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator

__all__ = ["SWITCH_INTERVAL", "short_switch_interval"]

SWITCH_INTERVAL = 0.0005
"""Seconds: the GIL switch interval while a job runs (CPython's default is 0.005)."""

_lock = threading.Lock()
_running = 0
_previous: float | None = None


@contextlib.contextmanager
def short_switch_interval(interval: float = SWITCH_INTERVAL) -> Iterator[None]:
    """Run the block with ``sys.setswitchinterval(min(current, interval))``; nested and
    concurrent uses (several jobs) share one setting, restored when the last one exits.

    Args:
        interval: seconds (> 0).

    Raises:
        ValueError: if ``interval <= 0``.
    """
    global _running, _previous
    if interval <= 0:
        raise ValueError(f"interval must be > 0, not {interval}")
    with _lock:
        if _running == 0:
            current = sys.getswitchinterval()
            if interval < current:
                _previous = current  # restored by the last one out
                sys.setswitchinterval(interval)
        _running += 1
    try:
        yield
    finally:
        with _lock:
            _running -= 1
            if _running == 0 and _previous is not None:
                sys.setswitchinterval(_previous)
                _previous = None
