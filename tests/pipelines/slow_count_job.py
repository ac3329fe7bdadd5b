"""A keyed count over a throttled source (about 2,000 records/s, 8,000 records), for the
graceful-stop tests: ``reactive run tests/pipelines/slow_count_job.py:flow``. The counts go to
a committing file sink in ``$REACTIVE_TEST_OUT`` (exactly once)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from reactive import Dataflow, KeyedProcessFunction, ValueStateDescriptor
from reactive.connectors.collections import CollectionSource, _CollectionReader
from reactive.connectors.files import CommittingFileSink
from reactive.sources import SourceReader

RECORDS = 8_000


# Hand-written: the graceful-stop tests signal the process while it runs, so the job must
# last seconds of wall-clock time; a TestingSource reads as fast as the task asks.
class ThrottledSource(CollectionSource):
    """The collection source, 50 records per read and a pause of 25 ms between reads (a
    slow upstream)."""

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        return _Throttled(self.items)


class _Throttled(_CollectionReader):
    async def read_batch(self, max_records: int) -> list[Any] | None:
        await asyncio.sleep(0.025)  # the upstream's pace, not a synchronisation
        return await super().read_batch(min(max_records, 50))


class Count(KeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def process_element(self, value: Any, ctx: Any) -> Any:
        n = self.count.value() + 1
        self.count.update(n)
        yield [value, n]


flow = Dataflow("slow-count", parallelism=2)
(flow.source(ThrottledSource([f"k{i % 97}" for i in range(RECORDS)])).uid("numbers")
     .key_by(lambda k: k)
     .process(Count()).uid("count")
     .sink(CommittingFileSink(os.environ.get("REACTIVE_TEST_OUT", "out/slow-count")))
     .uid("files"))
