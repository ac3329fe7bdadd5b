"""The key group of every value of an Arrow array at once: the canonical key bytes
(:mod:`reactive.key_encoding`, format ``canonical-v1``) built as a zero-padded byte matrix
and hashed with MurmurHash3 (x86, 32 bits, seed 0: what ``mmh3.hash(data, 0,
signed=False)`` computes) in numpy, four bytes per step for all rows.

Covered: strings (tag 0x04), binary (0x05) and integers that fit int64 (0x01), without
nulls and with canonical encodings of at most :data:`MAX_WIDTH` bytes. For anything else
(floats, nulls, longer values) :func:`key_groups_of` returns None and the caller hashes the
values one by one with :func:`reactive.keygroups.assign_to_key_group`; both give the same
key groups, which the tests check against each other (Austin Appleby's MurmurHash3
reference, ``MurmurHash3_x86_32``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .schema import pa

__all__ = ["MAX_WIDTH", "key_groups_of", "murmur3_rows"]

MAX_WIDTH = 64
"""The longest canonical encoding hashed here, in bytes (a wider row would widen the
matrix of every row of the array)."""

_C1 = np.uint32(0xCC9E2D51)
_C2 = np.uint32(0x1B873593)
_TAG_INT, _TAG_STR, _TAG_BYTES = 0x01, 0x04, 0x05


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def murmur3_rows(matrix: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """MurmurHash3_x86_32 (seed 0) of each row's first ``lengths[i]`` bytes.

    Args:
        matrix: ``uint8`` of shape ``(rows, width)``, width a multiple of 4 and larger than
            every length; the bytes past a row's length must be zero.
        lengths: per row, its length in bytes.

    Returns:
        The hashes, ``uint32`` per row.
    """
    blocks = np.ascontiguousarray(matrix).view("<u4")
    nblocks = lengths // 4
    h = np.zeros(len(matrix), np.uint32)
    with np.errstate(over="ignore"):
        for j in range(int(nblocks.max()) if len(nblocks) else 0):
            active = nblocks > j
            k = blocks[:, j] * _C1
            k = _rotl(k, 15) * _C2
            mixed = _rotl(h ^ k, 13) * np.uint32(5) + np.uint32(0xE6546B64)
            h = np.where(active, mixed, h)
        # the tail: the bytes after the last whole block, zero-padded, read as one word
        tail = blocks[np.arange(len(matrix)), nblocks]
        k = _rotl(tail * _C1, 15) * _C2
        h = np.where(lengths % 4 != 0, h ^ k, h)
        h ^= lengths.astype(np.uint32)
        h ^= h >> np.uint32(16)
        h *= np.uint32(0x85EBCA6B)
        h ^= h >> np.uint32(13)
        h *= np.uint32(0xC2B2AE35)
        h ^= h >> np.uint32(16)
    return h


def _string_rows(array: Any, tag: int) -> tuple[np.ndarray, np.ndarray] | None:
    large = pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type)
    offset_type = np.dtype(np.int64 if large else np.int32)
    buffers = array.buffers()
    n = len(array)
    offsets = np.frombuffer(buffers[1], offset_type, n + 1,
                            array.offset * offset_type.itemsize).astype(np.int64)
    lengths = np.diff(offsets)
    if n == 0:
        return np.zeros((0, 4), np.uint8), lengths
    # the varint length prefix: 1 byte below 128, else up to 4 (longer rows are refused)
    vlen = 1 + (lengths >= 1 << 7) + (lengths >= 1 << 14) + (lengths >= 1 << 21)
    head = 1 + vlen
    total = head + lengths
    widest = int(total.max())
    if widest > MAX_WIDTH:
        return None
    width = (widest // 4 + 1) * 4  # one zero word past the longest row: its tail word
    flat = np.zeros(n * width, np.uint8)
    base = np.arange(n, dtype=np.int64) * width
    flat[base] = tag
    rest = lengths.copy()
    for i in range(int(vlen.max())):
        rows = np.flatnonzero(vlen > i)
        more = rest[rows] >= 0x80
        flat[base[rows] + 1 + i] = (rest[rows] & 0x7F) | np.where(more, 0x80, 0)
        rest[rows] >>= 7
    nbytes = int(offsets[-1] - offsets[0])
    if nbytes:
        data = np.frombuffer(buffers[2], np.uint8, nbytes, int(offsets[0]))
        # byte b of the values goes to its row's base + head + (b - the row's first byte)
        shift = base + head - (offsets[:-1] - offsets[0])
        flat[np.repeat(shift, lengths) + np.arange(nbytes, dtype=np.int64)] = data
    return flat.reshape(n, width), total


def _int_rows(array: Any) -> tuple[np.ndarray, np.ndarray] | None:
    values = array.to_numpy(zero_copy_only=False)
    if values.dtype == np.uint64 and len(values) and int(values.max()) >= 1 << 63:
        return None  # the long int form
    n = len(values)
    matrix = np.zeros((n, 12), np.uint8)
    matrix[:, 0] = _TAG_INT
    matrix[:, 1:9] = values.astype(">i8").view(np.uint8).reshape(n, 8)
    return matrix, np.full(n, 9, np.int64)


def key_groups_of(array: Any, max_parallelism: int) -> np.ndarray | None:
    """The key group of each value of ``array``, as the per-record API computes it, or
    None when the array is not covered here (see the module docstring).

    Args:
        array: a ``pyarrow.Array``.
        max_parallelism: the number of key groups.

    Returns:
        ``int32`` per value, or None.
    """
    if array.null_count:
        return None
    t = array.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        rows = _string_rows(array, _TAG_STR)
    elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
        rows = _string_rows(array, _TAG_BYTES)
    elif pa.types.is_integer(t):
        rows = _int_rows(array)
    else:
        return None
    if rows is None:
        return None
    hashes = murmur3_rows(*rows)
    return (hashes % np.uint32(max_parallelism)).astype(np.int32)
