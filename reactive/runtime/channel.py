"""Bounded FIFO channels and the input gate a task reads them through.

A :class:`Channel` connects one producer subtask to one consumer subtask and carries record
batches (``list``) and control events in order. Its capacity is counted in items (batches or
events): a producer awaiting ``put`` on a full channel is backpressure, as with anyio's
``create_memory_object_stream(max_buffer_size)``. The :class:`InputGate` multiplexes a task's
input channels, can *block* a channel (barrier alignment keeps its items queued, in order),
and delivers the task's mail (:class:`~.task_mailbox.TaskMailbox`) before any input, so a task
waiting for input wakes for mail too.

An unaligned checkpoint's barrier is put *ahead* of the items queued in a channel
(:meth:`Channel.put_overtaking`; Flink's priority events): the gate delivers it before any
data, even from a blocked channel, wrapped in an :class:`OvertakingBarrier` that says how many
queued items it overtook (they are the channel's in-flight data for that checkpoint).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

from .task_mailbox import TaskMailbox

__all__ = ["Channel", "InputGate", "OvertakingBarrier"]


class OvertakingBarrier:
    """An unaligned checkpoint's barrier in a channel, ahead of queued items.

    Attributes:
        barrier: the checkpoint barrier (a ``CheckpointBarrier``).
        overtaken: how many items queued behind it were put before it (records and events
            that precede the barrier in the stream).
    """

    __slots__ = ("barrier", "overtaken")

    def __init__(self, barrier: Any, overtaken: int) -> None:
        self.barrier = barrier
        self.overtaken = overtaken


class Channel:
    """A single-producer single-consumer bounded FIFO of batches and events.

    Args:
        capacity: maximum number of queued items (>= 1).
        name: for diagnostics (``"producer->consumer"``).
        side: the input of a two-input consumer the channel feeds (0 or 1; see
            ``reactive.graph.Edge.side``).

    Attributes:
        key_group_of: for a ``key_by`` edge, record -> key group (the partitioner's), so
            that an unaligned checkpoint's in-flight records can be re-partitioned by key
            group on a restore at another parallelism; None for other edges.
        broadcast: the edge broadcasts (every consumer instance gets every record).
    """

    __slots__ = (
        "_gate",
        "_items",
        "_space_waiter",
        "blocked",
        "broadcast",
        "capacity",
        "finished",
        "index",
        "key_group_of",
        "max_seen",
        "name",
        "side",
    )

    def __init__(self, capacity: int, name: str = "", side: int = 0) -> None:
        self.capacity = capacity
        self.name = name
        self.side = side
        self.key_group_of: Callable[[Any], int] | None = None
        self.broadcast = False
        self._items: deque[Any] = deque()
        self._space_waiter: asyncio.Future[None] | None = None
        self._gate: InputGate | None = None
        self.index = -1
        self.blocked = False
        self.finished = False
        self.max_seen = 0

    def __len__(self) -> int:
        return len(self._items)

    async def put(self, item: Any) -> None:
        """Append ``item``; waits while the channel is full (backpressure)."""
        items = self._items
        while len(items) >= self.capacity:
            waiter = asyncio.get_running_loop().create_future()
            self._space_waiter = waiter
            await waiter
        items.append(item)
        n = len(items)
        if n > self.max_seen:
            self.max_seen = n
        gate = self._gate
        if gate is not None and gate._waiter is not None and not self.blocked:
            gate._wake()

    def put_unbounded(self, item: Any) -> None:
        """Append ``item`` without waiting for room: the records an unaligned barrier is
        about to overtake (they exceed the capacity by at most one batch per barrier)."""
        self._items.append(item)
        gate = self._gate
        if gate is not None and gate._waiter is not None and not self.blocked:
            gate._wake()

    def put_overtaking(self, barrier: Any) -> None:
        """Put an unaligned checkpoint's ``barrier`` ahead of the queued items (behind the
        overtaking barriers already queued, which stay a prefix of the queue), never
        waiting for room."""
        items = self._items
        i = 0
        n = len(items)
        while i < n and type(items[i]) is OvertakingBarrier:
            i += 1
        items.insert(i, OvertakingBarrier(barrier, n - i))
        gate = self._gate
        if gate is not None:
            gate._overtaking += 1
            gate._wake()

    def overtaken(self, count: int) -> list[Any]:
        """The ``count`` items an overtaking barrier just taken from this channel passed:
        the first ``count`` queued items after the overtaking barriers queued since."""
        out: list[Any] = []
        for item in self._items:
            if len(out) == count:
                break
            if type(item) is not OvertakingBarrier:
                out.append(item)
        return out

    def _take(self) -> Any:
        item = self._items.popleft()
        waiter = self._space_waiter
        if waiter is not None:
            self._space_waiter = None
            if not waiter.done():
                waiter.set_result(None)
        return item


class InputGate:
    """A task's input channels, read together with its mailbox.

    ``get()`` returns ``(channel_index, item)`` from an unblocked channel with data (round
    robin, so no channel starves) or ``(-1, action)`` for a mailbox action, which takes
    precedence. Blocking a channel leaves its queued items in place, in order.

    Args:
        channels: the input channels, in the order of their indices.
        mailbox: the task's mailbox (a fresh one when omitted, e.g. a gate read alone).
    """

    def __init__(self, channels: list[Channel], mailbox: TaskMailbox | None = None) -> None:
        self.channels = channels
        for i, ch in enumerate(channels):
            ch.index = i
            ch._gate = self
        self._next = 0
        self._waiter: asyncio.Future[None] | None = None
        self.mailbox = mailbox if mailbox is not None else TaskMailbox()
        self.mailbox.bind(self._wake)
        # the mailbox's queue, read first by get()
        self._mail = self.mailbox.queue
        self._priority: Channel | None = None
        self._priority_threshold = 0
        # overtaking barriers queued in the channels (delivered before anything else)
        self._overtaking = 0

    def prioritize(self, index: int, threshold: int) -> None:
        """Deliver from channel ``index`` first whenever it holds ``threshold`` items or
        more (an iteration head's feedback channel: Carbone 2018 (PhD thesis), section 6.4.3.2,
        the loop drains before new input enters it)."""
        self._priority = self.channels[index]
        self._priority_threshold = threshold

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def block(self, index: int) -> None:
        """Stop delivering items of channel ``index`` (alignment)."""
        self.channels[index].blocked = True

    def unblock_all(self) -> None:
        """Deliver from every channel again."""
        for ch in self.channels:
            ch.blocked = False
        self._wake()

    def is_idle(self) -> bool:
        """True when nothing deliverable is queued (the task would wait in ``get``)."""
        if self._mail or self._overtaking:
            return False
        return all(ch.blocked or not ch._items for ch in self.channels)

    async def get(self) -> tuple[int, Any]:
        """Return the next mailbox action or channel item; waits when there is none."""
        channels = self.channels
        n = len(channels)
        while True:
            if self._mail:
                return -1, self._mail.popleft()
            if self._overtaking:
                for ch in channels:
                    if ch._items and type(ch._items[0]) is OvertakingBarrier:
                        self._overtaking -= 1
                        return ch.index, ch._take()
                self._overtaking = 0  # unreachable: every one is counted when queued
            first = self._priority
            if (first is not None and len(first._items) >= self._priority_threshold
                    and first._items and not first.blocked):
                return first.index, first._take()
            start = self._next
            for k in range(n):
                i = (start + k) % n
                ch = channels[i]
                if ch._items and not ch.blocked:
                    self._next = (i + 1) % n
                    return i, ch._take()
            waiter = asyncio.get_running_loop().create_future()
            self._waiter = waiter
            await waiter
