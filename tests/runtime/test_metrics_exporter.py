"""The Prometheus endpoint serves a running job's metrics, read at scrape time."""

from __future__ import annotations

import asyncio
import sys
import urllib.request

import pytest

from reactive import CheckpointConfig, Dataflow
from reactive.connectors.collections import ListSink
from reactive.errors import MissingExtraError
from reactive.testing import TestingSource

parser = pytest.importorskip("prometheus_client.parser")


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in parser.text_string_to_metric_families(text) for s in family.samples}


def _scrape(url: str) -> tuple[int, str, str]:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return resp.status, resp.headers.get("Content-Type", ""), resp.read().decode()


async def test_a_running_job_is_scraped(tmp_path):
    from reactive.metrics_exporter import serve_metrics

    # records, then an open stream: the job runs until the test cancels it
    source = TestingSource([*range(2_000), TestingSource.HOLD], batch_size=10)
    flow = Dataflow("scraped")
    (flow.source(source, uid="src").rebalance()  # a channel between two tasks
         .map(lambda x: x + 1).uid("plus").sink(ListSink()))
    job = await flow.start(checkpoints=CheckpointConfig(interval=0.05, directory=tmp_path))
    server = serve_metrics(job, port=0)
    try:
        await source.wait_held()
        # the barrier follows the records: once it completes, every operator counted them
        await job.checkpoint()
        assert server.host == "127.0.0.1" and server.port > 0
        assert server.url == f"http://127.0.0.1:{server.port}/metrics"

        status, content_type, text = await asyncio.to_thread(_scrape, server.url)
        assert status == 200 and content_type.startswith("text/plain")
        samples = _samples(text)
        records_in = {dict(k[1])["operator"]: v for k, v in samples.items()
                      if k[0] == "reactive_operator_records_in_total"}
        records_out = {dict(k[1])["operator"]: v for k, v in samples.items()
                       if k[0] == "reactive_operator_records_out_total"}
        assert records_in and records_out
        assert sum(records_out.values()) > 0
        assert sum(records_in.values()) > 0
        # every operator but the source received records; the source emitted them
        assert sum(1 for v in records_in.values() if v > 0) >= 2
        assert samples[("reactive_checkpoints_total", (("status", "completed"),))] >= 1
        assert ("reactive_checkpoints_total", (("status", "aborted"),)) in samples
        assert samples[("reactive_last_checkpoint_id", ())] >= 1
        assert samples[("reactive_checkpoint_size_bytes", (("stat", "last"),))] > 0
        assert ("reactive_checkpoint_alignment_seconds", (("stat", "median"),)) in samples
        assert samples[("reactive_job_restarts_total", ())] == 0
        assert samples[("reactive_job_status", (("status", "running"),))] == 1
        fills = [v for k, v in samples.items() if k[0] == "reactive_channel_fill_ratio"]
        assert fills and all(0 <= v <= 1 for v in fills)

        # counters only grow between scrapes (read again at each scrape, never cached)
        await job.checkpoint()
        _, _, text2 = await asyncio.to_thread(_scrape, server.url)
        again = _samples(text2)
        assert (again[("reactive_checkpoints_total", (("status", "completed"),))]
                > samples[("reactive_checkpoints_total", (("status", "completed"),))])
    finally:
        await job.cancel()
        await asyncio.to_thread(server.close)
    with pytest.raises(OSError):
        await asyncio.to_thread(_scrape, server.url)


def test_a_missing_prometheus_client_names_the_extra(monkeypatch):
    from reactive.metrics_exporter import serve_metrics

    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(MissingExtraError, match=r"reactive\[metrics\]"):
        serve_metrics(object())  # type: ignore[arg-type]
