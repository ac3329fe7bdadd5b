"""Canonical key encoding: keys Python considers equal share one key group and one state
entry, in every process and on both backends; a key without an encoding fails the job at its
first record, naming the operator and the type, unless ``key_by`` gets a key serializer."""

from __future__ import annotations

import collections
import datetime
import enum
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reactive import (
    CheckpointConfig,
    CheckpointStorage,
    ConfigurationError,
    Dataflow,
    JobFailedError,
    RestartStrategy,
    RestoreError,
    assign_to_key_group,
)
from reactive.backends.heap import HeapStateBackend
from reactive.backends.rocksdb import RocksDBStateBackend, read_rocksdb_snapshot
from reactive.connectors.collections import ListSink
from reactive.errors import UnsupportedKeyError
from reactive.key_encoding import decode_key, encode_key
from reactive.keygroups import KeyGroupAssigner
from reactive.state.backend import StateBackend
from tests.support import Count, checkpoint_state

BACKENDS = ["heap", "rocksdb"]
ROOT = Path(__file__).resolve().parents[2]


def make_backend(name: str, tmp_path: Path) -> StateBackend:
    return HeapStateBackend() if name == "heap" else RocksDBStateBackend(path=tmp_path / "db")


def final_state(directory: Path, job: str, backend: str) -> dict[Any, Any]:
    """State ``count`` of operator ``count`` in the job's latest completed checkpoint."""
    if backend == "heap":
        return checkpoint_state(directory, job, "count", "count")
    import pickle

    chk = CheckpointStorage(directory, job).completed()[-1]
    out: dict[Any, Any] = {}
    for i, sub in chk.metadata.operators["count"].subtasks.items():
        if sub.keyed_state is not None:
            data = read_rocksdb_snapshot(sub.keyed_state.to_json(), chk.job_dir,
                                         directory / f"read-{job}-{i}")
            for k, v in data.get("count", {}).items():
                assert k not in out, f"key {k!r} stored twice"
                out[k] = pickle.loads(v)
    return out


def causes(exc: BaseException | None) -> Iterator[BaseException]:
    while exc is not None:
        yield exc
        exc = exc.__cause__


# ---------------------------------------------------------------------- the encoding
class Name(str):
    """A str subclass (like a StrEnum member): equal to the plain string."""


class Color(enum.StrEnum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


class Pair(NamedTuple):
    a: Any
    b: Any


SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                    st.text(), st.binary())
KEYS = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4).map(tuple),
                            st.frozensets(inner, max_size=4)),
    max_leaves=20,
)


def equal_twin(draw: st.DrawFn, key: Any) -> Any:
    """A key equal to ``key`` built from other types or in another order."""
    if isinstance(key, bool | int):
        options: list[Any] = [key, int(key)]
        if abs(key) < 2**53:
            options.append(float(key))
        if key in (0, 1):
            options.append(bool(key))
        if key == 0:
            options.append(-0.0)
        return draw(st.sampled_from(options))
    if isinstance(key, float):
        if key.is_integer():
            return draw(st.sampled_from([key, int(key), -key if key == 0 else key]))
        return key
    if isinstance(key, str):
        return draw(st.sampled_from([key, Name(key)]))
    if isinstance(key, tuple):
        items = tuple(equal_twin(draw, x) for x in key)
        if len(items) == 2 and draw(st.booleans()):
            return Pair(*items)
        return items
    if isinstance(key, frozenset):
        members = [equal_twin(draw, x) for x in key]
        return frozenset(draw(st.permutations(members)))
    return key


@st.composite
def twins(draw: st.DrawFn) -> tuple[Any, Any]:
    key = draw(KEYS)
    return key, equal_twin(draw, key)


@given(KEYS)
def test_decode_gives_back_an_equal_key(key: Any) -> None:
    data = encode_key(key)
    assert decode_key(data) == key
    assert encode_key(decode_key(data)) == data


@given(twins())
def test_equal_keys_have_identical_bytes(pair: tuple[Any, Any]) -> None:
    a, b = pair
    assert a == b
    assert encode_key(a) == encode_key(b)
    assert assign_to_key_group(a, 128) == assign_to_key_group(b, 128)


@given(KEYS, KEYS)
def test_bytes_are_equal_exactly_when_keys_are(a: Any, b: Any) -> None:
    assert (encode_key(a) == encode_key(b)) == (a == b)


def test_equal_keys_of_different_types_decode_to_one_canonical_form() -> None:
    assert encode_key(1) == encode_key(1.0) == encode_key(True)
    assert encode_key(0) == encode_key(-0.0) == encode_key(False)
    assert encode_key(Color.RED) == encode_key("red")
    assert encode_key(Level.HIGH) == encode_key(3)
    assert encode_key(Pair("x", 1)) == encode_key(("x", 1.0))
    assert encode_key(2**200) == encode_key(float(2**200))
    for key, canonical in [(True, 1), (2.0, 2), (Color.RED, "red"), (Pair(1, 2), (1, 2))]:
        decoded = decode_key(encode_key(key))
        assert decoded == canonical and type(decoded) is type(canonical)
    assert type(decode_key(encode_key(frozenset({True, "a"})))) is frozenset
    assert decode_key(encode_key(float("inf"))) == float("inf")
    assert decode_key(encode_key("\ud800 lone surrogate")) == "\ud800 lone surrogate"


@pytest.mark.e2e
def test_frozenset_bytes_do_not_depend_on_the_hash_seed() -> None:
    key = frozenset(f"member-{i}" for i in range(20))
    code = ("from reactive.key_encoding import encode_key;"
            "print(encode_key(frozenset(f'member-{i}' for i in range(20))).hex())")
    outputs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       cwd=ROOT, env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout.strip()
        for seed in (1, 2, 3)
    }
    assert outputs == {encode_key(key).hex()}


@pytest.mark.parametrize("key, type_name", [
    (Decimal("1.5"), "Decimal"),
    (datetime.date(2024, 1, 1), "date"),
    (enum.Enum("Plain", "A").A, "Plain"),  # type: ignore[attr-defined]
    (object(), "object"),
    (float("nan"), "float"),
    ((1, ("x", Decimal(2))), "Decimal"),
    (frozenset({1, Decimal(2)}), "Decimal"),
    ([1, 2], "list"),
])
def test_keys_without_an_encoding_are_refused_by_type(key: Any, type_name: str) -> None:
    with pytest.raises(UnsupportedKeyError) as info:
        encode_key(key)
    assert f"'{type_name}'" in str(info.value) or "NaN" in str(info.value)
    assert info.value.key_type.__name__ == type_name
    assert "key_serializer" in str(info.value)


def test_unhashable_keys_are_refused_before_hashing() -> None:
    with pytest.raises(UnsupportedKeyError, match=r"'list' is not hashable.*tuple"):
        KeyGroupAssigner(128)([1, 2])


@pytest.mark.parametrize("data", [
    b"",  # nothing
    b"\x09",  # unknown tag
    b"\x04\x05ab",  # a str whose length runs past the end
    encode_key(7) + b"\x00",  # trailing bytes
    b"\x03\x00",  # a truncated float
    b"\x02\x01\x05",  # a small int in the long form: not the one encoding of 5
    b"\x04\x02\xff\xfe",  # a short str that is not UTF-8 (the decoder's fast path)
    b"\x04\x01ab",  # a short str with a trailing byte
], ids=["empty", "tag", "length", "trailing", "truncated", "long-form", "utf-8",
        "str-trailing"])
def test_malformed_bytes_do_not_decode(data: bytes) -> None:
    with pytest.raises(ValueError, match="not a canonical key encoding"):
        decode_key(data)


# ---------------------------------------------------------------------- jobs
def count_flow(name: str, records: list[Any], parallelism: int, sink: ListSink,
               **key_by: Any) -> Dataflow:
    flow = Dataflow(name, parallelism=parallelism, max_parallelism=128, batch_size=8)
    (flow.from_collection(records).uid("src").key_by(lambda r: r, **key_by)
         .process(Count()).uid("count").sink(sink))
    return flow


@pytest.mark.parametrize("parallelism", [1, 2])
@pytest.mark.parametrize("backend", BACKENDS)
async def test_equal_keys_count_into_one_state_entry(tmp_path: Path, backend: str,
                                                     parallelism: int) -> None:
    config = CheckpointConfig(interval=None, directory=tmp_path)
    first = [1, 1.0, True] * 10
    sink = ListSink()
    await count_flow("equal", first, parallelism, sink).run(
        checkpoints=config, state_backend=make_backend(backend, tmp_path))
    assert sorted(n for _, n in sink.records) == list(range(1, 31))
    assert final_state(tmp_path, "equal", backend) == {1: 30}

    # resumed, the first key the new run meets is True: it must find the state of 1
    later = first + [True, 1.0, 1] * 5
    sink = ListSink()
    await count_flow("equal", later, parallelism, sink).run(
        checkpoints=config, state_backend=make_backend(backend, tmp_path), resume=True)
    assert [n for _, n in sink.records] == list(range(31, 46))
    assert final_state(tmp_path, "equal", backend) == {1: 45}


FROZEN_KEYS = [sorted(f"{prefix}{i}" for i in range(6)) for prefix in ("a", "b", "c", "d")]


def frozenset_job(directory: str, backend: str, rounds: int, resume: bool) -> None:
    """Count ``rounds`` rounds of the frozenset keys (in a fresh process), printing the
    emitted ``[sorted members, count]`` as JSON."""
    from reactive.runtime.loop import run_coroutine

    records = [frozenset(members) for _ in range(rounds) for members in FROZEN_KEYS]
    sink = ListSink()
    flow = count_flow("frozen", records, 2, sink)
    run_coroutine(flow.run(checkpoints=CheckpointConfig(interval=None, directory=directory),
                           state_backend=make_backend(backend, Path(directory)),
                           resume=resume))
    print(json.dumps([[sorted(k), n] for k, n in sink.records]))


def run_in_process(directory: Path, backend: str, rounds: int, resume: bool,
                   seed: int) -> list[tuple[tuple[str, ...], int]]:
    code = ("import sys; from tests.state.test_canonical_keys import frozenset_job; "
            f"frozenset_job({str(directory)!r}, {backend!r}, {rounds}, {resume})")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "PYTHONHASHSEED": str(seed)})
    assert out.returncode == 0, out.stderr[-3000:]
    return [(tuple(k), n) for k, n in json.loads(out.stdout.strip().splitlines()[-1])]


@pytest.mark.e2e
@pytest.mark.parametrize("backend", BACKENDS)
def test_frozenset_key_state_survives_a_restart_with_another_hash_seed(
        tmp_path: Path, backend: str) -> None:
    first = run_in_process(tmp_path, backend, rounds=3, resume=False, seed=1)
    assert collections.Counter(k for k, _ in first) == {tuple(m): 3 for m in FROZEN_KEYS}
    resumed = run_in_process(tmp_path, backend, rounds=5, resume=True, seed=2)
    by_key: dict[tuple[str, ...], list[int]] = {}
    for k, n in resumed:
        by_key.setdefault(k, []).append(n)
    # the counts continue: every key's state was found under the second hash seed
    assert by_key == {tuple(m): [4, 5] for m in FROZEN_KEYS}


@pytest.mark.parametrize("parallelism", [1, 2])
@pytest.mark.parametrize("backend", BACKENDS)
async def test_key_without_encoding_fails_the_job_naming_operator_and_type(
        tmp_path: Path, backend: str, parallelism: int) -> None:
    flow = Dataflow("decimal", parallelism=parallelism, max_parallelism=128)
    (flow.from_collection(["1.5", "2"]).uid("src").key_by(Decimal)
         .process(Count()).uid("count").sink(ListSink()))
    with pytest.raises(JobFailedError) as info:
        await flow.run(restart=RestartStrategy.fixed(3, 0.0),
                       state_backend=make_backend(backend, tmp_path))
    assert info.value.attempts == 1  # a restart would refuse the same key again
    errors = [e for e in causes(info.value) if isinstance(e, UnsupportedKeyError)]
    assert errors, f"no UnsupportedKeyError in {list(causes(info.value))}"
    assert errors[0].operator == "count" and errors[0].key_type is Decimal
    message = str(info.value)
    assert "operator 'count'" in message and "'Decimal'" in message
    assert "key_serializer" in message


@pytest.mark.parametrize("parallelism", [1, 2])
async def test_unhashable_key_fails_the_job_with_a_clear_error(tmp_path: Path,
                                                               parallelism: int) -> None:
    flow = Dataflow("lists", parallelism=parallelism, max_parallelism=128)
    (flow.from_collection([("a", 1)]).uid("src").key_by(list)
         .process(Count()).uid("count").sink(ListSink()))
    with pytest.raises(JobFailedError, match=r"operator 'count'.*'list' is not hashable"):
        await flow.run(restart=RestartStrategy.none())


class DecimalKeys:
    """Writes equal Decimals (``1.5``, ``1.50``) as identical bytes."""

    def serialize(self, key: Decimal) -> bytes:
        return str(key.normalize()).encode()

    def deserialize(self, data: bytes) -> Decimal:
        return Decimal(data.decode())


@pytest.mark.parametrize("parallelism", [1, 2])
@pytest.mark.parametrize("backend", BACKENDS)
async def test_key_serializer_keys_count_and_restore(tmp_path: Path, backend: str,
                                                     parallelism: int) -> None:
    config = CheckpointConfig(interval=None, directory=tmp_path)
    records = [Decimal("1.5"), Decimal("1.50"), Decimal("2")] * 4
    sink = ListSink()
    await count_flow("dec", records, parallelism, sink, key_serializer=DecimalKeys()).run(
        checkpoints=config, state_backend=make_backend(backend, tmp_path))
    assert max(n for k, n in sink.records if k == Decimal("1.5")) == 8
    assert max(n for k, n in sink.records if k == 2) == 4

    sink = ListSink()
    await count_flow("dec", [*records, Decimal("2.0"), Decimal("1.5")], parallelism, sink,
                     key_serializer=DecimalKeys()).run(
        checkpoints=config, state_backend=make_backend(backend, tmp_path), resume=True)
    assert sorted(sink.records) == [(Decimal("1.5"), 9), (Decimal("2.0"), 5)]


@pytest.mark.parametrize("backend", BACKENDS)
async def test_state_of_one_key_encoding_is_not_restored_with_another(
        tmp_path: Path, backend: str) -> None:
    config = CheckpointConfig(interval=None, directory=tmp_path)
    await count_flow("switch", ["a", "b"], 1, ListSink()).run(
        checkpoints=config, state_backend=make_backend(backend, tmp_path))

    class Utf8:
        def serialize(self, key: str) -> bytes:
            return key.encode()

        def deserialize(self, data: bytes) -> str:
            return data.decode()

    with pytest.raises(JobFailedError) as info:
        await count_flow("switch", ["a", "b", "c"], 1, ListSink(), key_serializer=Utf8()).run(
            checkpoints=config, state_backend=make_backend(backend, tmp_path), resume=True,
            restart=RestartStrategy.none())
    assert any(isinstance(e, RestoreError) and "key_serializer" in str(e)
               for e in causes(info.value))


def test_key_by_refuses_a_key_serializer_without_serialize() -> None:
    flow = Dataflow("bad")
    with pytest.raises(ConfigurationError, match="key_serializer"):
        flow.from_collection([1]).key_by(lambda r: r, key_serializer=object())  # type: ignore[arg-type]
