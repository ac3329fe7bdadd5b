"""The ``key_by`` partitioner sends every record to the instance owning its key's key group
(Flink's KeyGroupStreamPartitioner), also when its key -> channel memo overflows."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reactive.keygroups import assign_to_key_group, operator_index_for_key_group
from reactive.runtime.partitioner import KeyGroupPartitioner, KeySelectorError

keys = st.one_of(st.text(max_size=6), st.integers(-1000, 1000),
                 st.tuples(st.text(max_size=3), st.integers(0, 9)))


@settings(max_examples=60, deadline=None)
@given(records=st.lists(keys, max_size=300), channels=st.integers(2, 7),
       memo=st.integers(1, 50))
def test_every_record_goes_to_the_instance_owning_its_key_group(records, channels, memo):
    partitioner = KeyGroupPartitioner(channels, lambda r: r, 128)
    partitioner.assigner.cache_size = memo  # small memos overflow within one batch
    batch = records + records[::2]  # repeated keys hit the memo
    out = partitioner.split(batch)
    expected: list[list[object]] = [[] for _ in range(channels)]
    for r in batch:
        expected[operator_index_for_key_group(assign_to_key_group(r, 128), channels,
                                              128)].append(r)
    assert out == expected
    assert partitioner.split(batch) == expected  # the memo, now warm, agrees


def test_an_unhashable_key_names_the_keyed_operator():
    partitioner = KeyGroupPartitioner(2, lambda r: r, 128, operator="count")
    with pytest.raises(KeySelectorError) as info:
        partitioner.split(["a", ["not", "hashable"], "b"])
    assert info.value.record == ["not", "hashable"]
    assert "count" in str(info.value) and "hashable" in str(info.value)


def test_a_failing_key_selector_names_the_record():
    partitioner = KeyGroupPartitioner(2, lambda r: r["id"], 128)
    with pytest.raises(KeySelectorError) as info:
        partitioner.split([{"id": 1}, {"name": "x"}])
    assert info.value.record == {"name": "x"} and isinstance(info.value.cause, KeyError)
