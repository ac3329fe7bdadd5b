"""Shared benchmark pieces: workloads, peak RSS, table printing."""

from __future__ import annotations

import resource
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["peak_rss_mb", "print_table", "zipf_keys"]


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
