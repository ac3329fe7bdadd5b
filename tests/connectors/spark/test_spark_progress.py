"""What `reactive run --runner spark` prints per micro-batch, from Spark's progress reports:
the source records a micro-batch read are counted by its offsets (the source's reader hands
Spark its first chain's rows, so Spark's numInputRows counts those), the marker once; and
no line of what PySpark's Python workers print about themselves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

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


def test_the_jvm_output_filter_drops_worker_prints_and_start_up_notes_only() -> None:
    import os

    from reactive.connectors.spark.jvm_output import JvmOutputFilter

    jvm_read, jvm_write = os.pipe()
    console_read, console_write = os.pipe()
    lines = [b"WARNING: Using incubator modules: jdk.incubator.vector\n",
             b"26/11/28 01:09:23 WARN Utils: Your hostname resolves to a loopback address\n",
             b"Starting Streaming TransformWithStateInPandas Python worker.\n", b"\n",
             b"a user's print\n"]
    later = [b"Streaming TransformWithStateInPandas Python worker Starting execution of "
             b"UDF: <bound method ...>.\n", b"\n",
             b"26/11/28 01:11:49 ERROR StreamingQueryListenerBus: Listener threw\n",
             b"26/11/28 01:11:50 WARN a warning once the session runs\n", b"\n",
             b"\tat py4j.CallbackClient.sendCommand(CallbackClient.java:397)\n"]
    with open(jvm_read, "rb") as pipe:
        out = JvmOutputFilter(pipe, console=console_write)
        os.write(jvm_write, b"".join(lines))
        while out.dropped < 4:  # what was written before the session started is judged
            os.sched_yield()
        out.session_started()
        os.write(jvm_write, b"".join(later))
        os.close(jvm_write)
        out.join()
    os.close(console_write)
    with open(console_read, "rb") as console:
        shown = console.read()
    assert shown == (b"a user's print\n"
                     b"26/11/28 01:11:49 ERROR StreamingQueryListenerBus: Listener threw\n"
                     b"26/11/28 01:11:50 WARN a warning once the session runs\n\n"
                     b"\tat py4j.CallbackClient.sendCommand(CallbackClient.java:397)\n")


KEYED_COUNT = '''
from reactive import Dataflow
from reactive.connectors.files import CommittingFileSink

flow = Dataflow("counts", parallelism=2)
(flow.from_collection([f"w{i % 7}" for i in range(300)])
     .key_by(lambda w: w).reduce(lambda a, b: a + b).uid("sum")
     .sink(CommittingFileSink(OUT)).uid("out"))
'''


@pytest.mark.e2e
def test_reactive_run_on_spark_prints_progress_and_no_worker_lines(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    program = tmp_path / "counts.py"
    program.write_text(KEYED_COUNT.replace("OUT", repr(str(tmp_path / "out"))))
    done = subprocess.run(
        [sys.executable, "-m", "reactive", "run", str(program), "--runner", "spark",
         "--checkpoint-dir", str(tmp_path / "chk")],
        capture_output=True, text=True, timeout=900, check=False,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    assert done.returncode == 0, done.stderr[-3000:]
    # the reduce runs in Python (transformWithState), whose driver worker prints about
    # itself each time the query starts: none of it reaches the console (a restart after
    # a worker that did not connect back in time logs Spark's error, which stays)
    chatter = [line for line in done.stderr.splitlines()
               if "Streaming TransformWithStateInPandas Python worker" in line]
    assert chatter == [], done.stderr[-3000:]
    # the last progress report reached the listener before it was removed
    assert "Listener PythonStreamingQueryListenerWrapper threw" not in done.stderr
    printed = done.stdout.splitlines()
    batches = [line for line in printed if line.startswith("query out: micro-batch ")]
    summary = [line for line in printed if line.startswith("  query of sink out")]
    assert len(summary) == 1 and "transformWithState" in summary[0]
    # a line per micro-batch, the last included, which read the end-of-input marker
    micro_batches = int(summary[0].split(": ")[1].split(" micro-batches")[0])
    assert [int(line.split(",")[0].rsplit(" ", 1)[1]) for line in batches] == \
        list(range(micro_batches))
    assert sum(int(line.split(", ")[1].split(" records")[0].replace(",", ""))
               for line in batches) == 301  # every record and the marker
    assert "state 7 rows" in batches[-1]
