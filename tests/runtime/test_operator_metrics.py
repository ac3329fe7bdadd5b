"""Operator metrics are keyed by uid: two operators of the same name (two ``.map()`` steps)
report separate series, in ``job.metrics`` and in the Prometheus text."""

from __future__ import annotations

import asyncio
import collections
import urllib.request

import pytest

from reactive import Dataflow
from reactive.connectors.collections import ListSink


def _flow(named: bool) -> tuple[Dataflow, ListSink]:
    out = ListSink()
    flow = Dataflow("labels", parallelism=1)
    stream = flow.from_collection(list(range(1000)))
    first = stream.map(lambda x: x + 1)
    if named:
        first = first.uid("plus-one")
    second = first.map(lambda x: x * 2)
    if named:
        second = second.uid("times-two")
    second.filter(lambda x: x % 4 == 0).uid("quarter").sink(out)
    return flow, out


async def test_two_maps_are_two_operators_in_job_metrics():
    flow, out = _flow(named=True)
    job = await flow.run()
    assert len(out.records) == 500
    ops = job.metrics.operators
    assert ops["plus-one"] == {"records_in": 1000, "records_out": 1000}
    assert ops["times-two"] == {"records_in": 1000, "records_out": 1000}
    assert ops["quarter"] == {"records_in": 1000, "records_out": 500}
    names = job.metrics.operator_names
    assert names["plus-one"] == names["times-two"] == "map"
    # the per-name view adds operators that share a name
    assert job.metrics.by_name()["map"] == {"records_in": 2000, "records_out": 2000}


async def test_without_uids_the_generated_ones_keep_them_apart():
    flow, _ = _flow(named=False)
    job = await flow.run()
    maps = [uid for uid, name in job.metrics.operator_names.items() if name == "map"]
    assert len(maps) == 2
    assert [job.metrics.operators[uid]["records_in"] for uid in maps] == [1000, 1000]


async def test_the_prometheus_text_has_one_series_per_uid_with_the_name_as_a_label():
    parser = pytest.importorskip("prometheus_client.parser")
    from reactive.metrics_exporter import serve_metrics

    flow, _ = _flow(named=True)
    job = await flow.run()
    server = serve_metrics(job, port=0)
    try:
        text = await asyncio.to_thread(
            lambda: urllib.request.urlopen(server.url, timeout=30).read().decode())
    finally:
        await asyncio.to_thread(server.close)
    samples = [s for family in parser.text_string_to_metric_families(text)
               for s in family.samples]
    keys = [(s.name, tuple(sorted(s.labels.items()))) for s in samples]
    assert not [k for k, n in collections.Counter(keys).items() if n > 1]  # valid: unique
    records_in = {(s.labels["operator"], s.labels["name"]): s.value for s in samples
                  if s.name == "reactive_operator_records_in_total"}
    assert records_in[("plus-one", "map")] == 1000
    assert records_in[("times-two", "map")] == 1000
    assert records_in[("quarter", "filter")] == 1000
