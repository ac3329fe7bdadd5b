"""Shared benchmark pieces: workloads, peak RSS, table printing."""

from __future__ import annotations

import importlib
import resource
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from reactive import KeyedProcessFunction, ValueStateDescriptor

__all__ = ["peak_rss_mb", "print_table", "zipf_keys"]


#: ``CheckpointConfig(history=...)`` for a benchmark that reads the statistics of every
#: checkpoint of its run (a job keeps the last 10 by default)
ALL_CHECKPOINTS = 1_000_000


def zipf_keys(n: int, vocabulary: int, exponent: float = 1.1, seed: int = 42) -> list[str]:
    """``n`` words drawn from a ``vocabulary``-word list with Zipf(exponent) frequencies
    (numpy ``default_rng(seed)``): the W1 workload's input."""
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, vocabulary + 1, dtype=np.float64)
    p = ranks ** -exponent
    p /= p.sum()
    idx = rng.choice(vocabulary, size=n, p=p)
    words = [f"w{i}" for i in range(vocabulary)]
    return [words[i] for i in idx.tolist()]


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB."""
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024 if sys.platform != "darwin" else kb / 2**20


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Print and return a Markdown table."""
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:,.2f}" if abs(v) < 100 else f"{v:,.0f}"
        if isinstance(v, int):
            return f"{v:,}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    text = "\n".join(lines)
    print(text)
    return text


REPO = Path(__file__).resolve().parents[1]


def package_at_revision(folder: str, revision: str, name: str, into: Path) -> ModuleType:
    """Import the Python files of ``folder`` (e.g. ``backends/heap``) at git ``revision`` as a
    package ``name`` under ``into``: a baseline to measure in the same process as the
    working tree.

    Raises:
        subprocess.CalledProcessError: if git does not know ``revision`` or ``folder``.
    """
    pkg = into / name
    pkg.mkdir(parents=True, exist_ok=True)
    files = subprocess.run(["git", "ls-tree", "--name-only", revision, f"{folder}/"],
                           cwd=REPO, check=True, capture_output=True, text=True).stdout.split()
    for path in files:
        if path.endswith(".py"):
            text = subprocess.run(["git", "show", f"{revision}:{path}"], cwd=REPO, check=True,
                                  capture_output=True, text=True).stdout
            (pkg / Path(path).name).write_text(text)
    if str(into) not in sys.path:
        sys.path.insert(0, str(into))
    return importlib.import_module(name)


class SilentCount(KeyedProcessFunction):
    """Keyed count that emits nothing: state benchmarks measure state, not output."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def process_element(self, value: Any, ctx: Any) -> None:
        self.count.update(self.count.value() + 1)
