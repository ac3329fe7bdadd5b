"""The RocksDB key layout of keyed state: ``key group | state id | key bytes``.

As in Flink's ``RocksDBKeyedStateBackend`` (Carbone 2018 (PhD thesis), section 4.2), every value
lives under::

    key group (2 bytes, big-endian) | state id (4 bytes) | encoded key

so the state of a key-group range is one contiguous key range (iteration, deletion and
rescaling by range). The state id is derived from the state's name (a 4-byte BLAKE2b digest),
so instances that never met agree on it and a restore can merge their files without
rewriting keys. The encoded key is its canonical encoding (:mod:`reactive.key_encoding`:
equal keys, equal bytes, in every process), or the ``key_by`` key serializer's bytes; the key
group is the murmur3 hash of the same bytes. The user-key suffix of Flink's layout is not
used: list and map state are one value per key.
"""

from __future__ import annotations

import hashlib

__all__ = [
    "KEY_GROUP_BYTES",
    "MAX_KEY_GROUPS",
    "PREFIX_BYTES",
    "key_group_bounds",
    "key_group_of",
    "key_group_prefix",
    "key_group_upper_bound",
    "state_id",
]

#: bytes of the key-group prefix
KEY_GROUP_BYTES = 2
#: bytes of key group and state id, before the encoded key
PREFIX_BYTES = KEY_GROUP_BYTES + 4
#: key groups a 2-byte prefix can address (the backend's bound on max_parallelism)
MAX_KEY_GROUPS = 1 << 16
#: a bound above every key of the last key group (3 bytes sort after every 2-byte prefix)
_END_OF_KEYS = b"\xff\xff\xff"


def state_id(name: str) -> bytes:
    """Return the 4-byte id of state ``name`` in RocksDB keys (stable across processes)."""
    return hashlib.blake2b(name.encode(), digest_size=4).digest()


def key_group_prefix(key_group: int) -> bytes:
    """Return the 2-byte prefix of the keys of ``key_group``."""
    return key_group.to_bytes(KEY_GROUP_BYTES, "big")


def key_group_of(key: bytes) -> int:
    """Return the key group of a stored key."""
    return int.from_bytes(key[:KEY_GROUP_BYTES], "big")


def key_group_bounds(start: int, end: int) -> tuple[bytes, bytes | None]:
    """Return the RocksDB key bounds ``[lower, upper)`` of key groups ``start..end``
    (``upper`` None: up to the end of the key space)."""
    return key_group_prefix(start), (key_group_prefix(end + 1)
                                     if end + 1 < MAX_KEY_GROUPS else None)


def key_group_upper_bound(end: int) -> bytes:
    """Return an exclusive upper bound of the keys of key groups up to ``end`` that exists
    even for the last key group (for ``delete_range``)."""
    upper = key_group_bounds(end, end)[1]
    return upper if upper is not None else _END_OF_KEYS
