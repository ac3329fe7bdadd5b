"""The dependency rules of the code base, checked from its imports (``ast``, every import:
module level, inside functions, and under ``TYPE_CHECKING``).

- No import circle between modules of the runtime, the backends and the connectors: two
  modules that import each other cannot be understood (or changed) apart.
- The runtime (``reactive`` without its ``backends`` and ``connectors``, which live in the
  repository's top-level folders of those names) never imports ``reactive.backends`` or
  ``reactive.connectors``: the defaults that need them name them (``reactive.defaults``
  loads them by name when first used), so importing ``reactive`` never imports them.
- A backend never imports another backend (cross-backend restore goes through the neutral
  key-group stream format in ``reactive.state``); backends never import reactive.connectors.
- The time layer (timers, mailbox, watermarks) does not reach up into the task.
- Packages are layered: each package of ``reactive`` (and each top-level module, the
  backends and connectors, and the runtime's operator library) imports only lower layers
  (``LAYERS``), so no two packages import each other. Where a lower package needs a higher
  one's object it names a protocol of its own (the checkpoint coordinator drives
  ``reactive.checkpoint.checkpointable_task.CheckpointableTask``, which the runtime's tasks
  implement; state time-to-live reads a ``TtlTimeProvider``); ``UPWARD`` would list an
  exception with its reason, and is empty.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# folder -> the package it installs as (pyproject.toml's package-dir)
PACKAGES = {"reactive": "reactive", "backends": "reactive.backends",
            "connectors": "reactive.connectors"}


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for folder, package in PACKAGES.items():
        for f in (ROOT / folder).rglob("*.py"):
            name = ".".join((package, *f.relative_to(ROOT / folder).with_suffix("").parts))
            mods[name.removesuffix(".__init__")] = f
    return mods


def _room(module: str) -> str:
    """``runtime``, ``backends`` or ``connectors``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ("backends", "connectors") else "runtime"


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[str, bool]]:
    """``(imported module, at module level)`` for every import of the module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    top_level = {id(node) for node in tree.body}
    for node in tree.body:  # TYPE_CHECKING and try blocks at module level run on import
        if isinstance(node, ast.If | ast.Try):
            top_level |= {id(n) for n in ast.walk(node)}
    out = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for t in targets:
            while t and t not in MODULES:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.append((t, id(node) in top_level))
    return out


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _cycles() -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    edges = {m: {t for t, _ in deps} for m, deps in GRAPH.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    assert _cycles() == []


def test_the_runtime_does_not_import_backends_or_connectors():
    bad = [f"{name} -> {target}" for name, deps in GRAPH.items() if _room(name) == "runtime"
           for target, _ in deps if _room(target) != "runtime"]
    assert bad == []


@pytest.mark.e2e
def test_importing_reactive_imports_no_backend_or_connector():
    import subprocess
    import sys
    code = ("import sys, reactive, reactive.spi; "
            "print(sorted(m for m in sys.modules if m.startswith(('reactive.backends', "
            "'reactive.connectors'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


@pytest.mark.e2e
@pytest.mark.parametrize("module", ["reactive", "reactive.backends.rocksdb",
                                    "reactive.connectors.files", "reactive.columnar"])
def test_importing_the_record_path_imports_no_pandas(module: str) -> None:
    """pandas costs ~0.3 CPU s to import, in every process that runs a job (a restarted
    job's too); only a user's own code or a conversion to pandas may need it."""
    import subprocess
    import sys
    code = f"import sys, {module}; print('pandas' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"


def test_backends_are_independent_of_each_other_and_of_connectors():
    bad = []
    for name, deps in GRAPH.items():
        if _room(name) != "backends" or name == "reactive.backends":
            continue  # the package itself registers every backend's reader
        own = name.split(".")[2:3]
        for target, _ in deps:
            if _room(target) == "connectors" or (
                    _room(target) == "backends" and target.split(".")[2:3] not in ([], own)):
                bad.append(f"{name} -> {target}")
    assert bad == []


def test_the_time_layer_does_not_reach_into_the_task():
    bad = [f"{name} -> {target}" for name, deps in GRAPH.items()
           if name.startswith("reactive.time") for target, _ in deps
           if target.startswith("reactive.runtime.task")]
    assert bad == []


# ---------------------------------------------------------------- the layer rule
# The units of the layer rule: each package of ``reactive`` (``reactive.checkpoint``), each
# top-level module (``reactive.graph``), the backends and connectors, and the subpackages of
# SUBPACKAGE_UNITS. A unit imports only units of lower layers (UPWARD would list an import
# against the layers with its reason; there is none).
#
# The operator library is a unit of its own, below the rest of the runtime (Flink keeps
# ``streaming.api.operators`` apart from ``streaming.runtime.tasks`` too): operators never
# import tasks, channels or the job, and the logical graph, whose factories make operators,
# sits between the two.
SUBPACKAGE_UNITS = {"reactive.runtime.operators"}

LAYERS: list[set[str]] = [
    # errors, value serializers, the sink protocol, awaiting sync-or-async hooks
    {"reactive.errors", "reactive.serialization", "reactive.sinks", "reactive.awaiting"},
    # the source protocol, optional imports, the canonical key bytes, two-phase-commit sinks
    {"reactive.sources", "reactive.extras", "reactive.key_encoding",
     "reactive.two_phase_commit"},
    {"reactive.keygroups"},
    # keyed and operator state
    {"reactive.state"},
    # event time (clocks, watermarks, timers kept as keyed state), run options, the
    # defaults named by string
    {"reactive.time", "reactive.config", "reactive.defaults"},
    # checkpoints (storage, metadata, lineage, the barrier, the coordinator and the task
    # protocol it drives), user function interfaces
    {"reactive.checkpoint", "reactive.functions"},
    {"reactive.two_input_functions", "reactive.spi"},
    # the operators (timers, state, sources and sinks wrapped for a task)
    {"reactive.runtime.operators"},
    # the logical graph the runtime expands (its factories make operators)
    {"reactive.graph"},
    # tasks, channels, the execution graph, the job (its results and state queries)
    {"reactive.runtime"},
    # what is built on the runtime: embedding, windows, metrics, two-input streams
    {"reactive.embedding", "reactive.windowing", "reactive.metrics_exporter",
     "reactive.connected_streams"},
    # columnar execution (its windows use windowing's assigners), joins, the test toolkit
    {"reactive.columnar", "reactive.joined_streams", "reactive.testing"},
    # the streams of the fluent API (their methods reach the libraries above)
    {"reactive.stream"},
    # the backends (they register the columnar state's reader), the fluent API
    {"reactive.backends", "reactive.dataflow"},
    # the entry points and the connectors
    {"reactive", "reactive.cli", "reactive.connectors"},
    {"reactive.__main__"},
]
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}

# (importing module or package, imported module or package, why): imports against the
# layers, each one a cycle between two units. None is left: a new one needs its reason
# here, and one no module needs any more fails test_every_allowed_upward_import_is_used.
UPWARD: list[tuple[str, str, str]] = []


def _unit(module: str) -> str:
    """The unit of the layer rule that ``module`` belongs to."""
    for sub in SUBPACKAGE_UNITS:
        if module == sub or module.startswith(sub + "."):
            return sub
    parts = module.split(".")
    return ".".join(parts[:2])


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _upward(name: str, target: str) -> bool:
    return any(_within(name, a) and _within(target, b) for a, b, _ in UPWARD)


def test_every_package_has_a_layer():
    assert sorted({_unit(name) for name in MODULES} - set(RANK)) == []


def test_packages_import_only_lower_layers():
    bad = [f"{name} -> {target}" for name, deps in GRAPH.items() for target, _ in deps
           if _unit(target) != _unit(name) and RANK[_unit(target)] >= RANK[_unit(name)]
           and not _upward(name, target)]
    assert bad == []


def test_every_allowed_upward_import_is_used():
    """An exception no module needs any more goes (the layering got better)."""
    used = {(a, b) for a, b, _ in UPWARD for name, deps in GRAPH.items()
            for target, _ in deps if _within(name, a) and _within(target, b)}
    assert sorted({(a, b) for a, b, _ in UPWARD} - used) == []


def test_the_module_map_lists_every_module():
    """ARCHITECTURE.md's "Modules, one job each" names every module of the three folders,
    and nothing that is gone."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    block = text.split("## Modules, one job each")[1].split("```text\n")[1].split("```")[0]
    listed = {line.split()[0] for line in block.splitlines() if line.strip()}
    actual = {str(path.relative_to(ROOT)) for path in MODULES.values()}
    assert sorted(actual - listed) == [] and sorted(listed - actual) == []


def test_one_logger_per_module():
    """Every module that logs uses ``logging.getLogger(__name__)``, so a user tunes the
    log level of one module (``reactive.checkpoint.coordinator``) or of a whole room
    (``reactive.checkpoint``)."""
    bad = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "getLogger"
                    and not (len(node.args) == 1 and isinstance(node.args[0], ast.Name)
                             and node.args[0].id == "__name__")):
                bad.append(name)
    assert bad == []
