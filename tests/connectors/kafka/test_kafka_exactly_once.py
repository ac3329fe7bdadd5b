"""Kafka -> keyed count -> Kafka exactly once, against librdkafka's mock cluster (a real
Kafka protocol peer on a local port, see ``tests/kafka_cluster.py``): in process, then with
SIGKILL of the job's process at seeded moments (including between checkpoint completion and
the Kafka commit, and inside an open Kafka transaction) and restarts at other parallelisms.
The output is read committed from the raw record batches (the mock ignores isolation
levels) and must hold every expected record exactly once."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from reactive.connectors.kafka import read_committed
from tests.kafka_cluster import CLIENT_OPTIONS, MockKafkaCluster
from tests.pipelines import kafka_count_job as job

SCRIPT = Path(job.__file__)
ROOT = SCRIPT.parents[2]
VOCABULARY = 300


def words(n: int, seed: int) -> list[str]:
    rnd = random.Random(seed)
    weights = [1.0 / (i + 1) ** 1.1 for i in range(VOCABULARY)]
    return [f"w{i}" for i in rnd.choices(range(VOCABULARY), weights=weights, k=n)]


def produce_words(cluster: MockKafkaCluster, topic: str, items: list[str]) -> None:
    """Spread the words over the topic's 4 partitions (round robin)."""
    cluster.produce(topic, ((None, w.encode(), i % 4, None) for i, w in enumerate(items)))


def expected(items: list[str]) -> collections.Counter[tuple[str, int]]:
    """The batch result: ``(word, i)`` once for i in 1..count(word)."""
    counts = collections.Counter(items)
    return collections.Counter((w, i) for w, c in counts.items() for i in range(1, c + 1))


async def committed_output(cluster: MockKafkaCluster, topic: str
                           ) -> collections.Counter[tuple[str, int]]:
    records = await read_committed(cluster.bootstrap_servers, topic, CLIENT_OPTIONS)
    assert records, "no committed output"
    # the mock drops the oldest data past a few MB per partition: nothing may be dropped here
    assert set(cluster.lowest_offsets(topic).values()) == {0}
    out: collections.Counter[tuple[str, int]] = collections.Counter()
    for r in records:
        word, n = json.loads(r.value or b"null")
        assert r.key == word.encode()
        out[(word, n)] += 1
    return out


async def test_kafka_to_kafka_in_process_is_exact(kafka_cluster, tmp_path):
    items = words(5_000, seed=1)
    produce_words(kafka_cluster, "eo-in-1", items)
    flow = job.build(kafka_cluster.bootstrap_servers, "eo-in-1", "eo-out-1", parallelism=3)
    from reactive import CheckpointConfig

    await flow.run(checkpoints=CheckpointConfig(interval=0.05, directory=str(tmp_path)))
    assert await committed_output(kafka_cluster, "eo-out-1") == expected(items)


def kill_schedule(seed: int) -> list[tuple[str, int]]:
    """Seeded kill points, each with the parallelism of the run it kills: between completion
    and the Kafka commit (and again in the recovery's commits), inside an open Kafka
    transaction, right after a Kafka commit, after a pre-commit, at records."""
    rnd = random.Random(seed)
    return [
        (f"commit:{rnd.randint(1, 3)}", rnd.choice((1, 2, 3))),
        (f"midcommit:{rnd.randint(1, 3)}", rnd.choice((1, 2, 3))),
        (f"commit:{rnd.randint(1, 2)}", rnd.choice((1, 2, 3))),
        (f"committed:{rnd.randint(1, 3)}", rnd.choice((1, 2, 3))),
        (f"precommit:{rnd.randint(1, 4)}", rnd.choice((1, 2, 3))),
        (f"record:{rnd.randint(500, 12_000)}", rnd.choice((1, 2, 3))),
    ]


def run_until_done(cluster: MockKafkaCluster, topics: tuple[str, str], chk: Path,
                   schedule: list[tuple[str, int]], log: Path) -> list[int]:
    """Run the job once per kill point (each at its parallelism), then without a kill at
    parallelism 2, until it exits 0; returns the exit codes."""
    codes: list[int] = []
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REACTIVE_TEST_KILL_LOG": str(log)}
    for kill, parallelism in [*schedule, ("none:0", 2)]:
        proc = subprocess.run(
            [sys.executable, str(SCRIPT), cluster.bootstrap_servers, *topics, str(chk),
             str(parallelism)],
            env={**env, "REACTIVE_TEST_KILL": kill}, capture_output=True, text=True,
            timeout=120, check=False)
        codes.append(proc.returncode)
        assert proc.returncode in (0, -signal.SIGKILL), proc.stderr[-3000:]
        if proc.returncode == 0:
            break
    assert codes[-1] == 0, "the job did not finish after the last kill"
    return codes


def _sigkill_run(cluster: MockKafkaCluster, tmp_path: Path, seed: int) -> None:
    items = words(15_000, seed=seed)
    topics = (f"kill-in-{seed}", f"kill-out-{seed}")
    produce_words(cluster, topics[0], items)
    schedule = kill_schedule(seed)
    log = tmp_path / "kills.log"
    codes = run_until_done(cluster, topics, tmp_path / "chk", schedule, log)
    kills = log.read_text().split() if log.exists() else []
    assert kills == [k for k, _ in schedule][: len(kills)]
    # the kills between completion and commit, in an open transaction and after a commit
    # need only a few checkpoints: they always happen
    assert codes.count(-signal.SIGKILL) == len(kills) >= 4
    assert asyncio.run(committed_output(cluster, topics[1])) == expected(items)


@pytest.mark.e2e
@pytest.mark.parametrize("seed", [1, 2])
def test_sigkill_at_seeded_moments_and_rescaling_write_every_record_once(
        kafka_cluster, tmp_path, seed):
    _sigkill_run(kafka_cluster, tmp_path, seed)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3, 13))
def test_sigkill_many_seeds(kafka_cluster, tmp_path, seed):
    _sigkill_run(kafka_cluster, tmp_path, seed)


