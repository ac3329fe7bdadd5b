"""The task of an iteration's head: barriers and back-edge logging on a cyclic dataflow (ABS
paper, section 3.3, Algorithm 2; Carbone 2018 (PhD thesis), section 3.4.4.4, Algorithm 7), flow
control in the cycle, and the detection that the loop holds no record any more.

The head task reads its regular inputs and the loop's *feedback channel* (from the tail
instance with the same index) through one input gate.

Snapshots. Barrier n is aligned over the regular inputs only (the feedback channel cannot
deliver it before the head has sent it). Then the head forwards barrier n into the loop and
logs every record arriving on the feedback channel until barrier n comes back through the
tail: those records were inside the loop when the loop's operators snapshotted, so they are
the only state the cycle hides. The head snapshots when the barrier returns; its snapshot
is that log, and a restored head sends the log into the loop before any new input. Only
the back edge is logged, not every channel as in Chandy-Lamport.

Flow control (Carbone 2018 (PhD thesis), section 6.4.3.2). Bounded channels around a cycle can
deadlock under backpressure: the feedback channel is unbounded, so the tail never blocks, and the
head takes from it first once it holds ``channel_capacity`` items or more, so the loop drains
before new input enters it.

Termination. A bounded input ends when every regular input has ended and the loop holds no
record. After its inputs ended, each head instance sends a :class:`~.events.LoopProbe`
round into the loop; tasks forward a probe once it arrived on every input channel, so it
reaches the tail behind every record sent before it and behind what those records caused.
A head counts the feedback records it receives between sending the probe of a round and
receiving it back. When every instance reports a round with no feedback, no record is
left in the loop (any record still inside would descend from a feedback record some head
received during the round): the heads end the loop's data and the job's final checkpoint
follows. Operators in a loop must not hold records to emit later from processing-time
timers (they would be found quiescent too early).

Event time. Watermarks do not circulate: the head forwards no watermark into the loop until
the loop has ended (then the final one), and ignores what comes back through the tail. The
loop's output watermark is thus held at the minimum of its input watermark and the
timestamps of the records in flight in the loop, taken conservatively as unknown (Naiad's
rule that a loop's output frontier cannot pass work still circulating, Murray et al., SOSP
2013, section 2.3); event-time operators inside or after a loop see event time end with
the input.
"""

from __future__ import annotations

import functools
import time
from typing import Any, cast

from ..checkpoint.failure_reason import CheckpointFailureReason
from ..errors import ConfigurationError, ReactiveError
from .events import (
    MAX_WATERMARK,
    CheckpointBarrier,
    EndOfData,
    EndOfInput,
    LoopProbe,
)
from .operators.iteration import IterationHeadOperator
from .task import StreamTask

__all__ = ["IterationHeadTask", "LoopQuiescence"]


class LoopQuiescence:
    """The rounds of one iteration's quiescence detection, shared by its head instances
    (they run in one process).

    Args:
        parallelism: the number of head instances.
    """

    def __init__(self, parallelism: int) -> None:
        self.parallelism = parallelism
        self._heads: dict[int, IterationHeadTask] = {}
        self._reports: dict[int, dict[int, int]] = {}

    def register(self, head: IterationHeadTask) -> None:
        """Add a head instance (when the execution graph is built)."""
        self._heads[head.subtask] = head

    def report(self, subtask: int, round_: int, feedback: int) -> None:
        """Head ``subtask`` got probe ``round_`` back after receiving ``feedback`` records
        during the round; when every head has reported the round, tell them all whether
        the loop is quiescent."""
        reports = self._reports.setdefault(round_, {})
        reports[subtask] = feedback
        if len(reports) < self.parallelism:
            return
        del self._reports[round_]
        quiescent = not any(reports.values())
        for head in self._heads.values():
            head.post(functools.partial(head.on_round_decided, round_, quiescent))


class IterationHeadTask(StreamTask):
    """The task running an iteration's head operator (alone in its chain).

    Its gate holds the regular input channels and, last, the feedback channel.

    Raises:
        ConfigurationError: at run time, when checkpointing is not aligned exactly-once
            (an at-least-once or synchronous-snapshot job cannot snapshot a cycle).
    """

    is_iteration_head = True

    def __init__(self, *args: Any, quiescence: LoopQuiescence, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.head = cast(IterationHeadOperator, self.chain[0])
        self.feedback = len(self.gate.channels) - 1
        self.quiescence = quiescence
        quiescence.register(self)
        self.gate.prioritize(self.feedback, max(1, self.gate.channels[0].capacity
                                                if len(self.gate.channels) > 1 else 1))
        self._aligning: CheckpointBarrier | None = None
        self._arrived: set[int] = set()
        self._align_started = 0.0
        self._alignments: dict[int, float] = {}
        self._round = -1
        self._round_feedback = 0
        self._loop_ended = False
        # regular inputs whose EndOfInput has not come yet
        self._external_open = 0

    async def _broadcast(self, event: Any) -> None:
        # the head forwards a barrier when it is aligned, before the loop sees it; the
        # snapshot, taken when it returns, must not send it around a second time
        if isinstance(event, CheckpointBarrier):
            return
        await super()._broadcast(event)

    async def _run_inputs(self) -> None:
        if self.env.coordinator is not None and (
                not self.env.exactly_once or self.checkpointing.synchronous):
            raise ConfigurationError(
                f"iteration {self.head.name!r}: a loop needs aligned exactly-once "
                "checkpoints (CheckpointConfig(mode='exactly_once')); at-least-once and "
                "synchronous snapshots cannot snapshot a cycle")
        restored = self.head.take_restored_log()
        if restored:
            # Algorithm 7: the records inside the loop at the checkpoint go around again
            # before any new input
            self.records_in += len(restored)
            await self._push(restored, 0)
        # the regular inputs and the feedback channel; the output ends when the regular
        # inputs have (_on_head_event), the loop when the feedback channel has
        self._external_open = self.feedback
        self._open_inputs = self.feedback + 1
        await self._process_input(self._on_head_event, self._on_batch)

    def _on_batch(self, idx: int, batch: list[Any]) -> None:
        """A record batch: one from the feedback channel is logged (Algorithm 2) and
        counted for the quiescence round."""
        if idx != self.feedback:
            return
        if self._loop_ended:
            raise ReactiveError(
                f"iteration {self.head.name!r}: feedback record {batch[0]!r} after "
                "the loop had ended (an operator in the loop emitted it at the "
                "end of input; loops cannot produce records then)")
        self.head.log_feedback(batch)
        self._round_feedback += len(batch)

    async def _on_head_event(self, idx: int, item: Any) -> None:
        """A control event: regular inputs' barriers are aligned here, the feedback
        channel brings barriers and probes back; watermarks and statuses are dropped (the
        module's docstring: regular inputs' watermarks are held back until the loop ends,
        what comes back around is ignored)."""
        if idx == self.feedback:
            if isinstance(item, CheckpointBarrier):
                await self._barrier_returned(item)
            elif isinstance(item, LoopProbe):
                if item.loop == self.head.uid and item.round == self._round:
                    self.quiescence.report(self.subtask, item.round, self._round_feedback)
            elif isinstance(item, EndOfInput):
                self.gate.channels[idx].finished = True
                self._open_inputs -= 1
        elif isinstance(item, CheckpointBarrier):
            await self._on_barrier(idx, item)
        elif isinstance(item, EndOfData):
            self._data_ended.add(idx)
            if len(self._data_ended) == self.feedback:
                self._start_round()
        elif isinstance(item, EndOfInput):
            self.gate.channels[idx].finished = True
            self._open_inputs -= 1
            self._external_open -= 1
            if self._aligning is not None:
                await self._maybe_aligned()
            if not self._external_open:
                # the loop's tasks end their input, then the tail ends the feedback
                await self._end_input()

    # ------------------------------------------------------------------ checkpoints
    async def _on_barrier(self, idx: int, barrier: CheckpointBarrier) -> None:
        aligning = self._aligning
        cid = barrier.checkpoint_id
        if aligning is not None and cid < aligning.checkpoint_id:
            return
        if aligning is None or cid > aligning.checkpoint_id:
            if aligning is not None:
                self.gate.unblock_all()
                coordinator = self.env.coordinator
                if coordinator is not None:
                    coordinator.decline(
                        aligning.checkpoint_id, self,
                        ReactiveError(f"checkpoint {aligning.checkpoint_id} subsumed by "
                                      f"{cid} during alignment"),
                        CheckpointFailureReason.CHECKPOINT_DECLINED_SUBSUMED)
            self._aligning = barrier
            self._arrived = set()
            self._align_started = time.perf_counter()
        self._arrived.add(idx)
        self.gate.block(idx)
        await self._maybe_aligned()

    async def _maybe_aligned(self) -> None:
        barrier = self._aligning
        assert barrier is not None
        live = [i for i in range(self.feedback) if not self.gate.channels[i].finished]
        if not all(i in self._arrived for i in live):
            return
        self._aligning = None
        self.gate.unblock_all()
        cid = barrier.checkpoint_id
        self._alignments[cid] = time.perf_counter() - self._align_started
        # log from here: what comes back before the barrier was inside the loop
        self.head.open_log(cid)
        for w in self.writers:
            await w.broadcast_event(barrier)

    async def _barrier_returned(self, barrier: CheckpointBarrier) -> None:
        cid = barrier.checkpoint_id
        self.head.close_log(cid)
        for old in [c for c in self._alignments if c < cid]:
            del self._alignments[old]
        await self.checkpointing.checkpoint_state(barrier, self._alignments.pop(cid, 0.0))

    # ------------------------------------------------------------------ termination
    def _start_round(self) -> None:
        self._round += 1
        self._round_feedback = 0
        probe = LoopProbe(self.head.uid, self._round)

        async def send() -> None:
            for w in self.writers:
                await w.broadcast_event(probe)

        self.post(send)

    def on_round_decided(self, round_: int, quiescent: bool) -> Any:
        """Mailbox action: every head reported ``round_``; end the loop when it held no
        record, else send the next round."""
        if round_ != self._round or self._loop_ended:
            return None
        if not quiescent:
            self._start_round()
            return None
        self._loop_ended = True
        return self._end_loop()

    async def _end_loop(self) -> None:
        await self._advance_watermark(MAX_WATERMARK)
        await self._end_data()
        self.env.on_source_finished(self)
