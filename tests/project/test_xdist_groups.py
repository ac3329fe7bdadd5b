"""The default run's scheduling (tests/conftest.py): a module's tests run on one xdist worker,
and every test on the Spark session on one worker, whichever modules they are in."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: a test tree whose conftest takes the scheduling hooks of the repository's
CONFTEST = """
from tests.conftest import (  # noqa: F401 - the hooks under test
    pytest_collection_modifyitems, pytest_configure_node, pytest_unconfigure,
    pytest_xdist_make_scheduler)
import pytest

@pytest.fixture(scope="session")
def spark():
    return "a session"  # what matters is the fixture's name
"""
#: two modules on the Spark session and two without, in an order where xdist's loadfile
#: would hand the two Spark modules to different workers (the first unit to each worker)
MODULES = {
    "test_a_spark.py": "def test_one(spark):\n    pass\ndef test_two():\n    pass\n",
    "test_b_spark.py": "def test_three(spark):\n    pass\n",
    "test_c.py": "def test_four():\n    pass\ndef test_five():\n    pass\n",
    "test_d.py": "def test_six():\n    pass\n",
}


@pytest.mark.e2e
def test_the_spark_sessions_tests_share_a_worker_and_modules_stay_whole(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    for name, code in MODULES.items():
        (tmp_path / name).write_text(code)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup",
         "--no-loadscope-reorder", "-p", "no:cacheprovider", "-v", "-c", "/dev/null",
         "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ran = re.findall(r"\[(gw\d)\] \[\s*\d+%\] PASSED \S*::(test_\w+)", proc.stdout)
    worker = {test: gw for gw, test in ran}
    assert len(worker) == 6, proc.stdout
    # the tests using `spark`, in two modules, on one worker
    assert worker["test_one"] == worker["test_three"]
    # a module's other tests together (test_two is its module's unit without test_one)
    assert worker["test_four"] == worker["test_five"]
