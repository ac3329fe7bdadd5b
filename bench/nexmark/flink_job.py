"""The Flink anchor's job runner: run in the separate virtual environment that
``python -m bench.nexmark --anchor flink`` creates (it imports pyflink, never reactive).

    <venv>/bin/python flink_job.py EVENTS.jsonl EMPTY.jsonl N WORKDIR

It reads requests ``QUERY BACKEND`` from standard input, one a line, and answers each with
one JSON line, so the benchmark interleaves Flink's runs with its own in one JVM. A request
runs the query's SQL on Flink at parallelism 1 (state backend ``hashmap`` or ``rocksdb``
incremental) with exactly-once checkpoints every second, reading the event file that
:func:`reactive.connectors.nexmark.files.write_events` wrote (Flink nexmark's table
layout: ``event_type`` and a ``person`` / ``auction`` / ``bid`` row, watermark 4 s behind
``dateTime``, as Flink nexmark's DDL) into a blackhole sink, over the event file and over a
one-event file (the job's fixed start and stop cost, subtracted). The answer holds both
wall times and both CPU times: the JVM's (user + system time of all its threads, from
``/proc/<pid>/stat``: task, JIT, GC and checkpoint threads) plus this Python process's.
One warm-up job runs first; a line ``{"ready": true}`` says it is done.

The SQL texts state the Nexmark queries in Flink SQL's window table functions (q0-q5, q7,
q8 as described in ``bench/nexmark/queries.py``); they are written for this benchmark.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

SOURCE_DDL = """
CREATE TABLE events (
    event_type INT,
    person ROW<id BIGINT, name VARCHAR, emailAddress VARCHAR, creditCard VARCHAR,
               city VARCHAR, state VARCHAR, dateTime TIMESTAMP(3), extra VARCHAR>,
    auction ROW<id BIGINT, itemName VARCHAR, description VARCHAR, initialBid BIGINT,
                reserve BIGINT, dateTime TIMESTAMP(3), expires TIMESTAMP(3), seller BIGINT,
                category BIGINT, extra VARCHAR>,
    bid ROW<auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR,
            dateTime TIMESTAMP(3), extra VARCHAR>,
    dateTime AS CASE WHEN event_type = 0 THEN person.dateTime
                     WHEN event_type = 1 THEN auction.dateTime
                     ELSE bid.dateTime END,
    WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND
) WITH ('connector' = 'filesystem', 'path' = '{path}', 'format' = 'json')
"""

VIEWS = [
    """CREATE TEMPORARY VIEW person AS SELECT person.id AS id, person.name AS name,
       person.city AS city, person.state AS state, dateTime, person.extra AS extra
       FROM events WHERE event_type = 0""",
    """CREATE TEMPORARY VIEW auction AS SELECT auction.id AS id, auction.itemName AS itemName,
       auction.initialBid AS initialBid, auction.reserve AS reserve, dateTime,
       auction.expires AS expires, auction.seller AS seller, auction.category AS category,
       auction.extra AS extra FROM events WHERE event_type = 1""",
    """CREATE TEMPORARY VIEW bid AS SELECT bid.auction AS auction, bid.bidder AS bidder,
       bid.price AS price, bid.channel AS channel, bid.url AS url, dateTime,
       bid.extra AS extra FROM events WHERE event_type = 2""",
]

# (sink columns, query)
QUERIES = {
    "q0": ("auction BIGINT, bidder BIGINT, price BIGINT, dateTime TIMESTAMP(3), extra VARCHAR",
           "SELECT auction, bidder, price, dateTime, extra FROM bid"),
    "q1": ("auction BIGINT, bidder BIGINT, price DECIMAL(23, 3), dateTime TIMESTAMP(3), "
           "extra VARCHAR",
           "SELECT auction, bidder, 0.908 * price, dateTime, extra FROM bid"),
    "q2": ("auction BIGINT, price BIGINT",
           "SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0"),
    "q3": ("name VARCHAR, city VARCHAR, state VARCHAR, id BIGINT",
           """SELECT p.name, p.city, p.state, a.id
              FROM auction AS a JOIN person AS p ON a.seller = p.id
              WHERE a.category = 10 AND p.state IN ('OR', 'ID', 'CA')"""),
    "q4": ("category BIGINT, average BIGINT",
           """SELECT category, AVG(final) FROM (
                SELECT a.id, a.category, MAX(b.price) AS final
                FROM auction AS a JOIN bid AS b ON a.id = b.auction
                WHERE b.dateTime BETWEEN a.dateTime AND a.expires
                GROUP BY a.id, a.category) GROUP BY category"""),
    "q5": ("auction BIGINT, num BIGINT",
           """SELECT c.auction, c.num FROM (
                SELECT auction, COUNT(*) AS num, window_start, window_end
                FROM TABLE(HOP(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '2' SECOND,
                               INTERVAL '10' SECOND))
                GROUP BY auction, window_start, window_end) AS c
              JOIN (
                SELECT MAX(num) AS top, window_start, window_end FROM (
                  SELECT COUNT(*) AS num, window_start, window_end
                  FROM TABLE(HOP(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '2' SECOND,
                                 INTERVAL '10' SECOND))
                  GROUP BY auction, window_start, window_end)
                GROUP BY window_start, window_end) AS m
              ON c.window_start = m.window_start AND c.window_end = m.window_end
                 AND c.num >= m.top"""),
    "q7": ("auction BIGINT, bidder BIGINT, price BIGINT, dateTime TIMESTAMP(3), extra VARCHAR",
           """SELECT b.auction, b.bidder, b.price, b.dateTime, b.extra
              FROM bid AS b JOIN (
                SELECT MAX(price) AS top, window_end
                FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '10' SECOND))
                GROUP BY window_start, window_end) AS w
              ON b.price = w.top
              WHERE b.dateTime BETWEEN w.window_end - INTERVAL '10' SECOND
                                   AND w.window_end"""),
    "q8": ("id BIGINT, name VARCHAR, starttime TIMESTAMP(3)",
           """SELECT p.id, p.name, p.window_start FROM (
                SELECT id, name, window_start, window_end
                FROM TABLE(TUMBLE(TABLE person, DESCRIPTOR(dateTime), INTERVAL '10' SECOND))
                GROUP BY id, name, window_start, window_end) AS p
              JOIN (
                SELECT seller, window_start, window_end
                FROM TABLE(TUMBLE(TABLE auction, DESCRIPTOR(dateTime), INTERVAL '10' SECOND))
                GROUP BY seller, window_start, window_end) AS a
              ON p.id = a.seller AND p.window_start = a.window_start
                 AND p.window_end = a.window_end"""),
}


def run(path: Path, query: str, backend: str, work: Path) -> float:
    """Wall time (s) of ``query`` over the event file ``path`` with ``backend``."""
    from pyflink.table import EnvironmentSettings, TableEnvironment

    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    conf = env.get_config()
    for key, value in {
        "parallelism.default": "1",
        "table.exec.resource.default-parallelism": "1",
        "execution.checkpointing.interval": "1 s",
        "execution.checkpointing.mode": "EXACTLY_ONCE",
        "state.backend.type": backend,
        "state.backend.incremental": "true",
        "state.checkpoints.dir": (work / "chk").resolve().as_uri(),
    }.items():
        conf.set(key, value)
    env.execute_sql(SOURCE_DDL.format(path=path.resolve().as_posix()))
    for view in VIEWS:
        env.execute_sql(view)
    columns, sql = QUERIES[query]
    env.execute_sql(f"CREATE TABLE sink_{query} ({columns}) WITH ('connector' = 'blackhole')")
    start = time.perf_counter()
    env.execute_sql(f"INSERT INTO sink_{query} {sql}").wait()
    return time.perf_counter() - start


_JVM_PID: list[int] = []


def cpu_seconds() -> float:
    """CPU seconds used so far by the JVM (every thread) and by this process."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = time.process_time()
    if _JVM_PID:
        with open(f"/proc/{_JVM_PID[0]}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return total


def timed(path: Path, query: str, backend: str, work: Path) -> tuple[float, float]:
    """Wall and CPU seconds of one run."""
    cpu = cpu_seconds()
    wall = run(path, query, backend, work)
    return wall, cpu_seconds() - cpu


def main() -> None:
    events, empty, n = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    work = Path(sys.argv[4])
    run(empty, "q0", "hashmap", work)  # the JVM's and the planner's first job: warm-up
    if os.path.exists("/proc/self/stat"):
        from pyflink.java_gateway import get_gateway

        _JVM_PID.append(int(get_gateway().jvm.java.lang.ProcessHandle.current().pid()))
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        query, backend = line.split()
        fixed, fixed_cpu = timed(empty, query, backend, work)
        wall, cpu = timed(events, query, backend, work)
        print(json.dumps({"query": query, "backend": backend, "wall": wall, "fixed": fixed,
                          "cpu": cpu, "fixed_cpu": fixed_cpu,
                          "rate": n / max(wall - fixed, 1e-9),
                          "cpu_rate": n / max(cpu - fixed_cpu, 1e-9)}), flush=True)


if __name__ == "__main__":
    main()
