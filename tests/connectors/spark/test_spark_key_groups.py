"""The Spark runner's key-group shape: a keyed operator without timers runs grouped by key
group (one Python call and one state value per key group and micro-batch). Its output
equals the embedded run's, row for row, each key's rows in the embedded order; operators
with timers keep the per-key shape; the key group's state survives a round trip through its
serialized value."""

from __future__ import annotations

import collections
import json
import pickle
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from reactive import (
    CheckpointConfig,
    Dataflow,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    TumblingEventTimeWindows,
    ValueStateDescriptor,
)
from reactive.connectors.files import CommittingFileSink
from reactive.connectors.spark import SparkRunner, list_part_files
from reactive.connectors.spark.key_group_plan import (
    KEY_GROUP_SHAPE,
    key_group_refusal,
)
from reactive.connectors.spark.key_group_state import KeyGroupStateBackend
from reactive.connectors.spark.translation import translate
from reactive.serialization import Serializer
from tests.support import Count, pickled_by_value


@pytest.fixture(scope="module")
def spark(spark: Any) -> Iterator[Any]:
    """The test session's SparkSession; the workers unpickle this module's functions by value."""
    with pickled_by_value(__name__):
        yield spark


class Reversed(Serializer):
    """A custom serializer (UTF-8 of the reversed string), to see it applied."""

    def serialize(self, value: Any) -> bytes:
        return str(value)[::-1].encode()

    def deserialize(self, data: bytes) -> Any:
        return data.decode()[::-1]


class Profile(KeyedProcessFunction):
    """Every state kind the key-group shape holds: value, list, map, reducing, and a value
    with a custom serializer; emits the key's profile after each record."""

    def open(self, ctx: Any) -> None:
        self.total = ctx.get_state(ValueStateDescriptor("total", default=0))
        self.recent = ctx.get_state(ListStateDescriptor("recent"))
        self.by_category = ctx.get_state(MapStateDescriptor("by-category"))
        self.largest = ctx.get_state(ReducingStateDescriptor("largest", max))
        self.last = ctx.get_state(ValueStateDescriptor("last", serializer=Reversed()))

    def process_element(self, value: Any, ctx: Any) -> Iterable[Any]:
        _, category, amount = value
        self.total.update(self.total.value() + amount)
        self.recent.add(amount)
        if len(self.recent.get()) > 3:
            self.recent.update(self.recent.get()[-3:])
        self.by_category.put(category, self.by_category.get(category, 0) + amount)
        if amount % 7 == 0:
            self.by_category.remove(category)
        self.largest.add(amount)
        before = self.last.value()
        self.last.update(category)
        yield [ctx.current_key, self.total.value(), self.recent.get(),
               sorted(self.by_category.items()), self.largest.get(), before]


PURCHASES = [(f"u{(i * i) % 23}", f"c{(i * 7) % 4}", (i * 13) % 50) for i in range(900)]


def purchases(name: str, out: Path) -> Dataflow:
    """Two records per purchase (a flat_map before the key: both share the source
    position), a keyed profile, a reduce, a map after each: two sinks."""
    flow = Dataflow(name, parallelism=2, max_parallelism=16)
    doubled = flow.from_collection(PURCHASES).flat_map(
        lambda p: [p, (p[0], p[1], p[2] + 1)], name="twice")
    (doubled.key_by(lambda p: p[0]).process(Profile()).uid("profile")
            .map(lambda r: [*r, "seen"]).sink(CommittingFileSink(out / "profiles")).uid("profiles"))
    (doubled.map(lambda p: (p[1], p[0], p[2])).key_by(lambda p: p[0])
            .reduce(lambda a, b: (a[0], b[1], a[2] + b[2])).uid("sums")
            .sink(CommittingFileSink(out / "sums")).uid("sums-out"))
    return flow


def in_commit_order(directory: Path) -> list[Any]:
    """The committed rows in commit order: by micro-batch (or checkpoint), then part file,
    then line (a key's rows of one micro-batch are in one part file)."""
    return [json.loads(line) for p in list_part_files(directory)
            for line in p.path.read_text(encoding="utf-8").splitlines() if line.strip()]


def per_key(rows: list[Any]) -> dict[Any, list[Any]]:
    out: dict[Any, list[Any]] = collections.defaultdict(list)
    for row in rows:
        out[json.dumps(row[0])].append(row)
    return dict(out)


@pytest.mark.e2e
async def test_key_group_shape_equals_embedded_row_for_row_in_key_order(
        spark: Any, tmp_path: Path) -> None:
    await purchases("embedded", tmp_path / "embedded").run(
        checkpoints=CheckpointConfig(interval=0.05, directory=tmp_path / "chk"))
    job = SparkRunner(spark, tmp_path / "chk-spark", max_records_per_batch=450).run(
        purchases("spark", tmp_path / "spark"))
    assert job.shapes == {"profiles": KEY_GROUP_SHAPE, "sums-out": KEY_GROUP_SHAPE}
    for sink in ("profiles", "sums"):
        embedded = in_commit_order(tmp_path / "embedded" / sink)
        assert len(embedded) == 2 * len(PURCHASES)
        # every key's rows in the embedded order (micro-batches of 450 source records: two
        # of them, so each key's state crossed a micro-batch)
        assert per_key(in_commit_order(tmp_path / "spark" / sink)) == per_key(embedded)


class Alarm(KeyedProcessFunction):
    """Registers an event-time timer and fires on it: a function with timers."""

    def process_element(self, value: Any, ctx: Any) -> Iterable[Any]:
        ctx.timer_service.register_event_time_timer(value[1] + 1)
        return []

    def on_timer(self, timestamp: float, ctx: Any) -> Iterable[Any]:
        yield [ctx.current_key, timestamp]


def test_operators_with_timers_keep_the_per_key_shape(tmp_path: Path) -> None:
    flow = Dataflow("shapes", max_parallelism=16)
    timed = flow.from_collection([("a", 1.0)]).assign_timestamps(lambda r: r[1])
    timed.key_by(lambda r: r[0]).process(Count()).uid("c").sink(
        CommittingFileSink(tmp_path / "count")).uid("count")
    timed.key_by(lambda r: r[0]).reduce(lambda a, b: a).uid("r").sink(
        CommittingFileSink(tmp_path / "reduce")).uid("reduce")
    timed.key_by(lambda r: r[0]).process(Alarm()).uid("a").sink(
        CommittingFileSink(tmp_path / "alarm")).uid("alarm")
    (timed.key_by(lambda r: r[0]).window(TumblingEventTimeWindows.of(5)).reduce(lambda a, b: a)
          .uid("w").sink(CommittingFileSink(tmp_path / "window")).uid("window"))
    refusals = {p.sink.uid: key_group_refusal(p) for p in translate(flow) if p.sink}
    assert refusals["count"] is None and refusals["reduce"] is None
    assert "on_timer" in str(refusals["alarm"])
    assert "timers" in str(refusals["window"])


def test_key_group_state_round_trips_through_its_value() -> None:
    """Every key's state of a key group, written as one value and read back by another
    backend (another task after a restart), with a state no descriptor asked for yet kept."""
    first = KeyGroupStateBackend(16)
    count = first.get_state(ValueStateDescriptor("count", default=0))
    items = first.get_state(ListStateDescriptor("items"))
    tags = first.get_state(MapStateDescriptor("tags"))
    last = first.get_state(ValueStateDescriptor("last", serializer=Reversed()))
    first.load(None)
    for key, item in [("a", 1), ("b", 2), ("a", 3), (("t", 1), 4)]:
        first.set_current_key(key)
        count.update(count.value() + 1)
        items.add(item)
        tags.put(item % 2, item)
        last.update(f"v{item}")
    data = first.dump()
    assert data is not None
    # the custom serializer wrote its bytes
    assert pickle.loads(data)["last"] == (True, {"a": b"3v", "b": b"2v", ("t", 1): b"4v"})

    second = KeyGroupStateBackend(16)
    count2 = second.get_state(ValueStateDescriptor("count", default=0))
    second.load(data)
    second.set_current_key("a")
    assert count2.value() == 2
    second.set_current_key(("t", 1))
    count2.update(7)
    kept = second.dump()  # "items", "tags", "last" were never asked for: kept as loaded

    third = KeyGroupStateBackend(16)
    third.load(kept)
    items3 = third.get_state(ListStateDescriptor("items"))
    tags3 = third.get_state(MapStateDescriptor("tags"))
    last3 = third.get_state(ValueStateDescriptor("last", serializer=Reversed()))
    count3 = third.get_state(ValueStateDescriptor("count", default=0))
    third.set_current_key("a")
    assert (items3.get(), sorted(tags3.items()), last3.value()) == ([1, 3], [(1, 3)], "v3")
    third.set_current_key(("t", 1))
    assert count3.value() == 7
    # a key group whose keys all cleared their state stores nothing
    for key in ("a", "b", ("t", 1)):
        third.set_current_key(key)
        for state in (items3, tags3, last3, count3):
            state.clear()
    assert third.dump() is None
    third.load(None)
    third.set_current_key("a")
    assert count3.value() == 0 and items3.get() == []
