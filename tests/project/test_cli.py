"""The ``reactive`` command line against real checkpoint directories."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from reactive.cli import main

PIPELINE = '''
from reactive import Dataflow
from reactive.connectors.collections import DiscardingSink
from tests.support import Count

def flow():
    f = Dataflow("cli-job", parallelism=2)
    (f.from_collection([f"k{i % 37}" for i in range(20_000)]).uid("src")
      .key_by(lambda k: k).process(Count()).uid("count").sink(DiscardingSink()))
    return f
'''


def _write_pipeline(tmp_path: Path) -> Path:
    path = tmp_path / "pipeline.py"
    path.write_text(PIPELINE)
    return path


def test_run_list_and_inspect(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(Path(__file__).parents[2])
    pipeline = _write_pipeline(tmp_path)
    chk = tmp_path / "chk"
    assert main(["run", f"{pipeline}:flow", "--checkpoint-dir", str(chk),
                 "--interval", "0.01", "--parallelism", "3"]) == 0
    out = capsys.readouterr().out
    assert "job 'cli-job' finished" in out
    assert "in 20,000" in out

    assert main(["checkpoints", "list", str(chk)]) == 0
    listing = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in listing[1:]]
    assert rows and all(r[0] == "cli-job" and r[-1] == "yes" for r in rows)
    newest = max(int(r[1]) for r in rows)

    assert main(["checkpoints", "inspect", str(chk / "cli-job" / f"chk-{newest}")]) == 0
    text = capsys.readouterr().out
    assert f"checkpoint {newest} of job 'cli-job'" in text
    assert "operator 'count' (Count), parallelism 3" in text
    # the three instances own contiguous key-group ranges covering 0..127
    assert "key groups 0-42" in text and "key groups 43-85" in text and "key groups 86-127" in text


@pytest.mark.e2e
def test_errors_exit_non_zero_with_one_line(tmp_path):
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "reactive", *args], capture_output=True,
                              text=True, cwd=Path(__file__).parents[2])

    missing = run("checkpoints", "inspect", str(tmp_path / "nope"))
    assert missing.returncode == 2
    assert missing.stderr.strip().startswith("error: no such checkpoint directory")
    assert len(missing.stderr.strip().splitlines()) == 1

    incomplete = tmp_path / "job" / "chk-3"
    incomplete.mkdir(parents=True)
    r = run("checkpoints", "inspect", str(incomplete))
    assert r.returncode == 2 and "incomplete checkpoint" in r.stderr

    r = run("run", str(tmp_path / "missing.py"))
    assert r.returncode == 2 and "no such file" in r.stderr


def test_run_over_earlier_checkpoints_needs_resume_or_fresh(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(Path(__file__).parents[2])
    pipeline = _write_pipeline(tmp_path)
    chk = tmp_path / "chk"
    args = ["run", f"{pipeline}:flow", "--checkpoint-dir", str(chk), "--interval", "0.01"]
    assert main(args) == 0
    capsys.readouterr()
    # a second plain run would silently start over (or, before, resume a finished run)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "holds checkpoints of an earlier run" in err
    assert "--resume" in err and "--fresh" in err
    assert main([*args, "--fresh"]) == 0
    assert "in 20,000" in capsys.readouterr().out  # a new run reads the whole input
    assert main([*args, "--resume"]) == 0
    assert "in 0 " in capsys.readouterr().out  # the finished run has nothing left to read


def test_every_option_has_help_and_exit_codes_are_documented():
    import argparse

    from reactive.cli import build_parser

    parser = build_parser()
    assert "exit codes" in (parser.epilog or "")
    parsers = [parser]
    while parsers:
        p = parsers.pop()
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                parsers.extend(action.choices.values())
            elif action.dest not in ("help", "command", "action"):
                assert action.help, f"{p.prog}: {action.option_strings or action.dest}"


@pytest.mark.e2e
def test_validate_help_names_reactive_validate():
    r = subprocess.run([sys.executable, "-m", "reactive", "validate", "--help"],
                       capture_output=True, text=True, cwd=Path(__file__).parents[2])
    assert r.returncode == 0
    assert r.stdout.startswith("usage: reactive validate")


def test_checkpoints_list_says_what_it_was_given(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(Path(__file__).parents[2])
    pipeline = _write_pipeline(tmp_path)
    chk = tmp_path / "chk"
    assert main(["run", f"{pipeline}:flow", "--checkpoint-dir", str(chk),
                 "--interval", "0.01"]) == 0
    assert main(["savepoint", str(chk / "cli-job"), "--output", str(tmp_path / "sp")]) == 0
    capsys.readouterr()
    assert main(["checkpoints", "list", str(tmp_path / "sp")]) == 0
    out = capsys.readouterr().out
    assert "is savepoint" in out and "self-contained" in out and "restore_from=" in out
    assert main(["checkpoints", "list", str(chk / "cli-job")]) == 0
    assert "holds the checkpoints of job 'cli-job'" in capsys.readouterr().err
    assert main(["checkpoints", "list", str(chk)]) == 0
    assert "checkpoint root with 1 job(s)" in capsys.readouterr().err
