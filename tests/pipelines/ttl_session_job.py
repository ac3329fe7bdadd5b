"""A keyed running count whose state expires (``ttl=3`` seconds of record time) into a
:class:`~reactive.connectors.files.CommittingFileSink`, run as a subprocess by
``tests/state/test_state_ttl_kill.py`` and killed with SIGKILL.

Usage::

    python ttl_session_job.py OUT CHECKPOINTS RECORDS PARALLELISM BACKEND

``from_collection(events) -> key_by(key) -> process(SessionCount) -> committing file sink
(JSON lines)``, resuming from the latest completed checkpoint in
CHECKPOINTS (every 50 ms) at PARALLELISM, with BACKEND ``heap``, ``heap-incremental`` or
``rocksdb``. The TTL's processing-time clock reads the time of the record being processed
(:class:`RecordTime`), so which counts expired depends on the input only and a batch
computation (:func:`expected`) can check the output. Exits 0 when the input is done.

``REACTIVE_TEST_KILL=row:<n>`` makes this process kill itself with SIGKILL when its n-th
record (counted in this process, over the count's instances) reaches the count (appending
the kill point to the file ``REACTIVE_TEST_KILL_LOG`` first, if set).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
from collections.abc import Iterable
from typing import Any

from reactive import (
    CheckpointConfig,
    Dataflow,
    KeyedProcessFunction,
    RestartStrategy,
    StateTtlConfig,
    ValueStateDescriptor,
)
from reactive.backends.heap import HeapStateBackend
from reactive.backends.rocksdb import RocksDBStateBackend
from reactive.connectors.files import CommittingFileSink

JOB = "ttl-sessions"
KEYS = 300
TTL = 3.0

_KIND, _, _AT = os.environ.get("REACTIVE_TEST_KILL", "none:0").partition(":")
_rows = 0


def events(n: int, seed: int = 11) -> list[tuple[str, float]]:
    """``n`` events ``(key, time)`` in time order: each of :data:`KEYS` keys about every 2 s
    (exponential gaps), so many of its counts outlive the TTL and many do not."""
    rnd = random.Random(seed)
    t = 0.0
    out = []
    for _ in range(n):
        t += rnd.expovariate(KEYS / 2.0)
        out.append((f"k{rnd.randrange(KEYS)}", t))
    return out


def expected(evs: list[tuple[str, float]]) -> list[dict[str, Any]]:
    """The output a run without failures writes: per event, its key's count since the key
    was last idle for :data:`TTL` seconds or more."""
    state: dict[str, tuple[int, float]] = {}
    out = []
    for key, t in evs:
        n, expires = state.get(key, (0, -1.0))
        n = (n if expires > t else 0) + 1
        state[key] = (n, t + TTL)
        out.append({"key": key, "t": t, "n": n})
    return out


class RecordTime:
    """The TTL's processing-time clock: the time of the record being processed."""

    t = 0.0

    def now(self) -> float:
        return RecordTime.t

    def call_at(self, timestamp: float, callback: Any) -> Any:
        raise NotImplementedError("the job registers no timers")


class SessionCount(KeyedProcessFunction):
    """Counts a key's events; the count expires TTL seconds after its last write."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor(
            "count", default=0, ttl=StateTtlConfig(TTL, clock=RecordTime())))

    def process_element(self, event: Any, ctx: Any) -> Iterable[Any]:
        maybe_kill()
        key, t = event
        RecordTime.t = t
        n = self.count.value() + 1
        self.count.update(n)
        yield {"key": key, "t": t, "n": n}


def maybe_kill() -> None:
    """Count this process's records; SIGKILL at the chosen one."""
    global _rows
    _rows += 1
    if _KIND == "row" and _rows >= int(_AT):
        log = os.environ.get("REACTIVE_TEST_KILL_LOG")
        if log:
            with open(log, "a") as f:
                f.write(f"row:{_AT}\n")
        os.kill(os.getpid(), signal.SIGKILL)


async def main(out: str, checkpoints: str, records: int, parallelism: int, backend: str
               ) -> None:
    """Run (resume) the job."""
    state_backend: Any = HeapStateBackend(incremental=backend == "heap-incremental")
    if backend == "rocksdb":
        state_backend = RocksDBStateBackend(os.path.join(checkpoints, "..", "rocksdb-work"),
                                            incremental=True)
    flow = Dataflow(JOB, parallelism=parallelism, max_parallelism=32, batch_size=64)
    (flow.from_collection(events(records)).uid("events")
         .key_by(lambda e: e[0]).process(SessionCount()).uid("count")
         .sink(CommittingFileSink(out, format="jsonl")).uid("sink"))
    await flow.run(checkpoints=CheckpointConfig(interval=0.05, directory=checkpoints),
                   restart=RestartStrategy.none(), resume=True,
                   state_backend=state_backend)


if __name__ == "__main__":
    args = sys.argv[1:]
    asyncio.run(main(args[0], args[1], int(args[2]), int(args[3]), args[4]))
