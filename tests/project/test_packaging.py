"""What ``pip install`` of the project gives a user: one import name (``reactive``), a small
core that runs a job on the heap backend without any extra, and every package folder in the
wheel."""

from __future__ import annotations

import os
import subprocess
import tomllib
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"reactive": "reactive", "backends": "reactive.backends",
           "connectors": "reactive.connectors"}

WORDCOUNT = """
import asyncio
import sys
from reactive import Dataflow
from reactive.connectors.collections import ListSink

out = ListSink()
flow = Dataflow("wordcount")
(flow.from_collection(["a b a", "c b a"])
     .flat_map(str.split)
     .map(lambda w: (w, 1))
     .key_by(lambda kv: kv[0])
     .reduce(lambda a, b: (a[0], a[1] + b[1]))
     .sink(out))
asyncio.run(flow.run())
final = {}
for word, count in out.records:
    final[word] = count
assert final == {"a": 3, "b": 2, "c": 1}, final
heavy = sorted(m for m in ("pyspark", "pyarrow", "pandas", "rocksdict") if m in sys.modules)
print("ok", heavy)
"""


def test_the_package_list_names_every_folder():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"] == {v: k for k, v in FOLDERS.items()}
    folders = {".".join((package, *init.parent.relative_to(ROOT / folder).parts))
               for folder, package in FOLDERS.items()
               for init in (ROOT / folder).rglob("__init__.py")}
    assert set(config["packages"]) == folders


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


@pytest.mark.e2e
def test_a_fresh_venv_installs_a_small_core_that_runs_a_job(tmp_path):
    """``pip install .`` into a new virtual environment: under 60 MB installed, ``import
    reactive`` and a wordcount on the heap backend work, nothing imports PySpark, pyarrow,
    pandas or rocksdict (none is installed), and the package is marked typed (PEP 561)."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True).stdout.strip())
    before = _size(site)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    str(ROOT)], check=True, env=env, capture_output=True)
    installed = _size(site) - before
    assert installed < 60 * 2**20, f"pip install . added {installed / 2**20:.1f} MB"
    # run from a directory that is not the checkout, so the installed wheel is what runs
    proc = subprocess.run([python, "-c", WORDCOUNT], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[0] == "ok []"
    for heavy in ("pyspark", "pyarrow", "pandas", "rocksdict"):
        missing = subprocess.run([python, "-c", f"import {heavy}"], cwd=tmp_path, env=env,
                                 capture_output=True)
        assert missing.returncode != 0, f"{heavy} was installed by pip install ."
    # PEP 561: a user's type checker reads the package's own hints
    assert (site / "reactive" / "py.typed").is_file()
    top_level = {p.name for p in site.iterdir() if (p / "__init__.py").exists()}
    assert "backends" not in top_level and "connectors" not in top_level
    assert "reactive" in top_level
