"""Control events that travel through channels in order with record batches (the
checkpoint barrier is defined with the checkpoints, :mod:`reactive.checkpoint.barrier`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..checkpoint.barrier import CheckpointBarrier

__all__ = [
    "END_OF_DATA",
    "END_OF_INPUT",
    "MAX_WATERMARK",
    "CheckpointBarrier",
    "EndOfData",
    "EndOfInput",
    "LoopProbe",
    "Watermark",
]

MAX_WATERMARK = float("inf")


@dataclass(frozen=True, slots=True)
class Watermark:
    """Event-time progress: no record with a timestamp <= ``timestamp`` (seconds) follows."""

    timestamp: float


@dataclass(frozen=True, slots=True)
class EndOfData:
    """The channel's producer emits no more records (Flink's ``EndOfData``).

    Barriers still follow it: the job's final checkpoint comes after every operator has
    flushed what it emits at the end of input, so that output is committed by a checkpoint.
    """


@dataclass(frozen=True, slots=True)
class EndOfInput:
    """The channel's producer has finished; nothing follows on this channel."""


@dataclass(frozen=True, slots=True)
class LoopProbe:
    """A marker an iteration's head sends around its loop to detect that the loop holds no
    record any more (a round of the quiescence detection; see
    ``reactive.runtime.iteration_head``). A task forwards it once it arrived on every input
    channel, so every record sent before it, and what that record caused inside the loop,
    reaches the loop's tail ahead of it.

    Attributes:
        loop: the uid of the iteration's head.
        round: the round number, from 0.
    """

    loop: str
    round: int


END_OF_DATA = EndOfData()
END_OF_INPUT = EndOfInput()
