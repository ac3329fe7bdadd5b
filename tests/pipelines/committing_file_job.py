"""A keyed count into a :class:`~reactive.connectors.files.CommittingFileSink`, run as a subprocess by
``tests/connectors/files/test_committing_file_sink.py`` and killed with SIGKILL at chosen moments.

Usage::

    python committing_file_job.py OUT CHECKPOINTS FORMAT RECORDS [PARALLELISM [BACKEND]]

It resumes from the latest completed checkpoint in CHECKPOINTS (checkpoints every 100 ms)
at PARALLELISM (default 2; another parallelism than the checkpoint's rescales the restored
state) with the keyed state backend BACKEND (``heap``, the default, or ``rocksdb``, working
in the directory ``CHECKPOINTS.rocksdb``) and exits 0 when the input is done.

The environment variable ``REACTIVE_TEST_KILL`` names where this process kills itself with
SIGKILL (counters are per process, over all subtasks):

- ``record:<n>``: when the keyed count processes its n-th record;
- ``commit:<n>``: in the n-th commit, before the rename (between checkpoint completion and
  commit; during recovery when the n-th commit is one of the restored transactions);
- ``committed:<n>``: right after the n-th commit's rename (before the other subtask commits);
- ``precommit:<n>``: right after the n-th pre-commit (its checkpoint never completes);
- ``commitdeclined:<n>``: in the n-th commit of a transaction pre-committed for the
  checkpoint the source declined (see below), before the rename: the process dies after the
  next checkpoint completed, with the transactions of both checkpoints pending.

``REACTIVE_TEST_DECLINE=<n>`` makes the source decline its n-th snapshot in this process: the
barrier still flows, so every sink instance pre-commits that checkpoint, but the checkpoint
is aborted, and its transactions stay pending until the next checkpoint completes (so that
checkpoint lists pending transactions of two checkpoint ids per instance).

``REACTIVE_TEST_MODE`` is the checkpointing mode (default ``exactly_once``);
``REACTIVE_TEST_UNALIGNED=1`` takes unaligned checkpoints, and ``REACTIVE_TEST_RECORD_US=<n>``
makes the keyed count spend n microseconds of CPU per record (a slow operator: the channels
in front of it stay full, so unaligned checkpoints store in-flight records; measured on the
thread's CPU clock, as a wall-clock wait ends while a loaded machine deschedules the process
and the count then drains its channels).

Before killing itself it appends the kill point to the file ``REACTIVE_TEST_KILL_LOG`` (if
set), so the test knows the kill really happened there.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
import time
from collections.abc import Iterable
from typing import Any

from reactive import (
    CheckpointConfig,
    Dataflow,
    KeyedProcessFunction,
    RestartStrategy,
    ValueStateDescriptor,
)
from reactive.connectors.collections import CollectionSource, _CollectionReader
from reactive.connectors.files import CommittingFileSink, FileTransaction
from reactive.sources import SourceReader

JOB = "committing-files"
VOCABULARY = 2_000


def words(n: int, seed: int = 5) -> list[str]:
    """``n`` Zipf-like words (exponent 1.1), deterministic per seed: the job's input."""
    rnd = random.Random(seed)
    weights = [1.0 / (i + 1) ** 1.1 for i in range(VOCABULARY)]
    return [f"w{i}" for i in rnd.choices(range(VOCABULARY), weights=weights, k=n)]


def schema() -> Any:
    """The declared parquet schema of the output records ``(word, count)``."""
    import pyarrow as pa

    return pa.schema([("word", pa.string()), ("count", pa.int64())])


_KIND, _, _AT = os.environ.get("REACTIVE_TEST_KILL", "none:0").partition(":")
_COUNTERS = {"record": 0, "commit": 0, "committed": 0, "precommit": 0,
             "commitdeclined": 0}
_DECLINE_AT = int(os.environ.get("REACTIVE_TEST_DECLINE", "0"))
_RECORD_SECONDS = int(os.environ.get("REACTIVE_TEST_RECORD_US", "0")) / 1e6
# the source declined a snapshot; the next checkpoint the sinks pre-commit is that one (with
# max_concurrent=1 the declined checkpoint is triggered after the previous one completed, so
# no pre-commit of an earlier checkpoint comes after the source's decline)
_DECLINE: dict[str, Any] = {"declined": False, "checkpoint": None}
_CHUNK = 2_000  # records per checkpoint interval while the decline is set up


def _tick(kind: str) -> None:
    if kind != _KIND:
        return
    _COUNTERS[kind] += 1
    if _COUNTERS[kind] == int(_AT):
        log = os.environ.get("REACTIVE_TEST_KILL_LOG")
        if log:
            with open(log, "a") as f:
                f.write(f"{kind}:{_AT}\n")
                f.flush()
                os.fsync(f.fileno())
        os.kill(os.getpid(), signal.SIGKILL)


# Hand-written: the failure it injects is a declined source snapshot (snapshot_state
# raising), a SourceReader behaviour TestingSource's ABORT (a read failure) does not cover.
class WordSource(CollectionSource):
    """The words, non-parallel, position = index (``from_collection``'s source), declining
    its ``REACTIVE_TEST_DECLINE``-th snapshot of this process."""

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        return _WordReader(self.items)


class _WordReader(_CollectionReader):
    snapshots = 0

    async def read_batch(self, max_records: int) -> list[Any] | None:
        # every sink instance must have records in the declined checkpoint's interval and
        # in the next one's, however fast the input is read and however the loop hands
        # over: until the source has snapshotted the checkpoint after the declined one, it
        # reads at most _CHUNK more records per snapshot, and nothing more until the next
        # barrier (barriers are injected between reads, so each chunk lands in its interval)
        if _DECLINE_AT and self.snapshots <= _DECLINE_AT:
            allowed = (self.snapshots + 1) * _CHUNK - self.position
            if allowed <= 0:
                return []
            max_records = min(max_records, allowed)
        return await super().read_batch(max_records)

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        self.snapshots += 1
        if self.snapshots == _DECLINE_AT:
            _DECLINE["declined"] = True
            raise OSError(f"injected: the source declines its snapshot {self.snapshots}")
        return super().snapshot_state(checkpoint_id)


class Count(KeyedProcessFunction):
    """Emits ``(word, n)`` for the n-th occurrence of ``word``."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def process_element(self, value: Any, ctx: Any) -> Iterable[Any]:
        _tick("record")
        if _RECORD_SECONDS:
            end = time.thread_time() + _RECORD_SECONDS
            while time.thread_time() < end:
                pass
        n = self.count.value() + 1
        self.count.update(n)
        yield (value, n)


class KillingFileSink(CommittingFileSink):
    """The committing file sink with the kill points of ``REACTIVE_TEST_KILL``."""

    def pre_commit(self, txn: FileTransaction, checkpoint_id: int) -> None:
        if _DECLINE["declined"] and _DECLINE["checkpoint"] is None:
            _DECLINE["checkpoint"] = checkpoint_id
        super().pre_commit(txn, checkpoint_id)
        _tick("precommit")

    def commit(self, txn: FileTransaction) -> None:
        _tick("commit")
        if txn.checkpoint_id is not None and txn.checkpoint_id == _DECLINE["checkpoint"]:
            _tick("commitdeclined")
        super().commit(txn)
        _tick("committed")


async def main(out: str, checkpoints: str, fmt: str, records: int, parallelism: int = 2,
               backend: str = "heap") -> None:
    """Run (resume) the job.

    Args:
        out: the committed output directory.
        checkpoints: the checkpoint directory.
        fmt: ``"jsonl"`` or ``"parquet"``.
        records: how many input words.
        parallelism: the job's parallelism (every operator).
        backend: ``"heap"`` or ``"rocksdb"``.
    """
    state_backend: Any = None
    if backend == "rocksdb":
        from reactive.backends.rocksdb import RocksDBStateBackend

        state_backend = RocksDBStateBackend(checkpoints + ".rocksdb")
    elif backend != "heap":
        raise SystemExit(f"unknown backend {backend!r}: heap or rocksdb")
    flow = Dataflow(JOB, parallelism=parallelism, batch_size=256)
    (flow.source(WordSource(words(records)), name="words").uid("words")
         .key_by(lambda w: w)
         .process(Count()).uid("count")
         .sink(KillingFileSink(out, format=fmt, schema=schema() if fmt == "parquet" else None))
         .uid("files"))
    mode: Any = os.environ.get("REACTIVE_TEST_MODE", "exactly_once")  # or "synchronous"
    unaligned = os.environ.get("REACTIVE_TEST_UNALIGNED") == "1"
    await flow.run(checkpoints=CheckpointConfig(interval=0.1, directory=checkpoints, mode=mode,
                                                unaligned=unaligned),
                   restart=RestartStrategy.fixed(5, 0.0), resume=True,
                   state_backend=state_backend)


if __name__ == "__main__":
    args = sys.argv[1:]
    asyncio.run(main(args[0], args[1], args[2], int(args[3]),
                     int(args[4]) if len(args) > 4 else 2, args[5] if len(args) > 5 else "heap"))
