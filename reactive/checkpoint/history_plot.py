"""Drawing a job's checkpoint history: durations and sizes per completed checkpoint, as a PNG.

It reads what ``reactive checkpoints list`` reads (the ``_metadata`` of every completed
checkpoint of a job directory, through :class:`~reactive.checkpoint.storage.CheckpointStorage`)
and draws two panels over the checkpoint id (or the completion time):

- durations in seconds: end to end (trigger to completion) and, as the maxima over the
  tasks, the alignment, the synchronous part and the asynchronous part;
- sizes in bytes: what each checkpoint wrote (a bar per checkpoint, by kind: full,
  incremental or savepoint) and the whole state it references (files shared with earlier
  incremental checkpoints included).

matplotlib is the ``plot`` extra; it is imported only when a figure is drawn, and drawn with
the Agg canvas (no screen, and no change to the process's pyplot backend).
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..errors import ReactiveError
from ..extras import require
from .contract import CheckpointMetadata
from .metadata import METADATA
from .storage import CheckpointStorage

__all__ = [
    "CheckpointHistory",
    "CheckpointHistoryError",
    "CheckpointPoint",
    "HistoryPlot",
    "find_job_dir",
    "plot_checkpoint_history",
    "read_checkpoint_history",
]

#: The duration series, in the order they are drawn: series name -> legend label.
DURATION_SERIES = {
    "duration": "end to end",
    "alignment": "alignment",
    "sync": "synchronous part",
    "async": "asynchronous part",
}


class CheckpointHistoryError(ReactiveError):
    """A directory has no checkpoint history to draw: it is not a job directory or a root
    with one job, or the job has no completed checkpoint."""


@dataclass(frozen=True)
class CheckpointPoint:
    """One completed checkpoint, as drawn.

    Attributes:
        checkpoint_id: the id.
        kind: ``"full"``, ``"incremental"`` (its keyed state shares files with earlier
            checkpoints) or ``"savepoint"``.
        trigger_time: when it was triggered, seconds since the epoch.
        completion_time: when it completed (trigger time + end-to-end duration), seconds
            since the epoch.
        duration: seconds from trigger to completion (NaN when the metadata has no stats).
        alignment: max over tasks of the barrier alignment, seconds (NaN when not recorded).
        sync: max over tasks of the synchronous part, seconds (NaN when not recorded).
        async_: max over tasks of the asynchronous part, seconds (NaN when not recorded).
        size: bytes the checkpoint wrote (files it only references excluded).
        state_size: bytes of every file it references (its whole state).
    """

    checkpoint_id: int
    kind: str
    trigger_time: float
    completion_time: float
    duration: float
    alignment: float
    sync: float
    async_: float
    size: int
    state_size: int


@dataclass(frozen=True)
class CheckpointHistory:
    """The completed checkpoints of one job, oldest first.

    Attributes:
        job: the job's name (its directory's name).
        job_dir: the job directory.
        points: one per completed checkpoint, by id.
    """

    job: str
    job_dir: Path
    points: tuple[CheckpointPoint, ...]

    def series(self) -> dict[str, list[float]]:
        """The values drawn, one per checkpoint: ``id``, ``completion_time`` (seconds since
        the epoch), ``duration``, ``alignment``, ``sync``, ``async`` (seconds), ``size`` and
        ``state_size`` (bytes)."""
        p = self.points
        return {
            "id": [float(c.checkpoint_id) for c in p],
            "completion_time": [c.completion_time for c in p],
            "duration": [c.duration for c in p],
            "alignment": [c.alignment for c in p],
            "sync": [c.sync for c in p],
            "async": [c.async_ for c in p],
            "size": [float(c.size) for c in p],
            "state_size": [float(c.state_size) for c in p],
        }


@dataclass(frozen=True)
class HistoryPlot:
    """A figure written by :func:`plot_checkpoint_history`.

    Attributes:
        path: the PNG file.
        history: the checkpoints it shows.
        x: the x value of each checkpoint: its id, or its completion time in seconds since
            the epoch.
        series: the y values drawn per series name (:meth:`CheckpointHistory.series` without
            the x series, and without duration series the metadata did not record).
    """

    path: Path
    history: CheckpointHistory
    x: list[float]
    series: dict[str, list[float]]


def find_job_dir(directory: str | Path) -> Path:
    """The job directory of ``directory``: itself when it holds ``chk-<n>`` directories (or
    run records), else its only subdirectory (a checkpoint root with one job).

    Raises:
        CheckpointHistoryError: when it is missing, is one checkpoint, or is a root with no
            job or with several.
    """
    d = Path(directory)
    if not d.is_dir():
        raise CheckpointHistoryError(f"no such directory: {d}")
    if (d / METADATA).exists():
        raise CheckpointHistoryError(
            f"{d} is one checkpoint or savepoint; give its job directory (DIR/<job>)")
    children = list(d.iterdir())
    if any(p.name.startswith("chk-") or p.name == "_runs" for p in children):
        return d
    jobs = sorted(p for p in children if p.is_dir())
    if len(jobs) == 1:
        return jobs[0]
    if not jobs:
        raise CheckpointHistoryError(f"{d} holds no completed checkpoint (no job directory "
                                     "and no chk-<n> directory in it)")
    names = ", ".join(p.name for p in jobs)
    raise CheckpointHistoryError(f"{d} is a checkpoint root with {len(jobs)} jobs ({names}); "
                                 "give one job directory DIR/<job>")


def _kind(metadata: CheckpointMetadata) -> str:
    """``"savepoint"``, ``"incremental"`` or ``"full"``, as ``reactive checkpoints list`` says."""
    if metadata.is_savepoint:
        return "savepoint"
    return "incremental" if metadata.shared_paths() else "full"


def _seconds(stats: dict[str, Any], key: str) -> float:
    value = stats.get(key)
    return float(value) if isinstance(value, int | float) else math.nan


def read_checkpoint_history(directory: str | Path) -> CheckpointHistory:
    """Read the completed checkpoints of a job directory (or of a root with one job).

    Args:
        directory: ``DIR/<job>``, or a checkpoint root ``DIR`` that holds one job.

    Returns:
        the history, oldest checkpoint first.

    Raises:
        CheckpointHistoryError: when the directory is not one job's, or the job has no
            completed checkpoint.
    """
    job_dir = find_job_dir(directory)
    points = []
    for chk in CheckpointStorage(job_dir.parent, job_dir.name).completed():
        meta = chk.metadata
        stats: dict[str, Any] = {} if meta.metrics is None else meta.metrics.to_json()
        trigger = float(stats.get("trigger_time") or meta.timestamp or 0.0)
        duration = _seconds(stats, "duration")
        points.append(CheckpointPoint(
            checkpoint_id=chk.checkpoint_id,
            kind=_kind(meta),
            trigger_time=trigger,
            completion_time=trigger + (0.0 if math.isnan(duration) else duration),
            duration=duration,
            alignment=_seconds(stats, "alignment"),
            sync=_seconds(stats, "sync"),
            async_=_seconds(stats, "async_"),
            size=int(stats.get("size", 0)),
            state_size=meta.state_size,
        ))
    if not points:
        raise CheckpointHistoryError(f"{job_dir} holds no completed checkpoint")
    return CheckpointHistory(job_dir.name, job_dir, tuple(points))


_KIND_COLORS = {"full": "tab:blue", "incremental": "tab:green", "savepoint": "tab:purple"}


def plot_checkpoint_history(directory: str | Path, output: str | Path | None = None, *,
                            x: Literal["id", "time"] = "id", dpi: int = 120) -> HistoryPlot:
    """Draw the checkpoint history of a job as a PNG with two panels.

    The upper panel shows the durations in seconds (end to end, alignment, synchronous and
    asynchronous parts); the lower one the bytes each checkpoint wrote (bars coloured by
    kind: full, incremental, savepoint) and the bytes of the whole state it references.

    Args:
        directory: ``DIR/<job>``, or a checkpoint root ``DIR`` that holds one job.
        output: the PNG file to write (default: ``directory/checkpoints.png``); its parent
            directory is created.
        x: ``"id"`` to draw over the checkpoint id, ``"time"`` over the completion time.
        dpi: the resolution, dots per inch (the figure is 9 x 7 inches).

    Returns:
        the file written and the values drawn.

    Raises:
        CheckpointHistoryError: when the directory is not one job's, or the job has no
            completed checkpoint.
        MissingExtraError: when matplotlib (the ``plot`` extra) is not installed.
        ValueError: for another ``x`` than ``"id"`` or ``"time"``.
    """
    if x not in ("id", "time"):
        raise ValueError(f"x must be 'id' or 'time', got {x!r}")
    history = read_checkpoint_history(directory)
    feature = "reactive checkpoints plot"
    figure_mod = require("matplotlib.figure", "plot", feature)
    agg = require("matplotlib.backends.backend_agg", "plot", feature)
    ticker = require("matplotlib.ticker", "plot", feature)
    dates = require("matplotlib.dates", "plot", feature)

    series = history.series()
    xs = series.pop("id") if x == "id" else series["completion_time"]
    series.pop("completion_time")
    for name in list(DURATION_SERIES):
        if all(math.isnan(v) for v in series[name]):
            del series[name]  # not recorded in this job's metadata
    drawn_x: Sequence[Any] = xs if x == "id" else [
        datetime.datetime.fromtimestamp(t) for t in xs]

    fig = figure_mod.Figure(figsize=(9, 7), layout="constrained")
    agg.FigureCanvasAgg(fig)
    durations, sizes = fig.subplots(2, 1, sharex=True)
    n = len(history.points)
    fig.suptitle(f"checkpoints of job {history.job!r}: {n} completed")

    for name, label in DURATION_SERIES.items():
        if name in series:
            durations.plot(drawn_x, series[name], marker="o", markersize=3, label=label)
    durations.set_ylabel("seconds")
    durations.set_ylim(bottom=0)
    durations.yaxis.set_major_formatter(ticker.EngFormatter(unit="s"))
    durations.set_title("durations (alignment and parts: the slowest task)", fontsize="medium")
    durations.legend(fontsize="small")
    durations.grid(alpha=0.3)

    kinds = [c.kind for c in history.points]
    for kind, color in _KIND_COLORS.items():
        idx = [i for i, k in enumerate(kinds) if k == kind]
        if not idx:
            continue
        kx = [drawn_x[i] for i in idx]
        ky = [series["size"][i] for i in idx]
        if x == "id":
            sizes.bar(kx, ky, width=0.8, color=color, label=f"written ({kind})")
        else:
            sizes.plot(kx, ky, marker="o", linestyle="none", color=color,
                       label=f"written ({kind})")
    sizes.plot(drawn_x, series["state_size"], color="black", marker=".", linewidth=1,
               label="whole state referenced")
    sizes.set_ylabel("bytes")
    top = max(series["size"] + series["state_size"])
    sizes.set_ylim(0, top * 1.15 if top > 0 else 1)
    sizes.yaxis.set_major_formatter(ticker.EngFormatter(unit="B"))
    sizes.set_title("sizes", fontsize="medium")
    sizes.legend(fontsize="small")
    sizes.grid(alpha=0.3)
    if x == "id":
        sizes.set_xlabel("checkpoint id")
        sizes.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    else:
        sizes.set_xlabel("completion time")
        locator = dates.AutoDateLocator()
        sizes.xaxis.set_major_locator(locator)
        sizes.xaxis.set_major_formatter(dates.ConciseDateFormatter(locator))

    path = Path(output) if output is not None else Path(directory) / "checkpoints.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=dpi)
    return HistoryPlot(path, history, list(xs), series)
