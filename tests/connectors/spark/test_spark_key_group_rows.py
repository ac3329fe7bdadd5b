"""The key-group plan's packed rows (no Spark runs): the reader packs each key group's
records into one row per stretch of the source, with the key group the embedded runtime
computes, the largest event time, and the end-of-input marker as its own row; unpacking a
key group's rows gives its records in source order, a flat_map's outputs in their order."""

from __future__ import annotations

import datetime
import pickle
from typing import Any

import pytest

from reactive import Dataflow
from reactive.connectors.files import CommittingFileSink
from reactive.connectors.spark.key_group_rows import (
    MARKER_KEY_GROUP,
    key_group_records,
    unpack_records,
)
from reactive.connectors.spark.record_chain import (
    END_OF_INPUT,
    END_OF_INPUT_TIME,
    row_chunks,
)
from reactive.connectors.spark.translation import QueryPlan, translate
from reactive.errors import UserFunctionError
from reactive.key_encoding import encode_key
from reactive.keygroups import key_group_of_bytes
from tests.support import Count


def plan_of(tmp_path: Any, words: list[Any], *, split: bool = False,
            timestamps: bool = False) -> QueryPlan:
    flow = Dataflow("rows", max_parallelism=16)
    stream = flow.from_collection(words)
    if split:  # two records per input record, sharing its source position
        stream = stream.flat_map(lambda w: [f"{w}-1", f"{w}-2"])
    if timestamps:
        stream = stream.assign_timestamps(lambda w: float(len(w)))
    stream.key_by(lambda w: w).process(Count()).sink(CommittingFileSink(tmp_path / "out"))
    (plan,) = translate(flow)
    return plan


def rows_of(plan: QueryPlan, words: list[Any], flush: int, chunk: int = 3) -> list[dict[str, Any]]:
    source = [(w, None, i) for i, w in enumerate(words)]
    source.append((END_OF_INPUT, END_OF_INPUT_TIME, len(words)))
    batches = list(key_group_records(plan, flush)(row_chunks(iter(source), chunk)))
    return [row for b in batches for row in b.to_pylist()]


def records_by_group(rows: list[dict[str, Any]]) -> dict[int, list[Any]]:
    groups: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        if row["records"] is not None:
            groups.setdefault(row["kg"], []).append(row)
    # the rows of a key group in any order (Spark's sort by key group is not stable)
    return {g: unpack_records([r["records"] for r in reversed(rs)],
                              [r["seq"] for r in reversed(rs)])
            for g, rs in groups.items()}


@pytest.mark.parametrize("flush", [1, 4, 1000])
def test_packed_rows_give_each_key_group_its_records_in_source_order(
        tmp_path: Any, flush: int) -> None:
    words = [f"w{i % 7}" for i in range(40)]
    rows = rows_of(plan_of(tmp_path, words), words, flush)
    # the marker is the last row, alone, in a key group of its own, with the marker's time
    assert rows[-1]["records"] is None and rows[-1]["kg"] == MARKER_KEY_GROUP
    assert rows[-1]["ts"] == END_OF_INPUT_TIME and rows[-1]["seq"] == len(words)
    assert all(r["records"] is not None for r in rows[:-1])
    expected: dict[int, list[Any]] = {}
    for w in words:
        expected.setdefault(key_group_of_bytes(encode_key(w), 16), []).append(w)
    assert records_by_group(rows) == expected
    if flush == 1000:  # one row per key group when nothing is flushed early
        assert len(rows) == len(expected) + 1


def test_flat_map_outputs_keep_their_order_and_event_times_their_maximum(
        tmp_path: Any) -> None:
    words = ["a", "bb", "a", "ccc", "bb", "a"]
    rows = rows_of(plan_of(tmp_path, words, split=True, timestamps=True), words, flush=2)
    got = records_by_group(rows)
    expected: dict[int, list[Any]] = {}
    for w in words:
        for part in (f"{w}-1", f"{w}-2"):
            expected.setdefault(key_group_of_bytes(encode_key(part), 16), []).append(part)
    assert got == expected
    for row in rows[:-1]:
        _, records = pickle.loads(row["records"])
        latest = max(float(len(r)) for r in records)
        assert row["ts"] == datetime.datetime.fromtimestamp(latest, datetime.UTC)


def test_a_failing_key_selector_names_the_record_and_its_position(tmp_path: Any) -> None:
    words: list[Any] = ["a", "b", None, "c"]
    flow = Dataflow("rows", max_parallelism=16)
    (flow.from_collection(words).key_by(lambda w: w.upper()).process(Count())
         .sink(CommittingFileSink(tmp_path / "out")))
    (plan,) = translate(flow)
    with pytest.raises(UserFunctionError) as info:
        rows_of(plan, words, flush=100)
    assert info.value.record is None and info.value.position == "record 2"
