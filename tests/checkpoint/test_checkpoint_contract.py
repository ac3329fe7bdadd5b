"""The typed checkpoint contract (``reactive.checkpoint.contract``) and the pending checkpoint's
behaviour: the metadata that real jobs write reads into the types and writes back byte for
byte; a savepoint written by the code before the types existed still restores; malformed
metadata is refused naming the field; ``PendingCheckpoint`` acknowledges, aborts and
finalizes as Flink's does."""

from __future__ import annotations

import asyncio
import collections
import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from reactive import CheckpointConfig, CheckpointStorage, Dataflow, PushSource
from reactive.backends.heap import HeapStateBackend
from reactive.backends.rocksdb import RocksDBStateBackend
from reactive.checkpoint.contract import (
    CheckpointMetadata,
    FileRef,
    KeyedStateHandle,
    OperatorState,
    OperatorSubtaskState,
    StateHandle,
)
from reactive.checkpoint.failure_reason import CheckpointFailureReason
from reactive.checkpoint.metadata import METADATA, read_metadata, write_metadata
from reactive.checkpoint.pending_checkpoint import (
    OperatorInfo,
    PendingCheckpoint,
    TaskAcknowledgeResult,
)
from reactive.checkpoint.savepoints import export_savepoint
from reactive.checkpoint.stats import CheckpointStats
from reactive.connectors.collections import ListSink
from reactive.errors import CheckpointError, CorruptCheckpointError
from reactive.keygroups import KeyGroupRange
from tests.checkpoint.test_unaligned_checkpoints import _flow as unaligned_flow
from tests.checkpoint.test_unaligned_checkpoints import _in_flight, slow_count
from tests.data.make_format_v2_savepoint import FIRST, JOB, MAXP, flow, words
from tests.support import Count, final_counts, zipf_words

FIXTURE = Path(__file__).parents[1] / "data" / "format_v2_savepoint"


def _assert_round_trip(directory: Path, scratch: Path) -> None:
    """``directory``'s ``_metadata`` reads into the types and, written again, is the same
    bytes (same keys, same order, same values, same checksum)."""
    original = (directory / METADATA).read_bytes()
    body = json.loads(original)["body"]
    metadata = read_metadata(directory)
    assert metadata.to_json() == body
    assert CheckpointMetadata.from_json(json.loads(json.dumps(body))) == metadata
    scratch.mkdir(parents=True)
    write_metadata(scratch, metadata)
    assert (scratch / METADATA).read_bytes() == original


# ---------------------------------------------------------------------- compatibility
async def test_a_savepoint_written_before_the_typed_contract_restores_rescaled(
        tmp_path: Path) -> None:
    """tests/data/format_v2_savepoint was written by the code before the types existed
    (tests/data/make_format_v2_savepoint.py): it reads, verifies, round-trips byte for byte
    and restores at another parallelism, the counts continuing where it stopped."""
    savepoint = tmp_path / "sp"
    shutil.copytree(FIXTURE, savepoint)
    loaded = CheckpointStorage.load(savepoint)  # verifies every file's size and sha256
    meta = loaded.metadata
    assert meta.is_savepoint and meta.self_contained and meta.job == JOB
    assert meta.max_parallelism == MAXP and meta.commits is False
    count = meta.operators["count"]
    assert (count.parallelism, count.keyed) == (2, True)
    assert [sub.key_group_range for _, sub in count.by_index()] == [
        KeyGroupRange(0, 7), KeyGroupRange(8, 15)]
    assert all(sub.keyed_state is not None and sub.keyed_state.backend == "heap"
               for sub in count.subtasks.values())
    assert meta.operators["src"].subtasks[0].operator_state is not None
    _assert_round_trip(savepoint, tmp_path / "rewritten")

    source, sink = PushSource(), ListSink()
    job = await flow(source, sink, 3).start(
        checkpoints=CheckpointConfig(interval=None, directory=tmp_path / "chk"),
        restore_from=savepoint)
    for w in words(200, offset=FIRST):
        await source.send(w)
    source.close()
    await job.wait()
    assert final_counts(sink.records) == collections.Counter(words(FIRST + 200))


@pytest.mark.parametrize("setup", ["heap-unaligned", "heap-incremental", "rocksdb-incremental"])
async def test_metadata_written_by_a_job_round_trips_byte_for_byte(
        tmp_path: Path, setup: str) -> None:
    """Every retained checkpoint of a real job (keyed state of both backends, shared files
    of incremental snapshots, operator state, in-flight records of unaligned checkpoints)
    and a savepoint exported from the newest."""
    items = zipf_words(16_000, 300, seed=3)
    chk_dir = tmp_path / "chk"
    if setup == "heap-unaligned":
        await unaligned_flow(items, slow_count(), 2, name="contract").run(
            checkpoints=CheckpointConfig(interval=0.05, directory=chk_dir, retained=20,
                                         unaligned=True))
    else:
        backend: Any = HeapStateBackend(incremental=True) if setup == "heap-incremental" \
            else RocksDBStateBackend(incremental=True)
        f = Dataflow("contract", parallelism=2, max_parallelism=16, batch_size=64)
        (f.from_collection(items).uid("src").key_by(lambda w: w).process(Count()).uid("count")
         .sink(ListSink()))
        await f.run(checkpoints=CheckpointConfig(interval=0.01, directory=chk_dir, retained=5),
                    state_backend=backend)
    completed = CheckpointStorage(chk_dir, "contract").completed()
    assert completed
    if setup == "heap-unaligned":
        assert any(_in_flight(c) for c in completed)  # channel state is among them
    else:
        assert any(c.metadata.shared_paths() for c in completed)  # shared files too
    for c in completed:
        _assert_round_trip(c.path, tmp_path / f"rewritten-{c.checkpoint_id}")
    exported = export_savepoint(completed[-1], tmp_path / "sp")
    assert exported.metadata.self_contained and not exported.metadata.shared_paths()
    _assert_round_trip(exported.path, tmp_path / "rewritten-sp")


async def test_a_completed_checkpoint_reads_typed_and_as_the_v2_dict(tmp_path: Path) -> None:
    """``CompletedCheckpoint.metadata`` reads through its typed fields and, as the dict of
    the v2 JSON form it was before the types, through ``[]``, ``get``, ``in``, ``keys``,
    ``items`` and ``dict(...)``: both give what the ``_metadata`` file holds, for a
    checkpoint of a job and for the savepoint written by the code before the types; nothing
    can be assigned through the dict view."""
    items = zipf_words(2_000, 40, seed=5)
    f = Dataflow("compat", parallelism=2, max_parallelism=16, batch_size=64)
    (f.from_collection(items).uid("src").key_by(lambda w: w).process(Count()).uid("count")
     .sink(ListSink()))
    await f.run(checkpoints=CheckpointConfig(interval=0.01, directory=tmp_path / "chk"))
    completed = CheckpointStorage(tmp_path / "chk", "compat").completed()[-1]
    shutil.copytree(FIXTURE, tmp_path / "sp")
    for checkpoint in (completed, CheckpointStorage.load(tmp_path / "sp")):
        meta = checkpoint.metadata
        body = json.loads((checkpoint.path / METADATA).read_text())["body"]
        # a reader of the dict form, as written against the untyped metadata
        assert dict(meta) == body and list(meta) == list(body) and len(meta) == len(body)
        assert meta.keys() == body.keys() and dict(meta.items()) == body
        assert meta.get("kind") == meta["kind"] == meta.kind
        assert meta["checkpoint_id"] == meta.checkpoint_id == checkpoint.checkpoint_id
        assert meta["max_parallelism"] == meta.max_parallelism == 16
        assert "operators" in meta and "no such field" not in meta
        assert meta.get("no such field") is None and meta.get("no such field", 7) == 7
        with pytest.raises(KeyError, match="no such field"):
            meta["no such field"]
        for uid, operator in meta["operators"].items():
            typed = meta.operators[uid]
            assert operator["parallelism"] == typed.parallelism
            for index, sub in operator["subtasks"].items():
                handle = typed.subtasks[int(index)].keyed_state
                if handle is None:
                    assert sub["keyed_state"] is None
                else:
                    assert [f["path"] for f in sub["keyed_state"]["files"]] == [
                        ref.path for ref in handle.files]
        assert {uid for uid, op in meta["operators"].items() if op["keyed"]} == {"count"}
        # read-only: the view is no way to change the metadata
        with pytest.raises(TypeError):
            meta["kind"] = "savepoint"  # type: ignore[index]
        meta["operators"].clear()
        assert meta.operators and meta["operators"] == body["operators"]


# ---------------------------------------------------------------------- malformed input
def _write_body(directory: Path, body: dict[str, Any]) -> None:
    import hashlib

    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / METADATA).write_text(json.dumps(
        {"body": body, "sha256": hashlib.sha256(canonical).hexdigest()}))


def _body() -> dict[str, Any]:
    return CheckpointMetadata(
        job="j", checkpoint_id=3, kind="checkpoint", max_parallelism=8, operators={
            "op": OperatorState("op", 1, True, {0: OperatorSubtaskState(
                KeyedStateHandle("heap", "heap-v1", (FileRef("chk-3/op-0.heap", 1, "ab"),)),
                None, KeyGroupRange(0, 7))})}).to_json()


@pytest.mark.parametrize(("edit", "message"), [
    (lambda b: b["operators"]["op"]["subtasks"]["0"]["keyed_state"]["files"][0].pop("sha256"),
     r"operator 'op'\.subtasks\.0\.keyed_state\.files\[0\]: 'sha256' is missing"),
    (lambda b: b["operators"]["op"]["subtasks"]["0"]["keyed_state"].pop("backend"),
     r"keyed_state: 'backend' is missing"),
    (lambda b: b["operators"]["op"]["subtasks"]["0"].update(key_group_range=[0]),
     r"'key_group_range' is \[0\], not \[start, end\]"),
    (lambda b: b["operators"]["op"].update(parallelism="1"),
     r"operator 'op': 'parallelism' is '1'"),
    (lambda b: b.pop("max_parallelism"), r"body: 'max_parallelism' is missing"),
])
def test_malformed_metadata_is_refused_naming_the_field(tmp_path: Path, edit: Any,
                                                        message: str) -> None:
    body = _body()
    read_metadata_ok = tmp_path / "ok"
    _write_body(read_metadata_ok, body)
    assert read_metadata(read_metadata_ok).to_json() == body
    edit(body)
    _write_body(tmp_path / "bad", body)
    with pytest.raises(CorruptCheckpointError, match=message):
        read_metadata(tmp_path / "bad")


def test_a_handle_keeps_the_fields_its_backend_wrote() -> None:
    doc = {"backend": "lsm", "files": [{"path": "chk-1/a", "size": 3, "sha256": "x"}],
           "levels": [[1, 2]], "format": "lsm-v3"}
    handle = KeyedStateHandle.from_json(doc)
    assert (handle.backend, handle.format, handle.shared) == ("lsm", "lsm-v3", None)
    assert handle.extra == {"levels": [[1, 2]]}
    assert list(handle.to_json().items()) == list(doc.items())  # its order too
    moved = handle.with_paths({"chk-1/a": "a"})
    assert moved.files == (FileRef("a", 3, "x"),) and moved.to_json()["levels"] == [[1, 2]]


# ---------------------------------------------------------------------- PendingCheckpoint
def _pending(commit: bool = True) -> PendingCheckpoint:
    operators = {"src": OperatorInfo("src", "Source", 1, False),
                 "count": OperatorInfo("count", "Count", 2, True)}
    return PendingCheckpoint(7, "checkpoint", time.monotonic() + 60, time.perf_counter(),
                             {"a", "b"}, CheckpointStats(7, trigger_time=123.0), commit,
                             operators)


def _figures(size: float) -> dict[str, float]:
    return {"alignment": 0.5, "sync": 0.25, "async": 1.0, "size": size}


def _keyed(i: int) -> OperatorSubtaskState:
    return OperatorSubtaskState(
        KeyedStateHandle("heap", "heap-v1", (FileRef(f"chk-7/count-{i}.heap", 10, "s"),)),
        None, KeyGroupRange(8 * i, 8 * i + 7))


async def test_pending_checkpoint_counts_each_task_once_and_finalizes_to_metadata() -> None:
    p = _pending()
    opstate = OperatorSubtaskState(operator_state=StateHandle(
        "pickle-v1", (FileRef("chk-7/src-0.opstate", 5, "t"),)))
    assert p.acknowledge("a", 0, {"src": opstate, "count": _keyed(0)}, _figures(15)) \
        is TaskAcknowledgeResult.SUCCESS
    assert p.acknowledge("a", 0, {}, _figures(1)) is TaskAcknowledgeResult.DUPLICATE
    assert p.acknowledge("z", 0, {}, _figures(1)) is TaskAcknowledgeResult.UNKNOWN
    assert not p.is_fully_acknowledged
    with pytest.raises(CheckpointError, match="1 task"):
        p.finalize(job="j", max_parallelism=16, mode="exactly_once", run_id="r",
                   checkpoint_dir_name="chk-7")
    with pytest.raises(KeyError, match="nope"):
        p.acknowledge("b", 1, {"nope": _keyed(1)}, _figures(1))
    assert p.acknowledge("b", 1, {"count": _keyed(1)}, _figures(10)) \
        is TaskAcknowledgeResult.SUCCESS
    assert p.is_fully_acknowledged
    meta = p.finalize(job="j", max_parallelism=16, mode="exactly_once", run_id="r",
                      checkpoint_dir_name="chk-7")
    assert meta.operators["count"] == OperatorState("Count", 2, True,
                                                    {0: _keyed(0), 1: _keyed(1)})
    assert meta.operators["src"].subtasks == {0: opstate}
    assert (meta.checkpoint_id, meta.kind, meta.commits, meta.run_id, meta.timestamp) == (
        7, "checkpoint", True, "r", 123.0)
    assert meta.metrics is not None and meta.metrics.status == "completed"
    assert meta.metrics.size == 25 and meta.metrics.async_ == 1.0
    assert meta.state_size == 25
    assert CheckpointMetadata.from_json(meta.to_json()) == meta


async def test_pending_savepoint_is_finalized_with_paths_of_its_own_directory() -> None:
    p = _pending()
    p.kind = "savepoint"
    p.acknowledge("a", 0, {"count": _keyed(0)}, _figures(1))
    p.acknowledge("b", 1, {"count": _keyed(1)}, _figures(1))
    meta = p.finalize(job="j", max_parallelism=16, mode="exactly_once", run_id="r",
                      checkpoint_dir_name="chk-7")
    assert meta.self_contained
    assert sorted(r.path for r in meta.file_refs()) == ["count-0.heap", "count-1.heap"]
    shared = _pending()
    shared.kind = "savepoint"
    outside = OperatorSubtaskState(KeyedStateHandle(
        "heap", "heap-v2", (FileRef("shared/x", 1, "s"),), (FileRef("shared/x", 1, "s"),)))
    shared.acknowledge("a", 0, {"count": outside}, _figures(1))
    shared.acknowledge("b", 1, {"count": _keyed(1)}, _figures(1))
    with pytest.raises(CheckpointError, match="self-contained"):
        shared.finalize(job="j", max_parallelism=16, mode="exactly_once", run_id="r",
                        checkpoint_dir_name="chk-7")


async def test_an_aborted_pending_checkpoint_fails_its_waiters_and_takes_no_more_acks() -> None:
    p = _pending()
    waiter = asyncio.ensure_future(asyncio.shield(p.done))
    error = p.abort(CheckpointFailureReason.CHECKPOINT_EXPIRED, "timed out after 1 s")
    assert p.is_discarded and p.stats.status == "aborted"
    assert p.stats.failure_reason == "CHECKPOINT_EXPIRED"
    with pytest.raises(CheckpointError, match="checkpoint 7 aborted: timed out") as caught:
        await waiter
    assert caught.value is error
    assert p.committed.done() and p.committed.exception() is error
    assert p.acknowledge("a", 0, {}, _figures(1)) is TaskAcknowledgeResult.DISCARDED
    with pytest.raises(CheckpointError, match="aborted"):
        p.finalize(job="j", max_parallelism=16, mode="exactly_once", run_id="r",
                   checkpoint_dir_name="chk-7")
