"""The plug-in interface: what a third-party state backend, source or sink implements and
uses, in one module (the user API is :mod:`reactive`; everything else is internal).

- State backends implement :class:`StateBackend` (a factory) and :class:`KeyedStateBackend`
  (one operator instance's keyed state by key group, with the state objects of
  :class:`ValueState` ...), whose ``snapshot`` is the synchronous part and returns a
  :class:`KeyedStateSnapshot` whose ``write`` is the asynchronous part (Carbone 2018 (PhD
  thesis), section 4.5.1). Keys reach the backend as they are; :func:`encode_key` gives their
  canonical bytes (the same as the key-group hash), :func:`assign_to_key_group` their key group.
  Register a reader of your snapshot format with :func:`register_key_group_reader`, so other
  backends (and the PySpark bridge) can restore and read your snapshots as a
  :class:`KeyGroupStream`; read another backend's with :func:`read_key_groups`. Write snapshot
  files with :func:`write_atomic` and list them in the handle with their size and sha256.
  ``restore`` runs in a worker thread, every other hook on the event loop's thread
  (:mod:`reactive.state.backend`, "Threads"). ``reactive.testing.backend_contract`` in the
  repository is the contract suite the built-in backends pass; it calls the hooks on the same
  threads.
- Sources implement :class:`Source` / :class:`SourceReader` (batches, and the position as
  operator state); sinks :class:`Sink` / :class:`SinkWriter`, or :class:`TwoPhaseCommitSink`
  for exactly-once output (Carbone 2018 (PhD thesis), table 4.1).
"""

from .checkpoint.durable_files import write_atomic
from .errors import RecordRejectedError
from .key_encoding import decode_key, encode_key
from .keygroups import KeyGroupRange, assign_to_key_group, key_group_range_for_operator
from .serialization import Serializer
from .sinks import Sink, SinkWriter
from .sources import Source, SourceReader
from .state.api import ListState, MapState, ReducingState, State, ValueState
from .state.backend import (
    KeyedStateBackend,
    KeyedStateSnapshot,
    KeyGroupsInMemory,
    SnapshotContext,
    StateBackend,
)
from .state.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from .state.key_group_stream import (
    KeyGroupReader,
    KeyGroupState,
    KeyGroupStream,
    read_key_groups,
    register_key_group_reader,
)
from .two_phase_commit import TwoPhaseCommitSink

__all__ = [
    "KeyGroupRange",
    "KeyGroupReader",
    "KeyGroupState",
    "KeyGroupStream",
    "KeyGroupsInMemory",
    "KeyedStateBackend",
    "KeyedStateSnapshot",
    "ListState",
    "ListStateDescriptor",
    "MapState",
    "MapStateDescriptor",
    "RecordRejectedError",
    "ReducingState",
    "ReducingStateDescriptor",
    "Serializer",
    "Sink",
    "SinkWriter",
    "SnapshotContext",
    "Source",
    "SourceReader",
    "State",
    "StateBackend",
    "StateDescriptor",
    "TwoPhaseCommitSink",
    "ValueState",
    "ValueStateDescriptor",
    "assign_to_key_group",
    "decode_key",
    "encode_key",
    "key_group_range_for_operator",
    "read_key_groups",
    "register_key_group_reader",
    "write_atomic",
]
