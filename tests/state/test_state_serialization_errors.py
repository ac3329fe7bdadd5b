"""A keyed state value that cannot be serialized fails the first checkpoint (or RocksDB
write) that meets it with a StateSerializationError naming the operator, the state and the
key, on the heap and RocksDB backends."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from reactive import (
    CheckpointConfig,
    Dataflow,
    JobFailedError,
    KeyedProcessFunction,
    RestartStrategy,
    ValueStateDescriptor,
)
from reactive.backends.heap import HeapKeyedStateBackend, HeapStateBackend
from reactive.backends.rocksdb import RocksDBStateBackend
from reactive.connectors.collections import ListSink
from reactive.errors import StateSerializationError
from reactive.keygroups import KeyGroupRange
from reactive.state.backend import SnapshotContext, StateBackend

UNSERIALIZABLE = {
    "lambda": lambda: (lambda x: x),
    "lock": threading.Lock,
}


class Remember(KeyedProcessFunction):
    """Keeps the last value per key; for key ``"bad"`` a value pickle refuses."""

    def __init__(self, bad: str) -> None:
        self.bad = bad

    def open(self, ctx: Any) -> None:
        self.last = ctx.get_state(ValueStateDescriptor("last"))

    def process_element(self, value: Any, ctx: Any) -> Iterable[Any]:
        self.last.update(UNSERIALIZABLE[self.bad]() if value == "bad" else value)
        return ()


class Refusing:
    """A descriptor serializer that refuses one value."""

    def serialize(self, value: Any) -> bytes:
        if value == "bad":
            raise ValueError("refused")
        return str(value).encode()

    def deserialize(self, data: bytes) -> Any:
        return data.decode()


class RememberWithSerializer(KeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        self.last = ctx.get_state(ValueStateDescriptor("last", serializer=Refusing()))

    def process_element(self, value: Any, ctx: Any) -> Iterable[Any]:
        self.last.update(value)
        return ()


def causes(exc: BaseException | None) -> Iterator[BaseException]:
    while exc is not None:
        yield exc
        exc = exc.__cause__


def serialization_error(exc: BaseException) -> StateSerializationError:
    found = [e for e in causes(exc) if isinstance(e, StateSerializationError)]
    assert found, f"no StateSerializationError in {[repr(e) for e in causes(exc)]}"
    return found[0]


def make_backend(name: str, tmp_path: Path, **options: Any) -> StateBackend:
    if name == "heap":
        return HeapStateBackend()
    return RocksDBStateBackend(path=tmp_path / "db", **options)


async def run_job(tmp_path: Path, fn: KeyedProcessFunction, backend: StateBackend,
                  parallelism: int = 1) -> JobFailedError:
    records = ["a", "b", "bad", "c", "d"]
    flow = Dataflow("unserializable", parallelism=parallelism, max_parallelism=128)
    (flow.from_collection(records).uid("src").key_by(lambda r: r)
         .process(fn).uid("remember").sink(ListSink()))
    with pytest.raises(JobFailedError) as info:
        # restarts are allowed, yet the job fails on the first attempt: every restart would
        # meet the same value again
        await flow.run(checkpoints=CheckpointConfig(interval=None, directory=tmp_path),
                       restart=RestartStrategy.fixed(3, 0.0), state_backend=backend)
    assert info.value.attempts == 1
    return info.value


def assert_names_the_entry(error: StateSerializationError) -> None:
    assert (error.operator, error.state_name, error.key) == ("remember", "last", "bad")
    text = str(error)
    assert "'remember'" in text and "'last'" in text and "'bad'" in text


@pytest.mark.parametrize("parallelism", [1, 2])
@pytest.mark.parametrize("bad", sorted(UNSERIALIZABLE))
@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
async def test_unpicklable_value_fails_the_checkpoint_naming_the_entry(
        tmp_path: Path, backend: str, bad: str, parallelism: int) -> None:
    failure = await run_job(tmp_path, Remember(bad), make_backend(backend, tmp_path),
                            parallelism)
    assert_names_the_entry(serialization_error(failure))
    # the job reports it, not a generic checkpoint failure
    assert "'last'" in str(failure) and "'bad'" in str(failure)


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
async def test_descriptor_serializer_refusal_names_the_entry(tmp_path: Path,
                                                             backend: str) -> None:
    failure = await run_job(tmp_path, RememberWithSerializer(), make_backend(backend, tmp_path))
    error = serialization_error(failure)
    assert_names_the_entry(error)
    assert isinstance(error.__cause__, ValueError)


@pytest.mark.parametrize("options", [{"write_batch_entries": 1}, {"cache_entries": 1}],
                         ids=["batch-write", "eviction"])
async def test_rocksdb_write_on_the_data_path_names_the_entry(tmp_path: Path,
                                                              options: dict[str, int]) -> None:
    failure = await run_job(tmp_path, Remember("lambda"),
                            make_backend("rocksdb", tmp_path, **options))
    assert_names_the_entry(serialization_error(failure))


async def test_heap_copy_on_write_defers_the_failure_to_the_snapshot(tmp_path: Path) -> None:
    backend = HeapKeyedStateBackend(KeyGroupRange(0, 127), 128, operator_uid="remember")
    last = backend.get_state(ValueStateDescriptor("last"))
    backend.set_current_key("bad")
    last.update(lambda x: x)  # type: ignore[attr-defined]
    job_dir = tmp_path / "job"
    ctx = SnapshotContext(1, job_dir, job_dir / "chk-1", job_dir / "shared", "remember", 0)
    snapshot = backend.snapshot(ctx)
    # the record touching the pending key group is not the one to fail
    backend.set_current_key("bad")
    last.update(1)  # type: ignore[attr-defined]
    with pytest.raises(StateSerializationError) as info:
        await snapshot.write()
    assert_names_the_entry(info.value)
    assert not list((job_dir / "chk-1").glob("*")), "a partial snapshot file was left behind"
    # the next snapshot holds the new value
    handle = await backend.snapshot(SnapshotContext(
        2, job_dir, job_dir / "chk-2", job_dir / "shared", "remember", 0)).write()
    assert handle["key_groups"]
