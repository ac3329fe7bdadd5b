"""Serializers for state values and keys.

A :class:`Serializer` turns a Python object into ``bytes`` and back. State descriptors take
one; the default (:class:`PickleSerializer`) handles any picklable object. Checkpoint files
written with pickle must be treated as trusted input, like any pickle.
"""

from __future__ import annotations

import pickle
from typing import Any, Protocol, runtime_checkable

import msgpack

__all__ = [
    "MsgpackSerializer",
    "PickleSerializer",
    "Serializer",
    "stable_key_bytes",
]


@runtime_checkable
class Serializer(Protocol):
    """Converts values to bytes and back; ``deserialize(serialize(v)) == v``."""

    def serialize(self, value: Any) -> bytes:
        """Return the bytes of ``value``."""
        ...

    def deserialize(self, data: bytes) -> Any:
        """Return the value encoded in ``data``."""
        ...


class PickleSerializer:
    """Pickle (highest protocol): any picklable Python object, fast for builtins."""

    def serialize(self, value: Any) -> bytes:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)

    def deserialize(self, data: bytes) -> Any:
        return pickle.loads(data)

    def __eq__(self, other: object) -> bool:
        return type(other) is PickleSerializer

    def __hash__(self) -> int:
        return hash(PickleSerializer)


class MsgpackSerializer:
    """MessagePack: compact and language neutral, for None/bool/int/float/str/bytes/list/dict.

    Tuples come back as lists; use pickle when that matters.
    """

    def serialize(self, value: Any) -> bytes:
        return msgpack.packb(value, use_bin_type=True)  # type: ignore[no-any-return]

    def deserialize(self, data: bytes) -> Any:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)


def stable_key_bytes(key: Any) -> bytes:
    """Return a process-independent byte encoding of a key, for hashing into key groups.

    ``str``, ``bytes``, ``int``, ``float``, ``bool``, ``None`` and tuples/lists of them encode
    with MessagePack (deterministic); other objects with pickle protocol 4. Python's ``hash()``
    is salted per process and must never decide a key group.
    """
    try:
        return msgpack.packb(key, use_bin_type=True)  # type: ignore[no-any-return]
    except (TypeError, ValueError, OverflowError):
        return pickle.dumps(key, protocol=4)
