"""``reactive checkpoints plot`` and the benchmark figures: PNGs of what was measured."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest

from reactive import CheckpointConfig, Dataflow
from reactive.checkpoint.history_plot import (
    CheckpointHistoryError,
    plot_checkpoint_history,
    read_checkpoint_history,
)
from reactive.checkpoint.metadata import read_metadata
from reactive.cli import main
from reactive.connectors.collections import DiscardingSink
from tests.support import Count, paced

pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MATPLOTLIB = ["matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg",
              "matplotlib.ticker", "matplotlib.dates"]


def _assert_png(path: Path) -> tuple[int, int]:
    """Check the PNG signature, the IHDR chunk and the IEND trailer; return (width, height)."""
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert data[12:16] == b"IHDR"
    assert data[-12:] == b"\x00\x00\x00\x00IEND\xaeB`\x82"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 100 and height > 100
    return width, height


def _listed_completed(directory: Path, capsys: pytest.CaptureFixture[str]) -> list[int]:
    """The ids ``reactive checkpoints list`` shows as completed."""
    capsys.readouterr()
    assert main(["checkpoints", "list", str(directory)]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    return [int(r[1]) for r in rows if r[-1] == "yes"]


@pytest.fixture(scope="module")
def checkpoint_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint root with one job that completed several checkpoints (keeps 5)."""
    root = tmp_path_factory.mktemp("plot") / "chk"
    flow = Dataflow("plot-job", parallelism=2)
    # paced: a checkpoint completes every 2,500 records, on any machine
    (flow.source(paced([f"k{i % 37}" for i in range(25_000)], every=2_500)).uid("src")
         .key_by(lambda k: k).process(Count()).uid("count").sink(DiscardingSink()))
    job = flow.execute(checkpoints=CheckpointConfig(interval=0.01, directory=root,
                                                    retained=5))
    assert len(job.metrics.completed_checkpoints) >= 2
    return root


def test_plot_draws_every_listed_checkpoint(checkpoint_root, tmp_path, capsys):
    job_dir = checkpoint_root / "plot-job"
    listed = _listed_completed(job_dir, capsys)
    assert len(listed) >= 2

    # the root (one job in it): the default output goes into the directory given
    assert main(["checkpoints", "plot", str(checkpoint_root)]) == 0
    out = capsys.readouterr().out
    default = checkpoint_root / "checkpoints.png"
    assert f"{len(listed)} checkpoints of job 'plot-job' drawn to {default}" in out
    _assert_png(default)
    default.unlink()  # leave the root as the other tests expect it

    # the same data through the function: one point per listed checkpoint, in id order
    plot = plot_checkpoint_history(job_dir, tmp_path / "sub" / "by-id.png")
    _assert_png(plot.path)
    assert plot.x == [float(n) for n in listed]
    assert [c.checkpoint_id for c in plot.history.points] == listed
    assert set(plot.series) == {"duration", "alignment", "sync", "async", "size",
                                "state_size"}
    assert all(len(values) == len(listed) for values in plot.series.values())
    for n, point, size, sync in zip(listed, plot.history.points, plot.series["size"],
                                    plot.series["sync"], strict=True):
        stats = read_metadata(job_dir / f"chk-{n}").metrics
        assert stats is not None
        assert size == stats.size
        assert size > 0
        assert sync == stats.sync
        assert point.kind == "full"  # the heap backend writes full snapshots
        assert point.state_size >= point.size
        assert point.duration >= max(point.sync, point.async_) >= 0


def test_plot_over_completion_time(checkpoint_root, tmp_path, capsys):
    out = tmp_path / "by-time.png"
    assert main(["checkpoints", "plot", str(checkpoint_root / "plot-job"), "--x", "time",
                 "--output", str(out)]) == 0
    assert str(out) in capsys.readouterr().out
    _assert_png(out)
    plot = plot_checkpoint_history(checkpoint_root / "plot-job", tmp_path / "t.png", x="time")
    assert plot.x == sorted(plot.x)
    assert plot.x == [c.trigger_time + c.duration for c in plot.history.points]


def test_a_directory_without_completed_checkpoints_is_a_cli_error(tmp_path, capsys):
    job = tmp_path / "root" / "job"
    (job / "chk-3").mkdir(parents=True)  # incomplete: no _metadata
    for directory in (job, tmp_path / "root"):
        assert main(["checkpoints", "plot", str(directory)]) == 2
        err = capsys.readouterr().err.strip()
        assert err == f"error: {job} holds no completed checkpoint"
    with pytest.raises(CheckpointHistoryError, match="no completed checkpoint"):
        read_checkpoint_history(job)
    assert not (job / "checkpoints.png").exists()

    (tmp_path / "root" / "other").mkdir()
    assert main(["checkpoints", "plot", str(tmp_path / "root")]) == 2
    err = capsys.readouterr().err
    assert "checkpoint root with 2 jobs (job, other)" in err and "DIR/<job>" in err

    assert main(["checkpoints", "plot", str(tmp_path / "missing")]) == 2
    assert "no such directory" in capsys.readouterr().err


def test_plot_help_is_documented(capsys):
    with pytest.raises(SystemExit) as info:
        main(["checkpoints", "plot", "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    assert "--output" in text and "checkpoints.png" in text and "--x" in text


def _without_matplotlib(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter in which matplotlib cannot be imported (as
    tests/project/test_extras.py hides a module)."""
    blocked = "; ".join(f"sys.modules[{m!r}] = None" for m in MATPLOTLIB)
    return subprocess.run([sys.executable, "-c", f"import sys; {blocked}; {code}"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


@pytest.mark.e2e
def test_without_matplotlib_the_plot_extra_is_named(checkpoint_root, tmp_path):
    out = tmp_path / "never.png"
    cli = _without_matplotlib(
        "from reactive.cli import main; "
        f"sys.exit(main(['checkpoints', 'plot', {str(checkpoint_root)!r}, "
        f"'--output', {str(out)!r}]))")
    assert cli.returncode == 2, cli.stderr
    assert cli.stderr.startswith("error: ")
    assert "pip install 'reactive[plot]'" in cli.stderr
    assert not out.exists()

    api = _without_matplotlib(
        "from reactive.checkpoint.history_plot import plot_checkpoint_history; "
        f"plot_checkpoint_history({str(checkpoint_root)!r}, {str(out)!r})")
    assert api.returncode != 0
    assert "MissingExtraError" in api.stderr
    assert "pip install 'reactive[plot]'" in api.stderr


TABLE = """W1: something
| run | records/s | vs bare loop | vs no checkpoints |
|---|---|---|---|
| bare Python loop | 10,477,713 | 1.00 | - |
| pipeline, no checkpoints | 1,508,421 | 0.14 | 1.00 |
| pipeline, checkpoints every 1 s | 1,518,425 | 0.14 | 1.01 |

| checkpoint | alignment ms | sync part ms | async part ms | bytes |
|---|---|---|---|---|
| 1 | 0.01 | 0.11 | 5.24 | 851,749 |

| format | Spark total s | pyarrow total s | total ratio |
|---|---|---|---|
| jsonl | 18.15 | 1.98 | 9.2x |
"""


def test_bench_figures_write_a_png_of_the_ratio_columns(tmp_path, capsys):
    from bench.figures import parse_ratio_tables, write_ratio_png

    tables = parse_ratio_tables(TABLE)
    assert len(tables) == 2  # the per-checkpoint table has no ratio column
    assert tables[0].labels == ["bare Python loop", "pipeline, no checkpoints",
                                "pipeline, checkpoints every 1 s"]
    assert tables[0].columns == {"vs bare loop": [1.0, 0.14, 0.14],
                                 "vs no checkpoints": [None, 1.0, 1.01]}
    assert tables[1].columns == {"total ratio": [9.2]}

    path = write_ratio_png(TABLE, tmp_path / "results" / "w1.png", "W1")
    assert path == tmp_path / "results" / "w1.png"
    assert f"figure written to {path}" in capsys.readouterr().out
    _assert_png(path)

    assert write_ratio_png("| a | b |\n|---|---|\n| x | 1 |\n", tmp_path / "no.png", "t") is None
    assert "PNG skipped" in capsys.readouterr().out
    assert not (tmp_path / "no.png").exists()


@pytest.mark.e2e
def test_bench_figures_without_matplotlib_skip_the_png(tmp_path):
    out = tmp_path / "w1.png"
    proc = _without_matplotlib(
        "from bench.figures import write_ratio_png; "
        f"r = write_ratio_png({TABLE!r}, {str(out)!r}, 'W1'); "
        "print('returned', r)")
    assert proc.returncode == 0, proc.stderr
    assert "PNG skipped" in proc.stdout and "pip install 'reactive[plot]'" in proc.stdout
    assert "returned None" in proc.stdout
    assert not out.exists()


def test_the_plot_extra_is_declared_and_in_the_test_extra():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert extras["plot"] == ["matplotlib>=3.8"]
    assert "reactive[plot]" in extras["test"]
