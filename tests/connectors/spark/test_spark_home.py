"""Spark's Python workers import PySpark from the installed package, not from Spark's zip of
its sources (:mod:`reactive.connectors.spark.spark_home`), and the mirror that makes it so is
used only where it is safe."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="the Spark tests need pyspark (the spark extra)")

from reactive.connectors.spark import spark_home


def test_the_sessions_python_workers_import_the_installed_pyspark(spark: Any) -> None:
    import pyspark

    # a worker process reports where it imported pyspark from: the package the driver
    # imported (compiled bytecode), not .../python/lib/pyspark.zip/pyspark/__init__.py
    where = spark.sparkContext.parallelize([0], 1).map(
        lambda _: __import__("pyspark").__file__).collect()
    assert where == [pyspark.__file__]


def test_the_mirror_holds_the_install_but_its_zips(tmp_path: Path) -> None:
    import pyspark

    home = Path(pyspark.__file__).resolve().parent
    mirror = spark_home.installed_spark_home(tmp_path)
    assert mirror is not None
    assert (mirror / "jars").resolve() == home / "jars"
    assert (mirror / "bin" / "spark-submit").is_file()
    assert not (mirror / "python").exists()
    assert (home / "python" / "lib" / "pyspark.zip").is_file()
    # made once: a second call finds it, and no staging directory is left beside it
    assert spark_home.installed_spark_home(tmp_path) == mirror
    assert [p.name for p in tmp_path.iterdir()] == [mirror.name]


def test_a_spark_home_the_user_set_or_another_interpreter_is_left_alone(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("SPARK_HOME", raising=False)
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    with spark_home.workers_import_installed_pyspark() as mirror:
        assert mirror is not None and os.environ["SPARK_HOME"] == str(mirror)
        assert mirror.parent == tmp_path / "reactive"
    assert "SPARK_HOME" not in os.environ  # restored: the JVM keeps the value it started with

    monkeypatch.setenv("SPARK_HOME", "/opt/spark")
    with spark_home.workers_import_installed_pyspark() as mirror:
        assert mirror is None and os.environ["SPARK_HOME"] == "/opt/spark"
    monkeypatch.delenv("SPARK_HOME")

    # workers running another interpreter may not have the installed package
    monkeypatch.setenv("PYSPARK_PYTHON", "/usr/bin/python3-elsewhere")
    with spark_home.workers_import_installed_pyspark() as mirror:
        assert mirror is None and "SPARK_HOME" not in os.environ
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    with spark_home.workers_import_installed_pyspark() as mirror:
        assert mirror is not None


def test_an_unwritable_cache_leaves_spark_home_unset(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert spark_home.installed_spark_home(blocker / "cache") is None
