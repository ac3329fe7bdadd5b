"""Combining the watermarks and idle/active statuses of a task's input channels (Flink's
``org.apache.flink.streaming.runtime.watermarkstatus.StatusWatermarkValve``).

Each input channel has a watermark, a status (idle or active) and an *aligned* flag. The
output watermark is the minimum watermark over the active, aligned channels, and never
decreases. A channel that becomes idle is no longer aligned, so it stops holding event time
back. A channel that becomes active again is aligned only if its watermark is at least the
last output watermark; otherwise its stale watermark stays out of the minimum until a
watermark from it reaches the output watermark. Without that rule a channel that resumes
with an old watermark would stall event time (the output cannot go down, but it would not
move until the stale channel caught up), and the windows fed by the other channels would
stop firing. Records an unaligned channel sends before it catches up may be late.

When every channel that has not ended is idle, no channel will move event time any more,
so the valve *flushes*: the output becomes the largest watermark among those channels, and
windows that can fire, fire (Flink's ``findAndOutputMaxWatermarkAcrossAllChannels``).

Differences from Flink, kept from this runtime's earlier behaviour:

* A watermark that arrives on an idle channel is recorded (Flink drops it); the channel
  still stays out of the minimum until it is active, and is aligned when it becomes active
  only if that watermark reached the output watermark. While *every* open channel is idle
  such a watermark is flushed at once: the task sends a channel's idle status before the
  watermark it flushes (Flink sends the watermark first), so the flushed watermark reaches
  the next task's valve on a channel already idle.
* A channel that ended (:meth:`StatusWatermarkValve.end_of_input`) leaves the valve; when
  every channel has ended, the output watermark is ``+inf``; when the channels left are all
  idle, their largest watermark is flushed.

The valve only computes; the task emits what it returns (watermarks, and an idle/active
status through :meth:`StatusWatermarkValve.all_idle`).
"""

from __future__ import annotations

__all__ = ["StatusWatermarkValve"]

_NEG_INF = float("-inf")
_INF = float("inf")


class StatusWatermarkValve:
    """Output watermark of a task from its input channels' watermarks and statuses.

    Every channel starts active and aligned, with watermark ``-inf``; so does the output
    watermark. Timestamps are event-time seconds.

    Args:
        num_channels: number of input channels (>= 0).

    Attributes:
        watermark: the last output watermark (seconds; ``-inf`` before the first).
        watermarks: per channel, the largest watermark received (seconds).
        idle: per channel, True while the channel is idle.
        aligned: per channel, True when its watermark takes part in the minimum.
        finished: per channel, True once it ended.
    """

    __slots__ = ("aligned", "finished", "idle", "watermark", "watermarks")

    def __init__(self, num_channels: int) -> None:
        self.watermark = _NEG_INF
        self.watermarks = [_NEG_INF] * num_channels
        self.idle = [False] * num_channels
        self.aligned = [True] * num_channels
        self.finished = [False] * num_channels

    def input_watermark(self, channel: int, timestamp: float) -> float | None:
        """Channel ``channel`` sent watermark ``timestamp`` (seconds).

        A watermark not larger than the channel's last one is ignored (Flink's
        ``inputWatermark``). On an idle channel it is recorded, and output only while every
        open channel is idle (the all-idle flush). An active channel that was unaligned
        becomes aligned once its watermark reaches the output watermark.

        Returns:
            The new output watermark when it advanced, else None.

        Raises:
            IndexError: if ``channel`` is not a channel of the valve.
        """
        if self.finished[channel] or timestamp <= self.watermarks[channel]:
            return None
        self.watermarks[channel] = timestamp
        if self.idle[channel]:
            # recorded; out of the minimum while idle, flushed when every channel is idle
            return self._advance()
        if not self.aligned[channel]:
            if timestamp < self.watermark:
                return None  # still behind the output: it cannot move the minimum
            self.aligned[channel] = True
        return self._advance()

    def input_watermark_status(self, channel: int, idle: bool) -> float | None:
        """Channel ``channel`` became idle (``idle=True``) or active again.

        Idle: the channel is no longer aligned, so the minimum over the other channels may
        advance; when it was the last active channel, the largest watermark over the open
        channels goes out (Flink's all-idle flush). Active: it is aligned only if its
        watermark is >= the output watermark (Flink's ``inputWatermarkStatus``); a status
        that does not change the channel's is ignored.

        Returns:
            The new output watermark when it advanced, else None.

        Raises:
            IndexError: if ``channel`` is not a channel of the valve.
        """
        if self.finished[channel] or idle == self.idle[channel]:
            return None
        self.idle[channel] = idle
        if idle:
            self.aligned[channel] = False
        else:
            self.aligned[channel] = self.watermarks[channel] >= self.watermark
        return self._advance()

    def end_of_input(self, channel: int) -> float | None:
        """Channel ``channel`` ended: it no longer takes part (``+inf`` once all ended).

        Returns:
            The new output watermark when it advanced, else None.

        Raises:
            IndexError: if ``channel`` is not a channel of the valve.
        """
        if self.finished[channel]:
            return None
        self.finished[channel] = True
        self.watermarks[channel] = _INF
        self.aligned[channel] = False
        return self._advance()

    def all_idle(self) -> bool:
        """True when every channel that has not ended is idle (also when all ended)."""
        return all(f or i for f, i in zip(self.finished, self.idle, strict=True))

    def _advance(self) -> float | None:
        """Move the output watermark to the minimum over the aligned channels if that is
        larger (Flink's ``findAndOutputNewMinWatermarkAcrossAlignedChannels``)."""
        low = _INF
        some_aligned = False
        some_open = False
        for wm, aligned, finished in zip(self.watermarks, self.aligned, self.finished,
                                         strict=True):
            if finished:
                continue
            some_open = True
            if aligned:
                some_aligned = True
                if wm < low:
                    low = wm
        if some_open and not some_aligned:
            if not self.all_idle():
                # an active channel is behind the output: event time stands still until it
                # catches up (it may still send records up to its own watermark)
                return None
            # every open channel is idle: none will move event time, flush the largest
            low = max(wm for wm, finished in zip(self.watermarks, self.finished, strict=True)
                      if not finished)
        if low > self.watermark:
            self.watermark = low
            return low
        return None
