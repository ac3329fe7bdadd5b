"""The Nexmark source: a parallel source of generated Person / Auction / Bid records whose
position is the event number.

The stream is cut into ``splits`` interleaved splits: split ``k`` holds the event numbers
``n`` with ``n % splits == k``. Each instance owns some splits and emits their events merged
in event-number order, so every instance's event time advances with the others'. A split's
position is the number of its next event: it is the reader's operator state (one entry per
split, dealt round robin on a restore at another parallelism, as Kafka partitions), so a
restore or a rescale resumes every split exactly where the checkpoint left it, and the
events are the same whichever instance generates them (they depend only on the
configuration and the event number).

The reader generates watermarks: the timestamp of the first event of the out-of-order group
of the smallest next event number of its splits (Flink nexmark's generator watermark), held
back by ``watermark_delay`` seconds if asked (Flink's nexmark DDL declares ``dateTime -
INTERVAL '4' SECOND``).
"""

from __future__ import annotations

from typing import Any

from reactive.errors import ConfigurationError
from reactive.extras import require
from reactive.sources import Source, SourceReader

from .config import NexmarkConfig
from .model import Event, event_time

__all__ = ["NexmarkSource"]


class NexmarkSource(Source):
    """Generated Nexmark events (records :class:`~.model.Person`, :class:`~.model.Auction`,
    :class:`~.model.Bid`), with event time and watermarks.

    Args:
        config: the stream's parameters (bounded by ``config.num_events``, or unbounded).
        splits: how many interleaved splits the stream is cut into: the largest useful
            parallelism (an instance without a split is idle). Fixed for the life of the
            job's checkpoints (a restore keeps the splits it finds in them).
        watermark_delay: seconds the watermarks are held back behind the generator's.
        chunk: events generated per vectorized step (records are handed out of the chunk
            ``max_records`` at a time; the position counts handed-out events only).

    Raises:
        ConfigurationError: for ``splits`` or ``chunk`` < 1 or a negative delay.
        MissingExtraError: without numpy (``pip install 'reactive[nexmark]'``).
    """

    state_redistribution = "split"
    timestamp_fn = staticmethod(event_time)

    def __init__(self, config: NexmarkConfig, splits: int = 8, watermark_delay: float = 0.0,
                 chunk: int = 4096) -> None:
        if splits < 1 or chunk < 1:
            raise ConfigurationError(f"splits and chunk must be >= 1, got {splits}, {chunk}")
        if watermark_delay < 0:
            raise ConfigurationError(f"watermark_delay must be >= 0, got {watermark_delay}")
        require("numpy", "nexmark", "the Nexmark generator")
        self.config = config
        self.splits = splits
        self.watermark_delay = watermark_delay
        self.chunk = chunk

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        return NexmarkReader(self, [[k, self.splits, k]
                                    for k in range(subtask, self.splits, parallelism)])


class NexmarkReader(SourceReader):
    """One instance's splits of a :class:`NexmarkSource`.

    Position entries are ``[split, splits, next event number]``.
    """

    def __init__(self, source: NexmarkSource, entries: list[list[int]]) -> None:
        self.source = source
        self.config = source.config
        self._set(entries)

    def _set(self, entries: list[list[int]]) -> None:
        import numpy as np

        counts = {int(e[1]) for e in entries}
        if len(counts) > 1:
            raise ConfigurationError(f"Nexmark source positions of different split counts: "
                                     f"{sorted(counts)}")
        self.num_splits = counts.pop() if counts else self.source.splits
        self.next: dict[int, int] = {int(e[0]): int(e[2]) for e in entries}
        self._numbers = np.zeros(0, dtype=np.int64)
        self._records: list[Event] = []
        self._taken = 0
        self._beyond: int | None = None
        self._watermark: float | None = None
        self._update_watermark()

    # -------------------------------------------------------------------- reading
    def _end(self) -> int | None:
        return self.config.num_events

    def _fill(self, wanted: int) -> bool:
        """Generate the next chunk of the splits' events; False at the end of all of them."""
        import numpy as np

        from .generator import generate_columns, to_records

        end = self._end()
        live = [(k, n) for k, n in self.next.items() if end is None or n < end]
        if not live:
            return False
        s = self.num_splits
        per = -(-max(wanted, self.source.chunk) // len(live))
        numbers = np.concatenate([n + s * np.arange(per, dtype=np.int64) for _, n in live])
        numbers.sort()
        numbers = numbers[:max(wanted, self.source.chunk)]
        if end is not None:
            numbers = numbers[numbers < end]
        self._numbers = numbers
        # the smallest event number not in the chunk: a split's next beyond its chunk part
        beyond = []
        for k, n in live:
            mine = numbers[numbers % s == k]
            nxt = int(mine[-1]) + s if len(mine) else n
            if end is None or nxt < end:
                beyond.append(nxt)
        self._beyond = min(beyond) if beyond else None
        self._records = to_records(generate_columns(self.config, numbers))
        self._taken = 0
        return True

    def _advance(self, upto: int) -> None:
        """Move the split positions past the first ``upto`` buffered events."""
        import numpy as np

        taken = self._numbers[:upto]
        if not len(taken):
            return
        s = self.num_splits
        splits = taken % s
        for k in np.unique(splits).tolist():
            self.next[k] = int(taken[splits == k].max()) + s

    def _update_watermark(self) -> None:
        end = self._end()
        nexts = [n for n in self.next.values() if end is None or n < end]
        if nexts:
            self._watermark = (self.config.watermark_ms(min(nexts)) / 1000.0
                               - self.source.watermark_delay)

    async def read_batch(self, max_records: int) -> list[Any] | None:
        if self._taken >= len(self._records):
            self._advance(self._taken)
            if not self._fill(max_records):
                return None
        start = self._taken
        self._taken = stop = min(start + max_records, len(self._records))
        batch = self._records[start:stop]
        # the watermark after this batch: the next events' (exact, whatever was buffered)
        if stop < len(self._numbers):
            nxt = int(self._numbers[stop])
            if self._beyond is not None:
                nxt = min(nxt, self._beyond)
            wm = self.config.watermark_ms(nxt) / 1000.0 - self.source.watermark_delay
            self._watermark = wm if self._watermark is None else max(self._watermark, wm)
        else:
            self._advance(stop)
            self._numbers, self._records, self._taken = self._numbers[:0], [], 0
            self._update_watermark()
        return batch

    def positions(self) -> dict[int, int]:
        """The next event number of each split of the reader (after the handed-out events)."""
        saved = dict(self.next)
        self._advance(self._taken)
        out, self.next = self.next, saved
        return out

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        return [[k, self.num_splits, n] for k, n in sorted(self.positions().items())]

    def restore_state(self, entries: list[Any]) -> None:
        self._set([list(e) for e in entries])

    def describe_position(self) -> Any:
        return f"next event numbers {self.positions()}"

    def current_watermark(self) -> float | None:
        return self._watermark

    def is_idle(self) -> bool:
        return not self.next
