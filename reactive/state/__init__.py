"""Keyed and operator state: descriptors (with time-to-live), the state API, and the
state-backend protocol."""

from .api import AggregatingState, ListState, MapState, ReducingState, State, ValueState
from .backend import KeyedStateBackend, KeyedStateSnapshot, SnapshotContext, StateBackend
from .descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from .operator_state import OperatorListState, OperatorStateStore
from .ttl_config import StateTtlConfig

__all__ = [
    "AggregatingState",
    "AggregatingStateDescriptor",
    "KeyedStateBackend",
    "KeyedStateSnapshot",
    "ListState",
    "ListStateDescriptor",
    "MapState",
    "MapStateDescriptor",
    "OperatorListState",
    "OperatorStateStore",
    "ReducingState",
    "ReducingStateDescriptor",
    "SnapshotContext",
    "State",
    "StateBackend",
    "StateDescriptor",
    "StateTtlConfig",
    "ValueState",
    "ValueStateDescriptor",
]
