"""Live rescaling of W1 (``job.rescale``) against stop-with-savepoint + restore.

    python -m bench.rescale [--keys 1000000] [--records 8000000] [--backends heap rocksdb]
                            [--steps 2 4 3 1] [--between 1.0] [--repeats 1]
                            [--transfers auto auto-after-checkpoint checkpoint]
                            [--skip-restart]

W1 (``from_collection -> key_by -> KeyedProcessFunction count -> sink``, checkpoints every
1 s) runs over ``--keys`` distinct words first (so the keyed state holds that many keys),
then Zipf(1.1) words over the same vocabulary. Once the distinct words are counted, the job
is rescaled through ``--steps`` (from parallelism 1), ``--between`` seconds apart, while the
source reads at full speed. The pause of a rescale is the gap between two records reaching
the sink (any instance) that spans the new tasks' start: from the last record before the
rescale's barrier to the first one of the rescaled job. The longest gap that began between
the call and its return (however late it ended) is reported beside it: it also catches
what the rescale's checkpoint costs the job after the switch, and the noise of periodic
checkpoints the call waited for (compare "longest gap between rescales"). The same steps are
then run as Flink does without live rescaling: stop-with-savepoint, and a new run that
restores the savepoint at the new parallelism (the gap from the last record before the stop
to the first record of the new run). ``--transfers`` runs the live rescale once per state
transfer (``job.rescale(..., state_transfer=...)``), ``--repeats`` times: ``auto`` hands the
heap state over in memory and starts the new tasks at the rescale's barrier, while the old
tasks' snapshots write (RocksDB restores the checkpoint either way);
``auto-after-checkpoint`` hands it over too but starts the new tasks only once the
checkpoint completed and committed (``JobRunner.switch_at_barrier`` off: the baseline of the
switch at the barrier); ``checkpoint`` restores the rescale's checkpoint. A step's pause is
reported as min/median/max over the repeats.

Both ways must be exact: the sink keeps each word's last count and the number of records;
every record reaches the sink once (the sources read nothing after the rescale's barrier),
so the counts must equal the input's and the records its length. The per-rescale phases
say where the time goes: the checkpoint (trigger to completion: alignment, synchronous and
asynchronous parts, metadata), then the switch (commits, tear-down of the old tasks, restore
of the checkpoint's files at the new parallelism, start of the new tasks).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import ALL_CHECKPOINTS, print_table, zipf_keys
from reactive import CheckpointConfig, Dataflow, KeyedProcessFunction, ValueStateDescriptor
from reactive.backends.heap import HeapStateBackend
from reactive.backends.rocksdb import RocksDBStateBackend
from reactive.sinks import Sink, SinkWriter
from reactive.state.backend import StateBackend


class Count(KeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def process_element(self, word: str, ctx: Any, out: list[Any]) -> None:
        n = self.count.value() + 1
        self.count.update(n)
        out.append((word, n))


@dataclass
class Recorder:
    """What every sink instance of a run writes into: last count per word, records, and
    the gaps between two batches reaching the sink."""

    last: dict[str, int] = field(default_factory=dict)
    records: int = 0
    previous: float = 0.0
    gaps: list[tuple[float, float]] = field(default_factory=list)  # (end time, gap s)

    def write(self, batch: list[Any]) -> None:
        now = time.perf_counter()
        if self.previous and now - self.previous > 0.002:
            self.gaps.append((now, now - self.previous))
        self.previous = now
        self.last.update(batch)
        self.records += len(batch)

    def longest_gap(self, start: float, end: float) -> float:
        """The longest gap that began in ``[start, end)`` (a pause belongs to the stretch
        it began in, however late it ends)."""
        return self.longest(start, end)[1]

    def spanning(self, instant: float) -> float:
        """The gap that spans ``instant`` (0.0: records flowed then, no gap over 2 ms)."""
        return max((g for t, g in self.gaps if t - g <= instant < t), default=0.0)

    def longest(self, start: float, end: float) -> tuple[float, float]:
        """(when it began, seconds) of :meth:`longest_gap` (``(start, 0.0)``: none)."""
        return max(((t - g, g) for t, g in self.gaps if start <= t - g < end),
                   key=lambda x: x[1], default=(start, 0.0))


class RecordingSink(Sink[Any]):
    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def create_writer(self, subtask: int, parallelism: int) -> SinkWriter[Any]:
        return _Writer(self.recorder)


class _Writer(SinkWriter[Any]):
    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def write(self, batch: list[Any]) -> None:
        self.recorder.write(batch)


def _flow(words: list[str], recorder: Recorder, parallelism: int) -> Dataflow:
    flow = Dataflow("w1-rescale", parallelism=parallelism)
    (flow.from_collection(words).uid("words").key_by(lambda w: w)
     .process(Count()).uid("count").sink(RecordingSink(recorder)).uid("sink"))
    return flow


def _backend(name: str, work: Path) -> StateBackend:
    return HeapStateBackend() if name == "heap" else RocksDBStateBackend(path=work / "rocks")


async def _counted(job: Any, n: int) -> None:
    """Wait until the count has taken ``n`` records (in this run)."""
    while job.metrics.operators.get("count", {}).get("records_in", 0) < n:
        await asyncio.sleep(0.01)


@dataclass
class Step:
    way: str
    change: str
    pause: float
    checkpoint: float = 0.0
    switch: float = 0.0
    detail: str = ""
    at: float = 0.0  # perf_counter time the new tasks started
    window: float = 0.0  # the longest gap that began between the call and its return


async def live(words: list[str], keys: int, backend: str, steps: list[int], between: float,
               work: Path, transfer: str = "auto") -> tuple[list[Step], Recorder, float]:
    recorder = Recorder()
    job = await _flow(words, recorder, 1).start(
        checkpoints=CheckpointConfig(interval=1.0, directory=str(work / "chk"),
                                     history=ALL_CHECKPOINTS),
        state_backend=_backend(backend, work))
    if transfer == "auto-after-checkpoint":
        job._runner.switch_at_barrier = False
        transfer = "auto"
    await _counted(job, keys)
    out, p, windows, quiet_windows = [], 1, [], []
    for target in steps:
        t0 = time.perf_counter()
        await asyncio.sleep(between)
        t_call, w_call = time.perf_counter(), time.time()
        # a stretch without a rescale (periodic checkpoints included)
        quiet_windows.append((t0, t_call))
        completed = await job.rescale(target, state_transfer=transfer)  # type: ignore[arg-type]
        t_ret = time.perf_counter()
        windows.append((t_call, t_ret))
        await asyncio.sleep(0.2)
        stats = next(s for s in job.metrics.checkpoints
                     if s.checkpoint_id == completed.checkpoint_id)
        ck = stats.trigger_time - w_call + stats.duration
        phases = job._runner.rescale_phases[-1]
        way = job._runner.rescale_transfers[-1][1].split(":")[0]
        checkpoint = (f"checkpoint: wait {(stats.trigger_time - w_call) * 1e3:.0f}, "
                      f"align {stats.alignment * 1e3:.0f}, sync {stats.sync * 1e3:.0f}, "
                      f"async {stats.async_ * 1e3:.0f} ({stats.size / 1e6:.0f} MB)")
        at = job._runner.rescale_started[-1]
        if "barrier" in phases:
            # switched at the barrier: the checkpoint completes while the new tasks run
            way += ", at the barrier"
            detail = ("switch at the barrier: " + ", ".join(
                f"{k} {v * 1e3:.0f}" for k, v in phases.items())
                + f"; then {checkpoint}, completed {ck * 1e3:.0f} after the call")
            switch = sum(phases.values()) - phases["barrier"]
        else:
            commit = t_ret - t_call - ck - sum(phases.values())
            detail = (f"{checkpoint}; switch: commit {commit * 1e3:.0f}, "
                      + ", ".join(f"{k} {v * 1e3:.0f}" for k, v in phases.items()))
            switch = t_ret - t_call - ck
        out.append(Step(f"live ({way})", f"{p} -> {target}", 0.0, ck, switch, detail,
                        at=at))
        p = target
    await job.wait()
    # after the run: a pause that outlasted the wait above is recorded by now
    for step, (start, end) in zip(out, windows, strict=True):
        # the pause of the switch: the gap at the sink that spans the new tasks' start
        # (from the last record before the barrier to the first one after it)
        step.pause = recorder.spanning(step.at)
        began, step.window = recorder.longest(start, end)
        step.detail += (f"; longest gap from the call to the return {step.window * 1e3:.0f}, "
                        f"began {(began - start) * 1e3:.0f} after the call")
    quiet = max(recorder.longest_gap(start, end) for start, end in quiet_windows)
    return out, recorder, quiet


async def restarted(words: list[str], keys: int, backend: str, steps: list[int],
                    between: float, work: Path) -> tuple[list[Step], Recorder]:
    recorder = Recorder()
    config = CheckpointConfig(interval=1.0, directory=str(work / "chk-sp"),
                              history=ALL_CHECKPOINTS)
    job = await _flow(words, recorder, 1).start(checkpoints=config,
                                                state_backend=_backend(backend, work))
    await _counted(job, keys)
    out, p = [], 1
    for i, target in enumerate(steps):
        await asyncio.sleep(between)
        t_call = time.perf_counter()
        savepoint = await job.stop(path=work / f"savepoint-{i}")
        t_stopped = time.perf_counter()
        assert savepoint is not None
        job = await _flow(words, recorder, target).start(
            checkpoints=config, state_backend=_backend(backend, work / f"run-{i}"),
            restore_from=savepoint.path)
        await _counted(job, 1)
        t_ret = time.perf_counter()
        await asyncio.sleep(0.2)
        # the gap began before the stop returned and ended with the new run's first record
        pause = recorder.longest_gap(t_call, t_stopped)
        out.append(Step("stop-with-savepoint + restore", f"{p} -> {target}", pause,
                        t_stopped - t_call, t_ret - t_stopped, window=pause))
        p = target
    await job.wait()
    return out, recorder


def _check(words: list[str], recorder: Recorder, way: str) -> None:
    expected = collections.Counter(words)
    assert recorder.records == len(words), (way, recorder.records, len(words))
    assert recorder.last == dict(expected), f"{way}: final counts differ from the input's"


def _spread(values: list[float]) -> str:
    """min / median / max in ms."""
    v = sorted(values)
    return " / ".join(f"{x * 1e3:,.0f}" for x in (v[0], statistics.median(v), v[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--records", type=int, default=8_000_000)
    ap.add_argument("--backends", nargs="+", default=["heap", "rocksdb"])
    ap.add_argument("--steps", nargs="+", type=int, default=[2, 4, 3, 1])
    ap.add_argument("--between", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--transfers", nargs="+",
                    default=["auto", "auto-after-checkpoint", "checkpoint"],
                    choices=["auto", "auto-after-checkpoint", "checkpoint"])
    ap.add_argument("--skip-restart", action="store_true",
                    help="no stop-with-savepoint + restore run")
    args = ap.parse_args()
    words = [f"w{i}" for i in range(args.keys)]
    words += zipf_keys(args.records - args.keys, args.keys)
    rows = []
    for backend in args.backends:
        # transfer -> one list of steps per repeat; the repeats interleave the transfers
        lives: dict[str, list[list[Step]]] = {t: [] for t in args.transfers}
        quiets: dict[str, list[float]] = {t: [] for t in args.transfers}
        for _ in range(args.repeats):
            for transfer in args.transfers:
                with tempfile.TemporaryDirectory() as tmp:
                    steps, recorder, quiet = asyncio.run(live(
                        words, args.keys, backend, args.steps, args.between, Path(tmp),
                        transfer))
                    _check(words, recorder, f"live {transfer}")
                    for s in steps:
                        print(backend, transfer, s.way, s.change,
                              f"pause {s.pause * 1e3:.0f} ms;", s.detail, flush=True)
                lives[transfer].append(steps)
                quiets[transfer].append(quiet)
        restarts: list[Step] = []
        if not args.skip_restart:
            with tempfile.TemporaryDirectory() as tmp:
                restarts, recorder2 = asyncio.run(
                    restarted(words, args.keys, backend, args.steps, args.between, Path(tmp)))
                _check(words, recorder2, "stop-with-savepoint")
                for s in restarts:
                    print(backend, "stop+restore", s.change, f"pause {s.pause * 1e3:.0f} ms",
                          flush=True)
        for i in range(len(args.steps)):
            for transfer, runs in lives.items():
                pauses = [run[i].pause for run in runs]
                median_run = sorted(runs, key=lambda run: run[i].pause)[len(runs) // 2]
                s = median_run[i]
                ratio = (statistics.median(pauses) / restarts[i].pause
                         if restarts and restarts[i].pause else "-")
                rows.append([backend, f"{transfer}: {s.way}", s.change, _spread(pauses),
                             _spread([run[i].window for run in runs]),
                             _spread([run[i].switch for run in runs]), ratio, s.detail])
            if restarts:
                r = restarts[i]
                rows.append([backend, "stop-with-savepoint + restore", r.change,
                             _spread([r.pause]), _spread([r.pause]), _spread([r.switch]), 1.0,
                             ""])
        for transfer, gaps in quiets.items():
            rows.append([backend, f"{transfer}: longest gap between rescales", "-", "-",
                         _spread(gaps), "-", "-", "periodic checkpoints included"])
    print(f"{args.keys:,} keys, {args.records:,} records, {args.repeats} repeat(s); output "
          "exact in every run")
    print_table(["backend", "way", "change", "pause at the switch min / median / max (ms)",
                 "longest gap from call to return (ms)", "switch min / median / max (ms)",
                 "median x stop+restore",
                 "where the time goes, median run (ms)"], rows)


if __name__ == "__main__":
    main()
