"""Serializers for state values (and for ``key_by`` keys of types without a canonical
encoding).

A :class:`Serializer` turns a Python object into ``bytes`` and back. State descriptors take
one; the default (:class:`PickleSerializer`) handles any picklable object. Checkpoint files
written with pickle must be treated as trusted input, like any pickle. Keys are encoded by
:mod:`reactive.key_encoding` unless ``key_by`` is given a serializer.
"""

from __future__ import annotations

import pickle
from typing import Any, Protocol, runtime_checkable

import msgpack

__all__ = [
    "MsgpackSerializer",
    "PickleSerializer",
    "Serializer",
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

