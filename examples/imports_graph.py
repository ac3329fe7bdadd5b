"""The import graph of this machine's Python standard library, computed in loops.

    python examples/imports_graph.py [--parallelism N] [--interval S] [--fail-at N]
                                     [--output DIR] [--checkpoint-dir DIR]

Data: every module of the installed standard library (its ``.py`` files, test packages
left out) is a vertex; an ``import`` statement found with the ``ast`` module is an edge from
the importing module to the imported one (real data every machine has). Two loops
(``Stream.iterate``) run in one dataflow, each with keyed state, and checkpoint exactly once
(the loop heads log the records coming back around while a barrier travels the loop):

- connected components of the undirected graph by label propagation: a module keeps the
  smallest module name it has heard of and tells its neighbours when it learns a smaller
  one;
- per module, the number of modules it pulls in transitively: a module keeps the set it
  reaches and sends what it newly learns to the modules that import it.

Both results go to committing file sinks and are checked against networkx on the same
graph. ``--fail-at N`` fails the job once at its N-th loop step to watch it restore a
checkpoint (and the records its loops held) and still end with the exact result.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import collections
import json
import shutil
import sys
import sysconfig
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from reactive import (
    CheckpointConfig,
    Dataflow,
    KeyedProcessFunction,
    ListStateDescriptor,
    RestartStrategy,
    ValueStateDescriptor,
)
from reactive.connectors.files import CommittingFileSink

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- the graph
def stdlib_modules(stdlib: Path) -> dict[str, Path]:
    """Module name -> source file of the standard library under ``stdlib``."""
    modules: dict[str, Path] = {}
    for path in sorted(stdlib.rglob("*.py")):
        rel = path.relative_to(stdlib)
        parts = list(rel.with_suffix("").parts)
        if parts[0] in ("site-packages", "dist-packages", "test", "idlelib") or any(
                p in ("test", "tests") or "-" in p for p in parts):
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts:
            modules[".".join(parts)] = path
    return modules


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is a module of the graph."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def import_edges(modules: dict[str, Path]) -> list[tuple[str, str]]:
    """``(importer, imported)`` for every import between two modules of the graph."""
    edges: set[tuple[str, str]] = set()
    for name, path in modules.items():
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except (SyntaxError, ValueError):
            continue  # a file of the wrong Python version (lib2to3 fixtures ...)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - node.level + 1] if node.level > 1 else anchor
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{a.name}" for a in node.names] + [base]
            for target in targets:
                found = _resolve(target, modules)
                if found is not None and found != name:
                    edges.add((name, found))
    return sorted(edges)


# ---------------------------------------------------------------- the loops
class FailOnce:
    """Fails the job once, at the ``n``-th loop step of this process (injected)."""

    steps = 0
    n: int | None = None

    @classmethod
    def tick(cls) -> None:
        cls.steps += 1
        if cls.steps == cls.n:
            raise RuntimeError(f"injected failure at loop step {cls.n}")


class SmallestName(KeyedProcessFunction):
    """Label propagation: ``("edge", m, neighbour)`` or ``("label", m, name)`` records."""

    def open(self, ctx: Any) -> None:
        self.label = ctx.get_state(ValueStateDescriptor("label"))
        self.neighbours = ctx.get_state(ListStateDescriptor("neighbours"))

    def process_element(self, record: tuple[str, str, str], ctx: Any) -> Iterator[Any]:
        FailOnce.tick()
        kind, module, value = record
        label = self.label.value()
        if kind == "edge":
            self.neighbours.add(value)
            if label is not None:
                yield ("again", value, label)
        elif label is None or value < label:
            self.label.update(value)
            yield ("out", module, value)
            for n in self.neighbours.get():
                yield ("again", n, value)


class Reach(KeyedProcessFunction):
    """Transitive imports: ``("imported_by", m, importer)`` tells ``m`` who imports it;
    ``("reach", m, modules)`` tells ``m`` modules it reaches."""

    def open(self, ctx: Any) -> None:
        self.reach = ctx.get_state(ValueStateDescriptor("reach", default=frozenset()))
        self.importers = ctx.get_state(ListStateDescriptor("importers"))

    def process_element(self, record: tuple[str, str, Any], ctx: Any) -> Iterator[Any]:
        FailOnce.tick()
        kind, module, value = record
        reach = self.reach.value()
        if kind == "imported_by":
            self.importers.add(value)
            yield ("again", value, tuple(sorted(reach | {module})))
            return
        new = frozenset(value) - reach - {module}
        if new:
            reach = reach | new
            self.reach.update(reach)
            yield ("out", module, len(reach))
            for importer in self.importers.get():
                yield ("again", importer, tuple(sorted(new)))


def _loop(fn: KeyedProcessFunction, uid: str, again_kind: str) -> Any:
    def step(records: Any) -> tuple[Any, Any]:
        stepped = records.key_by(lambda r: r[1]).process(fn).uid(uid)
        feedback = stepped.filter(lambda r: r[0] == "again").map(
            lambda r: (again_kind, r[1], r[2]))
        return feedback, stepped.filter(lambda r: r[0] == "out").map(lambda r: [r[1], r[2]])

    return step


def label_input(edges: Iterable[tuple[str, str]], modules: Iterable[str]) -> list[Any]:
    records: list[Any] = []
    for a, b in edges:
        records += [("edge", a, b), ("edge", b, a)]
    return records + [("label", m, m) for m in sorted(modules)]


def reach_input(edges: Iterable[tuple[str, str]]) -> list[Any]:
    return [("imported_by", imported, importer) for importer, imported in edges]


def build_flow(edges: list[tuple[str, str]], modules: list[str], output: Path,
               parallelism: int) -> Dataflow:
    """Two loops over the import graph, each into its committing file sink."""
    flow = Dataflow("imports-graph", parallelism=parallelism, batch_size=256)
    (flow.from_collection(label_input(edges, modules), name="undirected", uid="undirected")
        .iterate(_loop(SmallestName(), "labels", "label"), name="propagate", uid="propagate")
        .sink(CommittingFileSink(output / "components"), name="components"))
    (flow.from_collection(reach_input(edges), name="imports", uid="imports")
        .iterate(_loop(Reach(), "reach", "reach"), name="closure", uid="closure")
        .sink(CommittingFileSink(output / "reach"), name="reach"))
    return flow


def _committed(directory: Path) -> Iterator[list[Any]]:
    for part in sorted(directory.glob("part-*.jsonl")):
        with open(part, encoding="utf-8") as f:
            yield from (json.loads(line) for line in f)


async def run(args: argparse.Namespace) -> int:
    import networkx as nx

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    modules = stdlib_modules(stdlib)
    edges = import_edges(modules)
    print(f"{len(modules):,} modules and {len(edges):,} imports in {stdlib}")
    output, checkpoints = Path(args.output), Path(args.checkpoint_dir)
    shutil.rmtree(output, ignore_errors=True)
    shutil.rmtree(checkpoints / "imports-graph", ignore_errors=True)
    FailOnce.n = args.fail_at
    flow = build_flow(edges, sorted(modules), output, args.parallelism)
    job = await flow.run(checkpoints=CheckpointConfig(interval=args.interval,
                                                      directory=checkpoints),
                         restart=RestartStrategy.fixed(3, 0.0))
    labels: dict[str, str] = {}
    for module, label in _committed(output / "components"):
        labels[module] = min(label, labels.get(module, label))
    reach: dict[str, int] = collections.Counter()
    for module, count in _committed(output / "reach"):
        reach[module] = max(count, reach.get(module, 0))
    # networkx on the same graph; modules without imports are their own component
    graph = nx.DiGraph(edges)
    graph.add_nodes_from(modules)
    expected_labels = {m: min(c) for c in nx.connected_components(graph.to_undirected())
                       for m in c}
    expected_reach = {m: n for m in graph if (n := len(nx.descendants(graph, m) - {m}))}
    components = collections.Counter(labels.values())
    print(f"restarts: {job.metrics.restarts}; {len(components):,} components, the largest "
          f"with {max(components.values()):,} modules")
    print("modules that pull in the most others:")
    for module, n in sorted(reach.items(), key=lambda kv: (-kv[1], kv[0]))[:8]:
        print(f"  {module:30} {n:5,}")
    if labels != expected_labels or dict(reach) != expected_reach:
        print(f"NOT VALIDATED: components equal: {labels == expected_labels}, transitive "
              f"imports equal: {dict(reach) == expected_reach}")
        return 1
    print("validated against networkx: components and transitive imports equal")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="The stdlib import graph (see the docstring).")
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--interval", type=float, default=0.2, help="checkpoint interval, seconds")
    p.add_argument("--fail-at", type=int, default=None,
                   help="fail once at the N-th loop step (then restore and go on)")
    p.add_argument("--output", default=str(ROOT / "out" / "imports-graph"))
    p.add_argument("--checkpoint-dir", default=str(ROOT / "chk"))
    return asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
