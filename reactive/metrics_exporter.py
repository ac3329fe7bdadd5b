"""A job's metrics in the Prometheus text format, over HTTP (the ``metrics`` extra).

``serve_metrics(job)`` starts ``prometheus_client``'s own HTTP server (a daemon thread) with a
registry of its own holding one collector. The collector reads ``job.metrics`` only when
Prometheus scrapes: nothing is counted per record beyond what the runtime already counts.
The figures are read on the job's event loop (the collector posts a callback to it and waits
for the result), so a scrape sees one consistent snapshot and never races the tasks; what it
copies there is bounded (the running totals and the bounded checkpoint history), however
long the job has run. Counters come from the totals, so they never go down.

Exported (``reactive_`` prefix)::

    operator_records_in_total{operator,name} counter, summed over instances and attempts;
                                             operator is the uid (one series per operator,
                                             also when two share a name), name its name
    operator_records_out_total{operator,name} counter
    operator_state_entries{operator,name}    gauge, entries in its keyed state now (the
                                             backends' estimate, no pass over the keys)
    operator_state_expired_total{operator,name} counter, TTL entries removed (on access,
                                             in a sweep)
    operator_checkpoint_state_bytes{operator,name} gauge, its keyed state's files in the
                                             latest completed checkpoint (shared included)
    operator_checkpoint_ttl_dropped{operator,name} gauge, expired TTL entries that
                                             checkpoint left out
    channel_queued_items{channel}            gauge, items queued now (sampled at scrape)
    channel_capacity_items{channel}          gauge
    channel_fill_ratio{channel}              gauge, queued / capacity (1.0: backpressure)
    channel_max_queued_items                 gauge, the most ever queued in one channel
    checkpoints_total{status}                counter, status completed | aborted
    checkpoints_in_progress                  gauge
    checkpoint_failures_total{reason}        counter, CheckpointFailureReason names
    checkpoint_alignment_seconds{stat}       gauge, stat last | median (completed ones the
                                             history keeps, CheckpointConfig.history)
    checkpoint_sync_seconds{stat}            gauge
    checkpoint_async_seconds{stat}           gauge
    checkpoint_duration_seconds{stat}        gauge
    checkpoint_size_bytes{stat}              gauge
    completed_checkpoint_duration_seconds_total  counter, summed over all completed ones
    completed_checkpoint_size_bytes_total    counter, summed over all completed ones
    last_checkpoint_id                       gauge, the latest completed checkpoint
    last_checkpoint_timestamp_seconds        gauge, when it completed (Unix time)
    job_restarts_total                       counter
    job_status{status}                       gauge, 1 for the current status, else 0
    job_info{name, run_id}                   gauge, always 1

Example::

    job = await flow.start(checkpoints=CheckpointConfig(directory="chk"))
    server = serve_metrics(job, port=9464)   # http://127.0.0.1:9464/metrics
    ...
    server.close()
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .checkpoint.stats import CheckpointTotals
from .extras import require

if TYPE_CHECKING:
    from .runtime.job import Job

__all__ = ["MetricsServer", "serve_metrics"]

_STATUSES = ("created", "running", "restarting", "finished", "failed", "cancelled", "stopped")


@dataclass(frozen=True)
class _Checkpoint:
    """The exported figures of one checkpoint (a copy of its ``CheckpointStats``)."""

    checkpoint_id: int
    status: str
    failure_reason: str | None
    alignment: float
    sync: float
    async_: float
    duration: float
    size: int
    end_time: float


@dataclass(frozen=True)
class _Snapshot:
    """Plain copies of a job's figures, taken in one go on the job's event loop."""

    name: str
    run_id: str
    status: str
    restarts: int
    operators: dict[str, tuple[str, int, int]]  # uid -> (name, in, out)
    state: dict[str, dict[str, int]]  # uid -> JobMetrics.operator_state()'s figures
    channels: dict[str, tuple[int, int]]
    max_channel_length: int
    checkpoints: list[_Checkpoint]
    totals: CheckpointTotals

    @classmethod
    def of(cls, job: Job) -> _Snapshot:
        m = job.metrics
        names = m.operator_names
        return cls(
            name=job.name,
            run_id=job.run_id,
            status=job.status,
            restarts=m.restarts,
            operators={uid: (names.get(uid, uid), v["records_in"], v["records_out"])
                       for uid, v in m.operators.items()},
            state=m.operator_state(),
            channels=m.channel_fill(),
            max_channel_length=m.max_channel_length,
            checkpoints=[
                _Checkpoint(c.checkpoint_id, c.status, c.failure_reason, c.alignment, c.sync,
                            c.async_, c.duration, c.size, c.trigger_time + c.duration)
                for c in list(m.checkpoints)
            ],
            totals=m.totals,
        )


class _JobCollector:
    """A ``prometheus_client`` collector that reads a job's metrics at scrape time.

    Args:
        job: the job.
        loop: the job's event loop (None: read directly, in the scraping thread).
        timeout: seconds a scrape waits for the loop to take the snapshot.
    """

    def __init__(self, job: Job, loop: asyncio.AbstractEventLoop | None, timeout: float) -> None:
        self._prom = require("prometheus_client.core", "metrics",
                             "the Prometheus metrics endpoint")
        self._job = job
        self._loop = loop
        self._timeout = timeout

    def _snapshot(self) -> _Snapshot:
        loop = self._loop
        if loop is None or loop.is_closed() or not loop.is_running():
            return _Snapshot.of(self._job)
        try:
            if asyncio.get_running_loop() is loop:
                return _Snapshot.of(self._job)  # scraped from the loop itself
        except RuntimeError:
            pass  # another thread (the HTTP server's): ask the loop
        result: concurrent.futures.Future[_Snapshot] = concurrent.futures.Future()

        def take() -> None:
            try:
                result.set_result(_Snapshot.of(self._job))
            except BaseException as exc:
                result.set_exception(exc)

        try:
            loop.call_soon_threadsafe(take)
        except RuntimeError:  # the loop closed meanwhile: nothing races us any more
            return _Snapshot.of(self._job)
        return result.result(timeout=self._timeout)

    def collect(self) -> Iterator[Any]:
        """Yield the metric families (called by the registry on every scrape)."""
        p = self._prom
        s = self._snapshot()

        records_in = p.CounterMetricFamily(
            "reactive_operator_records_in", "Records an operator received (all instances and "
            "attempts); operator is its uid.", labels=["operator", "name"])
        records_out = p.CounterMetricFamily(
            "reactive_operator_records_out", "Records an operator emitted (all instances and "
            "attempts); operator is its uid.", labels=["operator", "name"])
        for uid, (name, n_in, n_out) in sorted(s.operators.items()):
            records_in.add_metric([uid, name], n_in)
            records_out.add_metric([uid, name], n_out)
        yield records_in
        yield records_out

        families = [
            (p.GaugeMetricFamily, "reactive_operator_state_entries", "entries",
             "Entries in an operator's keyed state now (the backends' estimate)."),
            (p.CounterMetricFamily, "reactive_operator_state_expired", "expired",
             "Time-to-live entries an operator's state removed, on access or in a sweep."),
            (p.GaugeMetricFamily, "reactive_operator_checkpoint_state_bytes", "state_bytes",
             "Bytes of an operator's keyed state in the latest completed checkpoint."),
            (p.GaugeMetricFamily, "reactive_operator_checkpoint_ttl_dropped", "ttl_dropped",
             "Expired time-to-live entries the latest completed checkpoint left out."),
        ]
        for family, metric, field_, doc in families:
            f = family(metric, doc, labels=["operator", "name"])
            for uid, figures in sorted(s.state.items()):
                name = s.operators[uid][0] if uid in s.operators else uid
                f.add_metric([uid, name], figures[field_])
            yield f

        queued = p.GaugeMetricFamily("reactive_channel_queued_items",
                                     "Items (batches or events) queued in a channel now.",
                                     labels=["channel"])
        capacity = p.GaugeMetricFamily("reactive_channel_capacity_items",
                                       "A channel's capacity in items.", labels=["channel"])
        fill = p.GaugeMetricFamily("reactive_channel_fill_ratio",
                                   "Queued items over capacity (1: the producer waits).",
                                   labels=["channel"])
        for name, (n, cap) in sorted(s.channels.items()):
            queued.add_metric([name], n)
            capacity.add_metric([name], cap)
            fill.add_metric([name], n / cap if cap else 0.0)
        yield queued
        yield capacity
        yield fill
        yield p.GaugeMetricFamily("reactive_channel_max_queued_items",
                                  "The most items ever queued in one channel (all attempts).",
                                  value=s.max_channel_length)

        t = s.totals
        total = p.CounterMetricFamily("reactive_checkpoints", "Checkpoints and savepoints that "
                                      "ended, by status.", labels=["status"])
        total.add_metric(["aborted"], t.aborted)
        total.add_metric(["completed"], t.completed)
        yield total
        yield p.GaugeMetricFamily("reactive_checkpoints_in_progress",
                                  "Checkpoints triggered and not yet ended.",
                                  value=t.in_progress)
        failures = p.CounterMetricFamily("reactive_checkpoint_failures",
                                         "Aborted checkpoints by CheckpointFailureReason.",
                                         labels=["reason"])
        for reason, n in sorted(t.failures.items()):
            failures.add_metric([reason], n)
        yield failures
        yield p.CounterMetricFamily("reactive_completed_checkpoint_duration_seconds",
                                    "Trigger to completion, summed over every completed "
                                    "checkpoint.", value=t.duration)
        yield p.CounterMetricFamily("reactive_completed_checkpoint_size_bytes",
                                    "Bytes written, summed over every completed checkpoint.",
                                    value=t.size)

        done = [c for c in s.checkpoints if c.status == "completed"]
        costs: list[tuple[str, str, list[float]]] = [
            ("alignment_seconds", "Barrier alignment (max over tasks)",
             [c.alignment for c in done]),
            ("sync_seconds", "Synchronous snapshot part (max over tasks)", [c.sync for c in done]),
            ("async_seconds", "Asynchronous snapshot part (max over tasks)",
             [c.async_ for c in done]),
            ("duration_seconds", "Trigger to completion", [c.duration for c in done]),
            ("size_bytes", "Bytes written", [float(c.size) for c in done]),
        ]
        for suffix, what, values in costs:
            g = p.GaugeMetricFamily(f"reactive_checkpoint_{suffix}",
                                    f"{what} of the last completed checkpoint (stat=last) and "
                                    "the median over the completed ones of the history "
                                    "(stat=median).",
                                    labels=["stat"])
            if values:
                g.add_metric(["last"], values[-1])
                g.add_metric(["median"], statistics.median(values))
            yield g
        last = t.last_completed
        if last is not None:
            yield p.GaugeMetricFamily("reactive_last_checkpoint_id",
                                      "Id of the latest completed checkpoint.",
                                      value=last.checkpoint_id)
            yield p.GaugeMetricFamily("reactive_last_checkpoint_timestamp_seconds",
                                      "Unix time the latest completed checkpoint completed.",
                                      value=last.trigger_time + last.duration)

        yield p.CounterMetricFamily("reactive_job_restarts",
                                    "Restarts after a failure.", value=s.restarts)
        status = p.GaugeMetricFamily("reactive_job_status", "1 for the job's current status.",
                                     labels=["status"])
        for name in _STATUSES:
            status.add_metric([name], 1.0 if s.status == name else 0.0)
        yield status
        info = p.GaugeMetricFamily("reactive_job_info", "The job's name and run id.",
                                   labels=["name", "run_id"])
        info.add_metric([s.name, s.run_id], 1.0)
        yield info


class MetricsServer:
    """A running metrics endpoint (returned by :func:`serve_metrics`).

    Attributes:
        host: the address it is bound to.
        port: the port it listens on (the one chosen when 0 was asked for).
        url: ``http://host:port/metrics`` (any path serves the metrics).
        registry: its ``prometheus_client`` registry (holds only the job's collector).
    """

    def __init__(self, httpd: Any, thread: Any, host: str, registry: Any) -> None:
        self._httpd = httpd
        self._thread = thread
        self.host = host
        self.port: int = httpd.server_port
        self.registry = registry
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{self.port}/metrics"
        self._closed = False

    def close(self) -> None:
        """Stop serving and free the port (idempotent).

        Blocks for up to the server's poll interval (0.5 s); from a coroutine, use
        ``await asyncio.to_thread(server.close)`` to keep the loop free.
        """
        if self._closed:
            return
        self._closed = True
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve_metrics(job: Job, host: str = "127.0.0.1", port: int = 0,
                  timeout: float = 5.0) -> MetricsServer:
    """Serve ``job``'s metrics in the Prometheus text format over HTTP.

    Uses ``prometheus_client.start_http_server`` (a daemon thread). Call it from the job's
    event loop (after ``Dataflow.start``) so each scrape reads the metrics on that loop;
    called from elsewhere, scrapes read them directly from the server thread.

    Args:
        job: the job whose ``job.metrics`` to export.
        host: the address to bind; the default serves this machine only (``"0.0.0.0"``
            serves every interface, e.g. for a Prometheus in another container).
        port: the port; 0 picks a free one (see ``MetricsServer.port``).
        timeout: seconds a scrape waits for a busy event loop before failing (HTTP 500).

    Returns:
        the running server; ``close()`` it when done.

    Raises:
        MissingExtraError: when ``prometheus_client`` is not installed (``reactive[metrics]``).
        OSError: when the address cannot be bound.
    """
    prom = require("prometheus_client", "metrics", "the Prometheus metrics endpoint")
    try:
        loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    registry = prom.CollectorRegistry(auto_describe=False)
    registry.register(_JobCollector(job, loop, timeout))
    httpd, thread = prom.start_http_server(port, addr=host, registry=registry)
    return MetricsServer(httpd, thread, host, registry)
