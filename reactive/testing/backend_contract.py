"""The state-backend contract suite: pytest tests that a backend's own test module subclasses.

A state backend, the built-in ones or a third party's, runs it by subclassing
:class:`StateBackendContract` in one of its test modules (the class name must start with
``Test`` for pytest to collect it) and returning its backend::

    from reactive.testing.backend_contract import StateBackendContract

    class TestMyBackend(StateBackendContract):
        def create_state_backend(self, tmp_path):
            return MyStateBackend(path=tmp_path / "state")

(or override the ``state_backend`` fixture, to build the backend from other fixtures).
The asynchronous tests carry ``pytest.mark.asyncio``, so they run under pytest-asyncio's
default *strict* mode as well as its auto mode; the module needs pytest and pytest-asyncio
(the ``test`` extra).

The tests drive the backend the way the runtime does, on the threads the runtime uses:
``create_keyed_backend`` for a key-group range, ``set_current_key`` + the state API per
record, ``snapshot(ctx)`` (synchronous part) then ``await snap.write()`` (asynchronous part,
while the task keeps changing state) returning a JSON-serializable handle,
``notify_checkpoint_complete`` and ``dispose`` all on the event loop's thread, and
``restore(handles, job_dir)`` into new instances of any key-group range in a worker thread (as
the runtime restores off the loop). They check value/list/map/reducing semantics, per-key
isolation, the snapshot/restore round trip, restoring a key-group subset and merging several
instances,
snapshots isolated from later updates (including in-place mutation of a value read before),
self-contained savepoints, and custom serializers; every handle's files are checked as the
runtime relies on them (:func:`check_snapshot_handle`: relative paths under the job directory,
no ``..``, existing, with the recorded size and sha256, exclusive files under ``chk-<n>``,
shared ones under ``shared/``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import TYPE_CHECKING, Any, cast

from ..checkpoint.contract import KeyedStateHandle
from ..checkpoint.off_loop import in_thread
from ..errors import CorruptCheckpointError, RestoreError, StateAccessError
from ..extras import require
from ..keygroups import KeyGroupRange, assign_to_key_group
from ..state.api import ListState, MapState, ReducingState, ValueState
from ..state.backend import KeyedStateBackend, SnapshotContext, StateBackend
from ..state.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)

if TYPE_CHECKING:
    import pytest
else:
    pytest = require("pytest", "test", "the state backend contract suite")
    require("pytest_asyncio", "test", "the state backend contract suite")

__all__ = ["BackendHarness", "StateBackendContract", "check_snapshot_handle"]

MAX_PARALLELISM = 16
FULL = KeyGroupRange(0, MAX_PARALLELISM - 1)
LOW = KeyGroupRange(0, MAX_PARALLELISM // 2 - 1)
HIGH = KeyGroupRange(MAX_PARALLELISM // 2, MAX_PARALLELISM - 1)

COUNT = ValueStateDescriptor("count", default=0)
ITEMS = ValueStateDescriptor("items")
LOG = ListStateDescriptor("log")
ATTRS = MapStateDescriptor("attrs")
TOTAL = ReducingStateDescriptor("total", reduce_fn=lambda a, b: a + b)


def _value(kb: KeyedStateBackend, descriptor: ValueStateDescriptor) -> ValueState:
    return cast(ValueState, kb.get_state(descriptor))


def _list(kb: KeyedStateBackend, descriptor: ListStateDescriptor) -> ListState:
    return cast(ListState, kb.get_state(descriptor))


def _map(kb: KeyedStateBackend, descriptor: MapStateDescriptor) -> MapState:
    return cast(MapState, kb.get_state(descriptor))


def _reducing(kb: KeyedStateBackend, descriptor: ReducingStateDescriptor) -> ReducingState:
    return cast(ReducingState, kb.get_state(descriptor))


class BackendHarness:
    """Runs a :class:`StateBackend` outside a job, as the runtime's tasks do.

    Args:
        backend (StateBackend): the backend under test.
        job_dir (Path): where snapshots write (handle paths are relative to it).
    """

    def __init__(self, backend: StateBackend, job_dir: Path) -> None:
        self.backend = backend
        self.job_dir = job_dir
        self.instances: list[KeyedStateBackend] = []
        self._next_subtask = 0

    def create(self, key_group_range: KeyGroupRange = FULL) -> KeyedStateBackend:
        """A new keyed backend owning ``key_group_range`` (disposed by :meth:`close`).

        Args:
            key_group_range (KeyGroupRange): its key groups (of :data:`MAX_PARALLELISM`).

        Returns:
            KeyedStateBackend: the new instance.
        """
        kb = self.backend.create_keyed_backend(
            job_name="contract", operator_uid="op", subtask=self._next_subtask,
            key_group_range=key_group_range, max_parallelism=MAX_PARALLELISM,
        )
        self._next_subtask += 1
        self.instances.append(kb)
        return kb

    def context(self, kb: KeyedStateBackend, checkpoint_id: int,
                savepoint: bool = False) -> SnapshotContext:
        """The snapshot context the runtime would pass for ``checkpoint_id``.

        Args:
            kb (KeyedStateBackend): an instance this harness created.
            checkpoint_id (int): the checkpoint.
            savepoint (bool): a self-contained savepoint's context.

        Returns:
            SnapshotContext: paths under :attr:`job_dir`.
        """
        return SnapshotContext(
            checkpoint_id, self.job_dir, self.job_dir / f"chk-{checkpoint_id}",
            self.job_dir / "shared", "op", self.instances.index(kb), savepoint,
        )

    async def checkpoint(self, kb: KeyedStateBackend, checkpoint_id: int) -> dict[str, Any]:
        """Synchronous + asynchronous part, then completion.

        Args:
            kb (KeyedStateBackend): an instance this harness created.
            checkpoint_id (int): the checkpoint.

        Returns:
            dict[str, Any]: the snapshot's handle.
        """
        ctx = self.context(kb, checkpoint_id)
        snap = kb.snapshot(ctx)
        handle = await snap.write()
        check_snapshot_handle(handle, ctx)
        kb.notify_checkpoint_complete(checkpoint_id)
        return handle

    async def savepoint(self, kb: KeyedStateBackend, checkpoint_id: int) -> dict[str, Any]:
        """A self-contained snapshot (``SnapshotContext.savepoint``), which completes without
        ``notify_checkpoint_complete``, as an intermediate savepoint does.

        Args:
            kb (KeyedStateBackend): an instance this harness created.
            checkpoint_id (int): the savepoint's id.

        Returns:
            dict[str, Any]: the savepoint's handle.
        """
        ctx = self.context(kb, checkpoint_id, savepoint=True)
        handle = await kb.snapshot(ctx).write()
        check_snapshot_handle(handle, ctx)
        return handle

    async def restore(self, handles: list[dict[str, Any]],
                      key_group_range: KeyGroupRange = FULL) -> KeyedStateBackend:
        """A new keyed backend of ``key_group_range`` restored from ``handles``, on the
        threads the runtime uses: created on the event loop's thread, ``restore`` called
        in a worker thread (the runtime's :func:`~reactive.checkpoint.off_loop.in_thread`),
        every later hook on the loop's thread again.

        Args:
            handles (list[dict[str, Any]]): snapshot handles (of any instances).
            key_group_range (KeyGroupRange): the new instance's key groups.

        Returns:
            KeyedStateBackend: the restored instance.

        Raises:
            Exception: whatever the backend's ``restore`` raised.
        """
        kb = self.create(key_group_range)
        # handles travel through the JSON metadata: restore from what JSON gives back
        await in_thread(kb.restore, json.loads(json.dumps(handles)), self.job_dir)
        return kb

    def close(self) -> None:
        """Dispose every keyed backend created."""
        for kb in self.instances:
            kb.dispose()
        self.instances.clear()


def check_snapshot_handle(handle: dict[str, Any], ctx: SnapshotContext) -> None:
    """Check what a snapshot handle says about its files, as the runtime relies on it.

    The runtime stores the handle in the checkpoint's JSON metadata, verifies each listed
    file's size and sha256 before a restore (a mismatch makes the checkpoint unrestorable),
    resolves the paths under the job directory (refusing absolute paths and ``..``),
    deletes ``chk-<n>`` with the checkpoint and a file of ``"shared"`` when no retained
    checkpoint lists it, and moves a savepoint's ``chk-<n>`` elsewhere. So the handle must
    be JSON-serializable and name its backend; every ``{"path", "size", "sha256"}`` of
    ``"files"`` must be a relative POSIX path without ``..`` naming an existing file under
    ``ctx.job_dir`` with that size and sha256; the ``"shared"`` entries must be files of
    ``"files"`` under ``ctx.shared_dir`` and every other file must lie under
    ``ctx.checkpoint_dir``; a savepoint (``ctx.savepoint``) lists no shared file.

    Args:
        handle (dict[str, Any]): what ``KeyedStateSnapshot.write`` returned.
        ctx (SnapshotContext): the context the snapshot was taken with.

    Raises:
        AssertionError: naming the file and what is wrong with it.
    """
    try:
        json.dumps(handle)
    except (TypeError, ValueError) as exc:
        raise AssertionError(f"the snapshot handle is not JSON-serializable: {exc}") from exc
    assert isinstance(handle.get("backend"), str) and handle["backend"], \
        f"the snapshot handle names no backend (its 'backend' is {handle.get('backend')!r})"
    files = handle.get("files")
    assert isinstance(files, list), f"the snapshot handle's 'files' is {files!r}, not a list"
    job_dir = ctx.job_dir.resolve()
    for ref in files:
        assert isinstance(ref, dict) and {"path", "size", "sha256"} <= ref.keys(), \
            f"a file of the snapshot handle is {ref!r}, not {{'path', 'size', 'sha256'}}"
        rel = ref["path"]
        assert isinstance(rel, str) and rel, f"file path {rel!r} is not a non-empty str"
        assert not PurePosixPath(rel).is_absolute() and not PureWindowsPath(rel).is_absolute() \
            and not PureWindowsPath(rel).drive, (
                f"file path {rel!r} is absolute: handle paths are relative to the job "
                "directory (SnapshotContext.relative), or the checkpoint cannot move")
        assert ".." not in rel.replace("\\", "/").split("/"), (
            f"file path {rel!r} contains '..': the runtime refuses such paths on restore")
        path = ctx.job_dir / rel
        assert path.resolve().is_relative_to(job_dir), \
            f"file path {rel!r} leads outside the job directory {ctx.job_dir}"
        assert path.is_file(), f"file {rel!r} listed by the snapshot handle does not exist"
        size = path.stat().st_size
        assert ref["size"] == size, \
            f"file {rel!r} has {size} bytes, the snapshot handle says {ref['size']!r}"
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        assert ref["sha256"] == digest, (
            f"file {rel!r} has sha256 {digest}, the snapshot handle says {ref['sha256']!r}: "
            "the runtime would refuse to restore the checkpoint")
    listed = {ref["path"] for ref in files}
    shared = handle.get("shared", [])
    assert isinstance(shared, list), f"the snapshot handle's 'shared' is {shared!r}"
    assert not (ctx.savepoint and shared), (
        f"a savepoint's handle lists shared files {[r.get('path') for r in shared]}: a "
        "savepoint must be self-contained (SnapshotContext.savepoint)")
    shared_dir, checkpoint_dir = ctx.shared_dir.resolve(), ctx.checkpoint_dir.resolve()
    shared_paths: set[str] = set()
    for ref in shared:
        rel = ref.get("path") if isinstance(ref, dict) else None
        assert isinstance(rel, str) and rel in listed, \
            f"shared file {rel!r} is not among the handle's 'files'"
        assert (ctx.job_dir / rel).resolve().is_relative_to(shared_dir), \
            f"shared file {rel!r} is not under {ctx.shared_dir}"
        shared_paths.add(rel)
    for rel in listed - shared_paths:
        assert (ctx.job_dir / rel).resolve().is_relative_to(checkpoint_dir), (
            f"file {rel!r} is not under {ctx.checkpoint_dir} and not listed as shared: it "
            "would outlive (or be deleted before) the checkpoint that needs it")
    try:  # what the runtime reads of it when the task acknowledges
        typed = KeyedStateHandle.from_json(handle)
    except CorruptCheckpointError as exc:
        raise AssertionError(f"the runtime cannot read the snapshot handle: {exc}") from exc
    assert typed.to_json() == handle, \
        "the snapshot handle does not survive the checkpoint metadata unchanged"


def keys_in(kgr: KeyGroupRange, n: int) -> list[str]:
    """The first ``n`` keys ``"k<i>"`` whose key group lies in ``kgr``."""
    out: list[str] = []
    i = 0
    while len(out) < n:
        key = f"k{i}"
        if assign_to_key_group(key, MAX_PARALLELISM) in kgr:
            out.append(key)
        i += 1
    return out


def fill(kb: KeyedStateBackend, keys: list[str]) -> dict[str, tuple[Any, ...]]:
    """Write every kind of state for ``keys``; return what each key should hold as
    ``(count, log, attrs, total)``."""
    count, log = _value(kb, COUNT), _list(kb, LOG)
    attrs, total = _map(kb, ATTRS), _reducing(kb, TOTAL)
    expected = {}
    for i, key in enumerate(keys):
        kb.set_current_key(key)
        count.update(i)
        log.add_all([key, i])
        attrs.put("i", i)
        attrs.put(("t", i), key)
        total.add(i)
        total.add(1)
        expected[key] = (i, [key, i], {"i": i, ("t", i): key}, i + 1)
    return expected


def read_all(kb: KeyedStateBackend, keys: list[str]) -> dict[str, tuple[Any, ...]]:
    """Read back what :func:`fill` wrote, for ``keys``."""
    count, log = _value(kb, COUNT), _list(kb, LOG)
    attrs, total = _map(kb, ATTRS), _reducing(kb, TOTAL)
    out = {}
    for key in keys:
        kb.set_current_key(key)
        out[key] = (count.value(), log.get(), dict(attrs.items()), total.get())
    return out


class _Opaque:
    """A value pickle refuses: only a custom serializer can store it."""

    def __init__(self, payload: str) -> None:
        self.payload = payload

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Opaque) and other.payload == self.payload

    def __hash__(self) -> int:
        return hash(self.payload)

    def __reduce__(self) -> Any:
        raise TypeError("_Opaque values must go through OpaqueSerializer")


class OpaqueSerializer:
    """Stores :class:`_Opaque` as ``b"opaque:" + payload`` and counts its calls."""

    def __init__(self) -> None:
        self.serialized = 0
        self.deserialized = 0

    def serialize(self, value: Any) -> bytes:
        self.serialized += 1
        payload: str = value.payload
        return b"opaque:" + payload.encode()

    def deserialize(self, data: bytes) -> Any:
        self.deserialized += 1
        assert data.startswith(b"opaque:"), data
        return _Opaque(data[len(b"opaque:"):].decode())


class StateBackendContract:
    """Contract tests; subclass as ``Test<Name>`` and implement :meth:`create_state_backend`
    (or override the :meth:`state_backend` fixture)."""

    def create_state_backend(self, tmp_path: Path) -> StateBackend:
        """Return the backend under test.

        Args:
            tmp_path (Path): a fresh directory of the test, for the backend's files.

        Returns:
            StateBackend: the backend factory to test.
        """
        raise NotImplementedError(
            f"{type(self).__name__} must implement create_state_backend(tmp_path) or override "
            "the state_backend fixture")

    @pytest.fixture
    def state_backend(self, tmp_path: Path) -> StateBackend:
        """The backend under test (by default :meth:`create_state_backend`)."""
        return self.create_state_backend(tmp_path)

    @pytest.fixture
    def harness(self, state_backend: StateBackend, tmp_path: Path) -> Iterator[BackendHarness]:
        """A :class:`BackendHarness` of the backend, writing under ``tmp_path / "job"``."""
        h = BackendHarness(state_backend, tmp_path / "job")
        yield h
        h.close()

    # ------------------------------------------------------------------ semantics
    def test_value_state(self, harness: BackendHarness) -> None:
        kb = harness.create()
        s = _value(kb, ValueStateDescriptor("v", default=-1))
        kb.set_current_key("a")
        assert s.value() == -1
        s.update(5)
        assert s.value() == 5
        s.update(None)
        assert s.value() is None
        s.clear()
        assert s.value() == -1
        assert list(kb.keys("v")) == []

    def test_list_state(self, harness: BackendHarness) -> None:
        kb = harness.create()
        s = _list(kb, LOG)
        kb.set_current_key("a")
        assert s.get() == []
        s.add(1)
        s.add_all([2, 3])
        got = s.get()
        assert got == [1, 2, 3]
        got.append(99)  # the returned list is the caller's, not the state
        assert s.get() == [1, 2, 3]
        s.update([7])
        assert s.get() == [7]
        s.update([])
        assert s.get() == []
        assert list(kb.keys("log")) == []
        s.add(1)
        s.clear()
        assert s.get() == []

    def test_map_state(self, harness: BackendHarness) -> None:
        kb = harness.create()
        s = _map(kb, ATTRS)
        kb.set_current_key("a")
        assert s.get("x") is None and s.get("x", 0) == 0
        assert s.is_empty() and not s.contains("x")
        s.put("x", 1)
        s.put((2, "y"), [2])
        assert s.get("x") == 1 and s.contains((2, "y"))
        assert dict(s.items()) == {"x": 1, (2, "y"): [2]}
        assert set(s.keys()) == {"x", (2, "y")}
        assert sorted(map(str, s.values())) == ["1", "[2]"]
        s.remove("missing")
        s.remove("x")
        assert dict(s.items()) == {(2, "y"): [2]}
        s.remove((2, "y"))
        assert s.is_empty()
        assert list(kb.keys("attrs")) == []
        s.put("z", 3)
        s.clear()
        assert s.is_empty()

    def test_reducing_state(self, harness: BackendHarness) -> None:
        kb = harness.create()
        s = _reducing(kb, ReducingStateDescriptor("r", reduce_fn=lambda a, b: a * 10 + b))
        kb.set_current_key("a")
        assert s.get() is None
        for v in (1, 2, 3):
            s.add(v)
        assert s.get() == 123
        s.clear()
        assert s.get() is None
        s.add(4)
        assert s.get() == 4

    def test_per_key_and_per_state_isolation(self, harness: BackendHarness) -> None:
        kb = harness.create()
        keys = keys_in(FULL, 300)
        expected = fill(kb, keys)
        other = _value(kb, ValueStateDescriptor("other", default="none"))
        kb.set_current_key(keys[0])
        other.update("set")
        kb.get_state(COUNT).clear()
        expected[keys[0]] = (0, *expected[keys[0]][1:])
        assert read_all(kb, keys) == expected
        kb.set_current_key(keys[1])
        assert other.value() == "none"
        assert sorted(kb.keys("count")) == sorted(keys[1:])
        assert sorted(kb.keys("other")) == [keys[0]]
        assert sorted(kb.keys("log")) == sorted(keys)
        assert list(kb.keys("never-registered")) == []

    def test_misuse_raises_state_access_error(self, harness: BackendHarness) -> None:
        kb = harness.create(LOW)
        count = _value(kb, COUNT)
        with pytest.raises(StateAccessError):
            count.value()  # no current key yet
        with pytest.raises(StateAccessError):
            kb.set_current_key(keys_in(HIGH, 1)[0])
        with pytest.raises(StateAccessError):
            kb.get_state(ListStateDescriptor("count"))

    # ------------------------------------------------------------------ snapshots
    @pytest.mark.asyncio
    async def test_snapshot_restore_round_trip(self, harness: BackendHarness) -> None:
        kb = harness.create()
        keys = keys_in(FULL, 500)
        expected = fill(kb, keys)
        handle = await harness.checkpoint(kb, 1)
        assert all(ref["path"] and ref["size"] >= 0 and len(ref["sha256"]) == 64
                   for ref in handle["files"])
        restored = await harness.restore([handle])
        assert read_all(restored, keys) == expected
        assert sorted(restored.keys("count")) == sorted(keys)

    @pytest.mark.asyncio
    async def test_restore_key_group_subset(self, harness: BackendHarness) -> None:
        kb = harness.create(FULL)
        low, high = keys_in(LOW, 200), keys_in(HIGH, 200)
        expected = fill(kb, low + high)
        handle = await harness.checkpoint(kb, 1)
        for kgr, mine, theirs in ((LOW, low, high), (HIGH, high, low)):
            part = await harness.restore([handle], kgr)
            assert sorted(part.keys("count")) == sorted(mine)
            assert sorted(part.keys("attrs")) == sorted(mine)
            assert read_all(part, mine) == {k: expected[k] for k in mine}
            with pytest.raises(StateAccessError):
                part.set_current_key(theirs[0])

    @pytest.mark.asyncio
    async def test_restore_merges_several_instances(self, harness: BackendHarness) -> None:
        left, right = harness.create(LOW), harness.create(HIGH)
        low, high = keys_in(LOW, 150), keys_in(HIGH, 150)
        expected = {**fill(left, low), **fill(right, high)}
        handles = [await harness.checkpoint(left, 1), await harness.checkpoint(right, 1)]
        merged = await harness.restore(handles, FULL)
        assert read_all(merged, low + high) == expected
        assert sorted(merged.keys("log")) == sorted(low + high)

    @pytest.mark.asyncio
    async def test_snapshot_does_not_see_later_updates(self, harness: BackendHarness) -> None:
        kb = harness.create()
        keys = keys_in(FULL, 200)
        expected = fill(kb, keys)
        items = _value(kb, ITEMS)
        kb.set_current_key(keys[0])
        items.update(["before"])
        ctx = harness.context(kb, 1)
        snap = kb.snapshot(ctx)  # synchronous part only
        # the task keeps processing before the asynchronous part runs
        count, log = _value(kb, COUNT), _list(kb, LOG)
        attrs, total = _map(kb, ATTRS), _reducing(kb, TOTAL)
        kb.set_current_key(keys[0])
        value = items.value()
        value.append("after")  # in-place mutation of what get returned ...
        items.update(value)  # ... then written back
        for key in keys[1:50]:
            kb.set_current_key(key)
            count.update(-1)
            log.add("later")
            attrs.put("i", "later")
            total.add(1000)
        for key in keys[50:100]:
            kb.set_current_key(key)
            for s in (count, log, attrs, total):
                s.clear()
        new_keys = keys_in(FULL, 260)[200:]
        for key in new_keys:
            kb.set_current_key(key)
            count.update(7)
        handle = await snap.write()
        check_snapshot_handle(handle, ctx)
        kb.notify_checkpoint_complete(1)
        restored = await harness.restore([handle])
        assert read_all(restored, keys) == expected
        restored.set_current_key(keys[0])
        assert _value(restored, ITEMS).value() == ["before"]
        assert sorted(restored.keys("count")) == sorted(keys)
        # ... while the live instance has the new values
        kb.set_current_key(keys[0])
        assert items.value() == ["before", "after"]
        assert sorted(kb.keys("count")) == sorted(keys[:50] + keys[100:] + new_keys)

    @pytest.mark.asyncio
    async def test_state_changes_while_the_asynchronous_part_runs(
            self, harness: BackendHarness) -> None:
        kb = harness.create()
        keys = keys_in(FULL, 300)
        expected = fill(kb, keys)
        ctx = harness.context(kb, 1)
        snap = kb.snapshot(ctx)
        # the runtime runs the asynchronous part as its own task on the loop, and the
        # task's records change state between any two of its steps
        writing = asyncio.ensure_future(snap.write())
        count = _value(kb, COUNT)
        rounds = 0
        while True:
            for key in keys[rounds % 10::10]:
                kb.set_current_key(key)
                count.update(-rounds)
            rounds += 1
            if writing.done():
                break
            await asyncio.sleep(0)
        handle = await writing
        check_snapshot_handle(handle, ctx)
        kb.notify_checkpoint_complete(1)
        assert read_all(await harness.restore([handle]), keys) == expected

    @pytest.mark.asyncio
    async def test_successive_snapshots_each_restore_their_state(
            self, harness: BackendHarness) -> None:
        kb = harness.create()
        keys = keys_in(FULL, 400)
        first = fill(kb, keys)
        h1 = await harness.checkpoint(kb, 1)
        count = _value(kb, COUNT)
        for key in keys[:10]:
            kb.set_current_key(key)
            count.update(10_000)
        kb.set_current_key(keys[10])
        count.clear()
        h2 = await harness.checkpoint(kb, 2)
        second = dict(first)
        for key in keys[:10]:
            second[key] = (10_000, *first[key][1:])
        second[keys[10]] = (0, *first[keys[10]][1:])
        assert read_all(await harness.restore([h1]), keys) == first
        r2 = await harness.restore([h2])
        assert read_all(r2, keys) == second
        # a restored instance checkpoints again, and that snapshot restores too
        r2.set_current_key(keys[0])
        _value(r2, COUNT).update(1)
        h3 = await harness.checkpoint(r2, 3)
        third = dict(second)
        third[keys[0]] = (1, *second[keys[0]][1:])
        assert read_all(await harness.restore([h3]), keys) == third

    @pytest.mark.asyncio
    async def test_savepoint_is_self_contained(self, harness: BackendHarness) -> None:
        kb = harness.create()
        keys = keys_in(FULL, 200)
        expected = fill(kb, keys)
        await harness.checkpoint(kb, 1)  # what an incremental snapshot would build on
        count = _value(kb, COUNT)
        kb.set_current_key(keys[0])
        count.update(42)
        expected[keys[0]] = (42, *expected[keys[0]][1:])
        savepoint = await harness.savepoint(kb, 2)  # its files all under chk-2
        kb.set_current_key(keys[1])
        count.update(43)
        later = {**expected, keys[1]: (43, *expected[keys[1]][1:])}
        checkpoint = await harness.checkpoint(kb, 3)
        assert read_all(await harness.restore([savepoint]), keys) == expected
        assert read_all(await harness.restore([checkpoint]), keys) == later

    @pytest.mark.asyncio
    async def test_discarded_snapshot_leaves_backend_usable(
            self, harness: BackendHarness) -> None:
        kb = harness.create()
        keys = keys_in(FULL, 50)
        expected = fill(kb, keys)
        kb.snapshot(harness.context(kb, 1)).discard()
        handle = await harness.checkpoint(kb, 2)
        assert read_all(await harness.restore([handle]), keys) == expected

    @pytest.mark.asyncio
    async def test_custom_serializer(self, harness: BackendHarness) -> None:
        ser = OpaqueSerializer()
        desc = ValueStateDescriptor("opaque", serializer=ser)
        kb = harness.create()
        keys = keys_in(FULL, 100)
        state = _value(kb, desc)
        for key in keys:
            kb.set_current_key(key)
            state.update(_Opaque(key))
        handle = await harness.checkpoint(kb, 1)
        # pickle refuses _Opaque: values that restore went through the serializer (whose
        # calls a backend may make in another process, e.g. a forked snapshot writer)
        restored = await harness.restore([handle])
        state2 = _value(restored, ValueStateDescriptor("opaque", serializer=ser))
        for key in keys:
            restored.set_current_key(key)
            assert state2.value() == _Opaque(key)
        assert ser.deserialized >= len(keys)

    @pytest.mark.asyncio
    async def test_refuses_a_foreign_handle(self, harness: BackendHarness) -> None:
        kb = harness.create()
        with pytest.raises(RestoreError):
            await in_thread(kb.restore,
                            [{"backend": "no-such-backend", "format": "x", "files": []}],
                            harness.job_dir)
