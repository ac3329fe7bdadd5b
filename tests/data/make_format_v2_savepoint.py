"""Write ``tests/data/format_v2_savepoint``: a savepoint in checkpoint metadata format 2,
made by the code before the typed checkpoint contract (``reactive.checkpoint.contract``)
existed, so that tests/checkpoint/test_checkpoint_contract.py proves the contract reads (and restores)
what earlier versions wrote, not only what it writes itself.

Run from a checkout of that code (the package importable as ``reactive``)::

    python tests/data/make_format_v2_savepoint.py tests/data/format_v2_savepoint

The job: words from a push source, counted per word (keyed state ``count`` on the heap
backend), parallelism 2, max parallelism 16; the savepoint is taken after the first
``FIRST`` words (the list is ``words(FIRST)``) and is self-contained.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from reactive import (
    CheckpointConfig,
    Dataflow,
    KeyedProcessFunction,
    PushSource,
    ValueStateDescriptor,
)
from reactive.connectors.collections import ListSink

JOB = "format-v2"
MAXP = 16
FIRST = 300


def words(n: int, offset: int = 0) -> list[str]:
    """The ``n`` words starting at position ``offset`` of a fixed sequence (7 distinct)."""
    return [f"w{(i * 5) % 7}" for i in range(offset, offset + n)]


class Count(KeyedProcessFunction):
    """Keyed count: emits ``(key, n)`` after each record of ``key``."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def process_element(self, value: Any, ctx: Any) -> Iterable[Any]:
        n = self.count.value() + 1
        self.count.update(n)
        yield (ctx.current_key, n)


def flow(source: PushSource, sink: ListSink, parallelism: int) -> Dataflow:
    """The job's dataflow (uids ``src``, ``count``, ``out``)."""
    f = Dataflow(JOB, parallelism=parallelism, max_parallelism=MAXP)
    f.source(source).uid("src").key_by(lambda w: w).process(Count()).uid("count") \
        .sink(sink).uid("out")
    return f


async def main(dest: Path, scratch: Path) -> None:
    source = PushSource()
    job = await flow(source, ListSink(), 2).start(
        checkpoints=CheckpointConfig(interval=None, directory=scratch))
    for w in words(FIRST):
        await source.send(w)
    await job.savepoint(dest)
    await job.cancel()


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(main(Path(sys.argv[1]), Path(tmp)))
