"""A keyed count into a committing file sink, run as a subprocess by
``tests/checkpoint/test_lineage_faults.py`` through a whole lineage: start, stop with a savepoint,
restore at another parallelism (into the same or a new checkpoint directory), kill -9,
resume, run again.

Usage::

    python lineage_job.py OUT CHECKPOINTS PARALLELISM RECORDS BACKEND
        [--restore-from PATH] [--resume] [--stop-at N --savepoint PATH]

``--stop-at N`` stops the job with a savepoint written to PATH once the count has processed
N records in this process. ``REACTIVE_TEST_KILL=record:<n>`` kills this process with SIGKILL
at the count's n-th record (appending the point to ``REACTIVE_TEST_KILL_LOG`` first).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from collections.abc import Iterable
from typing import Any

from reactive import (
    CheckpointConfig,
    Dataflow,
    KeyedProcessFunction,
    RestartStrategy,
    ValueStateDescriptor,
)
from reactive.connectors.files import CommittingFileSink
from reactive.testing import TestingSource
from tests.support import zipf_words

JOB = "lineage-faults"
VOCABULARY = 500


def words(n: int, seed: int = 11) -> list[str]:
    """``n`` Zipf-like words, deterministic per seed: the job's input."""
    return zipf_words(n, VOCABULARY, seed)


_KIND, _, _AT = os.environ.get("REACTIVE_TEST_KILL", "none:0").partition(":")


class Progress:
    """Records processed by the count in this process (shared by every instance)."""

    seen = 0
    reached: asyncio.Event | None = None
    stop_at = 0


class Count(KeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def process_element(self, value: Any, ctx: Any) -> Iterable[Any]:
        Progress.seen += 1
        if _KIND == "record" and Progress.seen == int(_AT):
            log = os.environ.get("REACTIVE_TEST_KILL_LOG")
            if log:
                with open(log, "a") as f:
                    f.write(f"record:{_AT}\n")
                    f.flush()
                    os.fsync(f.fileno())
            os.kill(os.getpid(), signal.SIGKILL)
        if Progress.reached is not None and Progress.seen == Progress.stop_at:
            Progress.reached.set()
        n = self.count.value() + 1
        self.count.update(n)
        yield (value, n)


def backend(name: str, checkpoints: str) -> Any:
    if name in ("heap", "heap-fork"):
        from reactive.backends.heap import HeapStateBackend

        return HeapStateBackend(snapshot="fork" if name == "heap-fork" else "paced")
    from reactive.backends.rocksdb import RocksDBStateBackend

    return RocksDBStateBackend(path=os.path.join(checkpoints, "_rocksdb"), incremental=True)


PACE = 1_000
"""Words between two waits of the input for a completed checkpoint."""


async def main(args: argparse.Namespace) -> None:
    flow = Dataflow(JOB, parallelism=args.parallelism, batch_size=128)
    # every PACE words, and at the end, the input waits for a completed checkpoint: the
    # stop-with-savepoint asked for at record ``stop_at`` lands within a few PACE of it,
    # however fast the input is read, so a later run still has records to be killed at; the
    # markers are in every run (positions index this list), not only in the stopped one
    items: list[Any] = []
    for i, word in enumerate(words(args.records)):
        if i and i % PACE == 0:
            items.append(TestingSource.CHECKPOINT)
        items.append(word)
    items.append(TestingSource.CHECKPOINT)
    (flow.source(TestingSource(items)).uid("words")
         .key_by(lambda w: w)
         .process(Count()).uid("count")
         .sink(CommittingFileSink(args.out, format="jsonl")).uid("files"))
    job = await flow.start(
        checkpoints=CheckpointConfig(interval=0.05, directory=args.checkpoints),
        state_backend=backend(args.backend, args.checkpoints),
        restart=RestartStrategy.fixed(3, 0.0), resume=args.resume,
        restore_from=args.restore_from)
    if args.stop_at:
        Progress.reached = asyncio.Event()
        Progress.stop_at = args.stop_at
        done = asyncio.ensure_future(job.wait())
        reached = asyncio.ensure_future(Progress.reached.wait())
        await asyncio.wait({done, reached}, return_when=asyncio.FIRST_COMPLETED)
        reached.cancel()
        if not done.done():
            await job.stop(savepoint=True, path=args.savepoint)
        await done
    else:
        await job.wait()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("checkpoints")
    p.add_argument("parallelism", type=int)
    p.add_argument("records", type=int)
    p.add_argument("backend", choices=["heap", "heap-fork", "rocksdb"])
    p.add_argument("--restore-from", default=None)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--stop-at", type=int, default=0)
    p.add_argument("--savepoint", default=None)
    asyncio.run(main(p.parse_args()))
