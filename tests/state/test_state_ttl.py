"""State time-to-live (``ttl=`` on a state descriptor): expiry per update type and
visibility on a manual clock, per entry for lists and maps, event time by the watermark, and
the expiry timestamps through snapshots, restores at another parallelism and across
backends. Each function here reads or writes its state from a command record, as Flink's
TTL state tests drive a state through a test harness."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from reactive import (
    KeyedProcessFunction,
    KeyGroupRange,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from reactive.backends.heap import HeapStateBackend
from reactive.backends.rocksdb import RocksDBStateBackend
from reactive.errors import ConfigurationError, StateAccessError
from reactive.functions import RuntimeContext
from reactive.state.operator_state import OperatorStateStore
from reactive.state.ttl import StateTtlConfig
from reactive.testing.operator_harness import OperatorTestHarness

TTL = 10.0


class Probe(KeyedProcessFunction):
    """Commands ``(key, op, arg)`` on one state of each kind, answers ``(key, op, result)``."""

    def __init__(self, ttl: Any = TTL, serializer: Any = None) -> None:
        self.ttl = ttl
        self.serializer = serializer

    def open(self, ctx: Any) -> None:
        self.value = ctx.get_state(ValueStateDescriptor(
            "value", default="none", serializer=self.serializer, ttl=self.ttl))
        self.list = ctx.get_state(ListStateDescriptor("list", ttl=self.ttl))
        self.map = ctx.get_state(MapStateDescriptor("map", ttl=self.ttl))
        self.sum = ctx.get_state(ReducingStateDescriptor(
            "sum", reduce_fn=lambda a, b: a + b, ttl=self.ttl))

    def process_element(self, record: Any, ctx: Any) -> Iterable[Any]:
        key, op, arg = record
        result: Any = None
        if op == "set":
            self.value.update(arg)
        elif op == "get":
            result = self.value.value()
        elif op == "add":
            self.list.add(arg)
        elif op == "list":
            result = self.list.get()
        elif op == "put":
            self.map.put(*arg)
        elif op == "map":
            result = dict(self.map.items())
        elif op == "has":
            result = self.map.contains(arg)
        elif op == "at":
            result = self.map.get(arg, "absent")
        elif op == "sum+":
            self.sum.add(arg)
        elif op == "sum":
            result = self.sum.get()
        yield (key, op, result)


def harness(fn: Probe | None = None, **options: Any) -> OperatorTestHarness:
    h = OperatorTestHarness.for_keyed_process(fn or Probe(), key_selector=lambda r: r[0],
                                              **options)
    h.open()
    return h


def ask(h: OperatorTestHarness, key: str, op: str, arg: Any = None) -> Any:
    (out,) = h.process_element((key, op, arg))
    return out[2]


def at(h: OperatorTestHarness, t: float) -> None:
    h.set_processing_time(t)


@pytest.mark.parametrize("update_type", ["on_create_and_write", "on_read_and_write"])
def test_a_value_expires_ttl_after_its_last_write_or_read(update_type):
    h = harness(Probe(StateTtlConfig(TTL, update_type=update_type)))
    at(h, 0.0)
    ask(h, "k", "set", "v")
    at(h, 6.0)
    assert ask(h, "k", "get") == "v"  # a read at 6 restarts the ttl on read-and-write
    at(h, 10.0)
    expected = "v" if update_type == "on_read_and_write" else "none"
    assert ask(h, "k", "get") == expected
    at(h, 30.0)  # beyond any refresh
    assert ask(h, "k", "get") == "none"
    # a write restarts it in either mode
    ask(h, "k", "set", "w")
    at(h, 39.9)
    assert ask(h, "k", "get") == "w"


def test_an_expired_value_is_returned_once_if_not_cleaned_up():
    h = harness(Probe(StateTtlConfig(TTL, visibility="return_expired_if_not_cleaned_up")))
    ask(h, "k", "set", "v")
    at(h, 11.0)
    assert ask(h, "k", "get") == "v"  # still there: returned, and removed by this access
    assert ask(h, "k", "get") == "none"


def test_list_elements_and_map_entries_expire_one_by_one():
    h = harness()
    at(h, 0.0)
    ask(h, "k", "add", 1)
    ask(h, "k", "put", ("a", 1))
    at(h, 6.0)
    ask(h, "k", "add", 2)
    ask(h, "k", "put", ("b", 2))
    assert ask(h, "k", "list") == [1, 2]
    at(h, 10.0)
    assert ask(h, "k", "list") == [2]
    assert ask(h, "k", "map") == {"b": 2}
    assert ask(h, "k", "has", "a") is False
    assert ask(h, "k", "at", "b") == 2
    at(h, 16.0)
    assert ask(h, "k", "list") == []
    assert ask(h, "k", "map") == {}
    # the expired entries are gone from the backend, not only hidden
    backend = h.keyed_backend
    assert backend is not None
    assert list(backend.keys("list")) == [] and list(backend.keys("map")) == []


def test_a_fold_after_expiry_starts_again():
    h = harness()
    ask(h, "k", "sum+", 5)
    ask(h, "k", "sum+", 7)
    assert ask(h, "k", "sum") == 12
    at(h, 30.0)
    ask(h, "k", "sum+", 1)
    assert ask(h, "k", "sum") == 1


def test_keys_expire_independently():
    h = harness()
    ask(h, "a", "set", 1)
    at(h, 5.0)
    ask(h, "b", "set", 2)
    at(h, 12.0)
    assert (ask(h, "a", "get"), ask(h, "b", "get")) == ("none", 2)


def test_event_time_ttl_follows_the_watermark():
    h = harness(Probe(StateTtlConfig(TTL, time_characteristic="event_time")))
    h.process_watermark(100.0)
    ask(h, "k", "set", "v")
    at(h, 10_000.0)  # processing time does not matter
    assert ask(h, "k", "get") == "v"
    h.process_watermark(109.0)
    assert ask(h, "k", "get") == "v"
    h.process_watermark(110.0)
    assert ask(h, "k", "get") == "none"


@pytest.mark.parametrize("backend", ["heap", "rocksdb", "heap-to-rocksdb", "rocksdb-to-heap"])
async def test_expiry_times_survive_snapshot_and_rescaled_restore(tmp_path: Path, backend):
    """A restore neither resurrects an expired entry nor expires a live one early: the
    expiry timestamps are part of the snapshot, on either backend and across them."""
    first, _, second = backend.partition("-to-")
    second = second or first

    def state_backend(name: str, where: str) -> Any:
        if name == "heap":
            return HeapStateBackend()
        return RocksDBStateBackend(path=tmp_path / where, incremental=True)

    keys = [f"k{i}" for i in range(40)]
    h = harness(max_parallelism=16, state_backend=state_backend(first, "a"),
                directory=tmp_path / "chk")
    at(h, 0.0)
    for k in keys[:20]:
        ask(h, k, "set", k)
        ask(h, k, "add", 1)
    at(h, 6.0)
    for k in keys[20:]:
        ask(h, k, "set", k)
        ask(h, k, "add", 2)
    snapshot = await h.snapshot()
    h.close()
    # restored into two instances (parallelism 2) at processing time 12: the first 20 keys'
    # entries (written at 0) are expired, the last 20 (written at 6) live until 16
    answers: dict[str, tuple[Any, Any]] = {}
    for subtask in range(2):
        r = OperatorTestHarness.for_keyed_process(
            Probe(), key_selector=lambda rec: rec[0], subtask=subtask, parallelism=2,
            max_parallelism=16, state_backend=state_backend(second, f"b{subtask}"))
        r.open(restore_from=snapshot)
        at(r, 12.0)
        for k in keys:
            if r.owns_key(k):
                answers[k] = (ask(r, k, "get"), ask(r, k, "list"))
        at(r, 16.0)
        assert all(ask(r, k, "get") == "none" for k in keys if r.owns_key(k))
        r.close()
    assert answers == {k: ("none", []) if i < 20 else (k, [2]) for i, k in enumerate(keys)}


class Upper:
    """A custom serializer: str values as upper-case bytes (to see it ran)."""

    def serialize(self, value: Any) -> bytes:
        return value.upper().encode()

    def deserialize(self, data: bytes) -> Any:
        return data.decode().lower()


async def test_a_custom_serializer_sees_only_its_values(tmp_path: Path):
    h = harness(Probe(serializer=Upper()), state_backend=HeapStateBackend(),
                directory=tmp_path)
    ask(h, "k", "set", "abc")
    snapshot = await h.snapshot()
    h.close()
    r = OperatorTestHarness.for_keyed_process(Probe(serializer=Upper()),
                                              key_selector=lambda rec: rec[0])
    r.open(restore_from=snapshot)
    at(r, 9.0)
    assert ask(r, "k", "get") == "abc"
    at(r, 10.0)
    assert ask(r, "k", "get") == "none"


def test_configuration_errors_name_the_state():
    with pytest.raises(ConfigurationError, match="positive number of seconds"):
        StateTtlConfig(0)
    with pytest.raises(ConfigurationError, match="visibility"):
        StateTtlConfig(1.0, visibility="sometimes")  # type: ignore[arg-type]

    class MapWithSerializer(KeyedProcessFunction):
        def open(self, ctx: Any) -> None:
            ctx.get_state(MapStateDescriptor("m", serializer=Upper(), ttl=5))

    with pytest.raises(ConfigurationError, match="map state 'm'"):
        OperatorTestHarness.for_keyed_process(MapWithSerializer(), lambda r: r).open()


def test_event_time_ttl_outside_a_process_function_is_refused():
    """Only a keyed process function has a watermark to read; elsewhere ``get_state``
    fails naming the operator."""
    backend = HeapStateBackend().create_keyed_backend(
        job_name="j", operator_uid="op", subtask=0, key_group_range=KeyGroupRange(0, 7),
        max_parallelism=8)
    ctx = RuntimeContext("windowed", "op", 0, 1, 8, backend, OperatorStateStore())
    with pytest.raises(StateAccessError, match="'windowed': event-time ttl"):
        ctx.get_state(ValueStateDescriptor(
            "v", ttl=StateTtlConfig(1.0, time_characteristic="event_time")))


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_keys_never_read_again_are_swept_and_the_state_stays_flat(tmp_path: Path, backend):
    """An ever-growing key space (each key written once, at 1,000 keys per second of the
    manual clock, ttl 1 s): the incremental cleanup removes the expired keys nobody reads
    again, so the state holds about the last second's keys, not all of them; without a ttl
    it holds all 20,000."""
    state_backend = (HeapStateBackend() if backend == "heap"
                     else RocksDBStateBackend(path=tmp_path / "db", incremental=True))
    h = harness(Probe(StateTtlConfig(1.0)), state_backend=state_backend)
    sizes = []
    for i in range(20_000):
        at(h, i / 1000)
        assert ask(h, f"k{i}", "set", i) is None
        if i % 2_000 == 1_999:
            assert h.keyed_backend is not None
            sizes.append(len(list(h.keyed_backend.keys("value"))))
    # the live keys are the last 1,000; the sweep lags behind by at most a pass
    assert max(sizes[3:]) < 4_000, sizes
    assert ask(h, "k19999", "get") == 19_999
    at(h, 25.0)
    assert ask(h, "k19999", "get") == "none"
    assert h.operator.fn.value.expired > 15_000


class RecordTime:
    """A processing-time clock that reads the time of the record being processed: the job's
    expiry then depends on its input only, so a batch computation can check it."""

    t = 0.0

    def now(self) -> float:
        return RecordTime.t

    def call_at(self, timestamp: float, callback: Any) -> Any:  # pragma: no cover - unused
        raise NotImplementedError


def sessions(n: int, keys: int, seed: int) -> list[tuple[str, float]]:
    import random

    rnd = random.Random(seed)
    t = 0.0
    out = []
    for _ in range(n):
        t += rnd.expovariate(keys / 2.0)  # each key every ~2 s on average, ttl 3 s
        out.append((f"k{rnd.randrange(keys)}", t))
    return out


def expected_counts(events: list[tuple[str, float]], ttl: float) -> dict[str, tuple[int, float]]:
    """Per key: the running count at its last event, restarting when the key was not
    written for ``ttl`` seconds, and the expiry time of that count."""
    state: dict[str, tuple[int, float]] = {}
    for key, t in events:
        n, expires = state.get(key, (0, -1.0))
        state[key] = ((n if expires > t else 0) + 1, t + ttl)
    return state


async def test_a_job_with_ttl_state_is_exact_through_failures(tmp_path: Path):
    from reactive import CheckpointConfig, Dataflow, RestartStrategy
    from reactive.connectors.collections import ListSink
    from tests.support import FailureInjector, checkpoint_state, paced

    events = sessions(20_000, 400, seed=3)
    injector = FailureInjector([4_500, 9_100, 15_300])

    class SessionCount(KeyedProcessFunction):
        inj = injector

        def open(self, ctx: Any) -> None:
            self.count = ctx.get_state(ValueStateDescriptor(
                "count", default=0, ttl=StateTtlConfig(3.0, clock=RecordTime())))

        def process_element(self, event: Any, ctx: Any) -> Iterable[Any]:
            self.inj.tick()
            key, t = event
            RecordTime.t = t
            n = self.count.value() + 1
            self.count.update(n)
            yield (key, n)

    sink = ListSink()
    flow = Dataflow("ttl-sessions", parallelism=2, max_parallelism=32, batch_size=128)
    (flow.source(paced(events, every=1_000)).uid("events")
         .key_by(lambda e: e[0])
         .process(SessionCount()).uid("count")
         .sink(sink))
    job = await flow.run(checkpoints=CheckpointConfig(interval=0.01, directory=tmp_path),
                         restart=RestartStrategy.fixed(5, 0.0))
    assert injector.failures == 3 and job.metrics.restored_checkpoints
    expected = expected_counts(events, 3.0)
    last: dict[str, int] = {}
    for key, n in sink.records:
        last[key] = n
    assert last == {k: n for k, (n, _) in expected.items()}
    # the final checkpoint holds each live count with its expiry time; expired ones may
    # have been swept already, and none is resurrected
    final = checkpoint_state(tmp_path, "ttl-sessions", "count", "count")
    end = events[-1][1]
    live = {k: v for k, v in expected.items() if v[1] > end}
    assert live.items() <= final.items() <= expected.items()
    assert len(live) < len(expected)
    # every expiry that a later event of its key found was counted once at least (on that
    # access, or by a sweep before it; a failed attempt's counts stay, so replays add more)
    found_expired = 0
    written: dict[str, float] = {}
    for key, t in events:
        if key in written and written[key] + 3.0 <= t:
            found_expired += 1
        written[key] = t
    stats = job.metrics.keyed_state()["count"]
    assert stats["expired"] >= found_expired > 0
    assert stats["keys"] == 0  # sampled from the running attempt: the job has ended


def test_a_batch_reads_the_wall_clock_once_and_an_access_outside_reads_it_live():
    """Inside a batch every access sees the batch's start time (one clock read a batch,
    not two a record); outside one (a timer, a state query) an access reads the clock, so
    an idle operator never answers with the time of its last batch."""
    from reactive.keygroups import KeyGroupRange
    from reactive.state.ttl_clock import TtlClock

    wall = [100.0]
    reads = []

    def read() -> float:
        reads.append(wall[0])
        return wall[0]

    clock = TtlClock(read)
    backend = HeapStateBackend().create_keyed_backend(
        job_name="j", operator_uid="op", subtask=0, key_group_range=KeyGroupRange(0, 15),
        max_parallelism=16)
    state = backend.get_ttl_state(ValueStateDescriptor("v", default=0, ttl=TTL),
                                  StateTtlConfig(TTL), clock)
    assert state is not None
    clock.freeze()
    for i in range(50):
        backend.set_current_key(f"k{i}")
        state.update(state.value() + 1)
        wall[0] += 1.0  # the batch runs long: 50 s of wall time
    backend.set_current_key("k0")
    assert state.value() == 1  # the batch's time: written at 100, live until 110
    clock.thaw()
    assert len(reads) == 1
    # outside the batch the clock is read: k0 (written at 100) expired at 110 < 150
    assert state.value() == 0
    assert len(reads) == 2


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_the_native_value_state_and_the_decorator_store_the_same(tmp_path: Path, backend):
    """The heap backend's own TTL value state stores what the decorator stores, so either
    reads what the other wrote (and snapshots do not depend on which one wrote them)."""
    from reactive.keygroups import KeyGroupRange
    from reactive.state.ttl import backend_descriptor, ttl_state
    from reactive.state.ttl_clock import TtlClock

    kb = (HeapStateBackend() if backend == "heap" else
          RocksDBStateBackend(path=tmp_path / "db")).create_keyed_backend(
        job_name="j", operator_uid="op", subtask=0, key_group_range=KeyGroupRange(0, 15),
        max_parallelism=16)
    now = [0.0]
    clock = TtlClock(lambda: now[0])
    descriptor = ValueStateDescriptor("v", default="none", ttl=TTL)
    config = StateTtlConfig(TTL)
    native = kb.get_ttl_state(descriptor, config, clock)
    decorator = ttl_state(descriptor, config, kb.get_state(backend_descriptor(descriptor, config)),
                          clock.now)
    assert native is not None and native is not decorator
    kb.set_current_key("a")
    native.update("x")
    kb.set_current_key("b")
    decorator.update("y")
    now[0] = 5.0
    kb.set_current_key("a")
    assert decorator.value() == "x"
    kb.set_current_key("b")
    assert native.value() == "y"
    now[0] = 10.0  # both written at 0: expired at 10
    assert native.value() == "none"
    kb.set_current_key("a")
    assert decorator.value() == "none"
    kb.dispose()


async def test_the_job_reports_each_operators_keys_and_expired_entries(tmp_path: Path):
    """``job.metrics.keyed_state()`` while the job runs: the keys in the operator's state
    and the entries its TTL expired, in step with what a user sent."""
    from reactive import CheckpointConfig, Dataflow, PushSource
    from reactive.connectors.collections import DiscardingSink
    from reactive.time.clock import ManualClock

    clock = ManualClock(0.0)

    class Count(KeyedProcessFunction):
        def open(self, ctx: Any) -> None:
            self.count = ctx.get_state(ValueStateDescriptor(
                "c", default=0, ttl=StateTtlConfig(TTL, clock=clock)))

        def process_element(self, value: Any, ctx: Any) -> None:
            self.count.update(self.count.value() + 1)

    source = PushSource()
    flow = Dataflow("ttl-metrics", parallelism=1)
    (flow.source(source).uid("src").key_by(lambda v: v).process(Count()).uid("count")
         .sink(DiscardingSink()))
    job = await flow.start(checkpoints=CheckpointConfig(interval=None, directory=tmp_path))
    for k in ("a", "b", "c"):
        last = await source.send(k)
    while source.durable <= last:
        await job.checkpoint()
    assert job.metrics.keyed_state()["count"] == {"keys": 3, "expired": 0}
    clock.advance(TTL)  # a, b and c expire; a is written again
    last = await source.send("a")
    while source.durable <= last:
        await job.checkpoint()
    stats = job.metrics.keyed_state()["count"]
    assert stats["expired"] >= 1  # a's expired count, found on access (b, c: by a sweep)
    assert stats["keys"] == 3 - (stats["expired"] - 1)
    await job.cancel()


class Reminder(KeyedProcessFunction):
    """Keeps a key's last value with a ttl and registers a processing-time timer
    ``delay`` after each record; the timer reports what the state holds then."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def open(self, ctx: Any) -> None:
        self.last = ctx.get_state(ValueStateDescriptor("last", default="none", ttl=TTL))

    def process_element(self, record: Any, ctx: Any) -> Iterable[Any]:
        _, value, t = record
        self.last.update(value)
        ctx.timer_service.register_processing_time_timer(t + self.delay)
        return ()

    def on_timer(self, timestamp: float, ctx: Any) -> Iterable[Any]:
        yield (ctx.current_key, timestamp, self.last.value())


def test_a_timer_outliving_its_keys_state_fires_and_finds_it_expired():
    """A timer is not deleted when its key's TTL state expires (as in Flink, whose TTL
    never touches timers): it fires, and reads the default, never the expired value (no
    resurrection); the read removes the expired entry, so nothing is left of the key."""
    h = harness(Reminder(delay=3 * TTL))
    at(h, 0.0)
    h.process_element(("a", "first", 0.0))
    h.process_element(("b", "kept", 0.0))
    at(h, 25.0)
    h.process_element(("b", "second", 25.0))  # b's value lives until 35, its timer at 55
    # a's state expired at 10; its timer (at 30) stays, with b's at 30 and 55
    assert h.num_processing_time_timers() == 3
    assert h.set_processing_time(30.0) == [("a", 30.0, "none"), ("b", 30.0, "second")]
    assert h.keyed_backend is not None
    assert sorted(h.keyed_backend.keys("last")) == ["b"]
    assert h.set_processing_time(55.0) == [("b", 55.0, "none")]
    assert list(h.keyed_backend.keys("last")) == []
    assert h.num_processing_time_timers() == 0


async def test_a_sweep_finding_nothing_expired_adds_nothing_to_the_next_checkpoint(
        tmp_path: Path):
    """The incremental cleanup checks live keys without making them current, so the keys it
    checks do not count as changed: an incremental checkpoint after a pass over 1,000 live
    keys holds the one key the records wrote, not the keys the sweep looked at."""
    h = harness(Probe(StateTtlConfig(3600.0)),
                state_backend=HeapStateBackend(incremental=True), directory=tmp_path)
    at(h, 0.0)
    for i in range(1_000):
        ask(h, f"k{i}", "set", "x" * 200)
    first = await h.snapshot()
    await h.notify_checkpoint_complete(first.checkpoint_id)
    for _ in range(20_000):  # at least 1,250 keys checked (1/16 a record): a whole pass
        ask(h, "hot", "set", 1)
    assert h.operator.fn.value.expired == 0
    second = await h.snapshot()
    sizes = [s.subtasks[0].keyed_state.size for s in (first, second)  # type: ignore[union-attr]
             ]
    assert sizes[0] > 200_000 and sizes[1] < 5_000, sizes
