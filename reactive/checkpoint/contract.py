"""The typed checkpoint contract: what a completed checkpoint's ``_metadata`` says, as
frozen value objects (Flink's ``CheckpointMetadata``, ``OperatorState``,
``OperatorSubtaskState``, ``KeyedStateHandle`` / ``OperatorStateHandle`` and
``CheckpointMetrics``).

The JSON form is the on-disk format of :mod:`.metadata` (format version 2). Each type reads
it with ``from_json`` and writes it back with ``to_json``; for every document written by this
format, ``X.from_json(doc).to_json() == doc`` holds, keys in the same order, so a document
read and written again is byte for byte the same JSON::

    body = {"format": 2, "job", "checkpoint_id", "kind", "timestamp", "max_parallelism",
            "mode", "run_id", "commits", "operators": {uid: operator}, "stats": metrics,
            "self_contained", "reconfigurations": [reconfiguration, ...], "rescaled"}
    operator = {"name", "parallelism", "keyed", "subtasks": {"<index>": subtask}}
    subtask  = {"keyed_state": keyed handle | null, "operator_state": handle | null,
                "key_group_range": [start, end], "channel_state": handle}
    handle   = {"format", "files": [{"path", "size", "sha256"}, ...]}
    keyed handle = {"backend", "format", "files", "shared", "shared_reused", ...}
    reconfiguration = {"version": 1, "kind": "update", "operator", "function"}
                    | {"version": 1, "kind": "rescale", "operator",
                       "previous_parallelism", "parallelism"}
    rescaled = {uid: parallelism}   (the operators a job.rescale of the run changed)

``"reconfigurations"`` is written only by a checkpoint whose barrier carried one (a
document without it, from before or from another writer, reads as none).

A keyed handle is a state backend's own description of its snapshot: besides the fields the
runtime reads (its backend, its files, the shared subset), it keeps whatever the backend
wrote (heap's key-group index, RocksDB's file map) in :attr:`KeyedStateHandle.extra`, and
hands it back to the backend unchanged (:meth:`KeyedStateHandle.to_json`).

Paths in a :class:`FileRef` are relative to the checkpoint's root (the job directory, or a
self-contained savepoint's own directory); :func:`.metadata.read_metadata` checks that they
stay under it before anyone joins them to a directory.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Self

from ..errors import CorruptCheckpointError
from ..keygroups import KeyGroupRange

__all__ = [
    "FORMAT_VERSION",
    "OPERATOR_STATE_FORMAT",
    "CheckpointMetadata",
    "CheckpointMetrics",
    "FileRef",
    "KeyedStateHandle",
    "OperatorState",
    "OperatorSubtaskState",
    "Reconfiguration",
    "StateHandle",
]

# 2: canonical key encoding (key groups and RocksDB keys of format 1 differ), run ids
FORMAT_VERSION = 2
"""The version of the metadata format this module reads and writes."""

OPERATOR_STATE_FORMAT = "pickle-v1"
"""The format of an operator-state file: a pickled ``{name: (mode, entries)}``."""


def _malformed(where: str, what: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"checkpoint metadata: {where}: {what}")


def _obj(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _malformed(where, f"expected an object, found {type(value).__name__}")
    return value


def _get(doc: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in doc:
        raise _malformed(where, f"{key!r} is missing")
    value = doc[key]
    # bool is an int in Python, never the other way round in this format
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in (
            kind if isinstance(kind, tuple) else (kind,))):
        raise _malformed(where, f"{key!r} is {value!r}, not of type {kind}")
    return value


def _opt(doc: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    return None if doc.get(key) is None else _get(doc, key, kind, where)


def _ordered(out: dict[str, Any], order: tuple[str, ...]) -> dict[str, Any]:
    """``out`` with the keys of ``order`` first, in that order (a document's own order)."""
    if not order:
        return out
    head = {k: out[k] for k in order if k in out}
    head.update((k, v) for k, v in out.items() if k not in head)
    return head


@dataclass(frozen=True, slots=True)
class FileRef:
    """A file a checkpoint needs.

    Attributes:
        path: POSIX path relative to the checkpoint's root (see the module docstring).
        size: its size, bytes.
        sha256: its SHA-256, hex; checked before a restore reads the file.
    """

    path: str
    size: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        """Return ``{"path", "size", "sha256"}``."""
        return {"path": self.path, "size": self.size, "sha256": self.sha256}

    @classmethod
    def from_json(cls, doc: Any, where: str = "file") -> FileRef:
        """Read ``{"path", "size", "sha256"}``.

        Raises:
            CorruptCheckpointError: if a field is missing or of the wrong type.
        """
        d = _obj(doc, where)
        return cls(_get(d, "path", str, where), _get(d, "size", int, where),
                   _get(d, "sha256", str, where))


def _refs(doc: Mapping[str, Any], key: str, where: str) -> tuple[FileRef, ...]:
    refs = _get(doc, key, list, where)
    return tuple(FileRef.from_json(r, f"{where}.{key}[{i}]") for i, r in enumerate(refs))


def _opt_refs(doc: Mapping[str, Any], key: str, where: str) -> tuple[FileRef, ...] | None:
    return None if key not in doc else _refs(doc, key, where)


@dataclass(frozen=True, slots=True)
class StateHandle:
    """The files of one piece of non-keyed state: an operator's operator state
    (``pickle-v1``) or an unaligned checkpoint's in-flight records
    (:mod:`.channel_state`); Flink's ``OperatorStateHandle``.

    Attributes:
        format: how the files are written.
        files: the files (for both kinds of today: one).
    """

    format: str
    files: tuple[FileRef, ...]

    @property
    def size(self) -> int:
        """Bytes of all its files."""
        return sum(ref.size for ref in self.files)

    def to_json(self) -> dict[str, Any]:
        """Return ``{"format", "files"}``."""
        return {"format": self.format, "files": [ref.to_json() for ref in self.files]}

    @classmethod
    def from_json(cls, doc: Any, where: str = "handle") -> StateHandle:
        """Read ``{"format", "files"}``.

        Raises:
            CorruptCheckpointError: if a field is missing or of the wrong type.
        """
        d = _obj(doc, where)
        return cls(_get(d, "format", str, where), _refs(d, "files", where))


_KEYED_FIELDS = ("backend", "format", "files", "shared", "shared_reused")


@dataclass(frozen=True, slots=True)
class KeyedStateHandle:
    """A state backend's snapshot of one keyed operator instance (Flink's
    ``KeyedStateHandle``): what ``KeyedStateSnapshot.write`` returned, as JSON.

    Attributes:
        backend: the backend's name (``"heap"``, ``"rocksdb"``, ...): it picks the reader.
        format: the backend's format name, if it writes one.
        files: every file it needs.
        shared: the subset of ``files`` under the job's ``shared/`` that several
            checkpoints may reference (reference counted by the completed-checkpoint store);
            None when the handle has no such list (a backend that never shares files).
        shared_reused: the subset of ``shared`` uploaded by earlier checkpoints (not counted
            in this checkpoint's size); None when the handle has no such list.
        extra: every other field the backend wrote (its own format), in its order.
    """

    backend: str
    format: str | None
    files: tuple[FileRef, ...]
    shared: tuple[FileRef, ...] | None = None
    shared_reused: tuple[FileRef, ...] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    # the document's key order (to_json writes it back byte for byte); not part of equality
    _order: tuple[str, ...] = field(default=(), compare=False, repr=False)

    @property
    def size(self) -> int:
        """Bytes this checkpoint wrote for it: its files but those it reuses."""
        reused = set(self.shared_reused or ())
        return sum(ref.size for ref in self.files if ref not in reused)

    def to_json(self) -> dict[str, Any]:
        """Return the backend's handle as JSON (what ``KeyedStateBackend.restore`` gets)."""
        out: dict[str, Any] = {"backend": self.backend}
        if self.format is not None or "format" in self._order:  # a null the backend wrote
            out["format"] = self.format
        out["files"] = [ref.to_json() for ref in self.files]
        if self.shared is not None:
            out["shared"] = [ref.to_json() for ref in self.shared]
        if self.shared_reused is not None:
            out["shared_reused"] = [ref.to_json() for ref in self.shared_reused]
        out.update(self.extra)
        return _ordered(out, self._order)

    @classmethod
    def from_json(cls, doc: Any, where: str = "keyed_state") -> KeyedStateHandle:
        """Read a backend's handle (the ``reactive.state.backend`` protocol: a non-empty
        ``"backend"``, ``"files"``, optionally ``"shared"``).

        Raises:
            CorruptCheckpointError: if a field the runtime reads is missing or of the wrong
                type.
        """
        d = _obj(doc, where)
        backend = _get(d, "backend", str, where)
        if not backend:
            raise _malformed(where, "'backend' is empty")
        return cls(backend, _opt(d, "format", str, where), _refs(d, "files", where),
                   _opt_refs(d, "shared", where), _opt_refs(d, "shared_reused", where),
                   {k: v for k, v in d.items() if k not in _KEYED_FIELDS}, tuple(d))

    def with_paths(self, mapping: Mapping[str, str]) -> KeyedStateHandle:
        """A copy with every path of ``mapping`` replaced, in its file lists and in any
        string of :attr:`extra` equal to such a path (RocksDB's ``db_files``)."""
        def move(refs: tuple[FileRef, ...] | None) -> tuple[FileRef, ...] | None:
            return None if refs is None else tuple(
                replace(r, path=mapping.get(r.path, r.path)) for r in refs)
        return replace(self, files=move(self.files) or (), shared=move(self.shared),
                       shared_reused=move(self.shared_reused),
                       extra=_rebase(dict(self.extra), mapping))


def _rebase(value: Any, mapping: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        return mapping.get(value, value)
    if isinstance(value, list):
        return [_rebase(v, mapping) for v in value]
    if isinstance(value, dict):
        return {k: _rebase(v, mapping) for k, v in value.items()}
    return value


def _move(handle: StateHandle | None, mapping: Mapping[str, str]) -> StateHandle | None:
    if handle is None:
        return None
    return replace(handle, files=tuple(replace(r, path=mapping.get(r.path, r.path))
                                       for r in handle.files))


@dataclass(frozen=True, slots=True)
class OperatorSubtaskState:
    """The state of one operator instance in a checkpoint (Flink's ``OperatorSubtaskState``).

    Attributes:
        keyed_state: its keyed state backend's snapshot, None without keyed state.
        operator_state: its operator state (``pickle-v1``), None without any.
        key_group_range: the key groups the instance owned (a keyed operator), else None;
            the restore hands ``keyed_state`` to every new instance whose range meets it.
        channel_state: the in-flight input records of an unaligned checkpoint (stored
            under the task's head operator), None without any.
    """

    keyed_state: KeyedStateHandle | None = None
    operator_state: StateHandle | None = None
    key_group_range: KeyGroupRange | None = None
    channel_state: StateHandle | None = None

    def handles(self) -> Iterator[KeyedStateHandle | StateHandle]:
        """Its handles (keyed, operator, channel state), those present."""
        for h in (self.keyed_state, self.operator_state, self.channel_state):
            if h is not None:
                yield h

    def to_json(self) -> dict[str, Any]:
        """Return ``{"keyed_state", "operator_state"[, "key_group_range"][,
        "channel_state"]}``."""
        out: dict[str, Any] = {
            "keyed_state": None if self.keyed_state is None else self.keyed_state.to_json(),
            "operator_state": None if self.operator_state is None
            else self.operator_state.to_json(),
        }
        if self.key_group_range is not None:
            out["key_group_range"] = self.key_group_range.to_list()
        if self.channel_state is not None:
            out["channel_state"] = self.channel_state.to_json()
        return out

    @classmethod
    def from_json(cls, doc: Any, where: str = "subtask") -> OperatorSubtaskState:
        """Read one subtask's entry.

        Raises:
            CorruptCheckpointError: if a field is missing or of the wrong type.
        """
        d = _obj(doc, where)
        keyed = d.get("keyed_state")
        opstate = d.get("operator_state")
        channel = d.get("channel_state")
        kgr = _opt(d, "key_group_range", list, where)
        if kgr is not None and (len(kgr) != 2 or not all(
                isinstance(x, int) and not isinstance(x, bool) for x in kgr)):
            raise _malformed(where, f"'key_group_range' is {kgr!r}, not [start, end]")
        return cls(
            None if not keyed else KeyedStateHandle.from_json(keyed, f"{where}.keyed_state"),
            None if not opstate else StateHandle.from_json(opstate, f"{where}.operator_state"),
            None if kgr is None else KeyGroupRange(kgr[0], kgr[1]),
            None if not channel else StateHandle.from_json(channel, f"{where}.channel_state"),
        )


@dataclass(frozen=True, slots=True)
class OperatorState:
    """The state of every instance of one operator in a checkpoint (Flink's
    ``OperatorState``).

    Attributes:
        name: the operator's name.
        parallelism: its parallelism when the checkpoint was taken.
        keyed: whether it has keyed state.
        subtasks: each instance's state by instance index, in the order they acknowledged.
    """

    name: str
    parallelism: int
    keyed: bool
    subtasks: Mapping[int, OperatorSubtaskState] = field(default_factory=dict)

    def by_index(self) -> list[tuple[int, OperatorSubtaskState]]:
        """``(index, state)`` of its instances, by index."""
        return sorted(self.subtasks.items())

    def to_json(self) -> dict[str, Any]:
        """Return ``{"name", "parallelism", "keyed", "subtasks"}``."""
        return {"name": self.name, "parallelism": self.parallelism, "keyed": self.keyed,
                "subtasks": {str(i): s.to_json() for i, s in self.subtasks.items()}}

    @classmethod
    def from_json(cls, doc: Any, where: str = "operator") -> OperatorState:
        """Read one operator's entry.

        Raises:
            CorruptCheckpointError: if a field is missing or of the wrong type.
        """
        d = _obj(doc, where)
        subtasks: dict[int, OperatorSubtaskState] = {}
        for key, sub in _obj(_get(d, "subtasks", dict, where), where).items():
            if not key.isdigit():
                raise _malformed(where, f"subtask index {key!r} is not a number")
            subtasks[int(key)] = OperatorSubtaskState.from_json(sub, f"{where}.subtasks.{key}")
        return cls(_get(d, "name", str, where), _get(d, "parallelism", int, where),
                   _get(d, "keyed", bool, where), subtasks)


_METRICS_FIELDS = ("checkpoint_id", "kind", "status", "trigger_time", "duration", "alignment",
                   "sync", "async_", "size", "path", "failure", "failure_reason")


@dataclass(frozen=True, slots=True)
class CheckpointMetrics:
    """What a completed checkpoint cost, as its metadata records it (the ``"stats"``
    section; Flink's ``CheckpointMetrics``). Each field is None when the writer did not
    record it (a savepoint written by another program, say).

    Attributes:
        checkpoint_id: the id.
        kind: ``"checkpoint"`` or ``"savepoint"``.
        status: ``"completed"``.
        trigger_time: seconds since the epoch when it was triggered.
        duration: seconds from trigger to completion.
        alignment: max over tasks of the barrier alignment, seconds.
        sync: max over tasks of the synchronous part, seconds.
        async_: max over tasks of the asynchronous part, seconds.
        size: bytes written (shared files it only references excluded).
        path: the checkpoint directory (None: it is written before the path is known).
        failure: None for a completed checkpoint.
        failure_reason: None for a completed checkpoint.
        extra: fields of other writers, in their order.
    """

    checkpoint_id: int | None = None
    kind: str | None = None
    status: str | None = None
    trigger_time: float | None = None
    duration: float | None = None
    alignment: float | None = None
    sync: float | None = None
    async_: float | None = None
    size: int | None = None
    path: str | None = None
    failure: str | None = None
    failure_reason: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    # which known fields the document had (written back even when null)
    _present: tuple[str, ...] = field(default=_METRICS_FIELDS, compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        """Return the ``"stats"`` section."""
        out = {k: getattr(self, k) for k in self._present}
        out.update(self.extra)
        return out

    @classmethod
    def from_json(cls, doc: Any, where: str = "stats") -> CheckpointMetrics:
        """Read the ``"stats"`` section.

        Raises:
            CorruptCheckpointError: if it is not an object.
        """
        d = _obj(doc, where)
        return cls(**{k: d[k] for k in _METRICS_FIELDS if k in d},
                   extra={k: v for k, v in d.items() if k not in _METRICS_FIELDS},
                   _present=tuple(k for k in _METRICS_FIELDS if k in d))


RECONFIGURATION_VERSION = 1
"""The version of a ``"reconfigurations"`` entry this module writes."""


@dataclass(frozen=True, slots=True)
class Reconfiguration:
    """A reconfiguration a checkpoint's barrier carried and every task applied at its
    snapshot instant (Carbone 2018 (PhD thesis), section 4.5.5): restoring this checkpoint
    or a later one of the run restores the reconfigured job.

    Attributes:
        kind: ``"update"`` (a new version of an operator's function, ``job.update``) or
            ``"rescale"`` (a new parallelism, ``job.rescale``).
        operator: the uid of the operator reconfigured.
        function: an update's new function, ``module.qualname`` (empty for a rescale).
        parallelism: a rescale's new parallelism (None for an update).
        previous_parallelism: a rescale's parallelism before it (None for an update).
        version: the entry's format version (:data:`RECONFIGURATION_VERSION`).
        extra: fields of other writers or later versions, in their order.
    """

    kind: str
    operator: str
    function: str = ""
    version: int = RECONFIGURATION_VERSION
    extra: Mapping[str, Any] = field(default_factory=dict)
    parallelism: int | None = None
    previous_parallelism: int | None = None

    def to_json(self) -> dict[str, Any]:
        """Return the entry: ``{"version", "kind", "operator", "function"}`` for an
        update, ``{"version", "kind", "operator", "previous_parallelism", "parallelism"}``
        for a rescale."""
        out: dict[str, Any] = {"version": self.version, "kind": self.kind,
                               "operator": self.operator}
        if self.function or self.parallelism is None:
            out["function"] = self.function
        if self.previous_parallelism is not None:
            out["previous_parallelism"] = self.previous_parallelism
        if self.parallelism is not None:
            out["parallelism"] = self.parallelism
        out.update(self.extra)
        return out

    def describe(self) -> str:
        """One line for people: ``update m -> mod.f`` or ``rescale count 1 -> 2``."""
        if self.kind == "rescale":
            return (f"rescale {self.operator} {self.previous_parallelism} -> "
                    f"{self.parallelism}")
        return f"{self.kind} {self.operator} -> {self.function}"

    @classmethod
    def from_json(cls, doc: Any, where: str = "reconfiguration") -> Reconfiguration:
        """Read an entry.

        Raises:
            CorruptCheckpointError: if a field is missing or of the wrong type.
        """
        d = _obj(doc, where)
        known = ("version", "kind", "operator", "function", "parallelism",
                 "previous_parallelism")
        kind = _get(d, "kind", str, where)
        return cls(kind=kind, operator=_get(d, "operator", str, where),
                   function=(_opt(d, "function", str, where) or "") if kind == "rescale"
                   else _get(d, "function", str, where),
                   version=_get(d, "version", int, where),
                   extra={k: v for k, v in d.items() if k not in known},
                   parallelism=_opt(d, "parallelism", int, where),
                   previous_parallelism=_opt(d, "previous_parallelism", int, where))


def _rescaled(doc: Mapping[str, Any]) -> dict[str, int]:
    for uid, p in doc.items():
        if not isinstance(p, int) or isinstance(p, bool) or p < 1:
            raise _malformed("body", f"'rescaled' gives operator {uid!r} parallelism {p!r}")
    return dict(doc)


@dataclass(frozen=True, slots=True)
class CheckpointMetadata(Mapping[str, Any]):
    """A completed checkpoint's manifest (Flink's ``CheckpointMetadata``): the body of its
    ``_metadata`` (:mod:`.metadata` signs, checksums and writes it).

    It is also a read-only ``Mapping`` of its JSON form (:meth:`to_json`, format version 2),
    the reader for code written when the metadata was that dict: ``meta["operators"]``,
    ``meta.get("kind")``, ``"stats" in meta``, ``meta.keys()``, ``dict(meta)`` give what the
    ``_metadata`` body holds, nested values as plain JSON (dicts, lists, strings, numbers).
    Each lookup builds the JSON form anew (take :meth:`to_json` once for many lookups);
    changing what it returns does not change the metadata.

    Attributes:
        job: the dataflow's name.
        checkpoint_id: the id.
        kind: ``"checkpoint"`` or ``"savepoint"``.
        max_parallelism: the job's number of key groups; a restore requires the same.
        operators: each operator's state by uid, in the order they first acknowledged.
        timestamp: seconds since the epoch when it was triggered.
        mode: the checkpointing mode (``"exactly_once"``, ``"at_least_once"``,
            ``"synchronous"``).
        run_id: the run that took it (one ``Dataflow.start``); None for one written by
            another program (the Spark savepoint writer).
        commits: whether completing it committed side effects (False: an intermediate
            savepoint); None when the writer did not say.
        metrics: what it cost, None when not recorded.
        self_contained: a savepoint whose paths are relative to its own directory.
        format: the format version (:data:`FORMAT_VERSION`).
        reconfigurations: what its barrier reconfigured (empty: nothing).
        rescaled: the parallelism of each operator a ``job.rescale`` of the run changed,
            by uid, as the job ran when it was taken (empty: the program's); a resume of
            the run restores it at that parallelism.
        extra: fields of other writers, in their order.
    """

    job: str
    checkpoint_id: int
    kind: str
    max_parallelism: int
    operators: Mapping[str, OperatorState] = field(default_factory=dict)
    timestamp: float | None = None
    mode: str | None = None
    run_id: str | None = None
    commits: bool | None = None
    metrics: CheckpointMetrics | None = None
    self_contained: bool = False
    format: int = FORMAT_VERSION
    reconfigurations: tuple[Reconfiguration, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)
    rescaled: Mapping[str, int] = field(default_factory=dict)

    @property
    def is_savepoint(self) -> bool:
        """True for a savepoint (kind ``savepoint``)."""
        return self.kind == "savepoint"

    # the v2 compatibility reader: the Mapping methods over the JSON form
    def __getitem__(self, key: str) -> Any:
        """``to_json()[key]``.

        Raises:
            KeyError: when the ``_metadata`` body has no field ``key``.
        """
        return self.to_json()[key]

    def __iter__(self) -> Iterator[str]:
        """The fields of the JSON form, in the file's order."""
        return iter(self.to_json())

    def __len__(self) -> int:
        """The number of fields of the JSON form."""
        return len(self.to_json())

    def subtask_states(self) -> Iterator[tuple[str, int, OperatorSubtaskState]]:
        """``(uid, index, state)`` of every operator instance, in the document's order."""
        for uid, op in self.operators.items():
            for i, sub in op.subtasks.items():
                yield uid, i, sub

    def file_refs(self) -> Iterator[FileRef]:
        """Every file the checkpoint references (shared ones included, each as often as
        a handle lists it)."""
        for _, _, sub in self.subtask_states():
            for handle in sub.handles():
                yield from handle.files

    def shared_refs(self) -> Iterator[FileRef]:
        """Every file of a keyed handle's ``shared`` and ``shared_reused`` lists."""
        for _, _, sub in self.subtask_states():
            if sub.keyed_state is not None:
                yield from sub.keyed_state.shared or ()
                yield from sub.keyed_state.shared_reused or ()

    def shared_paths(self) -> set[str]:
        """The paths under ``shared/`` that the keyed handles reference (their ``shared``
        lists: the reference counts of the shared-state registry)."""
        return {ref.path for _, _, sub in self.subtask_states()
                if sub.keyed_state is not None for ref in sub.keyed_state.shared or ()}

    @property
    def state_size(self) -> int:
        """Bytes of every file it references (shared ones included)."""
        return sum(ref.size for ref in self.file_refs())

    def to_json(self) -> dict[str, Any]:
        """Return the ``_metadata`` body."""
        out: dict[str, Any] = {
            "format": self.format, "job": self.job, "checkpoint_id": self.checkpoint_id,
            "kind": self.kind}
        if self.timestamp is not None:
            out["timestamp"] = self.timestamp
        out["max_parallelism"] = self.max_parallelism
        for key, value in (("mode", self.mode), ("run_id", self.run_id),
                           ("commits", self.commits)):
            if value is not None:
                out[key] = value
        out["operators"] = {uid: op.to_json() for uid, op in self.operators.items()}
        if self.metrics is not None:
            out["stats"] = self.metrics.to_json()
        if self.self_contained:
            out["self_contained"] = True
        if self.reconfigurations:
            out["reconfigurations"] = [r.to_json() for r in self.reconfigurations]
        if self.rescaled:
            out["rescaled"] = dict(self.rescaled)
        out.update(self.extra)
        return out

    @classmethod
    def from_json(cls, doc: Any) -> CheckpointMetadata:
        """Read a ``_metadata`` body (its format version is not checked here: see
        :func:`.metadata.read_metadata`).

        Raises:
            CorruptCheckpointError: if a field is missing or of the wrong type.
        """
        d = _obj(doc, "body")
        known = ("format", "job", "checkpoint_id", "kind", "timestamp", "max_parallelism",
                 "mode", "run_id", "commits", "operators", "stats", "self_contained",
                 "reconfigurations", "rescaled")
        operators = {
            uid: OperatorState.from_json(op, f"operator {uid!r}")
            for uid, op in _obj(_get(d, "operators", dict, "body"), "body").items()}
        stats = d.get("stats")
        return cls(
            job=_get(d, "job", str, "body"),
            checkpoint_id=_get(d, "checkpoint_id", int, "body"),
            kind=_get(d, "kind", str, "body"),
            max_parallelism=_get(d, "max_parallelism", int, "body"),
            operators=operators,
            timestamp=_opt(d, "timestamp", (int, float), "body"),
            mode=_opt(d, "mode", str, "body"),
            run_id=_opt(d, "run_id", str, "body"),
            commits=_opt(d, "commits", bool, "body"),
            metrics=None if stats is None else CheckpointMetrics.from_json(stats),
            self_contained=bool(_opt(d, "self_contained", bool, "body")),
            format=int(_opt(d, "format", int, "body") or FORMAT_VERSION),
            reconfigurations=tuple(
                Reconfiguration.from_json(r, f"reconfiguration {i}")
                for i, r in enumerate(_opt(d, "reconfigurations", list, "body") or ())),
            extra={k: v for k, v in d.items() if k not in known},
            rescaled=_rescaled(_opt(d, "rescaled", dict, "body") or {}),
        )

    def with_paths(self, mapping: Mapping[str, str]) -> Self:
        """A copy with every file path of ``mapping`` replaced (see
        :meth:`KeyedStateHandle.with_paths`)."""
        def sub(s: OperatorSubtaskState) -> OperatorSubtaskState:
            return replace(
                s, keyed_state=None if s.keyed_state is None
                else s.keyed_state.with_paths(mapping),
                operator_state=_move(s.operator_state, mapping),
                channel_state=_move(s.channel_state, mapping))
        return replace(self, operators={
            uid: replace(op, subtasks={i: sub(s) for i, s in op.subtasks.items()})
            for uid, op in self.operators.items()})
