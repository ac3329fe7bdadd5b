"""Reading the state of a completed checkpoint or savepoint into Spark (a state processor,
like Flink's State Processor API ``SavepointReader.readKeyedState``).

```python
reader = CheckpointReader(spark, "chk/job/chk-42")
reader.operators()                       # uids, parallelism, state names, sizes
df = reader.keyed_state("count", "count")  # key_group, key, value: one row per key
reader.reconfigurations()                # what its barrier reconfigured (rescale, update)
reconfiguration_history(spark, "chk/job")  # every retained checkpoint's reconfigurations
```

Only completed checkpoints are read (their ``_metadata`` exists and passes its checksum; by
default every referenced file is checked against its recorded size and SHA-256 too).
Entries are read on the driver, one operator instance at a time, through the backend's own
reader (see :mod:`.state_readers`), then handed to Spark.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reactive.checkpoint.contract import KeyedStateHandle, OperatorState, Reconfiguration
from reactive.checkpoint.metadata import CompletedCheckpoint
from reactive.checkpoint.storage import CheckpointStorage
from reactive.errors import RestoreError
from reactive.keygroups import KeyGroupRange
from reactive.serialization import Serializer

from .errors import SparkBridgeError
from .state_readers import read_keyed_state

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["RECONFIGURATION_SCHEMA", "CheckpointReader", "OperatorSummary",
           "reconfiguration_history"]

RECONFIGURATION_SCHEMA = ("checkpoint_id long, kind string, operator string, "
                          "function string, previous_parallelism int, parallelism int")
"""The columns of :meth:`CheckpointReader.reconfigurations` and
:func:`reconfiguration_history`, as Spark DDL."""


def _reconfiguration_rows(checkpoint: CompletedCheckpoint) -> list[tuple[Any, ...]]:
    return [(checkpoint.checkpoint_id, r.kind, r.operator, r.function or None,
             r.previous_parallelism, r.parallelism)
            for r in checkpoint.metadata.reconfigurations]


def reconfiguration_history(spark: SparkSession, job_dir: str | Path) -> DataFrame:
    """The reconfigurations recorded by every completed checkpoint a job's checkpoint
    directory holds (``<directory>/<job>``), oldest first: the job's version history of
    epochs and reconfigurations (Carbone 2018 (PhD thesis), section 4.5.5). Retention
    keeps the last checkpoints only, so older reconfigurations are gone with theirs; the
    parallelism every operator ran at is in each checkpoint's ``operators()``.

    Args:
        spark: the session.
        job_dir: the job's checkpoint directory.

    Returns:
        a DataFrame of :data:`RECONFIGURATION_SCHEMA`: one row per reconfiguration
        (``function`` is null for a rescale, the parallelisms for an update).

    Raises:
        RestoreError: if ``job_dir`` is not a directory.
    """
    p = Path(job_dir)
    if not p.is_dir():
        raise RestoreError(f"checkpoint directory {p} does not exist")
    rows = [row for chk in CheckpointStorage(p.parent, p.name).completed()
            for row in _reconfiguration_rows(chk)]
    return spark.createDataFrame(rows, RECONFIGURATION_SCHEMA)


@dataclass(frozen=True)
class OperatorSummary:
    """What a checkpoint holds for one operator.

    Attributes:
        uid: the operator's uid (what state is keyed by across program versions).
        name: its name in the program.
        parallelism: its parallelism when the checkpoint was taken (instances).
        keyed: whether it is a keyed operator.
        backends: the state backends of its keyed-state handles (e.g. ``["heap"]``).
        state_names: the names of its keyed states that have entries.
        keyed_state_bytes: bytes of the files of its keyed state.
        operator_state_bytes: bytes of the files of its operator (non-keyed) state.
    """

    uid: str
    name: str
    parallelism: int
    keyed: bool
    backends: list[str]
    state_names: list[str]
    keyed_state_bytes: int
    operator_state_bytes: int


class CheckpointReader:
    """The state of one completed checkpoint or savepoint directory (``.../<job>/chk-<n>``).

    Args:
        spark: the session.
        path: the checkpoint directory.
        verify: check every referenced file's size and SHA-256 before reading (reads each
            file once more).

    Raises:
        RestoreError: if ``path`` is missing or is an incomplete checkpoint (no
            ``_metadata``: it was aborted, or is still being written).
        CorruptCheckpointError: if the metadata or (with ``verify``) a file fails its checksum.
    """

    def __init__(self, spark: SparkSession, path: str | Path, verify: bool = True) -> None:
        p = Path(path)
        if not p.is_dir():
            raise RestoreError(f"checkpoint directory {p} does not exist")
        if not (p / "_metadata").exists():
            raise RestoreError(
                f"{p} is an incomplete checkpoint (no _metadata: it was aborted or is still "
                "being written) and cannot be read; read a completed one, e.g. "
                "reactive.CheckpointStorage(directory, job).completed()[-1].path"
            )
        self.spark = spark
        self.checkpoint: CompletedCheckpoint = CheckpointStorage.load(p, verify=verify)
        self._state_names: dict[str, list[str]] = {}

    @property
    def checkpoint_id(self) -> int:
        """The checkpoint's id."""
        return self.checkpoint.checkpoint_id

    @property
    def kind(self) -> str:
        """``"checkpoint"`` or ``"savepoint"``."""
        return self.checkpoint.metadata.kind

    @property
    def max_parallelism(self) -> int:
        """The job's max parallelism (number of key groups) the state is split into."""
        return self.checkpoint.metadata.max_parallelism

    @property
    def reconfiguration_entries(self) -> tuple[Reconfiguration, ...]:
        """What this checkpoint's barrier reconfigured, as the metadata records it (plain
        Python, no Spark)."""
        return self.checkpoint.metadata.reconfigurations

    def reconfigurations(self) -> DataFrame:
        """What this checkpoint's barrier reconfigured (``job.rescale``, ``job.update``),
        one row per operator, as a DataFrame of :data:`RECONFIGURATION_SCHEMA` (empty when
        nothing was)."""
        return self.spark.createDataFrame(_reconfiguration_rows(self.checkpoint),
                                          RECONFIGURATION_SCHEMA)

    def _operator(self, uid: str) -> OperatorState:
        ops = self.checkpoint.metadata.operators
        if uid not in ops:
            raise RestoreError(f"checkpoint {self.checkpoint.path} has no operator {uid!r}; "
                               f"its operators: {sorted(ops)}")
        return ops[uid]

    def _handles(self, uid: str) -> Iterator[tuple[KeyedStateHandle, KeyGroupRange | None]]:
        for _, sub in self._operator(uid).by_index():
            if sub.keyed_state is not None:
                yield sub.keyed_state, sub.key_group_range

    def operators(self) -> list[OperatorSummary]:
        """Every operator with state in the checkpoint, by uid.

        Listing the state names of heap snapshots reads their files (the heap format does not
        record names in the metadata); RocksDB handles list them.

        Raises:
            RestoreError: if a state file cannot be read.
        """
        out = []
        for uid, op in sorted(self.checkpoint.metadata.operators.items()):
            subs = op.subtasks.values()
            out.append(OperatorSummary(
                uid=uid,
                name=op.name,
                parallelism=op.parallelism,
                keyed=op.keyed,
                backends=sorted({s.keyed_state.backend for s in subs
                                 if s.keyed_state is not None}),
                state_names=self.state_names(uid),
                keyed_state_bytes=sum(sum(r.size for r in s.keyed_state.files)
                                      for s in subs if s.keyed_state is not None),
                operator_state_bytes=sum(s.operator_state.size for s in subs
                                         if s.operator_state is not None),
            ))
        return out

    def state_names(self, uid: str) -> list[str]:
        """The names of operator ``uid``'s keyed states that have entries.

        Raises:
            RestoreError: for an unknown uid or an unreadable state file.
        """
        if uid not in self._state_names:
            names: set[str] = set()
            for handle, kgr in self._handles(uid):
                if "states" in handle.extra:  # the backend records them (RocksDB)
                    names.update(handle.extra["states"])
                else:
                    names.update(e[1] for e in read_keyed_state(
                        handle.to_json(), self.checkpoint.job_dir, self.max_parallelism, kgr))
            self._state_names[uid] = sorted(names)
        return self._state_names[uid]

    def entries(self, uid: str, state_name: str, deserializer: Serializer | None = None
                ) -> Iterator[tuple[int, Any, Any]]:
        """Yield ``(key group, key, value)`` of keyed state ``state_name`` of operator
        ``uid``, instance by instance (plain Python, no Spark). Keys from RocksDB snapshots
        are in their canonical form (``True`` as ``1``, a ``NamedTuple`` as a tuple; see
        :mod:`.state_readers`).

        Raises:
            RestoreError: for an unknown uid, an unsupported backend, or an unreadable file.
        """
        for handle, kgr in self._handles(uid):
            for kg, name, key, value in read_keyed_state(handle.to_json(), self.checkpoint.job_dir,
                                                         self.max_parallelism, kgr, deserializer):
                if name == state_name:
                    yield kg, key, value

    def keyed_state(self, uid: str, state_name: str, key_type: str | None = None,
                    value_type: str | None = None,
                    deserializer: Serializer | None = None) -> DataFrame:
        """Keyed state ``state_name`` of operator ``uid`` as a DataFrame with one row per key:
        ``key_group`` (int), ``key``, ``value``.

        Args:
            uid: the operator's uid.
            state_name: the state descriptor's name.
            key_type: Spark type of the keys as DDL (e.g. ``"string"``,
                ``"struct<origin: string, carrier: string>"`` for tuple keys); None: inferred.
            value_type: Spark type of the values as DDL; None: inferred.
            deserializer: decodes values stored as bytes (see
                :func:`~reactive.connectors.spark.state_readers.read_keyed_state`).

        Returns:
            the DataFrame (built on the driver from the entries).

        Raises:
            RestoreError: for an unknown uid, an unsupported backend, an unreadable file, or
                a state without entries when the types are not given (nothing to infer
                them from; the error lists the operator's states).
            SparkBridgeError: if Spark cannot infer a type for the keys or values (pass
                ``key_type``/``value_type``).
        """
        # tuple keys become structs with fields _1, _2, ... (Spark's inference for tuples)
        rows = list(self.entries(uid, state_name, deserializer))
        if key_type is not None and value_type is not None:
            schema = f"key_group int, key {key_type}, value {value_type}"
            return self.spark.createDataFrame(rows, schema)
        if not rows:
            raise RestoreError(
                f"operator {uid!r} of checkpoint {self.checkpoint.path} has no entries of state "
                f"{state_name!r} (its states: {self.state_names(uid)}); pass key_type and "
                "value_type to get an empty DataFrame"
            )
        try:
            df = self.spark.createDataFrame(rows, ["key_group", "key", "value"])
        except (TypeError, ValueError) as exc:  # PySparkTypeError/ValueError subclass these
            raise SparkBridgeError(
                f"Spark cannot infer the type of state {state_name!r} of {uid!r} (e.g. key "
                f"{rows[0][1]!r}, value {rows[0][2]!r}): pass key_type= and value_type= "
                f"({exc})"
            ) from exc
        return df.withColumn("key_group", df["key_group"].cast("int"))

