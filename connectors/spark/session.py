"""A local SparkSession with defaults for a small machine, and the Java check before it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from reactive.extras import require

from .errors import JavaNotFoundError
from .spark_home import workers_import_installed_pyspark

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from .jvm_output import JvmOutputFilter

__all__ = ["find_java", "local_session"]

_INSTALL_HINT = (
    "Spark needs a Java runtime (17 or newer for Spark 4, 8/11/17 for Spark 3.5). Install one, "
    "e.g. `apt-get install openjdk-17-jre-headless` (Debian/Ubuntu) or `brew install openjdk@17` "
    "(macOS), or set JAVA_HOME to an installed JDK/JRE"
)


def find_java() -> Path:
    """Return the ``java`` executable Spark will start (``$JAVA_HOME/bin/java``, else the
    one on ``PATH``), checking that it runs.

    Returns:
        the path of the java executable.

    Raises:
        JavaNotFoundError: if there is none, or it does not run; the message says how to
            install one.
    """
    home = os.environ.get("JAVA_HOME")
    if home:
        java = Path(home) / "bin" / "java"
        if not java.is_file():
            raise JavaNotFoundError(f"JAVA_HOME={home} has no bin/java. {_INSTALL_HINT}")
    else:
        found = shutil.which("java")
        if found is None:
            raise JavaNotFoundError(f"no `java` on PATH and JAVA_HOME is not set. {_INSTALL_HINT}")
        java = Path(found)
    try:
        # spark-submit would fail later with a less helpful "Java gateway process exited"
        subprocess.run([str(java), "-version"], capture_output=True, check=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        raise JavaNotFoundError(f"{java} does not run ({exc}). {_INSTALL_HINT}") from exc
    return java


def local_session(
    master: str = "local[*]",
    app_name: str = "reactive-spark-bridge",
    shuffle_partitions: int | None = None,
    driver_memory: str = "2g",
    log_level: str = "ERROR",
    extra_conf: dict[str, str] | None = None,
    filter_output: bool = True,
) -> SparkSession:
    """Return a SparkSession for one machine (or the active one, as ``getOrCreate`` does).

    Defaults suit a small machine and small-to-medium data: 4 shuffle partitions instead of
    Spark's 200 (each is a task; 200 tiny tasks cost more than the work), no web UI, no
    console progress bar, quiet logs, and Python workers running this interpreter (so
    ``reactive`` is importable in UDFs) and, with a pip-installed PySpark and no
    ``SPARK_HOME`` set, importing PySpark from the installed package rather than from
    Spark's zip of its sources (:mod:`.spark_home`). Arrow-optimized Python UDFs are turned
    off because they need pandas, which the bridge does not require.

    Args:
        master: the Spark master URL (``local[*]``: one worker thread per core).
        app_name: the application name.
        shuffle_partitions: ``spark.sql.shuffle.partitions``; None: 4 for batch jobs, and
            the Spark runner sizes its streaming queries to the dataflow's parallelism
            (``SparkRunner``), as it does in a session where nobody chose them.
        driver_memory: ``spark.driver.memory`` (only effective when this call starts the JVM).
        log_level: Spark's log level after start-up (``ERROR``, ``WARN``, ``INFO``...).
        extra_conf: more Spark configuration, applied last.
        filter_output: when this call starts the JVM, read its console output through
            :class:`~.jvm_output.JvmOutputFilter`: what PySpark's Python workers print about
            themselves (a ``transformWithState`` query's driver worker prints five lines
            each time the query starts) and the start-up notes below ``log_level`` go to
            the ``reactive.connectors.spark.jvm_output`` logger at DEBUG level, not to the
            console; False leaves the JVM's output as Spark writes it.

    Returns:
        the session.

    Raises:
        JavaNotFoundError: if no Java runtime is available (with how to install one).
        MissingExtraError: if pyspark is not installed (the ``spark`` extra).
    """
    require("pyspark.sql", "spark", "the PySpark bridge")
    find_java()
    from pyspark.sql import SparkSession

    # workers must run the driver's interpreter: another python may lack reactive or mmh3
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    partitions = 4 if shuffle_partitions is None else shuffle_partitions
    conf = {
        "spark.sql.shuffle.partitions": str(partitions),
        "spark.default.parallelism": str(partitions),
        # read by the Spark runner (runner.SIZED_BY_DEFAULT): the partitions nobody chose
        "spark.reactive.shufflePartitions.default": (str(partitions) if shuffle_partitions
                                                      is None else "chosen"),
        "spark.driver.memory": driver_memory,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.execution.pythonUDF.arrow.enabled": "false",
        "spark.sql.session.timeZone": "UTC",
        # how long a starting Python worker may take to connect back to the JVM (15 s by
        # default): on a loaded machine, interpreter start-up alone can take longer
        "spark.python.authenticate.socketTimeout": "120s",
        **(extra_conf or {}),
    }
    # a JVM started here gives its Python workers PySpark's installed, compiled package to
    # import, not Spark's zip of its sources (about 1 CPU s per worker process)
    with workers_import_installed_pyspark():
        output = _start_jvm(master, app_name, conf) if filter_output else None
        builder = SparkSession.builder.master(master).appName(app_name)
        for key, value in conf.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    if output is not None:
        output.session_started()
    return spark


def _start_jvm(master: str, app_name: str, conf: dict[str, str]) -> JvmOutputFilter | None:
    """Start the JVM and its SparkContext with the JVM's output filtered, unless a JVM is
    running already (then ``getOrCreate`` uses it and its output stays as it is)."""
    from pyspark import SparkConf, SparkContext

    # PySpark keeps the JVM it started (or connected to) here, also after a stop
    if getattr(SparkContext, "_gateway", None) is not None:
        return None
    from .jvm_output import launch_filtered_gateway

    spark_conf = SparkConf().setMaster(master).setAppName(app_name).setAll(list(conf.items()))
    gateway, output = launch_filtered_gateway(spark_conf)
    SparkContext(conf=spark_conf, gateway=gateway)
    return output
