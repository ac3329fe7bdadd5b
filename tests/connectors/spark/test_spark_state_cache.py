"""Batched state on the Spark runner: a keyed operator run by the stateful processor touches
each key's state once per call (one read and one write per state variable and timer row),
not once per record, and the results stay those of the operator. Spark's state handle is
replaced by an in-memory one that counts the calls (no JVM)."""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

from reactive import Dataflow, KeyedProcessFunction, SlidingEventTimeWindows
from reactive.connectors.files import CommittingFileSink
from reactive.connectors.spark.keyed_processor import KeyedOperatorProcessor
from reactive.connectors.spark.translation import translate
from reactive.key_encoding import encode_key
from reactive.state.descriptors import ListStateDescriptor, MapStateDescriptor
from reactive.windowing.aggregates import Aggregates, count, sum_of

CALLS: collections.Counter[str] = collections.Counter()


class _Handle:
    """Spark's ``StatefulProcessorHandle`` in memory: state per (grouping key, name)."""

    def __init__(self) -> None:
        self.key: bytes = b""
        self.data: dict[tuple[bytes, str], Any] = {}
        self.timers: set[tuple[bytes, int]] = set()

    def getValueState(self, name: str, schema: Any) -> Any:
        return _Value(self, name)

    def getListState(self, name: str, schema: Any) -> Any:
        return _List(self, name)

    def getMapState(self, name: str, key_schema: Any, value_schema: Any) -> Any:
        return _Map(self, name)

    def registerTimer(self, millis: int) -> None:
        CALLS["registerTimer"] += 1
        self.timers.add((self.key, millis))

    def deleteTimer(self, millis: int) -> None:
        CALLS["deleteTimer"] += 1
        self.timers.discard((self.key, millis))


class _Var:
    def __init__(self, handle: _Handle, name: str) -> None:
        self.h, self.name = handle, name

    @property
    def slot(self) -> tuple[bytes, str]:
        return (self.h.key, self.name)

    def call(self, what: str) -> None:
        CALLS[f"{self.name}.{what}"] += 1

    def exists(self) -> bool:
        self.call("read")
        return self.slot in self.h.data

    def clear(self) -> None:
        self.call("write")
        self.h.data.pop(self.slot, None)


class _Value(_Var):
    def get(self) -> Any:
        self.call("read")
        return self.h.data.get(self.slot)

    def update(self, row: Any) -> None:
        self.call("write")
        self.h.data[self.slot] = row


class _List(_Var):
    def get(self) -> Any:
        self.call("read")
        return iter(self.h.data.get(self.slot, []))

    def appendValue(self, row: Any) -> None:
        self.call("write")
        self.h.data.setdefault(self.slot, []).append(row)

    def put(self, rows: Any) -> None:
        self.call("write")
        self.h.data[self.slot] = list(rows)


class _Map(_Var):
    def _map(self) -> dict[Any, Any]:
        return self.h.data.setdefault(self.slot, {})

    def getValue(self, key: Any) -> Any:
        self.call("read")
        return self._map().get(key)

    def updateValue(self, key: Any, value: Any) -> None:
        self.call("write")
        self._map()[key] = value

    def removeKey(self, key: Any) -> None:
        self.call("write")
        self._map().pop(key, None)

    def containsKey(self, key: Any) -> bool:
        self.call("read")
        return key in self._map()

    def iterator(self) -> Any:
        self.call("read")
        return iter(list(self._map().items()))


class _Watermark:
    def __init__(self, millis: int) -> None:
        self.millis = millis

    def getCurrentWatermarkInMs(self) -> int:
        return self.millis


class _Expired:
    def __init__(self, millis: int) -> None:
        self.millis = millis

    def getExpiryTimeInMs(self) -> int:
        return self.millis


def _processor(build: Any) -> tuple[KeyedOperatorProcessor, _Handle]:
    flow = Dataflow("cached")
    build(flow).sink(CommittingFileSink(Path("/nonexistent"))).uid("out")
    plan = translate(flow)[0]
    assert plan.keyed is not None and plan.sink is not None
    processor = KeyedOperatorProcessor(plan.keyed, plan.after_key, plan.sink)
    handle = _Handle()
    processor.init(handle)  # type: ignore[arg-type]
    return processor, handle


def _rows(records: list[Any], key: bytes, first_seq: int = 0) -> list[Any]:
    """The rows Spark's Row-mode worker hands the processor: ``Row``s in the column order
    of the keyed query's input (``key, record, seq``)."""
    import pickle

    from pyspark.sql import Row

    make = Row("key", "record", "seq")
    return [make(key, pickle.dumps(r), first_seq + i) for i, r in enumerate(records)]


def _call(processor: KeyedOperatorProcessor, handle: _Handle, key: Any, records: list[Any],
          watermark_ms: int, first_seq: int = 0) -> list[Any]:
    handle.key = encode_key(key)
    rows = processor.handleInputRows((handle.key,), iter(_rows(records, handle.key, first_seq)),
                                     _Watermark(watermark_ms))  # type: ignore[arg-type]
    return [json.loads(r[0]) for r in rows]  # the sink's JSON lines


def _fire(processor: KeyedOperatorProcessor, handle: _Handle, key: Any,
          millis: int) -> list[Any]:
    handle.key = encode_key(key)
    rows = processor.handleExpiredTimer((handle.key,), _Watermark(millis),  # type: ignore[arg-type]
                                        _Expired(millis))  # type: ignore[arg-type]
    return [json.loads(r[0]) for r in rows]


def test_a_window_reads_and_writes_its_state_once_per_key_and_call() -> None:
    # sliding windows take the operator's per-record path (a record in two windows)
    processor, handle = _processor(
        lambda f: f.from_collection([]).assign_timestamps(lambda r: r[1], max_out_of_orderness=0)
        .key_by(lambda r: r[0]).window(SlidingEventTimeWindows.of(60, 30))
        .aggregate(Aggregates(count(), sum_of(lambda r: r[2], dtype="int")))
        .map(lambda w: (w.key, w.start, w.value)))
    CALLS.clear()
    assert _call(processor, handle, "a", [("a", 10.0 + i * 0.1, i) for i in range(200)], 0) == []
    # 200 records of the windows [-30, 30) and [0, 60): one read and one write of each
    # window's contents and of each window's timer row, not one per record
    contents = {k: v for k, v in CALLS.items() if k.startswith("window-contents")}
    assert contents == {"window-contents.read": 2, "window-contents.write": 2}
    assert CALLS["_reactive_timers.read"] == 2 and CALLS["_reactive_timers.write"] == 2
    assert CALLS["registerTimer"] == 2
    total = sum(range(200))
    assert _fire(processor, handle, "a", 30_000) == [["a", -30.0, [200, total]]]
    # the next call continues from what was written back
    _call(processor, handle, "a", [("a", 50.0, 1000)], 30_000, first_seq=200)
    assert _fire(processor, handle, "a", 60_000) == [["a", 0.0, [201, total + 1000]]]


class Tracker(KeyedProcessFunction):
    """A list and a map per key, changed by every record."""

    def open(self, ctx: Any) -> None:
        self.seen = ctx.get_state(ListStateDescriptor("seen"))
        self.counts = ctx.get_state(MapStateDescriptor("counts"))

    def process_element(self, value: Any, ctx: Any) -> Any:
        self.seen.add(value[1])
        self.counts.put(value[1] % 3, self.counts.get(value[1] % 3, 0) + 1)
        if value[1] % 7 == 0:
            self.counts.remove(value[1] % 3)
        yield (ctx.current_key, self.seen.get()[-2:], sorted(self.counts.items()))


def test_list_and_map_state_are_batched_and_read_back_as_written() -> None:
    processor, handle = _processor(
        lambda f: f.from_collection([]).key_by(lambda r: r[0]).process(Tracker()))
    expected_seen: list[int] = []
    expected_counts: dict[int, int] = {}
    for call in range(3):
        CALLS.clear()
        values = list(range(call * 50, call * 50 + 50))
        out = _call(processor, handle, "k", [("k", v) for v in values], 0, first_seq=call * 50)
        assert CALLS["seen.write"] <= 1 and CALLS["counts.write"] <= 3
        assert CALLS["counts.read"] <= 3 and CALLS["seen.read"] <= 2
        for v in values:
            expected_seen.append(v)
            expected_counts[v % 3] = expected_counts.get(v % 3, 0) + 1
            if v % 7 == 0:
                del expected_counts[v % 3]
        assert out[-1] == ["k", expected_seen[-2:],
                           [list(kv) for kv in sorted(expected_counts.items())]]
