"""Connected components by label propagation in a loop (``Stream.iterate``), for the
iteration tests: run in-process with :func:`build`, or as a process that the tests kill
(``python components_job.py OUT CHECKPOINTS PARALLELISM INTERVAL SEED VERTICES KILL_AT``:
the process kills itself with SIGKILL at its KILL_AT-th loop step, 0 for never), resuming from its
latest checkpoint, with its label updates in a committing file sink (exactly once)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from reactive import (
    CheckpointConfig,
    Dataflow,
    KeyedProcessFunction,
    ListStateDescriptor,
    RestartStrategy,
    Sink,
    ValueStateDescriptor,
)
from reactive.testing import TestingSource


def random_graph(seed: int, vertices: int = 600, components: int = 7,
                 extra_edges: int = 900) -> list[tuple[int, int]]:
    """A graph of ``components`` connected parts (each a random tree plus extra edges)."""
    rnd = random.Random(seed)
    ids = list(range(vertices))
    rnd.shuffle(ids)
    parts = [ids[i::components] for i in range(components)]
    edges = []
    for part in parts:
        for i in range(1, len(part)):
            edges.append((part[i], part[rnd.randrange(i)]))
    for _ in range(extra_edges):
        part = rnd.choice(parts)
        edges.append((rnd.choice(part), rnd.choice(part)))
    rnd.shuffle(edges)
    return edges


def loop_input(edges: Iterable[tuple[int, int]]) -> list[tuple[str, int, int]]:
    """The loop's input: each edge in both directions, then every vertex proposing itself."""
    records: list[tuple[str, int, int]] = []
    vertices: set[int] = set()
    for u, v in edges:
        records += [("edge", u, v), ("edge", v, u)]
        vertices |= {u, v}
    records += [("label", v, v) for v in sorted(vertices)]
    return records


class SmallestLabel(KeyedProcessFunction):
    """Keeps a vertex's smallest label and its neighbours; a smaller label goes to every
    neighbour (feedback) and out of the loop (an update)."""

    def open(self, ctx: Any) -> None:
        self.label = ctx.get_state(ValueStateDescriptor("label"))
        self.neighbours = ctx.get_state(ListStateDescriptor("neighbours"))

    def process_element(self, record: tuple[str, int, int], ctx: Any) -> Iterable[Any]:
        kind, vertex, value = record
        label = self.label.value()
        if kind == "edge":
            self.neighbours.add(value)
            if label is not None:
                yield ("feedback", value, label)
        elif label is None or value < label:
            self.label.update(value)
            yield ("update", vertex, value)
            for n in self.neighbours.get():
                yield ("feedback", n, value)


class KillAtStep(SmallestLabel):
    """:class:`SmallestLabel` that SIGKILLs its own process at the process's ``kill_at``-th
    loop step (counted over all instances): a crash at a seeded point of the computation,
    whatever the machine's speed."""

    kill_at = 0
    steps = 0

    def process_element(self, record: tuple[str, int, int], ctx: Any) -> Iterable[Any]:
        KillAtStep.steps += 1
        if KillAtStep.steps == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().process_element(record, ctx)


def build(edges: list[tuple[int, int]], sink: Sink, parallelism: int = 2,
          channel_capacity: int = 8, batch_size: int = 64,
          labels: KeyedProcessFunction | None = None) -> Dataflow:
    """The dataflow: input -> loop(key by vertex -> SmallestLabel) -> label updates."""
    flow = Dataflow("components", parallelism=parallelism, batch_size=batch_size,
                    channel_capacity=channel_capacity)

    def step(records: Any) -> tuple[Any, Any]:
        labelled = (records.key_by(lambda r: r[1])
                    .process(labels or SmallestLabel()).uid("labels"))
        feedback = labelled.filter(lambda r: r[0] == "feedback").map(
            lambda r: ("label", r[1], r[2]))
        updates = labelled.filter(lambda r: r[0] == "update").map(lambda r: [r[1], r[2]])
        return feedback, updates

    (flow.source(TestingSource(loop_input(edges)), uid="graph")
         .iterate(step, uid="propagate")
         .sink(sink).uid("updates"))
    return flow


def kill_test_graph(seed: int, vertices: int) -> list[tuple[int, int]]:
    """The graph of the kill -9 runs (large enough that a run lasts a few seconds)."""
    return random_graph(seed, vertices=vertices, components=11, extra_edges=vertices)


async def _main(out: Path, checkpoints: Path, parallelism: int, interval: float,
                seed: int, vertices: int, kill_at: int) -> None:
    from reactive.connectors.files import CommittingFileSink

    KillAtStep.kill_at = kill_at
    flow = build(kill_test_graph(seed, vertices), CommittingFileSink(out), parallelism,
                 labels=KillAtStep())
    await flow.run(checkpoints=CheckpointConfig(interval=interval, directory=checkpoints),
                   resume=True, restart=RestartStrategy.fixed(0, 0.0))


if __name__ == "__main__":
    asyncio.run(_main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]),
                      float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]),
                      int(sys.argv[7])))
