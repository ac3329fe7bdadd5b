"""The Nexmark benchmark's event stream (the nexmark extra: numpy; pyarrow for batches and
files): a deterministic generator of people, auctions and bids, as a parallel per-record
source whose position is the event number, as Arrow record batches, and as JSON-lines or
Parquet files that other engines read.

- :mod:`.config`: :class:`NexmarkConfig`, the stream's parameters.
- :mod:`.model`: the records :class:`Person`, :class:`Auction`, :class:`Bid`.
- :mod:`.generator`: the vectorized generator (event numbers to columns to records).
- :mod:`.source`: :class:`NexmarkSource`, the exactly-once, rescalable source.
- :mod:`.arrow`: the events as ``pyarrow.RecordBatch`` es (Flink nexmark's table layout),
  and :class:`~.arrow.NexmarkArrowSource`, the same events as a columnar stream.
- :mod:`.files`: writing the events as JSON lines or Parquet.
"""

from .arrow import NexmarkArrowSource, nexmark_columnar
from .config import NexmarkConfig
from .model import Auction, Bid, Event, EventType, Person, event_time
from .source import NexmarkSource

__all__ = ["Auction", "Bid", "Event", "EventType", "NexmarkArrowSource", "NexmarkConfig",
           "NexmarkSource", "Person", "event_time", "nexmark_columnar"]
