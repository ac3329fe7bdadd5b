"""The rows a key-group plan's reader hands Spark: each key group's records of a stretch of
the source packed into one row, so Spark shuffles, sorts and converts a few hundred rows
per micro-batch instead of one per record.

A row of :data:`KEY_GROUP_SCHEMA` holds, for one key group and one stretch of the reader's
records (at most :data:`FLUSH_RECORDS`), the pickle of ``(positions, records)``: the
records' source positions as int64 bytes and the records themselves, in source order. Its
``seq`` is the stretch's first position (the order of a key group's rows), its ``ts`` the
largest event time among its records (Spark's watermark is the largest event time seen,
so it is the same as with a row per record), ``kg`` the key group
(``murmur3(key bytes) mod max_parallelism``, :func:`reactive.keygroups.key_group_of_bytes`).
The end-of-input marker is a row with null ``records`` in a key group of its own,
:data:`MARKER_KEY_GROUP`.

Per record, the work left in Python is what the embedded runtime does too (the key
selector, the key's bytes and their hash) plus one pickle of a list; Spark's per-row costs
(the Arrow conversions of a Python data source and of ``transformWithStateInPandas``'s
input, which pyspark reads row by row, the shuffle, the sort by key group) are paid per
packed row.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from operator import itemgetter
from typing import Any

from .translation import QueryPlan

__all__ = ["FLUSH_RECORDS", "KEY_GROUP_SCHEMA", "MARKER_KEY_GROUP", "key_group_records",
           "unpack_records"]

KEY_GROUP_SCHEMA = "records binary, ts timestamp, seq bigint, kg int"
"""The reader's rows (see the module docstring)."""

MARKER_KEY_GROUP = -1
"""The end-of-input marker's ``kg``: no key's group. Not null: the marker shares its
micro-batch with the last records, and pyspark hands ``transformWithStateInPandas`` each
grouping key from a pandas conversion of a whole Arrow batch, where one null turns the
batch's int32 keys into floats, under which Spark's state store finds no key group's
state."""

FLUSH_RECORDS = 1 << 18
"""Records a reader task packs at most before it hands the packed rows to Spark: bounds
the reader's memory and a row's size (an Arrow binary array holds at most 2 GiB)."""


def key_group_records(plan: QueryPlan, flush_records: int = FLUSH_RECORDS
                      ) -> Callable[[Any], Any]:
    """The source reader's chain of a key-group plan: source records
    (:data:`~.record_chain.Chunk` s) through the steps before the keyed operator, packed by
    key group into Arrow batches of :data:`KEY_GROUP_SCHEMA`.

    Args:
        plan: a plan with a keyed operator.
        flush_records: records packed at most before the rows are emitted.

    Returns:
        the chain (a function of the chunks, yielding ``pyarrow.RecordBatch`` es).

    Raises:
        UserFunctionError: (in the reader) naming the keyed operator, the record and its
            source position, when the key selector or the key serializer raises; or naming
            the step, when a step before the keyed operator does.
    """
    steps = plan.before_key
    assert plan.keyed is not None
    key_of = plan.keyed.key_selector
    key_serializer = plan.keyed.key_serializer
    max_parallelism = plan.keyed.max_parallelism
    name, uid = plan.keyed.name, plan.keyed.uid

    def run(chunks: Any) -> Any:
        import datetime

        import mmh3
        import numpy as np
        import pyarrow as pa

        from reactive.errors import UserFunctionError
        from reactive.key_encoding import encode_key

        from .record_chain import END_OF_INPUT, run_steps

        ts_type = pa.timestamp("us", tz="UTC")
        schema = pa.schema([("records", pa.binary()), ("ts", ts_type), ("seq", pa.int64()),
                            ("kg", pa.int32())])
        encode = key_serializer.serialize if key_serializer is not None else encode_key
        dumps, proto, murmur = pickle.dumps, pickle.HIGHEST_PROTOCOL, mmh3.hash

        def group_of(r: Any, seq: int) -> int:
            try:
                return int(murmur(encode(key_of(r)), 0, False) % max_parallelism)
            except Exception as exc:
                raise UserFunctionError(name, uid, 0, 1, r, exc, f"record {seq}") from exc

        # the stretch held so far: its records, their positions and key groups, and the
        # largest event time per key group
        held_records: list[Any] = []
        held_seqs: list[int] = []
        held_groups: list[int] = []
        latest: dict[int, float] = {}

        def rows() -> Any:
            nonlocal held_records, held_seqs, held_groups, latest
            groups = np.asarray(held_groups, np.int64)
            order = np.argsort(groups, kind="stable")  # source order within a key group
            ordered = groups[order]
            starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
            ends = np.r_[starts[1:], len(order)]
            seqs = np.asarray(held_seqs, np.int64)[order]
            # in C: a list comprehension indexing record by record costs as much as hashing
            picked = itemgetter(*order.tolist())(held_records)
            records = list(picked) if len(order) > 1 else [picked]
            names = ordered[starts].tolist()
            out = pa.RecordBatch.from_arrays(
                [pa.array([dumps((seqs[a:b].tobytes(), records[a:b]), proto)
                           for a, b in zip(starts.tolist(), ends.tolist(), strict=True)],
                          pa.binary()),
                 pa.array([None if g not in latest else
                           datetime.datetime.fromtimestamp(latest[g], datetime.UTC)
                           for g in names], ts_type),
                 pa.array(seqs[starts], pa.int64()), pa.array(names, pa.int32())],
                schema=schema)
            held_records, held_seqs, held_groups, latest = [], [], [], {}
            return out

        for records, tss, seqs in chunks:
            marker = None
            if records and records[-1] is END_OF_INPUT:  # only ever a chunk's last row
                marker = (tss[-1], seqs[-1])
                records, seqs = records[:-1], seqs[:-1]
            times: list[Any] | None = None
            if steps:
                out = [(r, t, seq) for record, seq in zip(records, seqs, strict=True)
                       for r, t in run_steps(steps, record, None, f"record {seq}")]
                records = [o[0] for o in out]
                seqs = [o[2] for o in out]
                times = [o[1] for o in out]
            try:
                groups = [murmur(encode(key_of(r)), 0, False) % max_parallelism
                          for r in records]
            except Exception:  # again record by record, for the one that failed
                groups = [group_of(r, seq) for r, seq in zip(records, seqs, strict=True)]
            held_records.extend(records)
            held_seqs.extend(seqs)
            held_groups.extend(groups)
            if times is not None:
                for g, t in zip(groups, times, strict=True):
                    if t is not None and (g not in latest or t > latest[g]):
                        latest[g] = t
            if len(held_records) >= flush_records:
                yield rows()
            if marker is not None:
                if held_records:
                    yield rows()
                yield pa.RecordBatch.from_arrays(
                    [pa.array([None], pa.binary()), pa.array([marker[0]], ts_type),
                     pa.array([marker[1]], pa.int64()),
                     pa.array([MARKER_KEY_GROUP], pa.int32())],
                    schema=schema)
        if held_records:
            yield rows()

    return run


def unpack_records(packed: Any, firsts: Any) -> list[Any]:
    """The records of one key group's packed rows, in source order.

    Args:
        packed: the rows' ``records`` values (bytes; no null).
        firsts: their ``seq`` values (the first source position of each).

    Returns:
        the records, ordered by source position; records of one position (a ``flat_map``'s
        outputs) keep their order.
    """
    import numpy as np

    loads = pickle.loads
    if len(packed) == 1:
        return list(loads(packed[0])[1])
    order = np.argsort(np.asarray(firsts, np.int64), kind="stable")
    positions: list[Any] = []
    records: list[Any] = []
    for i in order:
        seqs, recs = loads(packed[i])
        positions.append(np.frombuffer(seqs, np.int64))
        records.extend(recs)
    at = np.concatenate(positions)
    if len(at) > 1 and bool((at[1:] < at[:-1]).any()):  # rows of interleaved stretches
        records = [records[i] for i in np.argsort(at, kind="stable")]
    return records
