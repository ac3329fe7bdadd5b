"""The keyed count of ``committing_file_job.py`` rescaled and updated while it runs, run as
a subprocess by ``tests/runtime/test_reconfiguration_kills.py`` and killed with SIGKILL at seeded
moments of its reconfigurations.

Usage::

    python reconfiguring_job.py OUT CHECKPOINTS RECORDS BACKEND

It resumes from the latest completed checkpoint in CHECKPOINTS (checkpoints every 100 ms, the
program at parallelism 2; a resumed run restores the parallelism its checkpoint recorded),
with BACKEND (``heap`` or ``rocksdb``, working in ``CHECKPOINTS.rocksdb``). While it runs it
goes through :data:`STEPS`, one every ``RECORDS / 8`` records the count takes in this
process: rescales to several parallelisms and updates of the count to :class:`CountV2`
(the same state and output), and exits 0 when the input is done.

``REACTIVE_TEST_KILL`` names where the process kills itself (counters per process):
``record``, ``precommit``, ``commit``, ``committed`` (see ``committing_file_job.py``) and

- ``reconfigure:<n>``: right before the n-th rescale or update is called;
- ``writer:<n>``: when the n-th sink writer is created (the first attempt creates two;
  later ones are created while a rescale builds its new execution graph);
- ``switched:<n>``: right after the n-th rescale or update returned.

Before killing itself it appends the kill point to ``REACTIVE_TEST_KILL_LOG`` (if set).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

from reactive import CheckpointConfig, Dataflow, ReconfigurationError, RestartStrategy
from reactive.sinks import SinkWriter
from tests.pipelines.committing_file_job import Count, KillingFileSink, WordSource, words

JOB = "reconfiguring"
STEPS: list[tuple[str, Any]] = [("rescale", 3), ("update", None), ("rescale", {"count": 1}),
                                ("rescale", 4), ("update", None), ("rescale", 2)]

_KIND, _, _AT = os.environ.get("REACTIVE_TEST_KILL", "none:0").partition(":")
_COUNTERS = {"reconfigure": 0, "writer": 0, "switched": 0}


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


class CountV2(Count):
    """The count's second version: the same state and output (the update is what runs)."""


class ReconfiguredFileSink(KillingFileSink):
    """Counts the writers it creates (``writer`` kill points)."""

    def create_writer(self, subtask: int, parallelism: int) -> SinkWriter[Any]:
        _tick("writer")
        return super().create_writer(subtask, parallelism)


async def main(out: str, checkpoints: str, records: int, backend: str) -> None:
    """Run (resume) the job through its reconfigurations."""
    state_backend: Any = None
    if backend == "rocksdb":
        from reactive.backends.rocksdb import RocksDBStateBackend

        state_backend = RocksDBStateBackend(checkpoints + ".rocksdb")
    flow = Dataflow(JOB, parallelism=2, batch_size=256)
    (flow.source(WordSource(words(records)), name="words").uid("words")
         .key_by(lambda w: w)
         .process(Count()).uid("count")
         .sink(ReconfiguredFileSink(out)).uid("files"))
    job = await flow.start(checkpoints=CheckpointConfig(interval=0.1, directory=checkpoints),
                           restart=RestartStrategy.fixed(5, 0.0), resume=True,
                           state_backend=state_backend)
    every = records // 8

    def ended() -> bool:
        return job.status in ("finished", "failed", "cancelled", "stopped")

    for i, (kind, arg) in enumerate(STEPS):
        while (not ended() and job.metrics.operators.get("count", {}).get("records_in", 0)
               < every * (i + 1)):
            await asyncio.sleep(0.005)
        if ended():
            break
        _tick("reconfigure")
        try:
            if kind == "rescale":
                await job.rescale(arg)
            else:
                await job.update("count", CountV2())
        except ReconfigurationError:
            break  # the input ended first (the final checkpoint runs): nothing to change
        _tick("switched")
    await job.wait()


if __name__ == "__main__":
    a = sys.argv[1:]
    asyncio.run(main(a[0], a[1], int(a[2]), a[3]))
