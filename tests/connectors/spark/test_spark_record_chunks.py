"""The Spark read tasks' chain over a chunk of records (``run_chunk``, one step at a time)
gives what the per-record chain (``run_steps``) gives, record by record, and fails naming
the same operator, record and source position."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("pyspark", reason="the Spark runner needs pyspark")

from hypothesis import given, settings
from hypothesis import strategies as st

from reactive.connectors.spark.record_chain import run_chunk, run_steps
from reactive.connectors.spark.translation import RecordStep
from reactive.errors import UserFunctionError

#: per-record steps over ints (and the tuples a map makes of them)
STEPS: dict[str, RecordStep] = {
    "double": RecordStep("double", "double", "map", lambda r: r * 2 if isinstance(r, int)
                         else r),
    "odd": RecordStep("odd", "odd", "filter", lambda r: not isinstance(r, int) or r % 2 == 1),
    "not-7": RecordStep("not-7", "not-7", "filter", lambda r: r != 7),
    "split": RecordStep("split", "split", "flat_map",
                        lambda r: [r, r + 1, r + 2] if isinstance(r, int) and r % 3 == 0
                        else [] if isinstance(r, int) and r % 5 == 0 else [r]),
    "ts": RecordStep("ts", "ts", "timestamps", lambda r: r if isinstance(r, int) else 0),
    "pair": RecordStep("pair", "pair", "map", lambda r: (r, "x")),
}


def per_record(steps: list[RecordStep], records: list[Any], seqs: list[int]
               ) -> tuple[list[Any], list[Any] | None, list[int]]:
    outs: list[Any] = []
    tss: list[Any] = []
    positions: list[int] = []
    for record, seq in zip(records, seqs, strict=True):
        for r, t in run_steps(steps, record, None, f"record {seq}"):
            outs.append(r)
            tss.append(t)
            positions.append(seq)
    timed = any(s.kind == "timestamps" for s in steps)
    return outs, tss if timed else None, positions


@settings(max_examples=200, deadline=None)
@given(chain=st.lists(st.sampled_from(sorted(STEPS)), max_size=6),
       records=st.lists(st.integers(-20, 40), max_size=60))
def test_a_chunk_through_the_steps_equals_each_record_through_them(
        chain: list[str], records: list[int]) -> None:
    steps = [STEPS[name] for name in chain]
    seqs = [100 + 3 * i for i in range(len(records))]
    assert run_chunk(steps, records, seqs) == per_record(steps, records, seqs)


@pytest.mark.parametrize("kind", ["map", "filter", "flat_map", "timestamps"])
def test_a_failing_function_is_named_with_the_record_and_position_as_per_record(
        kind: str) -> None:
    def fails_on_4(r: int) -> Any:
        if r == 4:
            raise ValueError("four")
        return [r] if kind == "flat_map" else r

    steps = [STEPS["double"], RecordStep("bad", "bad-uid", kind, fails_on_4)]
    records, seqs = [1, 5, 2, 3, 2], [10, 11, 12, 13, 14]  # 2 doubles to 4: at 12 first
    with pytest.raises(UserFunctionError) as chunked:
        run_chunk(steps, records, seqs)
    with pytest.raises(UserFunctionError) as each:
        per_record(steps, records, seqs)
    got = (chunked.value.operator, chunked.value.uid, chunked.value.record,
           chunked.value.position)
    assert got == ("bad", "bad-uid", 4, "record 12")
    assert got == (each.value.operator, each.value.uid, each.value.record,
                   each.value.position)
    assert isinstance(chunked.value.__cause__, ValueError)


def test_an_event_time_that_is_no_number_names_the_record() -> None:
    steps = [RecordStep("ts", "ts-uid", "timestamps", lambda r: "soon" if r == 2 else r)]
    with pytest.raises(UserFunctionError) as info:
        run_chunk(steps, [1, 2, 3], [0, 1, 2])
    assert (info.value.operator, info.value.record, info.value.position) == \
        ("ts", 2, "record 1")
