"""The console output of a Spark JVM that :func:`~.session.local_session` starts, filtered:
what PySpark's own Python workers print as they start and run (``print`` calls, not
log records: Spark copies a worker's stdout and stderr to the JVM's stderr line by line, so
no log level hides them) and the JVM's start-up chatter before the session's log level
applies go to this module's logger at DEBUG level; every other line (errors, warnings
after start-up, a user's own prints) reaches the console as before.

The streaming ``transformWithState`` driver worker, for one, prints five lines (and a
blank line after each) every time a query with a Python keyed operator starts.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from typing import IO, Any

__all__ = ["WORKER_CHATTER", "JvmOutputFilter", "launch_filtered_gateway"]

log = logging.getLogger(__name__)

#: the starts of the lines PySpark's Python workers print about themselves
WORKER_CHATTER = (b"Starting Streaming TransformWithStateInPandas Python worker",
                  b"Streaming TransformWithStateInPandas Python worker")

#: the JVM's lines before the session's log level applies: log4j's INFO and WARN records
#: (``yy/MM/dd HH:mm:ss LEVEL ...``) and the notes Spark and the JVM print at start-up
_START_UP = re.compile(rb"^(\d\d/\d\d/\d\d \d\d:\d\d:\d\d (INFO|WARN) |Using Spark's default "
                       rb"log4j profile|Setting default log level to|To adjust logging level "
                       rb"use|WARNING: Using incubator modules)")


class JvmOutputFilter:
    """Reads a JVM's stderr (a pipe) in a daemon thread and writes it, line by line, to the
    file descriptor the console had when the filter was made, but for the lines described
    in the module docstring.

    Args:
        pipe: the read end of the JVM's stderr (``Popen(..., stderr=PIPE).stderr``).
        console: the descriptor to write to (default: a duplicate of this process's
            stderr, 2, taken now: what the JVM would have inherited).
    """

    def __init__(self, pipe: IO[bytes], console: int | None = None) -> None:
        self.pipe = pipe
        self.console = os.dup(2) if console is None else console
        self.started = False  # set once the session's log level applies
        self.dropped = 0
        self._after_dropped = False
        self._thread = threading.Thread(target=self._run, name="spark-jvm-stderr",
                                        daemon=True)
        self._thread.start()

    def session_started(self) -> None:
        """From now on the JVM's log records reach the console whatever their level (the
        session's log level decides which the JVM writes)."""
        self.started = True

    def keep(self, line: bytes) -> bool:
        """Whether ``line`` (with its newline) goes to the console."""
        if line.startswith(WORKER_CHATTER) or (not self.started and _START_UP.match(line)):
            self._after_dropped = True
            return False
        if self._after_dropped and not line.strip():  # a worker's print ends in "\n\n"
            return False
        self._after_dropped = False
        return True

    def _run(self) -> None:
        for line in iter(self.pipe.readline, b""):
            if self.keep(line):
                _write_all(self.console, line)
            else:
                self.dropped += 1
                if line.strip():
                    log.debug("%s", line.rstrip().decode("utf-8", "replace"))

    def join(self, timeout: float | None = None) -> None:
        """Wait until the JVM closed its stderr (it exited)."""
        self._thread.join(timeout)


def _write_all(fd: int, data: bytes) -> None:
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:  # the console is gone (the process is exiting)
        pass


def launch_filtered_gateway(conf: Any) -> tuple[Any, JvmOutputFilter | None]:
    """Start Spark's JVM (PySpark's ``launch_gateway``) with its stderr read through a
    :class:`JvmOutputFilter`.

    Args:
        conf: the ``SparkConf`` the JVM starts with.

    Returns:
        ``(gateway, filter)``; the filter is None when PySpark connects to a JVM that was
        already running (``PYSPARK_GATEWAY_PORT``, as under ``spark-submit``).
    """
    from subprocess import PIPE

    from pyspark.java_gateway import launch_gateway

    if "PYSPARK_GATEWAY_PORT" in os.environ:
        return launch_gateway(conf), None  # type: ignore[no-untyped-call]
    # a developer hook of PySpark's, there to capture the JVM's output
    gateway = launch_gateway(conf, popen_kwargs={"stderr": PIPE})  # type: ignore[no-untyped-call]
    proc = gateway.proc
    return gateway, JvmOutputFilter(proc.stderr)
