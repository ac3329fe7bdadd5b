"""Key groups: contiguous ranges that partition [0, max_parallelism), stable hashing."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reactive import assign_to_key_group, key_group_range_for_operator
from reactive.keygroups import KeyGroupAssigner, operator_index_for_key_group


@given(st.integers(1, 512), st.data())
def test_ranges_partition_the_key_groups(max_parallelism, data):
    p = data.draw(st.integers(1, max_parallelism))
    owner: dict[int, int] = {}
    for i in range(p):
        r = key_group_range_for_operator(i, p, max_parallelism)
        assert len(r) >= 1
        for kg in r:
            assert kg not in owner
            owner[kg] = i
            assert operator_index_for_key_group(kg, p, max_parallelism) == i
    assert sorted(owner) == list(range(max_parallelism))


@given(st.one_of(st.text(), st.integers(), st.tuples(st.text(), st.integers())))
def test_assigner_memo_agrees_with_the_hash(key):
    assert KeyGroupAssigner(128)(key) == assign_to_key_group(key, 128)
    assert 0 <= assign_to_key_group(key, 128) < 128


@pytest.mark.e2e
def test_key_groups_are_stable_across_processes():
    keys = ["JFK", ("EWR", "UA"), 42, "ünïcode", b"bytes", 3.5]
    code = (
        "from reactive import assign_to_key_group as a;"
        f"print([a(k, 128) for k in {keys!r}])"
    )
    outputs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       check=True, env={"PYTHONHASHSEED": str(seed)}).stdout
        for seed in (1, 2)
    }
    assert outputs == {f"{[assign_to_key_group(k, 128) for k in keys]}\n"}
