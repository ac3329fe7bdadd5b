"""The Spark runner sized to the dataflow: a keyed query's shuffle partitions (Spark's state
store partitions) follow the dataflow's parallelism unless the user chose them; a user's
own SparkSession is left as it was, and the runner says what it gave the queries."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reactive import Dataflow
from reactive.connectors.files import CommittingFileSink
from reactive.connectors.spark import SparkRunner, local_session
from reactive.connectors.spark.key_group_plan import KEY_GROUP_SHAPE
from reactive.connectors.spark.runner import (
    SHUFFLE_PARTITIONS,
    SIZED_BY_DEFAULT,
    shuffle_partitions_for,
)
from tests.support import Count, pickled_by_value

WORDS = [f"w{i % 7}" for i in range(60)]


@pytest.fixture(scope="module")
def spark(spark: Any) -> Iterator[Any]:
    """The test session's SparkSession; the workers unpickle this module's functions by value."""
    with pickled_by_value(__name__):
        yield spark


@pytest.fixture
def users_session(spark: Any) -> Any:
    """A session as a user builds it: Spark's defaults, nothing about partitions set."""
    own = spark.newSession()
    own.conf.unset(SHUFFLE_PARTITIONS)
    own.conf.unset(SIZED_BY_DEFAULT)
    assert own.conf.get(SHUFFLE_PARTITIONS) == "200"
    return own


def keyed_count(out: Path, parallelism: int, max_parallelism: int = 128) -> Dataflow:
    flow = Dataflow("sized", parallelism=parallelism, max_parallelism=max_parallelism)
    (flow.from_collection(WORDS).key_by(lambda w: w).process(Count()).uid("count")
         .sink(CommittingFileSink(out)).uid("out"))
    return flow


def query_partitions(checkpoints: Path) -> int:
    """The shuffle partitions a query ran with, from its first offset-log entry (Spark
    keeps them there: a stateful query's partitioning is fixed for good)."""
    lines = (checkpoints / "sized" / "out" / "offsets" / "0").read_text().splitlines()
    return int(json.loads(lines[1])["conf"][SHUFFLE_PARTITIONS])


def test_partitions_follow_the_parallelism_in_a_users_session(
        users_session: Any, tmp_path: Path, caplog: Any) -> None:
    caplog.set_level(logging.INFO, logger="reactive.connectors.spark.runner")
    job = SparkRunner(users_session, tmp_path / "chk").run(keyed_count(tmp_path / "out", 3))
    assert query_partitions(tmp_path / "chk") == 3
    assert job.settings[SHUFFLE_PARTITIONS] == "3"
    # the user's session is as it was, and the log said what the queries got instead
    assert users_session.conf.get(SHUFFLE_PARTITIONS) == "200"
    said = [r.getMessage() for r in caplog.records if SHUFFLE_PARTITIONS in r.getMessage()]
    assert said and "=3" in said[0] and "Spark's default" in said[0]
    # what `reactive run --runner spark` prints per query
    summary = job.summary()["out"]
    assert summary["shape"] == KEY_GROUP_SHAPE  # a count without timers: one call per key group
    assert summary["input_rows"] == len(WORDS) + 1  # and the end-of-input marker
    assert summary["micro_batches"] >= 1 and summary["rows_per_second"] > 0
    assert summary["state_rows"] >= len(set(WORDS))  # a count per word, at least


def test_partitions_the_user_set_are_kept(users_session: Any, tmp_path: Path) -> None:
    users_session.conf.set(SHUFFLE_PARTITIONS, "5")
    job = SparkRunner(users_session, tmp_path / "chk").run(keyed_count(tmp_path / "out", 3))
    assert query_partitions(tmp_path / "chk") == 5
    assert SHUFFLE_PARTITIONS not in job.settings
    # and the runner's own argument wins over both
    job = SparkRunner(users_session, tmp_path / "chk2", shuffle_partitions=1).run(
        keyed_count(tmp_path / "out2", 3))
    assert query_partitions(tmp_path / "chk2") == 1


def test_local_session_without_a_choice_lets_the_runner_size(spark: Any, tmp_path: Path) -> None:
    # the test session's SparkSession, as local_session() gives it when nobody chose
    spark = local_session("local[2]", app_name="reactive-spark-sizing")
    try:
        SparkRunner(spark, tmp_path / "chk").run(keyed_count(tmp_path / "out", 3))
        assert query_partitions(tmp_path / "chk") == 3
    finally:  # as the module's session had them
        spark.conf.set(SHUFFLE_PARTITIONS, "2")
        spark.conf.set(SIZED_BY_DEFAULT, "chosen")


def test_shuffle_partitions_for_is_the_keyed_parallelism_up_to_max_parallelism() -> None:
    assert shuffle_partitions_for(keyed_count(Path("/x"), 3)) == 3
    assert shuffle_partitions_for(keyed_count(Path("/x"), 8, max_parallelism=4)) == 4
    flow = Dataflow("stateless", parallelism=2)
    flow.from_collection([1]).map(str).sink(CommittingFileSink("/x"))
    assert shuffle_partitions_for(flow) == 2
    flow = Dataflow("one-keyed-at-6", parallelism=2)
    (flow.from_collection([1]).key_by(str).process(Count()).set_parallelism(6)
         .sink(CommittingFileSink("/x")))
    assert shuffle_partitions_for(flow) == 6
