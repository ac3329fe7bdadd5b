"""Spark's progress of a running dataflow, one line per micro-batch of each query: what
``reactive run --runner spark`` prints while the queries run (Spark's own console progress
bar is off in :func:`~.session.local_session`).

A line names the query (its sink uids), the micro-batch, the source records it read (by
their offsets, :func:`~.runner.batch_records`), its wall-clock time and records/s, and the
rows and memory of its stateful operators' state, as Spark's ``StreamingQueryProgress``
reports them.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable
from typing import Any

from .runner import batch_records

__all__ = ["progress_line", "progress_printer"]


def progress_line(progress: dict[str, Any]) -> str:
    """One micro-batch's progress report as a line.

    Args:
        progress: a ``StreamingQueryProgress`` as a dict (its ``json`` parsed).

    Returns:
        e.g. ``"query results-sink: micro-batch 3, 200,000 records in 4.1 s (48,780
        records/s), state 1,234 rows (56,789 bytes)"``; a query without state says no more
        than its records.
    """
    records = batch_records(progress)
    millis = int((progress.get("durationMs") or {}).get("triggerExecution", 0))
    rate = f"{records / (millis / 1000):,.0f}" if millis else "-"
    line = (f"query {progress.get('name') or progress.get('id')}: micro-batch "
            f"{progress.get('batchId')}, {records:,} records in {millis / 1000:.1f} s "
            f"({rate} records/s)")
    operators = progress.get("stateOperators") or []
    if operators:
        rows = sum(int(o.get("numRowsTotal", 0)) for o in operators)
        size = sum(int(o.get("memoryUsedBytes", 0)) for o in operators)
        line += f", state {rows:,} rows ({size:,} bytes)"
    return line


def progress_printer(write: Callable[[str], None] = print) -> Any:
    """A Spark ``StreamingQueryListener`` writing :func:`progress_line` for every
    micro-batch of every query of the session it is added to
    (``spark.streams.addListener``; remove it with ``removeListener``).

    Args:
        write: where the lines go (``print`` by default).

    Returns:
        the listener (its class derives from PySpark's, imported only here); its
        ``wait_printed(queries, timeout)`` waits until the last micro-batch of each of the
        given queries is written (Spark hands progress reports to listeners
        asynchronously), so that it is removed, or the process exits, with no report
        still on its way to it.
    """
    from pyspark.sql.streaming.listener import StreamingQueryListener

    class _Printer(StreamingQueryListener):
        def __init__(self) -> None:
            self.printed: set[tuple[str, int]] = set()  # (query id, micro-batch)
            self.done = threading.Condition()

        def onQueryStarted(self, event: Any) -> None:
            """Nothing to say before the first micro-batch."""

        def onQueryProgress(self, event: Any) -> None:
            progress = json.loads(event.progress.json)
            write(progress_line(progress))
            with self.done:
                self.printed.add((str(progress.get("id")), int(progress.get("batchId", -1))))
                self.done.notify_all()

        def wait_printed(self, queries: Iterable[Any], timeout: float = 10.0) -> bool:
            """Wait until each query's last progress report is written; False when
            ``timeout`` seconds passed first."""
            last = []
            for q in queries:
                p = q.lastProgress
                if p is not None:
                    last.append((str(p["id"]), int(p["batchId"])))
            with self.done:
                return self.done.wait_for(lambda: self.printed.issuperset(last), timeout)

        def onQueryIdle(self, event: Any) -> None:
            """An idle query has no micro-batch to report."""

        def onQueryTerminated(self, event: Any) -> None:
            """The summary after the run says how each query ended."""

    return _Printer()
