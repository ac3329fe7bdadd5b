"""Columnar event-time windows into a :class:`~reactive.connectors.files.CommittingFileSink`,
run as a subprocess by ``tests/columnar/test_columnar_kill.py`` and killed with SIGKILL.

Usage::

    python columnar_window_job.py OUT CHECKPOINTS RECORDS PARALLELISM KIND

``from_arrow(events) -> assign_timestamps("ts", 5) -> key_by("k") -> window(KIND: tumbling,
sliding or session).allowed_lateness(20).agg(count, sum, min, max, mean) -> committing file
sink (parquet, the batches as they are)``, resuming from the latest completed checkpoint in
CHECKPOINTS (every 50 ms) at PARALLELISM. Exits 0 when the input is done.

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

from reactive import (
    CheckpointConfig,
    Dataflow,
    RestartStrategy,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
)
from reactive.backends.heap import HeapStateBackend
from reactive.connectors.files import CommittingFileSink
from reactive.windowing import EventTimeSessionWindows

JOB = "columnar-windows"
BATCH_ROWS = 200
DELAY = 5.0
LATENESS = 20.0
ASSIGNERS = {"tumbling": TumblingEventTimeWindows.of(100),
             "sliding": SlidingEventTimeWindows.of(100, 30),
             "session": EventTimeSessionWindows.with_gap(15)}

_KIND, _, _AT = os.environ.get("REACTIVE_TEST_KILL", "none:0").partition(":")
_rows = 0


def events(n: int, seed: int = 5) -> pa.Table:
    """The job's input: ``n`` rows over 20 keys, mostly in event-time order, some up to 40
    seconds behind (late rows among them), nulls in ``v``."""
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(0, n // 2, n)) + rng.integers(-40, 10, n)
    v = rng.integers(-5, 50, n)
    return pa.table({"k": [f"k{i}" for i in rng.integers(0, 20, n)], "ts": ts,
                     "v": pa.array(v, mask=rng.random(n) < 0.05)})


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


async def main(out: str, checkpoints: str, records: int, parallelism: int, kind: str) -> None:
    """Run (resume) the job."""
    flow = Dataflow(JOB, parallelism=parallelism, max_parallelism=32)
    (flow.from_arrow(events(records), batch_size=BATCH_ROWS).uid("events")
         .map_batches(maybe_kill).set_parallelism(1).uid("kill")
         .assign_timestamps("ts", DELAY).set_parallelism(1).uid("stamps")
         .key_by("k").window(ASSIGNERS[kind], timestamp="ts").allowed_lateness(LATENESS)
         .agg(n=("v", "count"), s=("v", "sum"), lo=("v", "min"), hi=("v", "max"),
              m=("v", "mean")).uid("windows")
         .sink(CommittingFileSink(out, format="parquet")).uid("sink"))
    await flow.run(checkpoints=CheckpointConfig(interval=0.05, directory=checkpoints),
                   restart=RestartStrategy.none(), resume=True,
                   state_backend=HeapStateBackend())


if __name__ == "__main__":
    args = sys.argv[1:]
    asyncio.run(main(args[0], args[1], int(args[2]), int(args[3]), args[4]))
