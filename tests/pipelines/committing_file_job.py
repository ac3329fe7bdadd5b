"""A keyed count into a :class:`~connectors.files.CommittingFileSink`, run as a subprocess by
``tests/test_committing_file_sink.py`` and killed with SIGKILL at chosen moments.

Usage::

    python committing_file_job.py OUT CHECKPOINTS FORMAT RECORDS

It resumes from the latest completed checkpoint in CHECKPOINTS (checkpoints every 100 ms)
and exits 0 when the input is done. The environment variable ``REACTIVE_TEST_KILL`` names
where this process kills itself with SIGKILL (counters are per process, over all subtasks):

- ``record:<n>``: when the keyed count processes its n-th record;
- ``commit:<n>``: in the n-th commit, before the rename (between checkpoint completion and
  commit; during recovery when the n-th commit is one of the restored transactions);
- ``committed:<n>``: right after the n-th commit's rename (before the other subtask commits);
- ``precommit:<n>``: right after the n-th pre-commit (its checkpoint never completes).

Before killing itself it appends the kill point to the file ``REACTIVE_TEST_KILL_LOG`` (if
set), so the test knows the kill really happened there.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
from collections.abc import Iterable
from typing import Any

from connectors.files import CommittingFileSink, FileTransaction
from reactive import (
    CheckpointConfig,
    Dataflow,
    KeyedProcessFunction,
    RestartStrategy,
    ValueStateDescriptor,
)

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
_COUNTERS = {"record": 0, "commit": 0, "committed": 0, "precommit": 0}


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


class Count(KeyedProcessFunction):
    """Emits ``(word, n)`` for the n-th occurrence of ``word``."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def process_element(self, value: Any, ctx: Any) -> Iterable[Any]:
        _tick("record")
        n = self.count.value() + 1
        self.count.update(n)
        yield (value, n)


class KillingFileSink(CommittingFileSink):
    """The committing file sink with the kill points of ``REACTIVE_TEST_KILL``."""

    def pre_commit(self, txn: FileTransaction, checkpoint_id: int) -> None:
        super().pre_commit(txn, checkpoint_id)
        _tick("precommit")

    def commit(self, txn: FileTransaction) -> None:
        _tick("commit")
        super().commit(txn)
        _tick("committed")


async def main(out: str, checkpoints: str, fmt: str, records: int) -> None:
    flow = Dataflow(JOB, parallelism=2, batch_size=256)
    (flow.from_collection(words(records)).uid("words")
         .key_by(lambda w: w)
         .process(Count()).uid("count")
         .sink(KillingFileSink(out, format=fmt, schema=schema() if fmt == "parquet" else None))
         .uid("files"))
    await flow.run(checkpoints=CheckpointConfig(interval=0.1, directory=checkpoints),
                   restart=RestartStrategy.fixed(5, 0.0), resume=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
