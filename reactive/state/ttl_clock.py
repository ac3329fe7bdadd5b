"""The time a state's time-to-live is measured in, read once per batch of records.

Reading the clock is not free: ``time.time()`` costs 50-200 ns a call depending on the
platform (about 170 ns on the 2-core CI machine), and a TTL value state read and written for
every record would read it twice a record. The operator therefore freezes a
:class:`TtlClock` at the start of each batch of records it processes and thaws it after
(:func:`reactive.runtime.operators.record_calls.call_per_record`): inside a batch every access
sees the batch's time; outside one (a timer, a state query) an access reads the clock.

Consequence, stated as the invariant the TTL states keep: an access's time is never later
than the true time of the access, and never earlier than the start of the batch it runs in.
An entry written during a batch therefore expires at most one batch's processing time early
(the batch runs within the task's time slice, milliseconds), and a read may find an entry
live up to that long after its expiry; Flink's ``TtlTimeProvider`` has millisecond
granularity for the same reason.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["TtlClock"]


class TtlClock:
    """A time source that can be frozen for the length of a batch.

    Args:
        read: the underlying time source (seconds): the wall clock, a manual clock's
            ``now``, or the operator's current watermark for event-time TTL.

    Attributes:
        frozen: the batch's time while frozen, else None.
    """

    __slots__ = ("frozen", "read")

    def __init__(self, read: Callable[[], float]) -> None:
        self.read = read
        self.frozen: float | None = None

    def now(self) -> float:
        """The frozen time inside a batch, else the time read now (seconds)."""
        t = self.frozen
        return self.read() if t is None else t

    def freeze(self) -> None:
        """Fix the time for the accesses until :meth:`thaw` (the start of a batch)."""
        self.frozen = self.read()

    def thaw(self) -> None:
        """Let accesses read the time source again (the end of a batch)."""
        self.frozen = None
