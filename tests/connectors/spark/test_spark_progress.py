"""What `reactive run --runner spark` prints per micro-batch, from Spark's progress reports:
the source records a micro-batch read are counted by its offsets (the source's reader hands
Spark its first chain's rows, so Spark's numInputRows counts those), the marker once."""

from __future__ import annotations

import json
from typing import Any

from reactive.connectors.spark.progress import progress_line
from reactive.connectors.spark.runner import batch_records


def report(batch: int, start: Any, end: Any, rows: int, millis: int,
           state: list[dict[str, int]] | None = None) -> dict[str, Any]:
    return {"name": "results-sink", "batchId": batch, "numInputRows": rows,
            "durationMs": {"triggerExecution": millis},
            "sources": [{"startOffset": start, "endOffset": end, "numInputRows": rows}],
            "stateOperators": state or []}


def test_records_come_from_the_offsets_and_the_marker_counts_once() -> None:
    first = report(0, None, {"file": 0, "pos": 900, "line": 101, "seq": 100, "done": False},
                   rows=37, millis=2000)
    # Spark writes an offset it cannot parse as JSON as a string
    last = report(1, json.dumps({"file": 0, "pos": 900, "line": 101, "seq": 100,
                                 "done": False}),
                  {"file": 1, "pos": 0, "line": 1, "seq": 150, "done": True}, rows=3,
                  millis=500)
    after = report(2, {"index": 7, "done": True}, {"index": 7, "done": True}, rows=0,
                   millis=100)
    assert [batch_records(p) for p in (first, last, after)] == [100, 51, 0]
    # another source (no reactive offsets): Spark's own count
    assert batch_records(report(0, None, {"logOffset": 3}, rows=12, millis=1)) == 12


def test_a_line_says_records_rate_and_state() -> None:
    p = report(3, {"index": 0, "done": False}, {"index": 200_000, "done": False}, rows=5,
               millis=4000, state=[{"numRowsTotal": 1234, "memoryUsedBytes": 56_789}])
    assert progress_line(p) == ("query results-sink: micro-batch 3, 200,000 records in 4.0 s "
                                "(50,000 records/s), state 1,234 rows (56,789 bytes)")
    stateless = report(0, None, {"index": 10, "done": False}, rows=10, millis=0)
    assert progress_line(stateless) == ("query results-sink: micro-batch 0, 10 records in "
                                        "0.0 s (- records/s)")
