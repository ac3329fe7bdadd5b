"""The main job from Kafka to Kafka (``examples/flights.py --source kafka``): a slice of the
real data produced to librdkafka's mock cluster in the example's process, the job killed with
SIGKILL half way and restarted from its checkpoint, the committed results topic validated
exactly by Spark; and the example's refusals."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytest.importorskip("confluent_kafka", reason="the mock Kafka cluster needs confluent-kafka")
pytest.importorskip("aiokafka", reason="the Kafka connector needs aiokafka (the kafka extra)")

from tests.support import EXAMPLES, load_example

pytestmark = pytest.mark.e2e

EXAMPLE = EXAMPLES / "flights.py"


def test_flights_from_kafka_recovers_from_a_kill_and_validates_exactly(tmp_path):
    limit, malformed_every = 30_000, 1_000
    data = load_example("flights_data").prepare_flights(tmp_path / "flights.csv", limit=limit,
                                                malformed_every=malformed_every)
    # one more line that is not UTF-8: the source turns it into a dead letter
    lines = data.read_bytes().splitlines(keepends=True)
    lines[500] = lines[500].replace(b",", b"\xff,", 1)
    data.write_bytes(b"".join(lines))
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--source", "kafka", "--limit", str(limit),
         "--crash-at", "0.5", "--interval", "0.2", "--data", str(data),
         "--output", str(tmp_path / "out"), "--checkpoint-dir", str(tmp_path / "chk")],
        capture_output=True, text=True, timeout=600,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert f"Kafka: {limit:,} records produced to topic 'flights' (4 partitions" in out
    assert "crash: killing the job's process at record 15,000" in out
    assert "restarting from the latest completed checkpoint" in out
    assert re.search(r"OK: exactly-once holds: ([\d,]+) rows match the \1 expected", out)
    assert "crashes: 1" in out
    # every malformed row, and the line that is not UTF-8, reached the dead-letter topic,
    # exactly once across the crash
    dead = limit // malformed_every + 1
    assert re.search(rf"Kafka: [\d,]+ window results committed to 'flights-hourly-delays', "
                     rf"{dead} dead letters", out)
    assert f"dead letters committed: {dead}" in out
    assert not list(tmp_path.glob("out/part-*")), "the kafka variant writes no part files"


def test_resume_is_refused_for_kafka(tmp_path):
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--source", "kafka", "--resume",
                           "--checkpoint-dir", str(tmp_path / "chk")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--resume cannot continue a --source kafka run" in proc.stderr


def test_a_topic_the_mock_cluster_truncated_fails_loudly():
    flights_kafka = load_example("flights_kafka")
    cluster = flights_kafka.MockCluster()
    try:
        import confluent_kafka

        producer = confluent_kafka.Producer({"bootstrap.servers": cluster.bootstrap_servers,
                                             "log_level": 3, "linger.ms": 20})
        n = 60_000  # ~6 MB uncompressed into one partition: more than the mock keeps
        for i in range(n):
            while True:
                try:
                    producer.produce("too-big", b"x" * 100 + str(i).encode(), partition=0)
                    break
                except BufferError:
                    producer.poll(0.1)
        assert producer.flush(30) == 0
        with pytest.raises(SystemExit, match=r"dropped the oldest records of topic 'too-big' "
                                             r"\(partition 0: offsets 0-\d+\)"):
            cluster.check_complete("too-big", n)
        cluster.check_complete("too-big-not-there")  # an absent topic lost nothing
    finally:
        cluster.close()
