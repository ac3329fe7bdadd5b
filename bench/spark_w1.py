"""W1 (the keyed running count) into a committing file sink, on Spark local mode against the
embedded run, in one invocation: records/s with Spark's start-up excluded (and reported
apart).

    python -m bench.spark_w1 [--records 300000] [--vocabulary 100000] [--repeats 3]
                             [--batch 100000] [--masters local[2],local[1]]
                             [--shapes key-groups,per-key] [--read-partitions N]
                             [--warm-up WORDS]

The input: W1's keys (``bench.common.zipf_keys``: Zipf(1.1) over a 100,000-word vocabulary,
numpy seed 42), one per line in a text file, which both runners read with the line-file
source (a Spark query would carry a collection in its options). The dataflow:
``read_text_file -> key_by(word) -> process(bench.w1.Count) -> CommittingFileSink`` (JSON
lines ``[word, n]``), from nothing to the last committed file, on fresh directories:

- embedded (the baseline): parallelism 1 (W1's), heap backend, checkpoints every second;
- on Spark, in a child process per master (a SparkContext's master is fixed): the JVM and
  session started once and timed apart, each repeat ``SparkRunner.run`` alone; the
  dataflow's parallelism is the master's cores (the shuffle partitions of its keyed query).
  The process function runs in one of two plan shapes (``--shapes``), their repeats
  interleaved: ``key-groups`` (the default shape: ``transformWithStateInPandas`` grouped by
  the dataflow's 128 key groups, one Python call and one state value per key group and
  micro-batch) and ``per-key`` (``SparkRunner(key_groups=False)``: ``transformWithState``
  grouped by key, each key's state read and written once per micro-batch).
  ``--read-partitions`` sets the Spark tasks that read each micro-batch (the runner reads a
  line file in one by default); ``--warm-up`` runs each shape once on a small input before
  the repeats, timed apart as part of the start-up (the session's first queries start its
  Python workers: 10-60 s here, paid once per session, not per query).

Every Spark run's committed output is compared with the embedded run's, line for line.
Beside wall-clock seconds, each run's CPU seconds (the process tree's, from ``/proc``: the
embedded process; Spark's driver, JVM and Python workers) are reported: on a shared
machine they vary much less than wall-clock time, and wall-clock time on ``local[2]`` is at
best half of them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .common import print_table, zipf_keys

ROOT = Path(__file__).resolve().parent.parent
SHAPE_NAMES = {"key-groups": "key groups (transformWithStateInPandas)",
               "per-key": "per key (transformWithState)"}


def build(data: Path, out: Path, parallelism: int) -> Any:
    """The W1 dataflow over the words of ``data`` into a committing file sink at ``out``."""
    from reactive import Dataflow
    from reactive.connectors.files import CommittingFileSink

    from .w1 import Count

    flow = Dataflow("w1-spark", parallelism=parallelism, max_parallelism=128)
    (flow.read_text_file(data, uid="words").key_by(lambda w: w).process(Count()).uid("count")
         .sink(CommittingFileSink(out, format="jsonl")).uid("sink"))
    return flow


def output_lines(directory: Path) -> list[str]:
    """The committed JSON lines of a run, sorted (embedded and Spark part files alike)."""
    from reactive.connectors.spark import list_part_files

    return sorted(line for p in list_part_files(directory)
                  for line in p.path.read_text(encoding="utf-8").splitlines())


def embedded_run(data: Path, work: Path) -> tuple[float, float]:
    """One embedded run; returns its seconds and CPU seconds."""
    from reactive import CheckpointConfig
    from reactive.backends.heap import HeapStateBackend

    shutil.rmtree(work, ignore_errors=True)
    started, cpu = time.perf_counter(), tree_cpu_seconds()
    asyncio.run(build(data, work / "out", 1).run(
        checkpoints=CheckpointConfig(interval=1.0, directory=work / "chk"),
        state_backend=HeapStateBackend()))
    return time.perf_counter() - started, tree_cpu_seconds() - cpu


def tree_cpu_seconds(root: int | None = None) -> float:
    """CPU seconds (user and system, with those of exited children it waited for) of the
    process ``root`` (this one by default) and every live process below it, from Linux's
    ``/proc``: for a Spark run, the driver, the JVM and its Python workers. CPU time
    depends much less on what other jobs on a shared machine do than wall-clock time."""
    return sum(tree_cpu_split(root).values())


def tree_cpu_split(root: int | None = None) -> dict[str, float]:
    """:func:`tree_cpu_seconds` split into ``jvm`` (the ``java`` processes' own CPU) and
    ``python`` (every other process's, and the exited children any process waited for:
    Spark's Python workers)."""
    ticks = os.sysconf("SC_CLK_TCK")
    own: dict[int, tuple[bool, int, int]] = {}
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        pid = int(name)
        java = stat[stat.index("(") + 1:stat.rindex(")")] == "java"
        # utime + stime, and cutime + cstime (children it waited for)
        own[pid] = (java, int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14]))
        children.setdefault(int(fields[1]), []).append(pid)
    out = {"jvm": 0, "python": 0}
    todo = [os.getpid() if root is None else root]
    while todo:
        pid = todo.pop()
        java, mine, reaped = own.get(pid, (False, 0, 0))
        out["jvm" if java else "python"] += mine
        out["python"] += reaped
        todo.extend(children.get(pid, []))
    return {k: v / ticks for k, v in out.items()}


def micro_batch_seconds(job: Any) -> list[dict[str, float]]:
    """Per micro-batch of the job's query, from Spark's progress reports: the micro-batch's
    seconds in all (``triggerExecution``), in its Spark job (``addBatch``: reading,
    the keyed operator, the file sink) and in planning it (``queryPlanning``)."""
    out = []
    for reports in job.progress().values():
        for p in reports:
            d = json.loads(p.json).get("durationMs", {})
            out.append({k: round(int(d.get(m, 0)) / 1000, 2) for k, m in
                        (("total", "triggerExecution"), ("job", "addBatch"),
                         ("planning", "queryPlanning"))})
        break  # every sink of W1 is one query
    return out


def spark_child(args: argparse.Namespace) -> None:
    """In a child process: start one session, run W1 ``--repeats`` times; print JSON."""
    from reactive.connectors.spark import SparkRunner, local_session

    cores = int(m.group(1)) if (m := re.fullmatch(r"local\[(\d+)\]", args.master)) else 2
    started = time.perf_counter()
    spark = local_session(args.master, app_name="bench-spark-w1")
    startup = time.perf_counter() - started
    work = Path(args.work)
    shapes = args.shapes.split(",")
    warm_up = 0.0
    if args.warm_up:  # the first query of a session starts its Python workers
        small = work / "warm-up.txt"
        small.write_text("".join(f"w{i % 97}\n" for i in range(args.warm_up)), encoding="utf-8")
        started = time.perf_counter()
        for shape in shapes:
            out = work / f"warm-up-{shape}"
            SparkRunner(spark, out / "chk", key_groups=shape == "key-groups",
                        read_partitions=args.read_partitions).run(build(small, out / "out", cores))
            shutil.rmtree(out, ignore_errors=True)
        warm_up = time.perf_counter() - started
    runs: dict[str, list[float]] = {s: [] for s in shapes}
    cpus: dict[str, list[float]] = {s: [] for s in shapes}
    equal = dict.fromkeys(shapes, True)
    summary: dict[str, Any] = {}
    for i in range(args.repeats):
        for shape in shapes:
            out = work / f"spark-{shape}-{i}"
            shutil.rmtree(out, ignore_errors=True)
            started, split = time.perf_counter(), tree_cpu_split()
            job = SparkRunner(spark, out / "chk", max_records_per_batch=args.batch,
                              key_groups=shape == "key-groups",
                              read_partitions=args.read_partitions).run(
                build(Path(args.data), out / "out", cores))
            runs[shape].append(time.perf_counter() - started)
            after = tree_cpu_split()
            cpus[shape].append(sum(after.values()) - sum(split.values()))
            summary[shape] = next(iter(job.summary().values()), {})
            summary[shape]["durations"] = micro_batch_seconds(job)
            summary[shape]["cpu_split"] = {k: round(after[k] - split[k], 1) for k in after}
            if i == 0:
                equal[shape] = (output_lines(out / "out")
                                == output_lines(Path(args.embedded) / "out"))
            shutil.rmtree(out, ignore_errors=True)
    print(json.dumps({"startup": startup, "warm_up": warm_up, "runs": runs, "cpus": cpus, "equal": equal,
                      "summary": summary}))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=300_000)
    p.add_argument("--vocabulary", type=int, default=100_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch", type=int, default=100_000, help="records per micro-batch")
    p.add_argument("--masters", default="local[2],local[1]")
    p.add_argument("--shapes", default="key-groups,per-key",
                   help="plan shapes of the keyed function: key-groups, per-key")
    p.add_argument("--read-partitions", type=int, default=None,
                   help="Spark tasks reading each micro-batch (SparkRunner's read_partitions)")
    p.add_argument("--warm-up", type=int, default=0, metavar="WORDS",
                   help="before the timed repeats, run each shape once on this many words "
                        "(the session's first queries start its Python workers), timed apart")
    p.add_argument("--spark-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--master", default="local[2]", help=argparse.SUPPRESS)
    p.add_argument("--data", default=None, help=argparse.SUPPRESS)
    p.add_argument("--work", default=None, help=argparse.SUPPRESS)
    p.add_argument("--embedded", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.spark_child:
        spark_child(args)
        return
    work = Path(tempfile.mkdtemp(prefix="bench-spark-w1-"))
    try:
        data = work / "words.txt"
        data.write_text("".join(w + "\n" for w in zipf_keys(args.records, args.vocabulary)),
                        encoding="utf-8")
        table: list[list[Any]] = []
        durations: dict[str, list[dict[str, float]]] = {}
        splits: dict[str, dict[str, float]] = {}

        def row(name: str, seconds: list[float], cpus: list[float], base: float | None,
                base_cpu: float | None, extra: str = "") -> None:
            med, cpu = statistics.median(seconds), statistics.median(cpus)
            n = args.records
            table.append([name, f"{min(seconds):.1f} / {med:.1f} / {max(seconds):.1f}",
                          f"{n / max(seconds):,.0f} / {n / med:,.0f} / {n / min(seconds):,.0f}",
                          "1.000" if base is None else f"{base / med:.3f}",
                          f"{cpu:.1f} ({n / cpu:,.0f})",
                          "1.000" if base_cpu is None else f"{base_cpu / cpu:.3f}", extra])

        embedded = [embedded_run(data, work / "embedded") for _ in range(args.repeats)]
        base = statistics.median(e[0] for e in embedded)
        base_cpu = statistics.median(e[1] for e in embedded)
        row("embedded (p=1, heap, checkpoints every 1 s)", [e[0] for e in embedded],
            [e[1] for e in embedded], None, None)
        for master in args.masters.split(","):
            cmd = [sys.executable, "-m", "bench.spark_w1", "--spark-child", "--master", master,
                   "--data", str(data), "--repeats", str(args.repeats), "--batch",
                   str(args.batch), "--work", str(work), "--embedded",
                   str(work / "embedded"), "--shapes", args.shapes,
                   *(["--read-partitions", str(args.read_partitions)]
                     if args.read_partitions else []),
                   *(["--warm-up", str(args.warm_up)] if args.warm_up else [])]
            done = subprocess.run(cmd, cwd=ROOT, check=False, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"the Spark run on {master} failed:\n{done.stderr[-4000:]}")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            for shape in args.shapes.split(","):
                q = result["summary"].get(shape, {})
                row(f"Spark {master}, {SHAPE_NAMES.get(shape, shape)}", result["runs"][shape],
                    result["cpus"][shape], base, base_cpu, f"start-up {result['startup']:.1f} s"
                    + (f", warm-up {result['warm_up']:.1f} s" if args.warm_up else "")
                    + f"; equal: "
                    f"{result['equal'][shape]}; {q.get('micro_batches', '?')} micro-batches, "
                    f"state {q.get('state_rows', '?')} rows")
                durations[f"{master} {shape}"] = q.get("durations", [])
                splits[f"{master} {shape}"] = q.get("cpu_split", {})
        print(f"W1 into a committing file sink, {args.records:,} Zipf(1.1) words over "
              f"{args.vocabulary:,}, {args.repeats} repeats, micro-batches of "
              f"{args.batch:,}; machine shared with other jobs")
        print_table(["run", "seconds min / median / max", "records/s min / median / max",
                     "vs embedded (median)", "CPU s median (records per CPU s)",
                     "vs embedded (CPU)", "notes"], table)
        print(f"load average {' / '.join(f'{x:.1f}' for x in os.getloadavg())} (1 / 5 / 15 min)")
        for name, batches in durations.items():
            print(f"{name}, last repeat, per micro-batch (s): " + "; ".join(
                f"{d['total']} (job {d['job']}, planning {d['planning']})" for d in batches)
                + "; CPU s: " + ", ".join(f"{k} {v}" for k, v in splits.get(name, {}).items()))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
