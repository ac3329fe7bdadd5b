"""The public surface is exactly what is meant (as trio's ``test_exports``): the user API in
``reactive``, the plug-in interface in ``reactive.spi``. A name added or removed by accident
fails here; an intended change edits the lists below."""

from __future__ import annotations

import types

import pytest

import reactive
import reactive.spi

USER_API = {
    "AggregateFunction", "AggregatingState", "AggregatingStateDescriptor", "CheckpointConfig",
    "CheckpointError", "CheckpointStats",
    "CheckpointStorage", "CompletedCheckpoint", "ConfigurationError", "CorruptCheckpointError",
    "CountWindows", "Dataflow", "EventTimeSessionWindows", "Job", "JobCancelledError",
    "JobEndedError", "JobFailedError", "KeyGroupRange", "KeyedProcessFunction", "KeyedStateBackend",
    "KeyedStateSnapshot", "KeyedStream", "ListState", "ListStateDescriptor", "ManualClock",
    "MapState", "MapStateDescriptor", "MissingExtraError", "MsgpackSerializer",
    "PickleSerializer", "ProcessFunction", "ProcessWindowFunction", "PushSource", "ReactiveError",
    "ReducingState", "ReducingStateDescriptor", "RestartStrategy", "RestoreError",
    "RuntimeContext", "Serializer", "Sink", "SinkWriter", "SlidingEventTimeWindows",
    "SnapshotContext", "Source", "SourceReader", "StartOptions", "StateAccessError", "StateBackend",
    "StateQueryError", "StateSerializationError", "StateTtlConfig", "Stream", "TimeDomain", "TimeWindow",
    "TimerService",
    "TumblingEventTimeWindows", "TwoPhaseCommitSink", "UnsupportedKeyError",
    "UserFunctionError", "ValueState", "ValueStateDescriptor", "WindowResult",
    "assign_to_key_group", "key_group_range_for_operator",
}

PLUGIN_API = {
    "KeyGroupRange", "KeyGroupReader", "KeyGroupState", "KeyGroupStream", "KeyedStateBackend",
    "KeyedStateSnapshot", "ListState", "ListStateDescriptor", "MapState", "MapStateDescriptor",
    "RecordRejectedError", "ReducingState", "ReducingStateDescriptor", "Serializer", "Sink",
    "SinkWriter", "SnapshotContext", "Source", "SourceReader", "State", "StateBackend",
    "StateDescriptor",
    "TwoPhaseCommitSink", "ValueState", "ValueStateDescriptor", "assign_to_key_group",
    "decode_key", "encode_key", "key_group_range_for_operator", "read_key_groups",
    "register_key_group_reader", "write_atomic",
}


@pytest.mark.parametrize(("module", "expected"), [(reactive, USER_API),
                                                  (reactive.spi, PLUGIN_API)])
def test_exported_names_are_exactly_the_intended_ones(module, expected):
    assert set(module.__all__) == expected
    assert len(module.__all__) == len(set(module.__all__))  # no duplicates
    for name in module.__all__:
        assert getattr(module, name) is not None, name


@pytest.mark.parametrize("module", [reactive, reactive.spi])
def test_no_public_name_outside_all(module):
    """Every public, non-module attribute of the package is listed in ``__all__``."""
    public = {n for n, v in vars(module).items()
              if not n.startswith("_") and not isinstance(v, types.ModuleType)}
    assert public <= set(module.__all__), sorted(public - set(module.__all__))


def test_exported_objects_come_from_the_package():
    for module in (reactive, reactive.spi):
        for name in module.__all__:
            obj = getattr(module, name)
            owner = getattr(obj, "__module__", "reactive")
            assert owner.startswith("reactive"), f"{name} comes from {owner}"
