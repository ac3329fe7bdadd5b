"""The backends' own TTL value states (heap, RocksDB) against the TTL decorator, with the clock frozen
for batches as the operators freeze it: every read answers what the decorator answers at the
batch's time, and both leave the same ``(value, expires_at)`` pairs and expired counts, for
each update type and visibility."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from reactive import KeyGroupRange, ValueStateDescriptor
from reactive.backends.heap import HeapStateBackend
from reactive.backends.rocksdb import RocksDBStateBackend
from reactive.state.ttl import StateTtlConfig, backend_descriptor, ttl_state
from reactive.state.ttl_clock import TtlClock

TTL = 5.0
KEYS = [f"k{i}" for i in range(6)]


def _backend(kind: str, path: Path) -> Any:
    backend = HeapStateBackend() if kind == "heap" else RocksDBStateBackend(path=path)
    return backend.create_keyed_backend(
        job_name="j", operator_uid="op", subtask=0, key_group_range=KeyGroupRange(0, 15),
        max_parallelism=16)


@pytest.mark.parametrize("visibility", ["never_return_expired",
                                        "return_expired_if_not_cleaned_up"])
@pytest.mark.parametrize("update_type", ["on_create_and_write", "on_read_and_write"])
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_the_native_state_answers_as_the_decorator_in_and_out_of_batches(
        backend: str, update_type: str, visibility: str, seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    now = [100.0]
    config = StateTtlConfig(TTL, update_type=update_type,  # type: ignore[arg-type]
                            visibility=visibility)  # type: ignore[arg-type]
    descriptor = ValueStateDescriptor("v", default="none", ttl=config)
    native_kb, reference_kb = _backend(backend, tmp_path / "a"), _backend(backend, tmp_path / "b")
    native_clock, reference_clock = TtlClock(lambda: now[0]), TtlClock(lambda: now[0])
    native: Any = native_kb.get_ttl_state(descriptor, config, native_clock)
    assert native is not None and type(native).__name__.endswith(
        "TtlValueStateOnRead" if update_type == "on_read_and_write" else "TtlValueState")
    assert type(native).__module__ != "reactive.state.ttl"  # the backend's own
    reference: Any = ttl_state(descriptor, config,
                               reference_kb.get_state(backend_descriptor(descriptor, config)),
                               reference_clock.now)
    stored = backend_descriptor(descriptor, config)
    native_raw: Any = native_kb.get_state(stored)
    reference_raw: Any = reference_kb.get_state(stored)
    frozen = False
    reads = 0
    for step in range(600):
        op = rng.random()
        if op < 0.08:  # a batch starts or ends
            for clock in (native_clock, reference_clock):
                clock.thaw() if frozen else clock.freeze()
            frozen = not frozen
        elif op < 0.2:  # time passes (inside a batch too: the batch still sees its start)
            now[0] += rng.choice([0.5, 1.0, 2.5, TTL])
        else:
            key = rng.choice(KEYS)
            native_kb.set_current_key(key)
            reference_kb.set_current_key(key)
            if op < 0.75:
                assert native.value() == reference.value(), (step, key, now[0], frozen)
                reads += 1
            elif op < 0.95:
                native.update(step)
                reference.update(step)
            else:
                native.clear()
                reference.clear()
            # the same pair stored (a refresh on read included): snapshots do not depend on
            # which state wrote it
            assert native_raw.value() == reference_raw.value(), (step, key, now[0], frozen)
    assert reads > 200
    assert native.expired == reference.expired
    assert native.expired > 0
    native_kb.dispose()
    reference_kb.dispose()
