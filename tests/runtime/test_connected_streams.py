"""Two-input operators from a user's side: connect + co-map/co-flat-map/co-process (keyed
state shared by both inputs), broadcast state, and barrier alignment across both inputs."""

from __future__ import annotations

import collections
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from reactive import (
    CheckpointConfig,
    CheckpointStorage,
    ConfigurationError,
    Dataflow,
    ListStateDescriptor,
    MapStateDescriptor,
    RestartStrategy,
    UserFunctionError,
    ValueStateDescriptor,
)
from reactive.connectors.collections import ListSink
from reactive.connectors.files import CommittingFileSink
from reactive.testing import TestingSource
from reactive.two_input_functions import (
    BroadcastProcessFunction,
    CoProcessFunction,
    KeyedBroadcastProcessFunction,
    KeyedCoProcessFunction,
)
from tests.connectors.files.test_committing_file_sink import committed_records
from tests.support import operator_state_entry


def users_and_clicks(seed: int, n_users: int = 300, n_clicks: int = 6000
                     ) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    rnd = random.Random(seed)
    users = [(u, f"user-{u}") for u in range(n_users)]
    rnd.shuffle(users)
    clicks = [(rnd.randrange(n_users), f"/page/{i}") for i in range(n_clicks)]
    return users, clicks


class Enrich(KeyedCoProcessFunction):
    """Joins clicks with the user's name whichever arrives first: clicks wait in keyed
    state for the name (so the output does not depend on how the inputs interleave)."""

    def open(self, ctx: Any) -> None:
        self.name = ctx.get_state(ValueStateDescriptor("name"))
        self.waiting = ctx.get_state(ListStateDescriptor("waiting"))

    def process_element1(self, user: tuple[int, str], ctx: Any) -> Iterable[Any]:
        self.name.update(user[1])
        for url in self.waiting.get():
            yield (user[1], url)
        self.waiting.clear()

    def process_element2(self, click: tuple[int, str], ctx: Any) -> Iterable[Any]:
        name = self.name.value()
        if name is None:
            self.waiting.add(click[1])
        else:
            yield (name, click[1])


def _with_aborts(items: list[Any], positions: list[int]) -> list[Any]:
    out = list(items)
    for p in sorted(positions, reverse=True):
        out.insert(p, TestingSource.ABORT)
    return out


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
async def test_keyed_co_process_enriches_exactly_once_through_failures(tmp_path, backend):
    users, clicks = users_and_clicks(seed=3)
    expected = collections.Counter((f"user-{u}", url) for u, url in clicks)
    flow = Dataflow("enrich", parallelism=2, batch_size=64)
    user_stream = flow.source(TestingSource(_with_aborts(users, [150])), uid="users")
    click_stream = flow.source(TestingSource(_with_aborts(clicks, [2000, 4500])), uid="clicks")
    (user_stream.key_by(lambda u: u[0])
        .connect(click_stream.key_by(lambda c: c[0]))
        .process(Enrich()).uid("enrich")
        .sink(CommittingFileSink(tmp_path / "out")))
    state_backend = None
    if backend == "rocksdb":
        from reactive.backends.rocksdb import RocksDBStateBackend

        state_backend = RocksDBStateBackend(tmp_path / "rocksdb")
    job = await flow.run(checkpoints=CheckpointConfig(interval=0.01, directory=tmp_path / "chk"),
                         restart=RestartStrategy.fixed(5, 0.0), state_backend=state_backend)
    assert job.metrics.restarts == 3
    output = committed_records(tmp_path / "out")
    assert output == collections.Counter(tuple(r) for r in expected.elements())


async def test_co_map_and_co_flat_map_see_each_input_with_its_function():
    flow = Dataflow("co-map", parallelism=2)
    numbers = flow.from_collection(range(1000))
    words = flow.from_collection(["a b", "c", "", "d e f"] * 50)
    mapped, flat = ListSink(), ListSink()
    numbers.connect(words).map(lambda n: ("n", n * 2), lambda w: ("w", len(w))).sink(mapped)
    numbers.connect(words).flat_map(lambda n: [n] if n % 7 == 0 else None,
                                    lambda w: w.split()).sink(flat)
    await flow.run()
    assert collections.Counter(mapped.records) == collections.Counter(
        [("n", n * 2) for n in range(1000)] + [("w", len(w)) for w in
                                                 ["a b", "c", "", "d e f"] * 50])
    assert collections.Counter(flat.records) == collections.Counter(
        [n for n in range(1000) if n % 7 == 0] + ["a", "b", "c", "d", "e", "f"] * 50)


async def test_a_failing_co_function_names_its_input_and_record():
    flow = Dataflow("co-fail")
    a = flow.from_collection([1, 2, 3])
    b = flow.from_collection(["x", "boom", "y"])
    a.connect(b).map(lambda n: n, lambda s: 1 / (s != "boom")).name("co").sink(ListSink())
    with pytest.raises(Exception) as info:
        await flow.run()
    err = info.value
    while err is not None and not isinstance(err, UserFunctionError):
        err = err.__cause__
    assert isinstance(err, UserFunctionError)
    assert err.record == "boom" and err.operator == "co"
    assert "input 2" in str(err)


def test_connect_refuses_mixed_keying_and_wrong_functions():
    flow = Dataflow("refusals")
    a, b = flow.from_collection([1]), flow.from_collection([2])
    with pytest.raises(ConfigurationError, match="key both"):
        a.key_by(lambda x: x).connect(b).process(Enrich())
    with pytest.raises(ConfigurationError, match="KeyedCoProcessFunction"):
        a.connect(b).process(Enrich())
    with pytest.raises(ConfigurationError, match="different dataflows"):
        a.connect(Dataflow("other").from_collection([3]))
    with pytest.raises(ConfigurationError, match="MapStateDescriptor"):
        b.broadcast(ValueStateDescriptor("x"))  # type: ignore[arg-type]


class SideCounter(CoProcessFunction):
    """Counts each input's records in operator state."""

    def open(self, ctx: Any) -> None:
        self.state = ctx.get_operator_state("per-side")
        if not self.state.get():
            self.state.update([0, 0])
        self.counts = self.state.get()

    def process_element1(self, value: Any, ctx: Any) -> None:
        self.counts[0] += 1
        self.state.update(self.counts)

    def process_element2(self, value: Any, ctx: Any) -> None:
        self.counts[1] += 1
        self.state.update(self.counts)


async def test_alignment_keeps_each_input_exactly_before_its_barrier(tmp_path):
    """One input races ahead (big batches) while the other trickles (one record per
    batch): every checkpoint's per-input counts equal the two sources' positions."""
    flow = Dataflow("aligned", batch_size=256, channel_capacity=2)
    fast = flow.source(TestingSource(range(200_000)), uid="fast")
    # the slow input waits for a completed checkpoint every 400 records: several complete
    # whatever the machine's speed
    trickle: list[object] = []
    for i in range(3_000):
        trickle += [TestingSource.CHECKPOINT, i] if i and i % 400 == 0 else [i]
    slow = flow.source(TestingSource(trickle, batch_size=1), uid="slow")
    fast.connect(slow).process(SideCounter()).uid("sides").sink(ListSink())
    await flow.run(checkpoints=CheckpointConfig(interval=0.002, directory=tmp_path,
                                                retained=1000))
    completed = CheckpointStorage(tmp_path, "aligned").completed()
    assert len(completed) >= 5
    ahead = 0
    for chk in completed:
        counts = operator_state_entry(chk, "sides", "per-side", [0, 0])
        fast_pos = operator_state_entry(chk, "fast", "source-position", [0])[0]
        slow_index = operator_state_entry(chk, "slow", "source-position", [0])[0]
        # the position is an index into the items, markers included
        slow_pos = sum(1 for x in trickle[:slow_index] if x is not TestingSource.CHECKPOINT)
        assert counts == [fast_pos, slow_pos], f"checkpoint {chk.checkpoint_id}"
        ahead += fast_pos > 10 * slow_pos
    assert ahead  # some checkpoint was taken with the fast input far ahead


# ---------------------------------------------------------------- broadcast state
RULES = MapStateDescriptor("rules")


class ThresholdAlerts(KeyedBroadcastProcessFunction):
    """Alerts on readings above the threshold in force at the reading's event time.

    Rules are ``(effective_time, sensor_kind, threshold)``, broadcast; readings
    ``(time, sensor, kind, value)`` wait in keyed state until the watermark passes them,
    so a rule that arrives after a reading of a later time still applies to it."""

    def open(self, ctx: Any) -> None:
        self.pending = ctx.get_state(ListStateDescriptor("pending"))

    def process_broadcast_element(self, rule: tuple[float, str, float], ctx: Any) -> None:
        rules = ctx.get_broadcast_state(RULES)
        history = rules.get(rule[1], ())
        rules.put(rule[1], tuple(sorted((*history, (rule[0], rule[2])))))

    def process_element(self, reading: tuple[float, int, str, float], ctx: Any) -> None:
        self.pending.add(reading)
        ctx.timer_service.register_event_time_timer(reading[0])

    def on_timer(self, timestamp: float, ctx: Any) -> Iterable[Any]:
        rules = ctx.get_broadcast_state(RULES)
        keep = []
        for reading in self.pending.get():
            if reading[0] > timestamp:
                keep.append(reading)
                continue
            threshold = threshold_at(rules.get(reading[2], ()), reading[0])
            if threshold is not None and reading[3] > threshold:
                yield (reading[1], reading[0], reading[3])
        self.pending.update(keep)


def threshold_at(history: Iterable[tuple[float, float]], t: float) -> float | None:
    current = None
    for effective, threshold in history:
        if effective <= t:
            current = threshold
    return current


class RuleCopies(BroadcastProcessFunction):
    """Emits, per reading, the rules its instance holds (to compare instances)."""

    def process_broadcast_element(self, rule: Any, ctx: Any) -> None:
        ctx.get_broadcast_state(RULES).put(rule[1], rule[2])

    def process_element(self, value: Any, ctx: Any) -> Iterable[Any]:
        yield (ctx.subtask_index, value, sorted(ctx.get_broadcast_state(RULES).items()))


def sensor_data(seed: int) -> tuple[list[Any], list[Any]]:
    rnd = random.Random(seed)
    kinds = ["temp", "pressure", "humidity"]
    readings = [(float(t), rnd.randrange(40), rnd.choice(kinds), rnd.uniform(0, 100))
                for t in range(20_000)]
    # rules take effect half way between two readings' times: no ties to break
    rules = [(-0.5, k, 50.0) for k in kinds]
    rules += [(rnd.randrange(20_000) + 0.5, rnd.choice(kinds), rnd.uniform(20, 90))
              for _ in range(30)]
    rules.sort()
    return readings, rules


def expected_alerts(readings: list[Any], rules: list[Any]) -> collections.Counter[Any]:
    history: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    for t, kind, threshold in rules:
        history[kind].append((t, threshold))
    out: collections.Counter[Any] = collections.Counter()
    for t, sensor, kind, value in readings:
        threshold = threshold_at(sorted(history[kind]), t)
        if threshold is not None and value > threshold:
            out[(sensor, t, value)] += 1
    return out


def _alerts_flow(readings: list[Any], rules: list[Any], out: Path, parallelism: int
                 ) -> Dataflow:
    flow = Dataflow("alerts", parallelism=parallelism, batch_size=128)
    reading_stream = (flow.source(TestingSource(readings), uid="readings")
                      .assign_timestamps(lambda r: r[0], max_out_of_orderness=0))
    # rules change mid-stream: each arrives with event time, far from its readings' order
    rule_stream = (flow.source(TestingSource(rules), uid="rules")
                   .assign_timestamps(lambda r: r[0]))
    (reading_stream.key_by(lambda r: r[1])
        .connect(rule_stream.broadcast(RULES))
        .process(ThresholdAlerts()).uid("alerts")
        .sink(CommittingFileSink(out)))
    return flow


async def test_broadcast_rules_apply_from_their_event_time_through_a_rescale(tmp_path):
    readings, rules = sensor_data(seed=5)
    expected = expected_alerts(readings, rules)
    half = len(readings) // 2
    # run 1 at parallelism 2 stops half way (EOF) and leaves its final checkpoint ...
    first = _alerts_flow([*readings[:half], TestingSource.EOF, *readings[half:]],
                         rules, tmp_path / "out", 2)
    await first.run(checkpoints=CheckpointConfig(interval=0.01, directory=tmp_path / "chk"))
    # ... run 2 resumes it at parallelism 3 with a failure on the way
    second = _alerts_flow([*readings[:half], TestingSource.EOF, *readings[half:half + 3000],
                           TestingSource.ABORT, *readings[half + 3000:]],
                          rules, tmp_path / "out", 3)
    job = await second.run(checkpoints=CheckpointConfig(interval=0.01,
                                                        directory=tmp_path / "chk"),
                           resume=True, restart=RestartStrategy.fixed(3, 0.0))
    assert job.metrics.restarts == 1
    output = committed_records(tmp_path / "out")
    assert output == collections.Counter({tuple(k): v for k, v in expected.items()})


async def test_every_instance_holds_the_same_broadcast_state_after_a_rescale(tmp_path):
    rules = [(0.0, f"r{i}", i) for i in range(20)]
    values = list(range(200))

    def build(parallelism: int, items: list[Any], sink: ListSink) -> Dataflow:
        flow = Dataflow("copies", parallelism=parallelism, batch_size=10)
        (flow.source(TestingSource(items), uid="values").rebalance()
             .connect(flow.source(TestingSource([*rules, TestingSource.EOF]),
                                  uid="rules").broadcast(RULES))
             .process(RuleCopies()).uid("copies")
             .sink(sink))
        return flow

    # run 1 at parallelism 2: every value is seen after all rules (the values wait behind
    # an EOF until run 2), so run 1's output is empty and its final checkpoint has rules
    first = build(2, [TestingSource.EOF, *values], ListSink())
    await first.run(checkpoints=CheckpointConfig(interval=None, directory=tmp_path))
    sink = ListSink()
    second = build(4, [TestingSource.EOF, *values], sink)
    await second.run(checkpoints=CheckpointConfig(interval=None, directory=tmp_path),
                     resume=True)
    by_instance = {sub: held for sub, _, held in sink.records}
    assert sorted(by_instance) == [0, 1, 2, 3]
    assert all(held == sorted((f"r{i}", i) for i in range(20))
               for held in by_instance.values())
    assert sorted(v for _, v, _ in sink.records) == values
