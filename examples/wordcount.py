"""Word count over the source files of Python's own standard library, with checkpoints.

    python examples/wordcount.py [--input DIR] [--parallelism N] [--interval S]
                                 [--checkpoint-dir DIR] [--no-failure]

Reads every file of DIR (default: the running Python's standard library directory) with
the line-file source, splits lines into words, counts them per word in keyed state (heap
backend), and checkpoints every ``--interval`` seconds. Unless ``--no-failure``, it takes a
checkpoint on demand right after the start (``await job.checkpoint()``), then makes the
counting function raise once, to show the restart from that checkpoint. At the end it
compares the counts with a plain batch count of the same files and prints the most
frequent words and the checkpoint figures.
"""

from __future__ import annotations

import argparse
import collections
import re
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from reactive import (
    CheckpointConfig,
    Dataflow,
    KeyedProcessFunction,
    RestartStrategy,
    ValueStateDescriptor,
)

WORD = re.compile(r"[A-Za-z_]{3,}")


def words_of(line: str) -> list[str]:
    """The lowercase words (3+ letters) of a line."""
    return [w.lower() for w in WORD.findall(line)]


class Count(KeyedProcessFunction):
    """Counts records per key; emits ``(word, count)``; raises once when ``fail_next`` is set
    (a class attribute: shared by every instance)."""

    fail_next = False

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def process_element(self, word: str, ctx: Any) -> Iterator[tuple[str, int]]:
        if Count.fail_next:
            Count.fail_next = False
            raise RuntimeError(f"injected failure at word {word!r}")
        n = self.count.value() + 1
        self.count.update(n)
        yield (word, n)


async def main(args: argparse.Namespace) -> int:
    source_dir = Path(args.input)
    latest: dict[str, int] = {}

    def keep_latest(record: tuple[str, int]) -> None:
        word, n = record
        if n > latest.get(word, 0):
            latest[word] = n

    flow = Dataflow("wordcount", parallelism=args.parallelism, max_parallelism=128)
    (flow.read_text_file(source_dir, uid="lines").set_parallelism(args.parallelism)
         .flat_map(words_of, name="split")
         .key_by(lambda w: w)
         .process(Count(), name="count").uid("count")
         .sink(keep_latest, name="latest-counts"))

    checkpoint_dir = args.checkpoint_dir or tempfile.mkdtemp(prefix="wordcount-chk-")
    started = time.perf_counter()
    job = await flow.start(
        checkpoints=CheckpointConfig(interval=args.interval, directory=checkpoint_dir),
        restart=RestartStrategy.fixed(3, 0.1),
    )
    if args.failure:
        first = await job.checkpoint()
        print(f"checkpoint {first.checkpoint_id} taken on demand: {first.path}")
        Count.fail_next = True
    await job.wait()
    elapsed = time.perf_counter() - started

    expected: collections.Counter[str] = collections.Counter()
    for f in sorted(p for p in source_dir.iterdir() if p.is_file() and not p.name.startswith(".")):
        with open(f, "rb") as fh:
            for raw in fh:
                expected.update(words_of(raw.rstrip(b"\r\n").decode("utf-8", "replace")))
    total = sum(expected.values())
    exact = latest == dict(expected)

    m = job.metrics
    summary = m.summary()
    print(f"input: {source_dir} ({total:,} words, {len(expected):,} distinct)")
    print(f"ran {elapsed:.2f} s: {m.operators['count']['records_in'] / elapsed:,.0f} "
          f"words/s counted (replays included), restarts: {m.restarts}, "
          f"restored from: {m.restored_checkpoints or 'none'}")
    print("top words:", ", ".join(f"{w} {n:,}" for w, n in expected.most_common(8)))
    if summary["checkpoints"]:
        print(f"checkpoints: {summary['checkpoints']} completed in {checkpoint_dir}; median "
              f"sync {summary['median_sync'] * 1e3:.2f} ms, async "
              f"{summary['median_async'] * 1e3:.1f} ms, size {summary['median_size']:,.0f} B")
    print(f"validation against a batch count: {'exact' if exact else 'MISMATCH'}")
    return 0 if exact else 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--input", default=sysconfig.get_paths()["stdlib"],
                   help="directory of text files (default: the Python standard library)")
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--interval", type=float, default=1.0, help="checkpoint interval, seconds")
    p.add_argument("--checkpoint-dir", default=None, help="default: a new temporary directory")
    p.add_argument("--no-failure", dest="failure", action="store_false",
                   help="do not inject the failure that shows recovery")
    return p.parse_args(argv)


if __name__ == "__main__":
    from reactive import run_coroutine

    raise SystemExit(run_coroutine(main(parse_args())))
