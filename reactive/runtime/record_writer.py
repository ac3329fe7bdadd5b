"""The output side of a task: partition batches into per-channel buffers and flush them.

Buffers are flushed when they reach the batch size, when the task is about to wait for
input (so a quiet stream still has low latency), after the buffer timeout, and before a
control event (events must stay behind the records emitted before them).
"""

from __future__ import annotations

from typing import Any

from .channel import Channel
from .partitioner import Partitioner

__all__ = ["RecordWriter"]


class RecordWriter:
    """Writes one task's output for one outgoing edge.

    Args:
        partitioner: decides each record's channel.
        channels: one per downstream instance (index = downstream subtask index).
        batch_size: records per batch before a buffer is flushed.
    """

    __slots__ = ("batch_size", "buffers", "channels", "partitioner", "records_out")

    def __init__(self, partitioner: Partitioner, channels: list[Channel], batch_size: int):
        self.partitioner = partitioner
        self.channels = channels
        self.batch_size = batch_size
        self.buffers: list[list[Any]] = [[] for _ in channels]
        self.records_out = 0

    def add(self, batch: list[Any]) -> bool:
        """Partition ``batch`` into the buffers; True when a buffer reached the batch size."""
        self.records_out += len(batch)
        buffers = self.buffers
        full = False
        for i, part in enumerate(self.partitioner.split(batch)):
            if part:
                buf = buffers[i]
                if buf:
                    buf.extend(part)
                else:
                    # take ownership: operators always return fresh lists
                    buffers[i] = buf = part
                if len(buf) >= self.batch_size:
                    full = True
        return full

    async def flush_full(self) -> None:
        """Send the buffers that reached the batch size."""
        size = self.batch_size
        buffers = self.buffers
        for i, buf in enumerate(buffers):
            if len(buf) >= size:
                buffers[i] = []
                await self.channels[i].put(buf)

    async def flush(self) -> None:
        """Send every non-empty buffer."""
        buffers = self.buffers
        for i, buf in enumerate(buffers):
            if buf:
                buffers[i] = []
                await self.channels[i].put(buf)

    def broadcast_overtaking(self, barrier: Any) -> None:
        """Send an unaligned checkpoint's ``barrier`` on every channel ahead of the queued
        output: the buffered records go into the channels first (without waiting for
        room), so the barrier overtakes them too and the consumer stores them as
        in-flight data."""
        buffers = self.buffers
        for i, ch in enumerate(self.channels):
            buf = buffers[i]
            if buf:
                buffers[i] = []
                ch.put_unbounded(buf)
            ch.put_overtaking(barrier)

    async def broadcast_event(self, event: Any) -> None:
        """Flush, then send ``event`` on every channel."""
        await self.flush()
        for ch in self.channels:
            await ch.put(event)
