"""Records through a loop: label propagation (connected components) on a generated graph,
as a pipeline with ``Stream.iterate`` against a plain Python worklist loop, and the size of
the back-edge log per checkpoint against the checkpoint's whole state.

    python -m bench.iterate [--vertices 200000] [--edges 1000000] [--parallelism 1,2]
                            [--interval 1.0] [--rounds 1]

The graph: ``--vertices`` vertices in 20 components, each a random tree, plus random edges
within components up to ``--edges`` edges (numpy seed 42). Both runs compute the same
labels (the smallest vertex of each component) with the same per-vertex steps: a vertex
keeps its smallest label and, when it learns a smaller one, sends it to its neighbours.

- plain loop: a dict of labels, a dict of neighbour lists and a deque of proposals: the
  baseline (1.00);
- pipeline: ``from_collection -> iterate(key_by(vertex) -> process(SmallestLabel))`` on
  the heap backend, checkpoints every ``--interval`` s (aligned, exactly once; the loop's
  head logs its back edge), at each ``--parallelism`` (one event loop).

Loop steps/s is the number of records processed by the step's keyed function (input
records + feedback records) over the wall time; the count depends on the order proposals
arrive in (a label that is soon beaten still travels), so the table gives each run's own
count and also the ratio of wall times. For each
checkpoint of the pipeline the table gives the back-edge log (records and bytes, pickled)
beside the checkpoint's whole size (``CheckpointStats.size``). Both runs' labels are
checked against each other.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import pickle
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import ALL_CHECKPOINTS
from reactive import CheckpointConfig, CheckpointStorage, Dataflow
from reactive.connectors.collections import ListSink

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.pipelines.components_job import SmallestLabel


def generate(vertices: int, edges: int, components: int = 20) -> list[tuple[int, int]]:
    rng = np.random.default_rng(42)
    part = rng.integers(0, components, vertices)
    members = [np.flatnonzero(part == c) for c in range(components)]
    out: list[tuple[int, int]] = []
    for m in members:
        m = rng.permutation(m)
        for i in range(1, len(m)):
            out.append((int(m[i]), int(m[rng.integers(0, i)])))
    while len(out) < edges:
        c = int(rng.integers(0, components))
        if len(members[c]) > 1:
            a, b = rng.choice(members[c], 2)
            out.append((int(a), int(b)))
    return out


def loop_input(edges: list[tuple[int, int]]) -> list[tuple[str, int, int]]:
    records: list[tuple[str, int, int]] = []
    vertices: set[int] = set()
    for u, v in edges:
        records += [("edge", u, v), ("edge", v, u)]
        vertices.update((u, v))
    return records + [("label", v, v) for v in sorted(vertices)]


def plain_loop(records: list[tuple[str, int, int]]) -> tuple[dict[int, int], int, float]:
    """Labels, steps and seconds of the same propagation in a worklist loop."""
    t0 = time.perf_counter()
    labels: dict[int, int] = {}
    neighbours: dict[int, list[int]] = collections.defaultdict(list)
    work = collections.deque(records)
    steps = 0
    while work:
        kind, vertex, value = work.popleft()
        steps += 1
        label = labels.get(vertex)
        if kind == "edge":
            neighbours[vertex].append(value)
            if label is not None:
                work.append(("label", value, label))
        elif label is None or value < label:
            labels[vertex] = value
            for n in neighbours[vertex]:
                work.append(("label", n, value))
    return labels, steps, time.perf_counter() - t0


class CountingLabel(SmallestLabel):
    steps = 0

    def process_element(self, record: Any, ctx: Any) -> Any:
        CountingLabel.steps += 1
        return super().process_element(record, ctx)


async def pipeline(records: list[Any], parallelism: int, interval: float
                   ) -> tuple[dict[int, int], int, float, list[dict[str, Any]]]:
    CountingLabel.steps = 0
    sink = ListSink()
    flow = Dataflow("iterate-bench", parallelism=parallelism)

    def step(proposals: Any) -> tuple[Any, Any]:
        labelled = proposals.key_by(lambda r: r[1]).process(CountingLabel()).uid("labels")
        return (labelled.filter(lambda r: r[0] == "feedback").map(lambda r: ("label", *r[1:])),
                labelled.filter(lambda r: r[0] == "update").map(lambda r: (r[1], r[2])))

    flow.from_collection(records, uid="graph").iterate(step, uid="propagate").sink(sink)
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        job = await flow.run(checkpoints=CheckpointConfig(
            history=ALL_CHECKPOINTS, interval=interval, directory=d, retained=10_000))
        seconds = time.perf_counter() - t0
        stats = {s.checkpoint_id: s for s in job.metrics.checkpoints if s.status == "completed"}
        rows = []
        for chk in CheckpointStorage(d, "iterate-bench").completed():
            log: list[Any] = []
            for sub in chk.metadata.operators["propagate"].subtasks.values():
                handle = sub.operator_state
                if handle is not None:
                    states = pickle.loads((chk.job_dir / handle.files[0].path).read_bytes())
                    log += states.get("back-edge-log", ("split", []))[1]
            s = stats.get(chk.checkpoint_id)
            rows.append({"id": chk.checkpoint_id, "log_records": len(log),
                         "log_bytes": len(pickle.dumps(log)),
                         "size": s.size if s is not None else 0})
    labels: dict[int, int] = {}
    for v, label in sink.records:
        labels[v] = min(label, labels.get(v, label))
    return labels, CountingLabel.steps, seconds, rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vertices", type=int, default=200_000)
    p.add_argument("--edges", type=int, default=1_000_000)
    p.add_argument("--parallelism", default="1,2")
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=1)
    args = p.parse_args(argv)
    records = loop_input(generate(args.vertices, args.edges))
    print(f"{args.vertices:,} vertices, {args.edges:,} edges: {len(records):,} input records")
    base: list[float] = []
    base_walls: list[float] = []
    walls: dict[int, list[float]] = collections.defaultdict(list)
    step_counts: dict[int, int] = {}
    runs: dict[int, list[float]] = collections.defaultdict(list)
    logs: dict[int, list[dict[str, Any]]] = {}
    for _ in range(args.rounds):
        labels, steps, seconds = plain_loop(records)
        base.append(steps / seconds)
        base_walls.append(seconds)
        for par in (int(x) for x in args.parallelism.split(",")):
            got, p_steps, p_seconds, rows = asyncio.run(pipeline(records, par, args.interval))
            if got != labels:
                print(f"MISMATCH at parallelism {par}: the labels differ")
                return 1
            runs[par].append(p_steps / p_seconds)
            walls[par].append(p_seconds)
            step_counts[par] = p_steps
            logs[par] = rows
    b, bw = statistics.median(base), statistics.median(base_walls)
    print("\n| run | loop steps | loop steps/s (median) | ratio | wall s | wall ratio |")
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| plain Python worklist loop | {steps:,} | {b:,.0f} | 1.00 | {bw:.2f} | 1.00 |")
    for par, rates in runs.items():
        r, w = statistics.median(rates), statistics.median(walls[par])
        print(f"| pipeline, iterate, p={par}, checkpoints every {args.interval:g} s | "
              f"{step_counts[par]:,} | {r:,.0f} | {r / b:.2f} | {w:.2f} | {bw / w:.2f} |")
    for par, rows in logs.items():
        print(f"\nback-edge log per checkpoint, p={par}:")
        print("| checkpoint | log records | log bytes | checkpoint bytes | log share |")
        print("|---:|---:|---:|---:|---:|")
        for row in rows:
            share = row["log_bytes"] / row["size"] if row["size"] else 0.0
            print(f"| {row['id']} | {row['log_records']:,} | {row['log_bytes']:,} | "
                  f"{row['size']:,} | {share:.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
