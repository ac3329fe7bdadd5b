"""Benchmark figures: a bar chart PNG of the ratio columns of a benchmark's Markdown tables.

A benchmark prints its tables with :func:`bench.common.print_table` and passes the text here:
every table with a ratio column (a header ``ratio``, ``vs ...`` or ``x ...``) becomes one
panel of horizontal bars, one group per row, with the baseline (1.0) marked. Tables without
ratio columns (per-checkpoint figures) are left out.

matplotlib is the ``plot`` extra of ``reactive``; without it :func:`write_ratio_png` prints
that the PNG was skipped and returns None, and the benchmark still prints its tables.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from reactive.errors import MissingExtraError
from reactive.extras import require

__all__ = ["RESULTS", "RatioTable", "parse_ratio_tables", "write_ratio_png"]

#: Where the benchmarks write their figures by default: ``bench/results/<name>.png``.
RESULTS = Path(__file__).resolve().parent / "results"

_NUMBER = re.compile(r"^-?[\d,]*\.?\d+$")


@dataclass
class RatioTable:
    """The ratio columns of one Markdown table.

    Attributes:
        labels: the first cell of each row that has a ratio.
        columns: ratio column header -> one value per row (None where the cell is not a
            number, e.g. ``-``).
    """

    labels: list[str]
    columns: dict[str, list[float | None]]


def _is_ratio(header: str) -> bool:
    h = header.strip().lower()
    return h == "ratio" or h.startswith(("vs ", "x ")) or "ratio" in h


def _number(cell: str) -> float | None:
    c = cell.strip().rstrip("x")
    return float(c.replace(",", "")) if _NUMBER.match(c) else None


def parse_ratio_tables(text: str) -> list[RatioTable]:
    """The tables of ``text`` (Markdown, as :func:`bench.common.print_table` writes them) that
    have ratio columns, in order."""
    tables: list[list[list[str]]] = []
    current: list[list[str]] = []
    for line in [*text.splitlines(), ""]:
        s = line.strip()
        if s.startswith("|") and s.endswith("|"):
            current.append([c.strip() for c in s[1:-1].split("|")])
        elif current:
            tables.append(current)
            current = []
    out = []
    for rows in tables:
        if len(rows) < 3:  # header, separator, at least one row
            continue
        header, body = rows[0], rows[2:]
        ratio_cols = [i for i, h in enumerate(header) if i > 0 and _is_ratio(h)]
        if not ratio_cols:
            continue
        labels: list[str] = []
        columns: dict[str, list[float | None]] = {header[i]: [] for i in ratio_cols}
        for row in body:
            values = [_number(row[i]) if i < len(row) else None for i in ratio_cols]
            if all(v is None for v in values):
                continue
            labels.append(row[0])
            for i, v in zip(ratio_cols, values, strict=True):
                columns[header[i]].append(v)
        if labels:
            out.append(RatioTable(labels, columns))
    return out


def write_ratio_png(text: str, path: str | Path, title: str) -> Path | None:
    """Write the ratio columns of the tables in ``text`` as a bar chart PNG.

    Args:
        text: one or more Markdown tables (other lines are ignored).
        path: the PNG file (its directory is created).
        title: the figure's title (the benchmark and its parameters).

    Returns:
        the path written, or None when skipped: matplotlib (the ``plot`` extra) is missing,
        or no table has a ratio column. Either way a line says so on standard output.
    """
    tables = parse_ratio_tables(text)
    if not tables:
        print(f"PNG skipped: no ratio column in the tables for {path}")
        return None
    try:
        figure_mod = require("matplotlib.figure", "plot", "benchmark figures")
        agg = require("matplotlib.backends.backend_agg", "plot", "benchmark figures")
    except MissingExtraError as exc:
        print(f"PNG skipped: {exc}")
        return None
    heights = [1.0 + 0.45 * len(t.labels) * len(t.columns) for t in tables]
    fig = figure_mod.Figure(figsize=(9, sum(heights) + 0.8), layout="constrained")
    agg.FigureCanvasAgg(fig)
    axes = fig.subplots(len(tables), 1, squeeze=False, height_ratios=heights)[:, 0]
    fig.suptitle(title)
    for ax, table in zip(axes, tables, strict=True):
        n = len(table.columns)
        bar = 0.8 / n
        for j, (name, values) in enumerate(table.columns.items()):
            ys = [i + (j - (n - 1) / 2) * bar for i in range(len(table.labels))]
            kept = [(y, v) for y, v in zip(ys, values, strict=True) if v is not None]
            bars = ax.barh([y for y, _ in kept], [v for _, v in kept], height=bar, label=name)
            ax.bar_label(bars, fmt="%.2f", padding=2, fontsize="small")
        ax.axvline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_yticks(range(len(table.labels)), table.labels, fontsize="small")
        ax.invert_yaxis()  # first row on top, as in the table
        ax.set_xlabel("ratio (1.0 = the baseline)")
        ax.margins(x=0.15)
        ax.legend(fontsize="small", loc="best")
        ax.grid(axis="x", alpha=0.3)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=110)
    print(f"figure written to {out}")
    return out
