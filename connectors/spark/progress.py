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
from collections.abc import Callable
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
        the listener (its class derives from PySpark's, imported only here).
    """
    from pyspark.sql.streaming.listener import StreamingQueryListener

    class _Printer(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            """Nothing to say before the first micro-batch."""

        def onQueryProgress(self, event: Any) -> None:
            write(progress_line(json.loads(event.progress.json)))

        def onQueryIdle(self, event: Any) -> None:
            """An idle query has no micro-batch to report."""

        def onQueryTerminated(self, event: Any) -> None:
            """The summary after the run says how each query ended."""

    return _Printer()
