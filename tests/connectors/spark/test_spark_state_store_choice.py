"""The state store a query gets by default (``SparkRunner(state_store="auto")``): Spark's
in-memory (HDFS-backed) store for a native window, whose state the watermark bounds; RocksDB
for a keyed operator run in Python (``transformWithState`` needs it); the user's choice
otherwise. Spark keeps the provider in the query's offset log, where it is read back."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reactive import Dataflow, TumblingEventTimeWindows
from reactive.connectors.files import CommittingFileSink
from reactive.connectors.spark import SparkRunner, list_part_files
from reactive.connectors.spark.runner import ROCKSDB_PROVIDER, STATE_STORE_PROVIDER
from reactive.windowing.aggregates import Aggregates, count
from tests.support import Count, pickled_by_value

EVENTS = [(f"k{i % 3}", 1000.0 + i, i) for i in range(120)]


@pytest.fixture(scope="module")
def spark(spark: Any) -> Iterator[Any]:
    """The test session's SparkSession; the workers unpickle this module's functions by value."""
    with pickled_by_value(__name__):
        yield spark


def native_counts(out: Path) -> Dataflow:
    flow = Dataflow("stores", parallelism=2)
    (flow.from_collection(EVENTS).assign_timestamps(lambda e: e[1], max_out_of_orderness=2.0)
         .key_by(lambda e: e[0]).window(TumblingEventTimeWindows.of(10.0))
         .aggregate(Aggregates(count()), name="counts").uid("counts")
         .map(lambda w: [w.key, w.start, w.value[0]])
         .sink(CommittingFileSink(out)).uid("out"))
    return flow


def python_counts(out: Path) -> Dataflow:
    flow = Dataflow("stores", parallelism=2)
    (flow.from_collection([e[0] for e in EVENTS]).key_by(lambda w: w).process(Count())
         .uid("count").sink(CommittingFileSink(out)).uid("out"))
    return flow


def provider(checkpoints: Path) -> str | None:
    """The state store provider the query ran with, from its first offset-log entry."""
    lines = (checkpoints / "stores" / "out" / "offsets" / "0").read_text().splitlines()
    return json.loads(lines[1])["conf"].get(STATE_STORE_PROVIDER)


def committed(directory: Path) -> list[Any]:
    return sorted(json.loads(line) for p in list_part_files(directory)
                  for line in p.path.read_text(encoding="utf-8").splitlines() if line)


def test_a_native_window_runs_on_the_in_memory_store_by_default(
        spark: Any, tmp_path: Path) -> None:
    job = SparkRunner(spark, tmp_path / "chk").run(native_counts(tmp_path / "out"))
    assert STATE_STORE_PROVIDER not in job.settings
    assert provider(tmp_path / "chk") != ROCKSDB_PROVIDER
    assert "HDFSBackedStateStoreProvider" in str(provider(tmp_path / "chk"))
    # every event counted once, in its 10 s window
    expected = sorted([k, float(s), sum(1 for e in EVENTS if e[0] == k
                                        and s <= e[1] < s + 10)]
                      for k in ("k0", "k1", "k2") for s in range(1000, 1120, 10))
    assert committed(tmp_path / "out") == expected


def test_rocksdb_when_chosen_or_when_a_keyed_operator_runs_in_python(
        spark: Any, tmp_path: Path) -> None:
    job = SparkRunner(spark, tmp_path / "native", state_store="rocksdb").run(
        native_counts(tmp_path / "native-out"))
    assert job.settings[STATE_STORE_PROVIDER] == ROCKSDB_PROVIDER
    assert provider(tmp_path / "native") == ROCKSDB_PROVIDER
    job = SparkRunner(spark, tmp_path / "python").run(python_counts(tmp_path / "python-out"))
    assert job.settings[STATE_STORE_PROVIDER] == ROCKSDB_PROVIDER
    assert provider(tmp_path / "python") == ROCKSDB_PROVIDER


def test_an_unknown_state_store_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'rocksdb', 'default' or 'auto'"):
        SparkRunner(None, tmp_path, state_store="memory")  # type: ignore[arg-type]
