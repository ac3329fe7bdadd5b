"""Distinct keys of a record batch mapped once to dense slots, and each slot's key group.

This is the key handling of DataFusion's ``GroupsAccumulator`` design: a batch's key
column is dictionary-encoded (Arrow's hash kernel, in C++), only its *distinct* values are
looked up among the known keys, and every per-row step after that is an array operation
over the rows' codes. For string, binary and integer columns the lookup is itself
vectorized (:mod:`.slot_table`: hashes proposed, keys compared); other types and tuples
of several columns are looked up in a ``dict``. A new key gets the next slot; its key group
is the one the per-record API computes, ``murmur3(encode_key(key)) mod max_parallelism``
(:mod:`.canonical_hash` over the array, else :func:`reactive.keygroups.assign_to_key_group`
per key), so a row lands in the key group its key has through ``Stream.key_by`` and state
stays compatible across both APIs and across rescaling.

A dictionary-typed key column whose dictionary is the one of the previous batch (the usual
case: the batches of a Parquet column chunk, or a source with a fixed vocabulary) skips the
lookups altogether: the dictionary's slots are kept.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import UnsupportedKeyError
from ..keygroups import assign_to_key_group
from .canonical_hash import key_groups_of
from .grouping import combine_codes
from .schema import pa, pc
from .slot_table import SlotTable, identity_hashes

__all__ = ["BatchKeys", "KeyIndex"]


class BatchKeys:
    """The keys of one batch.

    Attributes:
        codes: per row, the index of its key among the batch's groups (``int64`` array of
            the batch's length).
        slots: per group, its slot in the :class:`KeyIndex` (``int64`` array).
        num_groups: the number of groups (``codes`` lie in ``[0, num_groups)``).
    """

    __slots__ = ("codes", "num_groups", "slots")

    def __init__(self, codes: np.ndarray, slots: np.ndarray) -> None:
        self.codes = codes
        self.slots = slots
        self.num_groups = len(slots)


class KeyIndex:
    """Known keys -> dense slots, with each slot's key group and the keys as Arrow arrays.

    Args:
        key_columns: the names of the key columns (one or more).
        max_parallelism: the number of key groups.
        operator: the keyed operator's uid, named in key errors.
        capacity: forget every key once this many are known (a partitioner, which needs
            key groups only, bounds its memory this way); None: keep all (keyed state).

    Attributes:
        size: the number of slots in use.
        key_groups: per slot, its key group (``int32``; valid up to ``size``).
    """

    def __init__(self, key_columns: list[str], max_parallelism: int,
                 operator: str | None = None, capacity: int | None = None) -> None:
        self.key_columns = key_columns
        self.max_parallelism = max_parallelism
        self.operator = operator
        self.capacity = capacity
        self.size = 0
        self.key_groups = np.zeros(1024, np.int32)
        self._slot_of: dict[Any, int] = {}
        # the keys of slots [0, size) as Arrow arrays, one list of chunks per key column,
        # appended to only (a snapshot captures a prefix in O(number of chunks))
        self.key_chunks: list[list[Any]] = [[] for _ in key_columns]
        self._dictionary: Any = None
        self._dictionary_slots: np.ndarray | None = None
        # one key column of strings, binary or integers: hashes -> slots, probed for a
        # batch's distinct values at once (a hash only proposes a slot); the keys whose
        # hash another key has, and the null key, beside it
        self._table = SlotTable() if len(key_columns) == 1 else None
        self._hashed: bool | None = None  # decided by the column's type, at first sight
        self._overflow: dict[Any, int] = {}
        self._null: int | None = None

    # ------------------------------------------------------------------ lookups
    def lookup(self, batch: Any) -> BatchKeys:
        """Map the rows of ``batch`` to slots, adding the keys not seen before.

        Args:
            batch: a ``pyarrow.RecordBatch`` with the key columns.

        Returns:
            The batch's :class:`BatchKeys`.

        Raises:
            UnsupportedKeyError: for a key without a canonical encoding (NaN, a timestamp
                ...), naming the operator.
        """
        if self.capacity is not None and self.size + batch.num_rows > self.capacity:
            self.clear()
        if len(self.key_columns) == 1:
            column = batch.column(self.key_columns[0])
            if pa.types.is_dictionary(column.type):
                if column.null_count == 0:
                    return self._lookup_dictionary(column)
                column = column.cast(column.type.value_type)  # null indices: decoded
            encoded = column.dictionary_encode(null_encoding="encode")
            codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
            return BatchKeys(codes, self._slots_of_values(encoded.dictionary))
        return self._lookup_tuples(batch)

    def _slots_of_values(self, uniques: Any) -> np.ndarray:
        """The slots of the values of one key column (a ``pyarrow.Array`` of distinct
        values, except that a dictionary may repeat one), adding the new ones.

        Strings, binary and integers go through the slot table alone: a batch's values are
        hashed at once (:func:`identity_hashes`), probed at once, and each proposed slot is
        confirmed by comparing the keys (``pyarrow.compute.equal``); new keys get the next
        slots and their key groups without a Python call per key. The rare key whose hash
        another key has lives in a small dict (``_overflow``). Other types go through the
        dict of all keys (``_slot_of``); a column is one or the other for the index's life.
        """
        if self._hashed is None:
            self._hashed = self._table is not None and _hashable(uniques.type)
        if not self._hashed:
            return self._slots_for([uniques], uniques.to_pylist())
        if not _hashable(uniques.type):
            raise TypeError(f"key column {self.key_columns[0]!r} changed type to "
                            f"{uniques.type}")
        if not uniques.null_count:
            return self._hashed_slots(uniques)
        is_null = uniques.is_null().to_numpy(zero_copy_only=False)
        slots = np.empty(len(uniques), np.int64)
        slots[is_null] = self._null_slot(uniques.type)
        slots[~is_null] = self._hashed_slots(uniques.filter(pa.array(~is_null)))
        return slots

    def _hashed_slots(self, values: Any) -> np.ndarray:
        table = self._table
        assert table is not None
        hashes = identity_hashes(values)
        assert hashes is not None
        slots = table.lookup(hashes)
        found = np.flatnonzero(slots >= 0)
        if len(found):
            same = pc.equal(values.take(pa.array(found)),
                            self._all_keys().take(pa.array(slots[found])))
            slots[found[~same.to_numpy(zero_copy_only=False)]] = -2  # another key's hash
        new = np.flatnonzero(slots == -1)
        if len(new):
            # a hash twice among the new keys: the first occurrence goes into the table,
            # the others are resolved one by one below
            _, first = np.unique(hashes[new], return_index=True)
            if len(first) < len(new):
                later = np.ones(len(new), bool)
                later[first] = False
                slots[new[later]] = -2
                new = new[~later]
            slots[new] = self._append(values.take(pa.array(new)), hashes[new])
        for i in np.flatnonzero(slots == -2).tolist():
            key = values[i].as_py()
            slot = self._overflow.get(key)
            if slot is None:
                holder = int(table.lookup(hashes[i:i + 1])[0])
                if holder >= 0 and self._all_keys()[holder].as_py() == key:
                    slot = holder
                else:
                    slot = int(self._append(values.slice(i, 1), None)[0])
                    self._overflow[key] = slot
            slots[i] = slot
        return slots

    def _append(self, values: Any, hashes: np.ndarray | None) -> np.ndarray:
        """Give new keys (an Arrow array) the next slots; ``hashes`` go into the table."""
        maxp = self.max_parallelism
        kgs = key_groups_of(values, maxp)
        if kgs is None:
            try:
                kgs = np.array([assign_to_key_group(k, maxp) for k in values.to_pylist()],
                               np.int32)
            except UnsupportedKeyError as exc:
                raise exc.for_operator(self.operator) from None
        start = self.size
        end = start + len(values)
        if end > len(self.key_groups):
            grown = np.zeros(max(end, 2 * len(self.key_groups)), np.int32)
            grown[:start] = self.key_groups[:start]
            self.key_groups = grown
        self.key_groups[start:end] = kgs
        self.key_chunks[0].append(values)
        self.size = end
        slots = np.arange(start, end, dtype=np.int64)
        if hashes is not None:
            assert self._table is not None
            self._table.insert(hashes, slots)
        return slots

    def _null_slot(self, value_type: Any) -> int:
        """The slot of the null key (None, as in the per-record API), added when new."""
        if self._null is None:
            self._null = int(self._append(pa.nulls(1, value_type), None)[0])
        return self._null

    def _all_keys(self) -> Any:
        """The keys of every slot, in slot order, as one chunked array (its chunks merged
        once there are many)."""
        chunks = self.key_chunks[0]
        if len(chunks) > 32:
            chunks[:] = [pa.concat_arrays(chunks)]
        return pa.chunked_array(chunks, type=chunks[0].type)

    def _lookup_dictionary(self, column: Any) -> BatchKeys:
        dictionary = column.dictionary
        codes = column.indices.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        known = self._dictionary
        if known is None or not (known is dictionary or _same_buffers(known, dictionary)
                                 or known.equals(dictionary)):
            slots = self._slots_of_values(dictionary)
            self._dictionary, self._dictionary_slots = dictionary, slots
        assert self._dictionary_slots is not None
        return BatchKeys(codes, self._dictionary_slots)

    def _lookup_tuples(self, batch: Any) -> BatchKeys:
        # each column dictionary-encoded, the codes combined into one integer per row,
        # its distinct values found by numpy (a sort), the tuples built per distinct key
        codes: np.ndarray
        uniques: np.ndarray
        dictionaries = []
        for i, name in enumerate(self.key_columns):
            column = batch.column(name)
            if pa.types.is_dictionary(column.type) and not column.null_count:
                # its own codes: a value the dictionary holds twice gives two codes of one
                # key, which _slots_for maps to one slot
                d, indices = column.dictionary, column.indices
            else:
                if pa.types.is_dictionary(column.type):
                    column = column.cast(column.type.value_type)
                encoded = column.dictionary_encode(null_encoding="encode")
                d, indices = encoded.dictionary, encoded.indices
            column_codes = indices.to_numpy(zero_copy_only=False)
            if i == 0:
                # the first column's codes as they are (a value absent from the batch is
                # dropped when the next column's codes are combined with them)
                codes, uniques = column_codes, np.arange(len(d), dtype=np.int64)
            else:
                # the distinct tuples so far combined with this column's codes: dense
                codes, pairs = combine_codes(codes, len(uniques), column_codes, len(d))
                uniques = uniques[pairs // len(d)] * len(d) + pairs % len(d)
            dictionaries.append((d, len(d)))
        positions = []
        rest = uniques
        for _, n in reversed(dictionaries):
            positions.append(rest % n)
            rest = rest // n
        positions.reverse()
        columns = [d.take(pa.array(p)) for (d, _), p in zip(dictionaries, positions,
                                                            strict=True)]
        keys = list(zip(*(c.to_pylist() for c in columns), strict=True))
        return BatchKeys(codes.astype(np.int64, copy=False).reshape(-1),
                         self._slots_for(columns, keys))

    def _slots_for(self, columns: list[Any], keys: list[Any]) -> np.ndarray:
        """The slots of distinct ``keys`` (the rows of the Arrow ``columns``), adding the
        new ones."""
        get = self._slot_of.get
        slots = np.fromiter((get(k, -1) for k in keys), np.int64, len(keys))
        new = np.flatnonzero(slots < 0)
        if len(new):
            self._add(columns, keys, new, slots)
        return slots

    def _add(self, columns: list[Any], keys: list[Any], new: np.ndarray,
             slots: np.ndarray) -> None:
        start = self.size
        if start + len(new) > len(self.key_groups):
            grown = np.zeros(max(start + len(new), 2 * len(self.key_groups)), np.int32)
            grown[:start] = self.key_groups[:start]
            self.key_groups = grown
        slot_of = self._slot_of
        # distinct Python values may still be equal keys (1 and 1.0 across batches are
        # not, within one typed Arrow array they cannot be): keep the first of equal ones
        added: list[int] = []
        slot = start
        for i in new.tolist():
            k = keys[i]
            known = slot_of.get(k)
            if known is None:
                slot_of[k] = slots[i] = slot
                added.append(i)
                slot += 1
            else:
                slots[i] = known
        taken = pa.array(added, pa.int64())
        new_columns = [column.take(taken) for column in columns]
        try:
            self.key_groups[start:slot] = self._key_groups_of(new_columns,
                                                              [keys[i] for i in added])
        except UnsupportedKeyError as exc:
            for i in added:  # leave the index as it was
                del slot_of[keys[i]]
            raise exc.for_operator(self.operator) from None
        self.size = slot
        for chunks, column in zip(self.key_chunks, new_columns, strict=True):
            chunks.append(column)

    def _key_groups_of(self, columns: list[Any], keys: list[Any]) -> Any:
        """The key groups of new keys: over the Arrow column at once where
        :func:`~reactive.columnar.canonical_hash.key_groups_of` covers its type, else key
        by key (the same function as the per-record API)."""
        if len(columns) == 1:
            found = key_groups_of(columns[0], self.max_parallelism)
            if found is not None:
                return found
        maxp = self.max_parallelism
        return [assign_to_key_group(k, maxp) for k in keys]

    def clear(self) -> None:
        """Forget every key (slots restart at 0)."""
        self._slot_of.clear()
        self.size = 0
        self.key_chunks = [[] for _ in self.key_columns]
        self._dictionary = self._dictionary_slots = None
        if self._table is not None:
            self._table.clear()
        self._overflow.clear()
        self._null = None

    # ------------------------------------------------------------------ snapshots
    def keys_prefix(self, chunk_counts: list[int]) -> list[Any]:
        """The key columns of the slots the first ``chunk_counts[i]`` chunks hold (one
        ``pyarrow.Array`` per key column)."""
        out = []
        for chunks, n in zip(self.key_chunks, chunk_counts, strict=True):
            part = chunks[:n]
            out.append(pa.concat_arrays(part) if part else None)
        return out

    def install(self, key_columns: list[Any]) -> np.ndarray:
        """Add restored keys (one Arrow array per key column, distinct keys); returns their
        slots, in order. Their key groups are computed again, as for any new key."""
        if len(self.key_columns) == 1:
            return self._slots_of_values(key_columns[0])
        keys = list(zip(*(c.to_pylist() for c in key_columns), strict=True))
        return self._slots_for(key_columns, keys)


def _hashable(value_type: Any) -> bool:
    """Whether a key column of this type goes through the slot table."""
    t = pa.types
    return bool(t.is_string(value_type) or t.is_large_string(value_type)
                or t.is_binary(value_type) or t.is_large_binary(value_type)
                or t.is_integer(value_type))


def _same_buffers(a: Any, b: Any) -> bool:
    """Whether two arrays are views of the same memory (the same dictionary object behind
    two batches): equal type, length, offset and buffer addresses."""
    if len(a) != len(b) or a.offset != b.offset or not a.type.equals(b.type):
        return False
    return [x.address if x is not None else None for x in a.buffers()] == \
        [x.address if x is not None else None for x in b.buffers()]
