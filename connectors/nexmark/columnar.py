"""The Nexmark source as a columnar stream: the generated events as Arrow record batches of
:func:`~.arrow.event_schema` (Flink nexmark's table layout), for the columnar API.

```python
flow = Dataflow("nexmark")
events = nexmark_columnar(flow, NexmarkArrowSource(NexmarkConfig(num_events=100_000)))
bids = events.filter(pc.field("event_type") == 2)      # a ColumnarStream
```

The reader is :class:`~.source.NexmarkReader`'s: the stream is cut into interleaved splits
and a split's position is the number of its next event, so a restore or a rescale resumes
every split exactly where the checkpoint left it. Each read hands out one whole record
batch of the next ``batch_size`` events of the instance's splits (merged in event-number
order), so a checkpoint always falls between two batches and no batch is ever split. The
string columns are built as Arrow arrays directly (no Python object per value).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reactive.errors import ConfigurationError
from reactive.extras import require
from reactive.sources import SourceReader

from .config import NexmarkConfig
from .source import NexmarkReader, NexmarkSource

if TYPE_CHECKING:
    from reactive import Dataflow
    from reactive.columnar import ColumnarStream

__all__ = ["NexmarkArrowSource", "nexmark_columnar"]


class NexmarkArrowSource(NexmarkSource):
    """Generated Nexmark events as ``pyarrow.RecordBatch`` es of
    :func:`~.arrow.event_schema` (``event_type``, the ``person`` / ``auction`` / ``bid``
    structs, ``dateTime``), with watermarks; the same events as :class:`NexmarkSource`'s
    records for the same configuration.

    Args:
        config: the stream's parameters (bounded by ``config.num_events``, or unbounded).
        splits: how many interleaved splits the stream is cut into (the largest useful
            parallelism); fixed for the life of the job's checkpoints.
        watermark_delay: seconds the watermarks are held back behind the generator's.
        batch_size: events per record batch (the last batch of a bounded stream may be
            shorter).

    Attributes:
        schema: the batches' ``pyarrow.Schema``.

    Raises:
        ConfigurationError: for ``splits`` or ``batch_size`` < 1 or a negative delay.
        MissingExtraError: without numpy and pyarrow (``pip install 'reactive[nexmark]'``).
    """

    # a record batch has no one event time: windows read the dateTime column instead
    timestamp_fn = None  # type: ignore[assignment]

    def __init__(self, config: NexmarkConfig, splits: int = 8, watermark_delay: float = 0.0,
                 batch_size: int = 16_384) -> None:
        if batch_size < 1:
            raise ConfigurationError(f"batch_size must be >= 1, got {batch_size}")
        super().__init__(config, splits, watermark_delay, chunk=batch_size)
        require("pyarrow", "nexmark", "Nexmark record batches")
        from .arrow import event_schema

        self.batch_size = batch_size
        self.schema = event_schema()

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        return NexmarkBatchReader(self, [[k, self.splits, k]
                                         for k in range(subtask, self.splits, parallelism)])


class NexmarkBatchReader(NexmarkReader):
    """One instance's splits of a :class:`NexmarkArrowSource`: one record batch per read.

    Position entries are ``[split, splits, next event number]``, as the per-record
    reader's (the two sources' checkpoints are interchangeable).
    """

    def _materialize(self, numbers: Any) -> list[Any]:
        from .arrow import to_record_batch
        from .generator import generate_columns

        return [to_record_batch(generate_columns(self.config, numbers, arrow=True))]

    async def read_batch(self, max_records: int) -> list[Any] | None:
        from reactive.columnar.schema import with_position

        if not self._fill(self.source.chunk):
            return None
        numbers, (batch,) = self._numbers, self._records
        # the whole batch is handed out: every split moves past its events in it
        self._advance(len(numbers))
        self._numbers, self._records, self._taken = numbers[:0], [], 0
        self._update_watermark()
        return [with_position(batch, f"event {int(numbers[0])}")]


def nexmark_columnar(flow: Dataflow, source: NexmarkArrowSource, name: str | None = None,
                     uid: str | None = "events") -> ColumnarStream:
    """Add ``source`` to ``flow`` as a columnar stream of record batches.

    Args:
        flow: the dataflow being built.
        source: the Nexmark record-batch source.
        name: the source operator's display name (default ``"nexmark"``).
        uid: its stable id (its positions are snapshotted under it).

    Returns:
        the :class:`~reactive.columnar.ColumnarStream` of the events.
    """
    from reactive import Stream
    from reactive.columnar import ColumnarStream

    stream = flow.source(source, name=name or "nexmark", uid=uid)
    return ColumnarStream(flow, stream.transformation, source.schema,
                          lambda t: Stream(flow, t))
