"""Unaligned checkpoints at a task's inputs (Flink's FLIP-76, ``execution.checkpointing.unaligned``).

An aligned barrier waits behind every record queued in front of it, so under backpressure a
checkpoint takes as long as the job needs to drain its channels. An unaligned barrier is
put *ahead* of the queued items (:meth:`~.channel.Channel.put_overtaking`); the first one
to reach a task makes it snapshot at once and forward the barrier, again ahead of its
queued output. The records the barrier overtook, and on the channels where it has not
arrived yet every record until it does, belong to the epoch before the barrier but were
not processed before the snapshot: they are the *channel state* (in-flight data) the task
stores with its snapshot. The task still processes them as they come (it never blocks a
channel); it stores a copy. On restore they are replayed into the operator before any new
input (``StreamTask.run``), re-partitioned by key group at another parallelism
(:mod:`reactive.checkpoint.channel_state`).

Only the consumer side stores in-flight data: a channel is one queue shared by its producer
and its consumer, so the records an overtaking barrier passes in the producer's output are
the records ahead of it in the consumer's input (the producer puts its unsent buffers into
the channel first). Savepoints and the job's final checkpoint stay aligned (the barrier's
``unaligned`` is False): a final checkpoint must come after every record, so that the
two-phase-commit sinks commit all of them.
"""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Awaitable, Callable
from typing import Any

from ..checkpoint.channel_state import InFlightEntry
from ..errors import CheckpointError, StateSerializationError
from .barrier_handler import OnAligned, OnDecline, SingleCheckpointBarrierHandler
from .channel import Channel, InputGate, OvertakingBarrier
from .events import CheckpointBarrier

__all__ = ["ChannelStateRecorder", "UnalignedCheckpointBarrierHandler"]

OnUnaligned = Callable[[CheckpointBarrier, "asyncio.Future[list[InFlightEntry]]"], Awaitable[None]]
"""``await on_unaligned(barrier, in_flight)``: snapshot now; ``in_flight`` resolves to the
checkpoint's channel state once the barrier has arrived on every input."""


class ChannelStateRecorder:
    """Collects one task's in-flight input records of one unaligned checkpoint.

    A channel's in-flight records are those the barrier overtook on it (still queued
    behind it when it arrives: recorded at once, so the checkpoint need not wait for the
    task to process them) and, until the barrier arrives on it, every item it delivers.

    Args:
        uid: the task's head operator (named in serialization errors).
        checkpoint_id: the checkpoint.
        channels: the task's input channels.
        first: the channel the first barrier came on; ``overtaken``: the items it overtook.
        live: the channels that have not ended.
    """

    def __init__(self, uid: str, checkpoint_id: int, channels: list[Channel], first: int,
                 overtaken: int, live: set[int]) -> None:
        self.uid = uid
        self.checkpoint_id = checkpoint_id
        self.channels = channels
        self.waiting = set(live)
        self.entries: list[InFlightEntry] = []
        self.result: asyncio.Future[list[InFlightEntry]] = (
            asyncio.get_running_loop().create_future())
        self.barrier_arrived(first, overtaken)

    @property
    def complete(self) -> bool:
        return self.result.done()

    def barrier_arrived(self, channel: int, overtaken: int) -> None:
        """The checkpoint's barrier arrived on ``channel``, ahead of ``overtaken`` items."""
        self.waiting.discard(channel)
        if overtaken:
            ch = self.channels[channel]
            for item in ch.overtaken(overtaken):
                if type(item) is list and item:
                    self._record(ch, item)
        self._check()

    def on_item(self, channel: int, item: Any) -> None:
        """The task took ``item`` from ``channel`` (before processing it)."""
        if channel in self.waiting and type(item) is list and item:
            self._record(self.channels[channel], item)

    def channel_ended(self, channel: int) -> None:
        """``channel`` ended: no barrier comes on it any more."""
        self.waiting.discard(channel)
        self._check()

    def fail(self, reason: BaseException) -> None:
        """Give the checkpoint up (aborted or subsumed)."""
        if not self.result.done():
            self.result.set_exception(reason)
            self.result.exception()  # retrieved: the asynchronous part may be gone

    def _record(self, ch: Channel, batch: list[Any]) -> None:
        # serialized now: an operator may change a record in place once it processes it
        try:
            blob = pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            self.fail(StateSerializationError(self.uid, "<in-flight records>", None, exc))
            return
        if ch.key_group_of is not None:
            key_group_of = ch.key_group_of
            self.entries.append(InFlightEntry(ch.side, "keyed", blob,
                                              [key_group_of(r) for r in batch]))
        else:
            self.entries.append(InFlightEntry(
                ch.side, "broadcast" if ch.broadcast else "split", blob, None))

    def _check(self) -> None:
        if not self.waiting and not self.result.done():
            self.result.set_result(self.entries)


class UnalignedCheckpointBarrierHandler(SingleCheckpointBarrierHandler):
    """Exactly-once barrier handling with unaligned checkpoints (Flink's
    ``SingleCheckpointBarrierHandler`` with its unaligned controller).

    An aligned barrier (a savepoint, the final checkpoint) is aligned as by the base class.
    The first overtaking barrier of checkpoint n triggers the snapshot (``on_unaligned``)
    with a :class:`ChannelStateRecorder`; the task hands it every item it takes while it
    records (:meth:`on_item`). A barrier of a newer checkpoint declines n as subsumed, as
    for an alignment.

    Args:
        gate: the task's input gate.
        uid: the task's head operator.
        on_aligned: snapshot for an aligned barrier.
        on_unaligned: snapshot for an unaligned barrier.
        on_decline: give up a subsumed checkpoint.
    """

    def __init__(self, gate: InputGate, uid: str, on_aligned: OnAligned,
                 on_unaligned: OnUnaligned, on_decline: OnDecline | None = None) -> None:
        super().__init__(gate, on_aligned, on_decline)
        self.uid = uid
        self.on_unaligned = on_unaligned
        #: the unaligned checkpoint whose in-flight records are being collected, or None
        self.recorder: ChannelStateRecorder | None = None

    def on_item(self, channel: int, item: Any) -> None:
        """The task took ``item`` from ``channel`` while :attr:`recorder` is set."""
        rec = self.recorder
        assert rec is not None
        rec.on_item(channel, item)

    async def on_barrier(self, channel: int, barrier: CheckpointBarrier) -> None:
        rec = self.recorder
        if rec is not None and barrier.checkpoint_id > rec.checkpoint_id:
            self._subsume(rec, barrier.checkpoint_id)
        await super().on_barrier(channel, barrier)

    async def on_overtaking(self, channel: int, item: OvertakingBarrier) -> None:
        """An unaligned barrier arrived on ``channel`` ahead of ``item.overtaken`` items."""
        barrier: CheckpointBarrier = item.barrier
        n = barrier.checkpoint_id
        rec = self.recorder
        if rec is not None and rec.checkpoint_id == n:
            rec.barrier_arrived(channel, item.overtaken)
            if rec.complete:
                self.recorder = None
            return
        if n <= self.current:
            return  # passed already (snapshotted, subsumed or aborted here)
        if rec is not None:
            self._subsume(rec, n)
        if self.aligning is not None:
            self._cancel_subsumed(self.aligning.checkpoint_id, n)
        self.current = n
        live = {i for i, ch in enumerate(self.gate.channels) if not ch.finished}
        rec = ChannelStateRecorder(self.uid, n, self.gate.channels, channel, item.overtaken,
                                   live)
        self.recorder = None if rec.complete else rec
        await self.on_unaligned(barrier, rec.result)

    async def on_end_of_input(self, channel: int) -> None:
        rec = self.recorder
        if rec is not None:
            rec.channel_ended(channel)
            if rec.complete:
                self.recorder = None
        await super().on_end_of_input(channel)

    def abort(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` was aborted: stop collecting its records."""
        rec = self.recorder
        if rec is not None and rec.checkpoint_id <= checkpoint_id:
            self.recorder = None
            rec.fail(CheckpointError(f"checkpoint {rec.checkpoint_id} aborted"))

    def _subsume(self, rec: ChannelStateRecorder, newer: int) -> None:
        self.recorder = None
        reason = CheckpointError(
            f"checkpoint {rec.checkpoint_id} subsumed: the barrier of checkpoint {newer} "
            f"arrived before every barrier of checkpoint {rec.checkpoint_id} "
            "(CHECKPOINT_DECLINED_SUBSUMED)")
        rec.fail(reason)
        if self.on_decline is not None:
            self.on_decline(rec.checkpoint_id, reason)
