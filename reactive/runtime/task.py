"""Stream tasks: one coroutine per parallel instance of an operator chain.

A task reads batches and control events from its :class:`~.channel.InputGate` (or from a
source reader), pushes batches through its chained operators, and writes the output through
its :class:`~.record_writer.RecordWriter` s (or to a sink writer). On a checkpoint barrier it
hands it to its :class:`~.subtask_checkpoint_coordinator.SubtaskCheckpointCoordinator`
(the synchronous part, forwarding the barrier, the asynchronous part); watermarks from its
inputs are merged by a :class:`~.watermark_valve.StatusWatermarkValve`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from ..checkpoint.failure_reason import CheckpointFailureReason
from ..errors import ReactiveError, UserFunctionError
from ..sources import SourceReader
from ..time.mailbox import OperatorMailbox
from ..time.watermarks import ACTIVE, IDLE, WatermarkStatus
from .barrier_handler import BarrierHandler, CheckpointBarrierTracker, SingleCheckpointBarrierHandler
from .channel import InputGate, OvertakingBarrier
from .events import (
    END_OF_DATA,
    END_OF_INPUT,
    MAX_WATERMARK,
    CheckpointBarrier,
    EndOfData,
    EndOfInput,
    LoopProbe,
    Watermark,
)
from .operators import SinkOperator, SourceOperator, StreamOperator, maybe_await
from .partitioner import KeySelectorError
from .record_writer import RecordWriter
from .subtask_checkpoint_coordinator import CheckpointAcknowledger, SubtaskCheckpointCoordinator
from .task_mailbox import MailboxAction
from .unaligned import UnalignedCheckpointBarrierHandler
from .watermark_valve import StatusWatermarkValve

if TYPE_CHECKING:
    from ..checkpoint.storage import CheckpointStorage
    from .operators.two_input import TwoInputOperator

__all__ = ["TIME_SLICE", "StreamTask", "TaskEnvironment"]

#: seconds a task processes queued input before it lets the event loop run other callbacks
#: (the application sharing the loop, the coordinator, asynchronous snapshot parts): a task
#: whose channels never run dry would otherwise hold the loop for as long as input keeps
#: arriving; a yield costs ~10 us, so 2 ms slices cost < 1% of throughput
TIME_SLICE = 0.002

#: the fewest records a task processes between two yields of an input batch it slices (see
#: :meth:`StreamTask._push_input`): below it the per-slice overhead would dominate
MIN_SLICE = 16


class _SuspensionProbe:
    """A loop callback that records whether it ran (see :meth:`StreamTask._write_sink`)."""

    __slots__ = ("suspended",)

    def __init__(self) -> None:
        self.suspended = False

    def mark(self) -> None:
        self.suspended = True


@dataclass
class TaskEnvironment:
    """What every task of one job attempt shares.

    Attributes:
        job_name: the dataflow's name.
        max_parallelism: number of key groups.
        batch_size: records per batch on channels.
        buffer_timeout: seconds after which partial output batches are flushed.
        exactly_once: align barriers (else at-least-once tracking).
        storage: checkpoint storage, None without checkpointing.
        coordinator: receives acknowledgements, None without checkpointing.
        spawn: runs a coroutine in the job's task group (asynchronous snapshot parts).
        on_source_finished: called when a source task reached its end of input.
        unaligned: checkpoints may be unaligned (``CheckpointConfig.unaligned``).
        synchronous: snapshots are written in the task before it goes on (the
            synchronous-snapshot baseline, ``CheckpointConfig(mode="synchronous")``).
    """

    job_name: str
    max_parallelism: int
    batch_size: int
    buffer_timeout: float
    exactly_once: bool
    storage: CheckpointStorage | None
    coordinator: CheckpointAcknowledger | None
    spawn: Callable[[Coroutine[Any, Any, None]], None]
    on_source_finished: Callable[[StreamTask], None]
    unaligned: bool = False
    synchronous: bool = False


class StreamTask:
    """One parallel instance of an operator chain.

    Args:
        env: the job attempt's shared environment.
        name: the chain's name (its operators' names joined by ' -> ').
        subtask: instance index; ``parallelism``: number of instances.
        operators: the chain, head first; a source chain starts with a SourceOperator, a sink
            chain ends with a SinkOperator.
        gate: input channels (a source task's gate has none), read with the task's
            mailbox (``gate.mailbox``).
        writers: one per outgoing edge.

    Attributes:
        mailbox: actions run in the task between two batches (:class:`~.task_mailbox.TaskMailbox`).
    """

    #: whether the task is an iteration's head (the job waits for its loop to end as for a
    #: source, before the final checkpoint)
    is_iteration_head = False

    #: the barrier handler of the input loop (set when the loop starts)
    _barriers: BarrierHandler

    def __init__(
        self,
        env: TaskEnvironment,
        name: str,
        subtask: int,
        parallelism: int,
        operators: list[StreamOperator],
        gate: InputGate,
        writers: list[RecordWriter],
    ) -> None:
        self.env = env
        self.name = name
        self.subtask = subtask
        self.parallelism = parallelism
        self.task_id = f"{name} ({subtask + 1}/{parallelism})"
        self.operators = operators
        self.gate = gate
        self.mailbox = gate.mailbox
        self.writers = writers
        self.source = operators[0] if isinstance(operators[0], SourceOperator) else None
        self.sink = operators[-1] if isinstance(operators[-1], SinkOperator) else None
        start = 1 if self.source else 0
        end = len(operators) - 1 if self.sink else len(operators)
        self.chain = operators[start:end]
        self.records_in = 0
        # (side, records) an unaligned checkpoint stored as in flight towards this task:
        # replayed into the chain before any new input (set by ExecutionGraph.restore)
        self.restored_in_flight: list[tuple[int, list[Any]]] = []
        self._unaligned: UnalignedCheckpointBarrierHandler | None = None
        self._last_yield = 0.0  # time.monotonic() when the task last let the loop run
        # records of one input batch the chain processes within a TIME_SLICE, from the cost
        # per record measured on the previous batches (see _push_input)
        self._slice = env.batch_size
        # seconds spent awaiting room in a full output channel (see _push_input)
        self._waited = 0.0
        self._ended = False
        self._closed = False
        # input channels whose EndOfInput has not come yet (see _process_input)
        self._open_inputs = 0
        # channels whose data ended, and loop probes waiting for the other channels
        self._data_ended: set[int] = set()
        self._probes: dict[LoopProbe, set[int]] = {}
        self.watermark = float("-inf")
        # event time (reactive.time): the valve combines the input channels' watermarks and
        # idle/active statuses; chained operators reach the task (timers, watermark
        # generators) via the mailbox
        self._valve = StatusWatermarkValve(len(gate.channels))
        self._idle_out = False
        self.checkpointing = SubtaskCheckpointCoordinator(
            self, operators, env.storage, env.coordinator, env.spawn, self._broadcast,
            lambda: self._closed)
        self.checkpointing.synchronous = env.synchronous
        for i, op in enumerate(self.chain):
            op.mailbox = OperatorMailbox(self, i)

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> None:
        """Open the operators, process until the end of input, close the operators."""
        try:
            for op in self.operators:
                if isinstance(op, SinkOperator):
                    await op.restore()
                op.open()
            if self.source is not None:
                self.source.reader.open(self.env.coordinator is not None)
                await self._run_source(self.source)
            else:
                await self._replay_in_flight()
                await self._run_inputs()
        finally:
            # closing disposes the keyed backends: an asynchronous snapshot part still in
            # flight must not acknowledge what it serializes from now on (see _async_part)
            self._closed = True
            for op in self.operators:
                with contextlib.suppress(Exception):
                    await maybe_await(op.close())

    async def _run_source(self, source: SourceOperator) -> None:
        reader = source.reader
        batch_size = self.env.batch_size
        timeout = self.env.buffer_timeout
        last_flush = time.monotonic()
        generates_watermarks = source.source.timestamp_fn is not None
        mail = self.mailbox
        while True:
            if mail.queue:
                await mail.run_pending()
            try:
                batch = await reader.read_batch(batch_size)
            except ReactiveError:
                raise
            except Exception as exc:
                raise source.fail(None, exc, reader.describe_position()) from exc
            if batch is None:
                break
            if batch:
                source.records_out += len(batch)
                await self._push(batch, 0)
            if generates_watermarks:
                await self._source_watermark(reader)
            now = time.monotonic()
            if not batch or now - last_flush >= timeout:
                await self._flush()
                last_flush = now
            # let the coordinator, downstream tasks and the application run between batches
            await asyncio.sleep(0)
        await self._advance_watermark(MAX_WATERMARK)
        await self._end_data()
        self.env.on_source_finished(self)
        # A finished source keeps injecting barriers, so the job can end with a final
        # checkpoint that commits every two-phase-commit sink (Flink FLIP-147).
        await mail.run_until(self._has_ended)

    def _has_ended(self) -> bool:
        return self._ended

    async def _source_watermark(self, reader: SourceReader) -> None:
        """Forward the watermark and idle status of a reader that generates them (per-split
        watermarks, :mod:`reactive.sources`); the status goes first, as for input channels."""
        idle = reader.is_idle()
        if idle != self._idle_out:
            await self.emit_watermark_status(IDLE if idle else ACTIVE)
        watermark = reader.current_watermark()
        if watermark is not None and watermark > self.watermark:
            await self._advance_watermark(watermark)

    def end(self) -> Awaitable[None]:
        """Mailbox action for a finished source: send end-of-input downstream and stop."""
        self._ended = True
        return self._end_input()

    async def _replay_in_flight(self) -> None:
        """Process the in-flight records of the restored unaligned checkpoint, before any
        new input: they preceded its barrier, after the state this task restored."""
        replay, self.restored_in_flight = self.restored_in_flight, []
        for side, records in replay:
            self.records_in += len(records)
            await self._push_input(records, side == 1)

    async def _run_inputs(self) -> None:
        """Process the input channels until every one has ended, then end the output."""
        self._barriers = self._create_barrier_handler()
        self._open_inputs = len(self.gate.channels)
        await self._process_input(self._on_event, None)
        await self._end_input()

    def _create_barrier_handler(self) -> BarrierHandler:
        """The barrier handler of the checkpointing mode: aligned, unaligned (FLIP-76) or
        at-least-once tracking."""
        gate = self.gate
        coordinator = self.env.coordinator
        # a checkpoint subsumed by a newer barrier during alignment is declined at once;
        # it is not a failure (Flink's CHECKPOINT_DECLINED_SUBSUMED): the newer one replaces it
        on_decline = None if coordinator is None else (
            lambda cid, reason: coordinator.decline(
                cid, self, reason, CheckpointFailureReason.CHECKPOINT_DECLINED_SUBSUMED))
        if self.env.exactly_once and self.env.unaligned:
            self._unaligned = UnalignedCheckpointBarrierHandler(
                gate, self.operators[0].uid, self.checkpointing.checkpoint_state,
                lambda barrier, in_flight: self.checkpointing.checkpoint_state(
                    barrier, 0.0, in_flight),
                on_decline)
            return self._unaligned
        if self.env.exactly_once:
            return SingleCheckpointBarrierHandler(
                gate, self.checkpointing.checkpoint_state, on_decline)
        return CheckpointBarrierTracker(gate, self.checkpointing.checkpoint_state)

    async def _process_input(self, on_event: Callable[[int, Any], Awaitable[None]],
                             on_batch: Callable[[int, list[Any]], None] | None) -> None:
        """The input loop, the default action of the task's mailbox: until
        ``_open_inputs`` drops to zero, run the mail, push each record batch through the
        chain (flushing the output after ``buffer_timeout`` and sharing the loop after each
        :data:`TIME_SLICE`), and hand every other item of channel ``idx`` to
        ``on_event(idx, item)``.

        Args:
            on_event: handles a control event (barriers, watermarks, ends of input...);
                it decrements ``_open_inputs`` when an input ends for good.
            on_batch: sees each record batch before it is processed (an iteration head
                logs its feedback), or None.
        """
        gate = self.gate
        unaligned = self._unaligned
        timeout = self.env.buffer_timeout
        # batches of a two-input operator's second input go to its process_batch2
        second = [ch.side == 1 for ch in gate.channels]
        two_input = any(second)
        last_flush = time.monotonic()
        while self._open_inputs:
            if gate.is_idle():
                await self._flush()
                # get() waits for input now: the loop runs everything else meanwhile
                last_flush = self._last_yield = time.monotonic()
            idx, item = await gate.get()
            if (unaligned is not None and unaligned.recorder is not None and idx >= 0
                    and type(item) is not OvertakingBarrier):
                # before processing: the record is stored as it came
                unaligned.on_item(idx, item)
            if idx < 0:
                await maybe_await(item())
            elif type(item) is list:
                self.records_in += len(item)
                if on_batch is not None:
                    on_batch(idx, item)
                now = await self._push_input(item, two_input and second[idx])
                if now - last_flush >= timeout:
                    await self._flush()
                    last_flush = now
                if now - self._last_yield >= TIME_SLICE:
                    await self.share_loop()
            else:
                await on_event(idx, item)

    async def _on_event(self, idx: int, item: Any) -> None:
        """A control event from input channel ``idx``."""
        if isinstance(item, CheckpointBarrier):
            await self._barriers.on_barrier(idx, item)
        elif type(item) is OvertakingBarrier:
            assert self._unaligned is not None
            await self._unaligned.on_overtaking(idx, item)
        elif isinstance(item, Watermark):
            await self._on_watermark(idx, item.timestamp)
        elif isinstance(item, WatermarkStatus):
            await self._on_watermark_status(idx, item.idle)
        elif isinstance(item, EndOfData):
            data_ended = self._data_ended
            data_ended.add(idx)
            if len(data_ended) == len(self.gate.channels):
                await self._end_data()
            if self._probes:
                await self._forward_probes(self._probes, data_ended)
        elif isinstance(item, LoopProbe):
            self._probes.setdefault(item, set()).add(idx)
            await self._forward_probes(self._probes, self._data_ended)
        elif isinstance(item, EndOfInput):
            self.gate.channels[idx].finished = True
            self._open_inputs -= 1
            await self._barriers.on_end_of_input(idx)
            if self._open_inputs:
                await self._on_watermark(idx, MAX_WATERMARK)

    async def _forward_probes(self, probes: dict[LoopProbe, set[int]],
                              data_ended: set[int]) -> None:
        """Forward each loop probe that has arrived on every channel still carrying data
        (a channel that ended its data sends no record, so no probe need come from it)."""
        n = len(self.gate.channels)
        for probe, arrived in list(probes.items()):
            if all(i in arrived or i in data_ended for i in range(n)):
                del probes[probe]
                await self._broadcast(probe)

    async def share_loop(self) -> None:
        """Let the event loop run its other ready callbacks once (the task's time slice,
        :data:`TIME_SLICE`, is used up)."""
        await asyncio.sleep(0)
        self._last_yield = time.monotonic()

    # ------------------------------------------------------------------ data path
    async def _push_input(self, batch: list[Any], second: bool) -> float:
        """Run an input batch through the chain, in slices of what the chain processes
        within a :data:`TIME_SLICE`, letting the loop run between slices; returns
        ``time.monotonic()`` at the end.

        A batch is sized by its producer, not by the cost of this chain: 1024 records of a
        RocksDB-backed keyed count take 5-10 ms, and the loop (the application sharing it,
        timers, checkpoint parts) would wait that long. The cost per record is measured on
        each batch: processing only, not the yields, nor the waits for room in a full output
        channel (a backpressured task would otherwise see its own cost grow and cut its
        batches into ever smaller slices, each one paying the per-batch overheads; measured:
        slices of 68-127 records behind a slow task), nor a sink's write that awaited I/O
        (a sink taking 0.1 s per remote write would be handed the fewest records,
        :data:`MIN_SLICE`, per call, and the job would crawl; see :meth:`_write_sink`). A
        sink writing without suspending (encoding, a local file) counts as processing. A
        cheap chain's batches stay whole, and so do a waiting sink's.
        """
        n = len(batch)
        step = self._slice
        waited = self._waited
        busy = 0.0
        now = time.monotonic()
        for i in range(0, n, step):
            part = batch if step >= n else batch[i:i + step]
            if second:
                await self._push_second(part)
            else:
                await self._push(part, 0)
            t = time.monotonic()
            busy += t - now
            now = t
            # after the last slice the caller decides (it also flushes on a timeout)
            if i + step < n and now - self._last_yield >= TIME_SLICE:
                await self.share_loop()
                now = self._last_yield
        busy -= self._waited - waited
        if busy > 0.0:
            self._slice = max(MIN_SLICE, int(TIME_SLICE * n / busy))
        return now

    async def _push(self, batch: list[Any], start: int) -> None:
        """Run ``batch`` through the chain from operator ``start``, then emit it."""
        chain = self.chain
        for i in range(start, len(chain)):
            op = chain[i]
            op.records_in += len(batch)
            batch = op.process_batch(batch)
            if op.generates_watermarks and op.watermark_split is not None:
                await self._push_split(batch, i)
                return
            if not batch:
                return
            op.records_out += len(batch)
        if self.sink is not None:
            self.sink.records_in += len(batch)
            await self._write_sink(self.sink, batch)
            return
        writers = self.writers
        full = False
        try:
            if len(writers) == 1:
                full = writers[0].add(batch)
            else:
                for w in writers:
                    full = w.add(list(batch)) or full
        except KeySelectorError as exc:
            op = chain[-1] if chain else self.operators[0]
            raise UserFunctionError(
                f"key_by after {op.name}", op.uid, self.subtask, self.parallelism,
                exc.record, exc.cause,
            ) from exc.cause
        if full:
            t = time.monotonic()
            for w in writers:
                await w.flush_full()
            self._waited += time.monotonic() - t

    async def _write_sink(self, sink: SinkOperator, batch: list[Any]) -> None:
        """Hand ``batch`` to the sink writer; a write that suspended the task (it awaited
        I/O: a remote write, a database round trip) counts as waiting, not as the chain's
        cost (see :meth:`_push_input`).

        Whether the task suspended is told by a callback scheduled before the write: the
        loop runs it only while this task is suspended, and always before the task resumes
        (the ready queue is FIFO), so it ran exactly when the write let the loop run. A
        write that suspended already shared the loop, so no time slice has to bound it.
        """
        t = time.monotonic()
        probe = _SuspensionProbe()
        handle = asyncio.get_running_loop().call_soon(probe.mark)
        try:
            await sink.write(batch)
        finally:
            handle.cancel()
        if probe.suspended:
            self._waited += time.monotonic() - t

    async def _push_split(self, head: list[Any], i: int) -> None:
        """Operator ``i`` cut its output with watermarks (``watermark_split``): send each
        part and each watermark in order, so a record behind a watermark comes after it."""
        op = self.chain[i]
        parts, op.watermark_split = op.watermark_split or [], None
        op.records_out += len(head) + sum(len(p) for _, p in parts)
        if head:
            await self._push(head, i + 1)
        for watermark, part in parts:
            await self.emit_watermark_from(i + 1, watermark)
            await self._push(part, i + 1)

    async def _push_second(self, batch: list[Any]) -> None:
        """Run ``batch`` of the second input through the chain's two-input head operator
        (``process_batch2``), then through the rest of the chain."""
        head = cast("TwoInputOperator", self.chain[0])
        head.records_in += len(batch)
        out = head.process_batch2(batch)
        if out:
            head.records_out += len(out)
            await self._push(out, 1)

    async def _flush(self) -> None:
        for w in self.writers:
            await w.flush()

    async def _on_watermark(self, channel: int, timestamp: float) -> None:
        """Input channel ``channel`` sent watermark ``timestamp`` (seconds); the input loop
        also calls this with ``MAX_WATERMARK`` for a channel that just ended."""
        valve = self._valve
        if self.gate.channels[channel].finished:
            low = valve.end_of_input(channel)
        else:
            low = valve.input_watermark(channel, timestamp)
        if low is not None:
            await self._advance_watermark(low)

    async def _on_watermark_status(self, channel: int, idle: bool) -> None:
        """An input channel became idle or active (``reactive.time.watermarks``).

        The status goes out first, so downstream tasks see the task active again before a
        watermark it emits for the change.
        """
        valve = self._valve
        low = valve.input_watermark_status(channel, idle)
        all_idle = valve.all_idle()
        generator = any(op.generates_watermarks and not op.forwards_watermark_status
                        for op in self.chain)
        if not generator and all_idle != self._idle_out:
            await self.emit_watermark_status(IDLE if all_idle else ACTIVE)
        if low is not None:
            await self._advance_watermark(low)

    async def _advance_watermark(self, timestamp: float) -> None:
        if timestamp == MAX_WATERMARK:
            # results still in flight (map_async) go out before event time ends
            for op in self.chain:
                pending = op.drain()
                if pending is not None:
                    await pending
        self.watermark = timestamp
        await self.emit_watermark_from(0, timestamp)

    async def emit_watermark_from(self, start: int, timestamp: float) -> None:
        """Run watermark ``timestamp`` through the chain from operator ``start`` and send it
        downstream. A watermark generator in the chain stops upstream watermarks (it emits
        its own), except the final one."""
        chain = self.chain
        for i in range(start, len(chain)):
            op = chain[i]
            out = op.process_watermark(timestamp)
            if out:
                await self._push(out, i + 1)
            if op.generates_watermarks and timestamp != MAX_WATERMARK:
                return
        for w in self.writers:
            await w.broadcast_event(Watermark(timestamp))

    async def emit_watermark_status(self, status: WatermarkStatus) -> None:
        """Send an idle/active status on every output channel."""
        self._idle_out = status.idle
        for w in self.writers:
            await w.broadcast_event(status)

    def post(self, action: MailboxAction) -> None:
        """Run ``action`` in this task between two batches (its mailbox)."""
        self.mailbox.post(action)

    def push_from(self, start: int, batch: list[Any]) -> Awaitable[None]:
        """Send ``batch`` through the chain from operator ``start`` (mailbox actions)."""
        return self._push(batch, start)

    async def _end_data(self) -> None:
        """Every input has ended its data: flush what operators emit at the end of input,
        then tell downstream. The final checkpoint's barriers follow, so this output is
        covered by it (committed exactly once by two-phase-commit sinks)."""
        chain = self.chain
        for i, op in enumerate(chain):
            out = op.end_input()
            if out:
                await self._push(out, i + 1)
        for w in self.writers:
            await w.broadcast_event(END_OF_DATA)

    async def _end_input(self) -> None:
        if self.sink is not None:
            await maybe_await(self.sink.writer.finish())
        for w in self.writers:
            await w.broadcast_event(END_OF_INPUT)

    # ------------------------------------------------------------------ checkpoints
    def trigger_checkpoint(self, barrier: CheckpointBarrier) -> Awaitable[None]:
        """Mailbox action of a source task: snapshot and inject ``barrier``."""
        return self.checkpointing.checkpoint_state(barrier, 0.0)

    async def _broadcast(self, event: Any) -> None:
        if type(event) is CheckpointBarrier and event.unaligned:
            # ahead of the queued output (see reactive.runtime.unaligned)
            for w in self.writers:
                w.broadcast_overtaking(event)
            return
        for w in self.writers:
            await w.broadcast_event(event)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> Awaitable[None]:
        """Mailbox action: checkpoint ``checkpoint_id`` completed (commit side effects)."""
        return self.checkpointing.notify_checkpoint_complete(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> Awaitable[None]:
        """Mailbox action: checkpoint ``checkpoint_id`` was aborted."""
        if self._unaligned is not None:
            self._unaligned.abort(checkpoint_id)
        return self.checkpointing.notify_checkpoint_aborted(checkpoint_id)
