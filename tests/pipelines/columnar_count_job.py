"""A columnar keyed running count into a :class:`~reactive.connectors.files.CommittingFileSink`,
run as a subprocess by ``tests/columnar/test_columnar_kill.py`` and killed with SIGKILL.

Usage::

    python columnar_count_job.py OUT CHECKPOINTS RECORDS PARALLELISM BACKEND

``from_arrow(words) -> key_by("word") -> agg(count, total) -> to_records -> committing
file sink (JSON lines)``, resuming from the latest completed checkpoint in CHECKPOINTS
(every 50 ms) at PARALLELISM, with BACKEND ``heap`` or ``heap-incremental`` (the columnar
state's snapshots follow the job backend's incremental flag), or ``rocksdb`` (the columnar
state in RocksDB, incremental checkpoints, a cache of 64 slots so rows go to RocksDB).
Exits 0 when the input is done.

``REACTIVE_TEST_KILL=row:<n>`` makes this process kill itself with SIGKILL when a record
batch takes its row count in this process to n or more (appending the kill point to the
file ``REACTIVE_TEST_KILL_LOG`` first, if set).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

import numpy as np
import pyarrow as pa

from reactive import CheckpointConfig, Dataflow, RestartStrategy
from reactive.backends.heap import HeapStateBackend
from reactive.backends.rocksdb import RocksDBStateBackend
from reactive.columnar.aggregate_operator import ColumnarAggregateOperator
from reactive.connectors.files import CommittingFileSink

JOB = "columnar-count"
VOCABULARY = 500
BATCH_ROWS = 500

_KIND, _, _AT = os.environ.get("REACTIVE_TEST_KILL", "none:0").partition(":")
_rows = 0


def words_table(n: int, seed: int = 7) -> pa.Table:
    """The job's input: ``n`` Zipf(1.2) words over :data:`VOCABULARY` and an int column."""
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, VOCABULARY + 1, dtype=np.float64) ** -1.2
    idx = rng.choice(VOCABULARY, size=n, p=ranks / ranks.sum())
    return pa.table({"word": [f"w{i}" for i in idx], "n": rng.integers(0, 100, n)})


def maybe_kill(batch: Any) -> Any:
    """Count this process's rows; SIGKILL at the chosen row."""
    global _rows
    _rows += batch.num_rows
    if _KIND == "row" and _rows >= int(_AT):
        log = os.environ.get("REACTIVE_TEST_KILL_LOG")
        if log:
            with open(log, "a") as f:
                f.write(f"row:{_AT}\n")
        os.kill(os.getpid(), signal.SIGKILL)
    return batch


async def main(out: str, checkpoints: str, records: int, parallelism: int, backend: str
               ) -> None:
    """Run (resume) the job."""
    state_backend: Any = HeapStateBackend(incremental=backend == "heap-incremental")
    if backend == "rocksdb":
        ColumnarAggregateOperator.cache_slots = 64
        state_backend = RocksDBStateBackend(os.path.join(checkpoints, "..", "rocksdb-work"))
    flow = Dataflow(JOB, parallelism=parallelism, max_parallelism=32)
    (flow.from_arrow(words_table(records), batch_size=BATCH_ROWS).uid("words")
         .map_batches(maybe_kill).uid("kill")
         .key_by("word").agg(count=("word", "count"), total=("n", "sum")).uid("agg")
         .to_records().sink(CommittingFileSink(out, format="jsonl")).uid("sink"))
    await flow.run(checkpoints=CheckpointConfig(interval=0.05, directory=checkpoints),
                   restart=RestartStrategy.none(), resume=True,
                   state_backend=state_backend)


if __name__ == "__main__":
    args = sys.argv[1:]
    asyncio.run(main(args[0], args[1], int(args[2]), int(args[3]), args[4]))
