"""Reading the keyed state of one snapshot handle, whatever backend wrote it.

A checkpoint's metadata holds, per operator instance, a ``keyed_state`` handle whose
``backend`` field names the state backend that wrote it. :func:`read_keyed_state` turns a
handle into ``(key group, state name, key, value)`` entries through the backend's own
key-group reader, the one its restores use (:func:`reactive.state.key_group_stream.read_key_groups`;
importing this module imports ``backends``, which registers the ``heap`` and ``rocksdb``
readers), so a new backend that registers a key-group reader is readable here too. Source:
Flink's State Processor API, which reads savepoints of any state backend through the
backend's own restore path. :func:`register_state_reader` still plugs in a reader of entries
for the bridge alone (it takes precedence).

Keys come back as the program's ``key_by`` returned them (heap) or in their canonical form
(RocksDB stores :func:`reactive.key_encoding.encode_key` bytes: ``True`` reads back as ``1``,
a ``NamedTuple`` as a tuple); keys that a ``key_by`` key serializer wrote into a RocksDB
snapshot stay bytes. Values come back as objects, except those of states with a custom
serializer, which stay its bytes unless a ``deserializer`` is given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import reactive.backends  # noqa: F401  (registers the built-in key-group readers)
from reactive.errors import RestoreError
from reactive.keygroups import KeyGroupRange
from reactive.serialization import Serializer
from reactive.state.key_group_stream import (
    find_key_group_reader,
    read_key_groups,
    registered_backends,
)

__all__ = ["StateEntry", "StateReader", "read_keyed_state", "register_state_reader",
           "supported_backends"]

#: ``(key group, state name, key, value)``
StateEntry = tuple[int, str, Any, Any]

#: ``reader(handle, job_dir, max_parallelism, deserializer)`` yields the handle's entries
StateReader = Callable[[dict[str, Any], Path, int, Serializer | None], Iterator[StateEntry]]

# readers of entries registered for the bridge alone (before the key-group readers)
_READERS: dict[str, StateReader] = {}


def register_state_reader(backend: str, reader: StateReader) -> None:
    """Make handles whose ``backend`` field is ``backend`` readable by the bridge with
    ``reader`` (replaces an earlier one, and takes precedence over the backend's key-group
    reader; a backend that registers a key-group reader with
    :func:`reactive.state.key_group_stream.register_key_group_reader` needs none).

    Args:
        backend: the value of the handle's ``backend`` field (the backend's ``name``).
        reader: yields ``(key group, state name, key, value)``; values deserialized when the
            backend stores bytes (with the given serializer, else the backend's default).
    """
    _READERS[backend] = reader


def supported_backends() -> list[str]:
    """The backends whose snapshots can be read."""
    return sorted(set(_READERS) | set(registered_backends()))


def read_keyed_state(handle: dict[str, Any], job_dir: Path, max_parallelism: int,
                     key_group_range: KeyGroupRange | None = None,
                     deserializer: Serializer | None = None) -> Iterator[StateEntry]:
    """Yield the ``(key group, state name, key, value)`` entries of a ``keyed_state`` handle.

    Args:
        handle: the handle from a checkpoint's metadata.
        job_dir: the directory the handle's paths are relative to.
        max_parallelism: the checkpoint's (for readers registered with
            :func:`register_state_reader` whose format does not store key groups).
        key_group_range: only entries of these key groups (the instance's own range; the
            others are not read).
        deserializer: decodes the values of states written with a custom serializer (they
            are that serializer's bytes); None leaves them as bytes. Other values are
            objects already.

    Raises:
        RestoreError: for a backend no reader is registered for ("unsupported backend"),
            or a file that cannot be read.
    """
    backend = str(handle.get("backend"))
    reader = _READERS.get(backend)
    if reader is not None:
        for entry in reader(handle, job_dir, max_parallelism, deserializer):
            if key_group_range is None or entry[0] in key_group_range:
                yield entry
        return
    if find_key_group_reader(backend) is None:
        raise RestoreError(
            f"unsupported backend {handle.get('backend')!r} (format {handle.get('format')!r}): "
            f"the PySpark bridge reads {supported_backends()}; register a reader with "
            "reactive.connectors.spark.register_state_reader"
        )
    decode = deserializer.deserialize if deserializer is not None else None
    with read_key_groups(handle, job_dir, key_group_range=key_group_range) as stream:
        for kg, serialized, states in stream:
            for name, entries in states.items():
                if decode is not None and name in serialized:
                    for key, value in entries.items():
                        yield kg, name, key, decode(value)
                else:
                    for key, value in entries.items():
                        yield kg, name, key, value
