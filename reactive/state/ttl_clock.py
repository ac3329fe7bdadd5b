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

A state on the per-record path subscribes to the clock (:meth:`TtlClock.subscribe`): at a
freeze the clock hands it the batch's time and the expiry of a write at that time (one
addition per state and batch, not per write), so an access compares with an attribute of
its own. Thawed, the time handed out is ``+inf`` (every stored expiry compares as due), which
sends an access to its slow path, where it reads the clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

__all__ = ["TtlClock", "TtlClockSubscriber"]


class TtlClockSubscriber(Protocol):
    """A state told the batch's time by its clock.

    Attributes:
        _ttl: the state's time to live (seconds).
        _batch_now: the frozen time, ``+inf`` while the clock is thawed.
        _batch_expires: ``_batch_now + _ttl`` while frozen, None while thawed.
        floor: a lower bound of the expiries the state wrote, which the clock lowers to
            ``_batch_expires`` at a freeze (the state's writes in the batch use it).
    """

    _ttl: float
    _batch_now: float
    _batch_expires: float | None
    floor: float


class TtlClock:
    """A time source that can be frozen for the length of a batch.

    Args:
        read: the underlying time source (seconds): the wall clock, a manual clock's
            ``now``, or the operator's current watermark for event-time TTL.

    Attributes:
        frozen: the batch's time while frozen, else None.
    """

    __slots__ = ("_subscribers", "frozen", "read")

    def __init__(self, read: Callable[[], float]) -> None:
        self.read = read
        self.frozen: float | None = None
        self._subscribers: list[TtlClockSubscriber] = []

    def now(self) -> float:
        """The frozen time inside a batch, else the time read now (seconds)."""
        t = self.frozen
        return self.read() if t is None else t

    def subscribe(self, state: TtlClockSubscriber) -> None:
        """Keep ``state``'s ``_batch_now`` / ``_batch_expires`` in step with the clock."""
        self._subscribers.append(state)
        self._tell(state)

    def _tell(self, state: TtlClockSubscriber) -> None:
        t = self.frozen
        if t is None:
            state._batch_now = math.inf
            state._batch_expires = None
        else:
            state._batch_now = t
            state._batch_expires = expires = t + state._ttl
            if expires < state.floor:
                state.floor = expires

    def freeze(self) -> None:
        """Fix the time for the accesses until :meth:`thaw` (the start of a batch)."""
        self.frozen = t = self.read()
        for state in self._subscribers:
            state._batch_now = t
            state._batch_expires = expires = t + state._ttl
            if expires < state.floor:
                state.floor = expires

    def thaw(self) -> None:
        """Let accesses read the time source again (the end of a batch)."""
        self.frozen = None
        for state in self._subscribers:
            state._batch_now = math.inf
            state._batch_expires = None
