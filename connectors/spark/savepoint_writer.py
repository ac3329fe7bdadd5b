"""Bootstrapping: write keyed state computed in Spark as a savepoint a pipeline restores from
(Flink's State Processor API ``SavepointWriter.withOperator`` with a
``KeyedStateBootstrapFunction``).

```python
(SavepointWriter(max_parallelism=128, job_name="wordcount")
    .with_keyed_state("count", "count", counts_df, key_column="word", value_column="n")
    .write("savepoints/"))                # -> savepoints/wordcount/chk-1
await flow.run(restore_from="savepoints/wordcount/chk-1", checkpoints=...)
```

Spark computes each row's key group with the runtime's own hash
(:func:`reactive.assign_to_key_group` over the key's canonical encoding, or the pipeline's
``key_by`` key serializer; in a Python UDF, so ``reactive`` must be importable on the
executors) and sorts by it; the driver then streams the rows in key-group order and
writes one heap snapshot file (format ``heap-v1``, through
:func:`reactive.backends.heap.format.write_heap_snapshot`) per target instance, holding one key group in
memory at a time. The metadata (kind ``savepoint``) is written last and atomically, like a
checkpoint's, so an interrupted write leaves an incomplete directory that restores refuse.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reactive.checkpoint.contract import (
    CheckpointMetadata,
    CheckpointMetrics,
    KeyedStateHandle,
    OperatorState,
    OperatorSubtaskState,
)
from reactive.checkpoint.storage import CheckpointStorage
from reactive.errors import ConfigurationError, UnsupportedKeyError
from reactive.key_encoding import encode_key, key_encoding_name
from reactive.keygroups import (
    assign_to_key_group,
    key_group_range_for_operator,
    operator_index_for_key_group,
)
from reactive.serialization import Serializer
from reactive.state.backend import file_name_component

from .errors import SavepointWriteError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["SavepointWriter"]

# (key group, state name, key, value)
_Entry = tuple[int, str, Any, Any]


@dataclass(frozen=True)
class _StateSource:
    state_name: str
    df: DataFrame
    key_columns: tuple[str, ...]
    value_column: str


def _plain(obj: Any) -> Any:
    """Spark ``Row`` s (structs) become tuples, the keys a ``key_by`` lambda returns."""
    from pyspark.sql import Row

    if isinstance(obj, Row):
        return tuple(_plain(v) for v in obj)
    if isinstance(obj, list):
        return [_plain(v) for v in obj]
    return obj


# the key group a row gets when its key has no canonical encoding (the driver reports it)
_NO_KEY_GROUP = -1


def _key(parts: Sequence[Any]) -> Any:
    """The key made of ``parts``: one column, the value itself; several, a tuple."""
    return _plain(parts[0]) if len(parts) == 1 else tuple(_plain(p) for p in parts)


def _key_group(max_parallelism: int, key_serializer: Serializer | None, *parts: Any) -> int:
    """Key group of the key made of ``parts``, exactly as the pipeline's ``key_by`` computes
    it, or ``_NO_KEY_GROUP`` for a key without a canonical encoding."""
    try:
        return assign_to_key_group(_key(parts), max_parallelism, key_serializer)
    except UnsupportedKeyError:
        return _NO_KEY_GROUP


def _refusal(parts: Sequence[Any]) -> str:
    """Why the key made of ``parts`` got no key group (the UDF only returns a number)."""
    try:
        encode_key(_key(parts))
    except UnsupportedKeyError as exc:
        return str(exc)
    return f"key {_key(parts)!r} got no key group"


class SavepointWriter:
    """Builds a savepoint from DataFrames of keyed state.

    Args:
        max_parallelism: the job's max parallelism (number of key groups); the pipeline that
            restores the savepoint must use the same.
        job_name: the dataflow's name; the savepoint goes to ``<directory>/<job_name>/chk-<n>``.

    Raises:
        ConfigurationError: if ``max_parallelism`` is outside 1..32768 or the name is invalid.
    """

    def __init__(self, max_parallelism: int, job_name: str) -> None:
        if not 1 <= max_parallelism <= 32768:
            raise ConfigurationError(f"max_parallelism must be in 1..32768, got {max_parallelism}")
        if not job_name or any(c in job_name for c in "/\\"):
            raise ConfigurationError(f"job name {job_name!r} must be non-empty and contain no '/'")
        self.max_parallelism = max_parallelism
        self.job_name = job_name
        self._states: dict[str, list[_StateSource]] = {}
        self._parallelism: dict[str, int] = {}
        self._key_serializers: dict[str, Serializer | None] = {}

    def with_keyed_state(
        self,
        uid: str,
        state_name: str,
        df: DataFrame,
        key_column: str | Sequence[str],
        value_column: str,
        parallelism: int = 1,
        key_serializer: Serializer | None = None,
    ) -> SavepointWriter:
        """Add value state ``state_name`` of operator ``uid``: one entry per row of ``df``.

        Args:
            uid: the operator's uid in the pipeline (``.uid(...)``).
            state_name: the state descriptor's name (e.g. ``ValueStateDescriptor("count")``).
            df: one row per key.
            key_column: the key column, or several columns that form a tuple key (the
                pipeline's ``key_by`` must return the same value: a struct column becomes a
                tuple too).
            value_column: the value column (a struct becomes a tuple; a null value means no
                state for that key and is skipped).
            parallelism: number of operator instances (files) to split the key groups into;
                any parallelism restores it (state is split by key group), this only sets
                the files' granularity. Several states of one uid must agree.
            key_serializer: the ``key_serializer`` the pipeline's ``key_by`` uses, if any
                (it decides the key groups; it is shipped to the executors, so it must be
                picklable). Several states of one uid must agree.

        Returns:
            this writer (to chain calls).

        Raises:
            ConfigurationError: on a missing column, a parallelism outside
                1..max_parallelism, a state added twice, or a parallelism or key serializer
                that differs from an earlier state of the same uid.
        """
        keys = (key_column,) if isinstance(key_column, str) else tuple(key_column)
        missing = [c for c in (*keys, value_column) if c not in df.columns]
        if not keys or missing:
            raise ConfigurationError(f"columns {missing or ['<key>']} are not in the DataFrame "
                                     f"(columns: {df.columns})")
        if not 1 <= parallelism <= self.max_parallelism:
            raise ConfigurationError(f"parallelism must be in 1..{self.max_parallelism}, "
                                     f"got {parallelism}")
        if self._parallelism.setdefault(uid, parallelism) != parallelism:
            raise ConfigurationError(f"operator {uid!r} was given parallelism "
                                     f"{self._parallelism[uid]} before, now {parallelism}")
        earlier = self._key_serializers.setdefault(uid, key_serializer)
        if earlier is not key_serializer and earlier != key_serializer:
            raise ConfigurationError(f"operator {uid!r} was given key serializer {earlier!r} "
                                     f"before, now {key_serializer!r}")
        sources = self._states.setdefault(uid, [])
        if any(s.state_name == state_name for s in sources):
            raise ConfigurationError(f"state {state_name!r} of operator {uid!r} added twice")
        sources.append(_StateSource(state_name, df, keys, value_column))
        return self

    # ------------------------------------------------------------------ writing
    def _sorted_entries(self, uid: str, source: _StateSource) -> Iterator[_Entry]:
        """The entries of one state in key-group order, streamed from Spark."""
        from pyspark.sql import functions as F
        from pyspark.sql.types import IntegerType

        maxp = self.max_parallelism
        key_serializer = self._key_serializers.get(uid)

        def key_group(*parts: Any) -> int:
            return _key_group(maxp, key_serializer, *parts)

        kg = F.udf(key_group, IntegerType())
        ordered = (source.df
                   .select(kg(*source.key_columns).alias("__kg"), *source.key_columns,
                           source.value_column)
                   .orderBy("__kg"))
        n = len(source.key_columns)
        # a global sort, read partition by partition: rows arrive in key-group order
        for row in ordered.toLocalIterator(prefetchPartitions=True):
            parts = [_plain(v) for v in row[1:1 + n]]
            if any(p is None for p in parts):
                raise SavepointWriteError(
                    f"state {source.state_name!r}: a row has a null key {tuple(parts)}")
            if row[0] == _NO_KEY_GROUP:
                raise SavepointWriteError(
                    f"state {source.state_name!r} of operator {uid!r}: {_refusal(parts)}")
            value = row[1 + n]
            if value is None:
                continue
            yield row[0], source.state_name, parts[0] if n == 1 else tuple(parts), _plain(value)

    def _key_groups(self, uid: str) -> Iterator[tuple[int, dict[str, dict[Any, Any]]]]:
        """``(key group, {state name: {key: value}})`` of operator ``uid``, ascending."""
        streams = [self._sorted_entries(uid, s) for s in self._states[uid]]
        merged = heapq.merge(*streams, key=lambda e: e[0]) if len(streams) > 1 else streams[0]
        for kg, group in itertools.groupby(merged, key=lambda e: e[0]):
            data: dict[str, dict[Any, Any]] = {}
            for _, name, key, value in group:
                entries = data.setdefault(name, {})
                if key in entries:
                    raise SavepointWriteError(
                        f"duplicate key {key!r} in state {name!r} of operator {uid!r}: "
                        "a savepoint holds one value per key (aggregate first)")
                entries[key] = value
            yield kg, data

    def write(self, directory: str | Path, checkpoint_id: int | None = None) -> Path:
        """Write the savepoint under ``<directory>/<job_name>/chk-<checkpoint_id>``.

        Args:
            directory: the checkpoint storage root.
            checkpoint_id: the savepoint's id; None: one more than the highest id in the job's
                directory (1 when empty).

        Returns:
            the savepoint directory, to pass as ``Dataflow.run(restore_from=...)``.

        Raises:
            ConfigurationError: if no state was added.
            SavepointWriteError: if the target directory exists, on a null or duplicate key.
            OSError: if a file cannot be written.
        """
        from reactive.backends.heap.format import write_heap_snapshot

        if not self._states:
            raise ConfigurationError("no state added: call with_keyed_state first")
        storage = CheckpointStorage(directory, self.job_name)
        cid = checkpoint_id if checkpoint_id is not None else storage.latest_id() + 1
        chk = storage.checkpoint_dir(cid)
        if chk.exists():
            raise SavepointWriteError(f"{chk} already exists: choose another checkpoint_id or "
                                      "directory")
        chk.mkdir(parents=True)
        maxp = self.max_parallelism
        operators: dict[str, OperatorState] = {}
        for uid in sorted(self._states):
            p = self._parallelism[uid]
            subtasks: dict[int, OperatorSubtaskState] = {}
            # key groups arrive ascending and instance ranges are contiguous, so each
            # instance's key groups are one run of the stream, written while it streams
            def instance(entry: tuple[int, Any], p: int = p) -> int:
                return operator_index_for_key_group(entry[0], p, maxp)

            stream = itertools.groupby(self._key_groups(uid), key=instance)
            pending = next(stream, None)
            for i in range(p):
                part: Iterator[tuple[int, dict[str, dict[Any, Any]]]] = iter(())
                if pending is not None and pending[0] == i:
                    part = pending[1]
                path = chk / f"{file_name_component(uid)}-{i}.heap"
                handle = write_heap_snapshot(
                    path, storage.job_dir, part,
                    key_encoding=key_encoding_name(self._key_serializers.get(uid)))
                if pending is not None and pending[0] == i:
                    pending = next(stream, None)
                subtasks[i] = OperatorSubtaskState(
                    KeyedStateHandle.from_json(handle), None,
                    key_group_range_for_operator(i, p, maxp))
            operators[uid] = OperatorState(uid, p, True, subtasks)
        storage.write_metadata(cid, CheckpointMetadata(
            job=self.job_name, checkpoint_id=cid, kind="savepoint", timestamp=time.time(),
            max_parallelism=maxp, mode="exactly_once", operators=operators,
            metrics=CheckpointMetrics.from_json(
                {"writer": "reactive.connectors.spark.SavepointWriter"}),
        ))
        return chk



