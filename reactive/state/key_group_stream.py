"""The backend-independent form of a keyed-state snapshot, read one key group at a time, and
the registry of the readers that produce it from each backend's snapshot handles.

Every state backend writes snapshots in its own format (a heap backend pickles each key
group, RocksDB keeps SST files), but they all split keyed state by key group (Flink's
``KeyGroupsStateHandle``). A *key-group stream* is that common ground::

    key group -> state name -> {key: value}

one :class:`KeyGroupState` per non-empty key group, in ascending key-group order when the
format allows it, plus what holds for the whole snapshot (:class:`KeyGroupStream`: the
backend that wrote it, its ``key_encoding`` marker from :mod:`reactive.key_encoding`, and the
descriptor kind of each state where the format records it).

- Keys are Python objects (a reader decodes stored key bytes with the ``key_decoder`` it is
  given: the restoring backend's key serializer, else the canonical
  :func:`~reactive.key_encoding.decode_key`).
- Values are Python objects, except the values of the states listed in
  :attr:`KeyGroupState.serialized`, which are still their descriptor's custom serializer's
  bytes (only that descriptor can decode them; the restoring backend does when the state is
  bound).

Readers are registered per handle ``"backend"`` name with
:func:`register_key_group_reader`; the built-in ones (``heap``, ``rocksdb``) are registered by
importing the ``backends`` package, whose ``__init__`` imports each backend's reader lazily
(``reactive`` never imports ``backends``). A restore of another backend's snapshot (heap <->
RocksDB, any rescaling) is then::

    for key_group, serialized, states in read_key_groups(handle, job_dir,
                                                         key_group_range=my_range,
                                                         key_decoder=my_decoder):
        ...  # install the entries in this backend's own structures

and so are tools that inspect checkpoints (the PySpark bridge's ``CheckpointReader``, like
Flink's State Processor API reading savepoints through the backends' restore path).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple, Protocol

from ..errors import RestoreError
from ..key_encoding import KEY_ENCODING
from ..keygroups import KeyGroupRange

__all__ = [
    "KeyDecoder",
    "KeyGroupReader",
    "KeyGroupState",
    "KeyGroupStream",
    "find_key_group_reader",
    "merge_key_groups",
    "read_key_groups",
    "register_key_group_reader",
    "registered_backends",
]

#: stored key bytes -> key (a ``key_by`` key serializer's ``deserialize``, or ``decode_key``)
KeyDecoder = Callable[[bytes], Any]


class KeyGroupState(NamedTuple):
    """The keyed state of one key group.

    A tuple, so ``for key_group, serialized, states in stream`` unpacks it.

    Attributes:
        key_group: the key group (``0 <= key_group < max_parallelism``).
        serialized: names of the states whose values are still their descriptor's custom
            serializer's bytes.
        states: ``{state name: {key: value}}``; only states with entries appear.
    """

    key_group: int
    serialized: frozenset[str]
    states: dict[str, dict[Any, Any]]


class KeyGroupStream(Iterator[KeyGroupState]):
    """The key groups of one snapshot handle, one in memory at a time, with what holds for
    all of them.

    Iterate it once. Readers that open files or scratch directories release them when the
    iteration ends; :meth:`close` (or a ``with`` block) releases them after a partial one.

    Args:
        key_groups: the key groups, in the neutral form.
        backend: the ``"backend"`` name of the handle it was read from.
        key_encoding: how the snapshot's keys were encoded (the handle's ``key_encoding``,
            see :func:`reactive.key_encoding.key_encoding_name`).
        kinds: descriptor kind (``"value"``, ``"list"``, ``"map"``, ``"reducing"``) of each
            state, for formats that record it (empty otherwise).
    """

    def __init__(self, key_groups: Iterator[KeyGroupState], *, backend: str,
                 key_encoding: str = KEY_ENCODING,
                 kinds: Mapping[str, str] | None = None) -> None:
        self._key_groups = key_groups
        self.backend = backend
        self.key_encoding = key_encoding
        self.kinds: Mapping[str, str] = dict(kinds or {})

    def __iter__(self) -> KeyGroupStream:
        return self

    def __next__(self) -> KeyGroupState:
        return next(self._key_groups)

    def close(self) -> None:
        """Stop reading and release the reader's files (a no-op once exhausted)."""
        close = getattr(self._key_groups, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> KeyGroupStream:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class KeyGroupReader(Protocol):
    """Reads a snapshot handle of one backend as a key-group stream."""

    def __call__(self, handle: dict[str, Any], job_dir: Path, *,
                 key_group_range: KeyGroupRange | None = None,
                 key_decoder: KeyDecoder | None = None) -> KeyGroupStream:
        """Return the key groups of ``handle``.

        Args:
            handle: a ``keyed_state`` handle from a checkpoint's metadata.
            job_dir: the job directory the handle's paths are relative to.
            key_group_range: only these key groups (the others are not read); None: all.
            key_decoder: for formats that store key bytes: bytes -> key; None: the canonical
                decoder for handles whose ``key_encoding`` is canonical, the raw bytes for
                keys a ``key_by`` key serializer wrote.

        Raises:
            RestoreError: if the handle is not of the reader's format, its files cannot be
                read, or a key cannot be decoded (possibly while iterating).
        """
        ...


_READERS: dict[str, KeyGroupReader] = {}


def register_key_group_reader(backend: str, reader: KeyGroupReader) -> None:
    """Make handles whose ``"backend"`` field is ``backend`` readable as key-group streams
    (replaces an earlier reader of that name).

    Args:
        backend: the backend's ``name``, as its handles record it.
        reader: the reader; import heavy dependencies inside it, so that registering costs
            nothing.
    """
    _READERS[backend] = reader


def registered_backends() -> list[str]:
    """The backend names whose snapshots can be read (sorted)."""
    return sorted(_READERS)


def find_key_group_reader(backend: str) -> KeyGroupReader | None:
    """The reader registered for ``backend``, or None."""
    return _READERS.get(backend)


def read_key_groups(handle: dict[str, Any], job_dir: Path, *,
                    key_group_range: KeyGroupRange | None = None,
                    key_decoder: KeyDecoder | None = None) -> KeyGroupStream:
    """Read any registered backend's snapshot handle as a key-group stream (the reader is
    chosen by the handle's ``"backend"`` field; arguments as :class:`KeyGroupReader`).

    Raises:
        RestoreError: if no reader is registered for the handle's backend, or as the
            reader raises.
    """
    backend = str(handle.get("backend"))
    reader = _READERS.get(backend)
    if reader is None:
        raise RestoreError(
            f"no reader of {handle.get('backend')!r} snapshots (format "
            f"{handle.get('format')!r}) is registered; readable: {registered_backends()} "
            "(importing the backends package registers the built-in ones)"
        )
    return reader(handle, job_dir, key_group_range=key_group_range, key_decoder=key_decoder)


def merge_key_groups(key_groups: Iterable[KeyGroupState]) -> dict[str, dict[Any, Any]]:
    """Merge key groups into ``{state name: {key: value}}`` (a whole snapshot in memory:
    for tools and tests that compare a checkpoint with the expected state).

    Custom-serialized values stay bytes.
    """
    out: dict[str, dict[Any, Any]] = {}
    for _, _, states in key_groups:
        for name, entries in states.items():
            out.setdefault(name, {}).update(entries)
    return out
