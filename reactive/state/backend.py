"""The state-backend protocol (Flink's ``StateBackend`` / ``KeyedStateBackend``).

A :class:`StateBackend` is a factory the user passes to ``run(state_backend=...)``; it
creates one :class:`KeyedStateBackend` per keyed operator instance, owning a contiguous
key-group range. Snapshots follow the asynchronous snapshot invocation of Carbone 2018
(PhD thesis), section 4.5.1: :meth:`KeyedStateBackend.snapshot` is the *synchronous part*, called in the
task between two batches; it returns a :class:`KeyedStateSnapshot` whose :meth:`write` is the
*asynchronous part*, run while the task keeps processing.

A snapshot is described by a *handle*: a JSON-serializable ``dict`` stored in the
checkpoint metadata. Every handle has:

- ``"backend"``: the backend's name (``"heap"``, ``"rocksdb"`` ...);
- ``"files"``: a list of ``{"path", "size", "sha256"}`` for every file it needs, with
  ``path`` relative to the job directory; the runtime verifies them before a restore;
- ``"shared"`` (optional): the subset of ``files`` living under the job's ``shared/`` folder
  that several checkpoints may reference (incremental snapshots); the runtime deletes a
  shared file when no retained checkpoint references it any more.

The handle stays a plain dict at this boundary, in both directions: the rest of it is the
backend's own format (its key-group index, its file map), which only the backend reads.
The runtime reads it into a :class:`~reactive.checkpoint.contract.KeyedStateHandle` when the
task acknowledges (a handle it cannot read declines the checkpoint, naming the operator),
keeps the backend's other fields verbatim, and gives :meth:`KeyedStateBackend.restore` the
same dict back.

Threads. The runtime calls the hooks of a keyed backend from two threads, never from two
at once:

- in a worker thread of the event loop's default executor (``asyncio.to_thread``; not
  always the same thread from one restore to the next): :meth:`KeyedStateBackend.restore`,
  after the instance was created and before its task runs, so the loop keeps serving the
  application while snapshots are read (a key-group reader registered with
  ``register_key_group_reader`` runs there too, and may be called from any other thread:
  a committed ``query_state``, the PySpark bridge);
- on the event loop's thread: everything else, :meth:`StateBackend.create_keyed_backend`,
  ``set_current_key``, ``get_state`` and the state objects, ``keys``, ``snapshot``, the
  coroutine ``KeyedStateSnapshot.write`` (a task of its own, while the task keeps
  processing records between its awaits; blocking work inside it belongs in a worker
  thread), ``discard``, ``notify_checkpoint_complete`` and ``dispose``.

So whatever a backend opens (a database connection, a file handle) must be usable from a
thread other than the one that opened it (``sqlite3.connect(..., check_same_thread=False)``,
say). ``reactive.testing.backend_contract`` calls the hooks on the same threads. An error
raised by ``restore`` fails the job at once as a ``RestoreError`` naming the operator and the
phase (restoring the same checkpoint again would fail the same way); an ``OSError`` keeps its
type and is retried by the restart strategy.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import RestoreError
from ..keygroups import KeyGroupRange, assign_to_key_group
from .api import State
from .descriptors import StateDescriptor

if TYPE_CHECKING:
    from .ttl_clock import TtlClock
    from .ttl_config import StateTtlConfig

__all__ = ["KeyGroupsInMemory", "KeyedStateBackend", "KeyedStateSnapshot", "SnapshotContext",
           "StateBackend", "file_name_component"]


@dataclass(frozen=True)
class SnapshotContext:
    """Where a snapshot writes its files.

    Attributes:
        checkpoint_id: the checkpoint being taken.
        job_dir: ``<directory>/<job>``; handle paths are relative to it.
        checkpoint_dir: ``<job_dir>/chk-<n>``, for files only this checkpoint uses.
        shared_dir: ``<job_dir>/shared``, for files incremental checkpoints share.
        operator_uid: the operator's stable id.
        subtask: the operator instance's index.
        savepoint: True for a self-contained savepoint (no shared files may be referenced).
    """

    checkpoint_id: int
    job_dir: Path
    checkpoint_dir: Path
    shared_dir: Path
    operator_uid: str
    subtask: int
    savepoint: bool = False

    def exclusive_path(self, suffix: str) -> Path:
        """Return ``chk-<n>/<uid>-<subtask><suffix>`` (directories created)."""
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        return self.checkpoint_dir / f"{file_name_component(self.operator_uid)}-{self.subtask}{suffix}"

    def relative(self, path: Path) -> str:
        """Return ``path`` relative to the job directory (the form handles store)."""
        return path.relative_to(self.job_dir).as_posix()


def file_name_component(text: str) -> str:
    """``text`` (an operator uid, a job name) as one file-name component of a snapshot's or
    a working directory's path: what is not alphanumeric or ``-_.`` becomes ``_``."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


class KeyedStateSnapshot(ABC):
    """The result of a snapshot's synchronous part."""

    @abstractmethod
    async def write(self) -> dict[str, Any]:
        """Asynchronous part: write the captured state and return its handle.

        Raises:
            OSError: when writing fails; the checkpoint is then declined.
        """

    def discard(self) -> None:  # noqa: B027 - optional hook
        """Release what the synchronous part captured (the checkpoint was aborted)."""


class KeyGroupsInMemory(Protocol):
    """The key groups one keyed backend instance hands to the instances after a rescale
    (:meth:`KeyedStateBackend.hand_over`): opaque to the runtime but for their range."""

    @property
    def key_group_range(self) -> KeyGroupRange:
        """The key groups held."""
        ...


class KeyedStateBackend(ABC):
    """Keyed state of one operator instance, organised by key group.

    Every hook but :meth:`restore` (a worker thread) runs on the event loop's thread (see
    the module's "Threads").

    Attributes:
        key_group_range: the key groups this instance owns.
        max_parallelism: the number of key groups of the job.
        current_key: the key that state calls are scoped to.
    """

    key_group_range: KeyGroupRange
    max_parallelism: int
    current_key: Any

    @abstractmethod
    def set_current_key(self, key: Any) -> None:
        """Scope subsequent state calls to ``key``.

        Raises:
            StateAccessError: if ``key`` is outside this instance's key-group range.
        """

    @abstractmethod
    def get_state(self, descriptor: StateDescriptor) -> State:
        """Return (creating or re-binding) the state named by ``descriptor``.

        Raises:
            StateAccessError: if the name was registered with another kind of state.
        """

    def get_ttl_state(self, descriptor: StateDescriptor, config: StateTtlConfig,
                      clock: TtlClock) -> State | None:
        """A backend's own implementation of a state with time-to-live (a fast path), or
        None (the default): the runtime then wraps :meth:`get_state`'s state in the TTL
        decorators of :mod:`reactive.state.ttl`.

        A state returned here must behave exactly as the decorator of its kind (a subclass of
        it, e.g. ``TtlValueState``) and store exactly what the decorator stores under
        :func:`reactive.state.ttl.backend_descriptor` (``(value, expires_at)`` pairs), so a
        snapshot restores into any backend, with or without the fast path.

        Args:
            descriptor: the user's descriptor (its ``ttl`` set).
            config: the descriptor's TTL.
            clock: the time the TTL is measured in (seconds; read ``clock.frozen`` inside
                a batch, else ``clock.now()``: :mod:`reactive.state.ttl_clock`).
        """
        return None

    def approximate_entries(self) -> int | None:
        """The entries (a key's value in one state) this instance holds, approximately and
        without a pass over them: a metric read at every scrape. None (the default): not
        known cheaply."""
        return None

    @abstractmethod
    def keys(self, state_name: str) -> Iterator[Any]:
        """Iterate over the keys that have a value in ``state_name`` (a stable copy)."""

    def keys_in_key_group(self, state_name: str, key_group: int) -> list[Any]:
        """The keys that have a value in ``state_name`` in ``key_group`` (of this instance's
        range), as a list: what an incremental walk over the state reads one key group at a
        time (the TTL cleanup). The default filters :meth:`keys`, O(keys of the instance);
        the built-in backends read the one key group.
        """
        maxp = self.max_parallelism
        return [k for k in self.keys(state_name) if assign_to_key_group(k, maxp) == key_group]

    @abstractmethod
    def snapshot(self, ctx: SnapshotContext) -> KeyedStateSnapshot:
        """Synchronous part of a snapshot: capture a consistent view cheaply."""

    @abstractmethod
    def restore(self, handles: list[dict[str, Any]], job_dir: Path) -> None:
        """Load the key groups of this instance's range from ``handles``.

        Called in a worker thread (the instance was created on the event loop's thread, and
        every later hook runs there again); at most once, before any other hook but
        ``set_key_serializer``. Handles may come from any number of earlier instances
        (rescaling); only key groups in :attr:`key_group_range` are loaded.

        Raises:
            RestoreError: when a handle is of another backend's format or unreadable.
        """

    def hand_over(self) -> KeyGroupsInMemory | None:
        """At a rescale's snapshot instant: this instance's key groups as live in-memory
        objects that a new instance of the same backend adopts by reference
        (:meth:`take_over`), or None (the default) when the backend cannot hand them over:
        the rescale then restores its checkpoint's files instead.

        After a hand-over the instance only ends (:meth:`dispose`): its state objects
        belong to the instances that take them over.
        """
        return None

    def take_over(self, parts: Sequence[KeyGroupsInMemory]) -> None:
        """Adopt the key groups of this instance's range from ``parts`` (what
        :meth:`hand_over` of the old instances returned), by reference: no copy, no
        serialization. Called once, before any other hook but ``set_key_serializer``,
        on the event loop's thread, in place of :meth:`restore`.

        Raises:
            RestoreError: a part is not this backend's.
        """
        raise RestoreError(f"{type(self).__name__} cannot take over key groups in memory")

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:  # noqa: B027
        """Checkpoint ``checkpoint_id`` completed (incremental backends track what was kept)."""

    def dispose(self) -> None:  # noqa: B027
        """Release resources (files, handles) at the end of the job or attempt."""


class StateBackend(ABC):
    """Factory of keyed state backends; passed as ``run(state_backend=...)``.

    Attributes:
        name: stored in every handle; a restore refuses handles of another backend unless the
            backend can read them.
    """

    name: str = "abstract"

    @abstractmethod
    def create_keyed_backend(
        self,
        *,
        job_name: str,
        operator_uid: str,
        subtask: int,
        key_group_range: KeyGroupRange,
        max_parallelism: int,
    ) -> KeyedStateBackend:
        """Create the keyed backend of one operator instance."""

    def columnar_state_backend(self) -> StateBackend | None:
        """The backend of the columnar operators' keyed state when the job runs with this
        one; None: they keep it in arrays on the heap
        (:class:`reactive.columnar.state.ColumnarStateBackend`)."""
        return None
