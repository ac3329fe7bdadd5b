"""A ``SPARK_HOME`` for a pip-installed PySpark whose Python workers import PySpark from the
installed package, with its compiled bytecode, instead of from ``python/lib/pyspark.zip``.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` (and Py4J's zip) at the front of every
Python worker's ``PYTHONPATH`` (``PythonUtils.sparkPythonPath``), so each worker process it
starts (a ``pyspark.daemon`` worker, a streaming source's driver-side runner, a planner) imports
PySpark from the zip. ``zipimport`` caches no bytecode: a worker compiles about 440 modules
from source and reads the zips' directories again when it invalidates the import caches, about
1 CPU s per process here, which is most of a small query's Python cost. A pip install ships the
same PySpark, compiled, in ``site-packages``. The directory made here mirrors the install
(symbolic links to its ``bin``, ``jars`` and every other entry) without ``python/``, so the
workers' ``PYTHONPATH`` names zips that do not exist and the interpreter finds PySpark and Py4J
(a dependency of the pip package) where pip put them.

It is used only where that holds: ``SPARK_HOME`` unset (a Spark distribution the user chose
stays as it is), PySpark installed with its zip, and the workers running this very
interpreter (``PYSPARK_PYTHON`` unset or naming ``sys.executable``; another interpreter may
lack the installed package).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["installed_spark_home", "workers_import_installed_pyspark"]

#: the entry of a pip-installed PySpark that holds its zips, left out of the mirror
_PYTHON_DIR = "python"


def _pyspark_install() -> tuple[Path, str] | None:
    """The directory and version of the installed ``pyspark`` package, when it carries
    Spark's zips (a pip install)."""
    try:
        import pyspark
    except ImportError:
        return None
    home = Path(pyspark.__file__).resolve().parent
    if not (home / _PYTHON_DIR / "lib" / "pyspark.zip").is_file() or not (home / "jars").is_dir():
        return None
    return home, pyspark.__version__


def _cache_root() -> Path:
    """Where the mirror is kept: ``$XDG_CACHE_HOME/reactive`` (``~/.cache/reactive``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "reactive"


def _complete(mirror: Path, entries: list[str]) -> bool:
    """Whether ``mirror`` links every entry of the install (a stale or partial one does not)."""
    return mirror.is_dir() and all((mirror / name).exists() for name in entries)


def installed_spark_home(cache: Path | None = None) -> Path | None:
    """The mirror of the installed PySpark without its zips (made once per install).

    Args:
        cache: the directory to keep it in (:func:`_cache_root` by default).

    Returns:
        the mirror's path, or None where it does not apply: no pip-installed PySpark with its
        zips, or no writable cache directory.
    """
    install = _pyspark_install()
    if install is None:
        return None
    home, version = install
    digest = hashlib.sha256(str(home).encode()).hexdigest()[:16]
    root = cache if cache is not None else _cache_root()
    mirror = root / f"spark-home-{version}-{digest}"
    entries = sorted(p.name for p in home.iterdir() if p.name != _PYTHON_DIR)
    if _complete(mirror, entries):
        return mirror
    try:
        root.mkdir(parents=True, exist_ok=True)
        staged = Path(tempfile.mkdtemp(prefix=f".{mirror.name}.", dir=root))
    except OSError:
        return None
    try:
        for name in entries:
            (staged / name).symlink_to(home / name)
        try:
            staged.rename(mirror)
        except OSError:  # another process made it first, or a stale one is in the way
            if not _complete(mirror, entries):
                shutil.rmtree(mirror, ignore_errors=True)
                staged.rename(mirror)
    except OSError:
        return None
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return mirror


def _workers_run_this_interpreter() -> bool:
    """Whether Spark's Python workers run ``sys.executable`` (``PYSPARK_PYTHON``)."""
    chosen = os.environ.get("PYSPARK_PYTHON")
    return chosen is None or os.path.abspath(chosen) == os.path.abspath(sys.executable)


@contextlib.contextmanager
def workers_import_installed_pyspark() -> Iterator[Path | None]:
    """Within the block, ``SPARK_HOME`` names :func:`installed_spark_home`'s mirror, where it
    applies (see the module's docstring): a JVM started in the block (PySpark's
    ``launch_gateway`` reads ``SPARK_HOME``) gives its Python workers no zips to import
    PySpark from. ``SPARK_HOME`` is restored after the block; the JVM keeps the value it
    started with.

    Yields:
        the mirror in use, or None (``SPARK_HOME`` left as it was).
    """
    if "SPARK_HOME" in os.environ or not _workers_run_this_interpreter():
        yield None
        return
    mirror = installed_spark_home()
    if mirror is None:
        yield None
        return
    os.environ["SPARK_HOME"] = str(mirror)
    try:
        yield mirror
    finally:
        if os.environ.get("SPARK_HOME") == str(mirror):
            del os.environ["SPARK_HOME"]
