"""The public surface is exactly what is meant (trio's ``test_exports``): every public
module is listed in ``PUBLIC_MODULES`` with its ``__all__`` pinned, and every module that the
README, the docs or the examples tell users to import is one of them. A name added or
removed by accident fails here; an intended change edits the lists below.

Public: ``reactive`` (the user API), ``reactive.spi`` (what a third-party backend, source or
sink implements), ``reactive.testing``, the user-facing subpackages re-exported for
convenience (``reactive.windowing``, ``reactive.errors``, ``reactive.columnar``,
``reactive.metrics_exporter``), the built-in backends and the connectors. Every other module
is the implementation: importable, free to change.
"""

from __future__ import annotations

import importlib
import re
import types
import typing
from pathlib import Path

import pytest
import typing_extensions

from reactive.errors import MissingExtraError

ROOT = Path(__file__).resolve().parents[2]

USER_API = {
    "AggregateFunction", "AggregatingState", "AggregatingStateDescriptor", "AsyncFailure",
    "BroadcastProcessFunction", "CheckpointConfig", "CheckpointError", "CheckpointStats",
    "CheckpointStorage", "CoProcessFunction", "CompletedCheckpoint", "ConfigurationError",
    "CorruptCheckpointError", "CountWindows", "Dataflow", "EventTimeSessionWindows",
    "IncompatibleUpdateError", "Job",
    "JobCancelledError", "JobEndedError", "JobFailedError", "KeyGroupRange",
    "KeyedBroadcastProcessFunction", "KeyedCoProcessFunction", "KeyedProcessFunction",
    "KeyedStateBackend", "KeyedStateSnapshot", "KeyedStream", "LateJoinInput", "ListState",
    "ListStateDescriptor", "ManualClock", "MapState", "MapStateDescriptor", "MissingExtraError",
    "MsgpackSerializer", "PickleSerializer", "ProcessFunction", "ProcessJoinFunction",
    "ProcessWindowFunction", "PushSource", "ReactiveError", "ReconfigurationError",
    "ReducingState",
    "ReducingStateDescriptor", "RestartStrategy", "RestoreError", "RetryPolicy",
    "RuntimeContext", "Serializer", "SimplePollingSource", "Sink", "SinkWriter",
    "SlidingEventTimeWindows",
    "SnapshotContext", "Source", "SourceReader", "StartOptions", "StateAccessError",
    "StateBackend", "StateQueryError", "StateSerializationError", "StateTtlConfig", "Stream",
    "TimeDomain", "TimeWindow", "TimerService", "TumblingEventTimeWindows",
    "TwoPhaseCommitSink", "UnsupportedKeyError", "UserFunctionError", "ValueState",
    "ValueStateDescriptor", "WindowResult", "assign_to_key_group",
    "key_group_range_for_operator", "new_event_loop", "run_coroutine",
}

PLUGIN_API = {
    "KeyGroupRange", "KeyGroupReader", "KeyGroupState", "KeyGroupStream", "KeyGroupsInMemory",
    "KeyedStateBackend",
    "KeyedStateSnapshot", "ListState", "ListStateDescriptor", "MapState", "MapStateDescriptor",
    "RecordRejectedError", "ReducingState", "ReducingStateDescriptor", "Serializer", "Sink",
    "SinkWriter", "SnapshotContext", "Source", "SourceReader", "State", "StateBackend",
    "StateDescriptor",
    "TwoPhaseCommitSink", "ValueState", "ValueStateDescriptor", "assign_to_key_group",
    "decode_key", "encode_key", "key_group_range_for_operator", "read_key_groups",
    "register_key_group_reader", "write_atomic",
}

PUBLIC_MODULES: dict[str, set[str]] = {
    "reactive": USER_API,
    "reactive.spi": PLUGIN_API,
    "reactive.testing": {
        "AbortExecution", "BackendHarness", "HarnessOptions", "ManualClock", "OperatorSnapshot",
        "OperatorTestHarness", "SinkContract", "SourceContract", "StateBackendContract",
        "TestingSource",
    },
    "reactive.errors": {
        "CheckpointError", "CheckpointProgressError", "ConfigurationError",
        "CorruptCheckpointError", "IncompatibleUpdateError", "JobCancelledError",
        "JobEndedError", "JobFailedError", "MissingExtraError", "ReactiveError",
        "ReconfigurationError", "RecordRejectedError", "RestoreError",
        "StateAccessError", "StateNotReadyError", "StateQueryError", "StateSerializationError",
        "UnsupportedKeyError", "UserFunctionError",
    },
    "reactive.windowing": {
        "AggregateFunction", "Aggregates", "BuiltinAggregate", "ContinuousEventTimeTrigger",
        "CountEvictor", "CountTrigger", "CountWindows", "DeltaEvictor",
        "DynamicEventTimeSessionWindows", "DynamicProcessingTimeSessionWindows",
        "EventTimeSessionWindows", "EventTimeTrigger", "Evictor", "GLOBAL_WINDOW",
        "GlobalWindows", "NeverTrigger", "ProcessWindowContext", "ProcessWindowFunction",
        "ProcessingTimeSessionWindows", "ProcessingTimeTrigger", "PurgingTrigger",
        "SlidingEventTimeWindows", "SlidingProcessingTimeWindows", "TimeEvictor", "TimeWindow",
        "TimestampedValue", "Trigger", "TriggerContext", "TriggerResult",
        "TumblingEventTimeWindows", "TumblingProcessingTimeWindows", "WindowAssigner",
        "WindowResult", "count", "first", "last", "max_of", "mean", "min_of", "sum_of",
    },
    "reactive.columnar": {"ArrowSource", "ColumnarStream", "ColumnarWindowedStream",
                          "KeyedColumnarStream", "MaxRows", "SchemaMismatchError",
                          "VectorizedAggregateFunction"},
    "reactive.metrics_exporter": {"MetricsServer", "serve_metrics"},
    "reactive.checkpoint": {
        "CheckpointMetadata", "CheckpointMetrics", "CheckpointStats", "CheckpointStorage",
        "CompletedCheckpoint", "FileRef", "KeyedStateHandle", "OperatorState",
        "OperatorSubtaskState", "Reconfiguration", "StateHandle", "read_metadata",
    },
    "reactive.backends.heap": {
        "FORMAT", "FORMAT_V2", "HeapKeyedStateBackend", "HeapStateBackend",
        "iter_heap_key_groups", "read_heap_snapshot", "write_heap_snapshot",
    },
    "reactive.backends.rocksdb": {
        "FORMAT", "RocksDBKeyedStateBackend", "RocksDBStateBackend", "iter_rocksdb_entries",
        "iter_rocksdb_key_groups", "read_rocksdb_snapshot", "state_id",
    },
    "reactive.connectors.collections": {
        "CallbackSink", "CollectionSource", "DiscardingSink", "ListSink", "PrintSink",
    },
    "reactive.connectors.files": {
        "CommittingFileSink", "CsvFileSource", "FileTransaction", "InvalidLine", "InvalidRow",
        "LineFileSource", "PartFileError",
    },
    "reactive.connectors.kafka": {
        "CommittedRecord", "KafkaDeadLetter", "KafkaRecord", "KafkaSink", "KafkaSinkError",
        "KafkaSource", "KafkaTransaction", "partition_owner", "read_committed",
    },
    "reactive.connectors.nexmark": {
        "Auction", "Bid", "Event", "EventType", "NexmarkArrowSource", "NexmarkConfig",
        "NexmarkSource", "Person", "event_time", "nexmark_columnar",
    },
    "reactive.connectors.spark": {
        "CheckpointReader", "JavaNotFoundError", "OperatorSummary", "PartFile", "ResultLog",
        "ResultLogError", "SavepointWriteError", "SavepointWriter", "SparkBridgeError",
        "SparkJob", "SparkJobError", "SparkRunner", "TranslationError", "ValidationReport",
        "find_java", "list_part_files", "local_session", "read_keyed_state",
        "reconfiguration_history", "register_state_reader", "supported_backends",
        "validate_exactly_once",
    },
}

# References in README.md to implementation modules, known and left for the README's
# rewrite to point at the public re-exports (``reactive.windowing``, ``reactive.spi``); a
# new reference to an internal module fails the test.
KNOWN_INTERNAL_REFERENCES = {
    "reactive.windowing.aggregates",  # its names are in reactive.windowing
    "reactive.runtime.gc_tuning.throughput_gc",  # applied by the runtime, described only
    "reactive.state.key_group_stream.register_key_group_reader",  # in reactive.spi
}


def _import(name: str) -> types.ModuleType:
    try:
        return importlib.import_module(name)
    except (ImportError, MissingExtraError) as exc:
        # the README's test command installs `.[test]`, which holds every extra: a public
        # module that does not import there is a broken module, not a missing extra
        pytest.fail(f"{name} does not import: {exc} (install the test extra: "
                    f"pip install -e '.[test]')")


@pytest.mark.parametrize("name", sorted(PUBLIC_MODULES))
def test_exported_names_are_exactly_the_intended_ones(name):
    module = _import(name)
    assert sorted(module.__all__) == sorted(PUBLIC_MODULES[name])
    assert len(module.__all__) == len(set(module.__all__))  # no duplicates
    for exported in module.__all__:
        assert getattr(module, exported) is not None, exported


# what ``from __future__ import annotations`` and ``from typing import ...`` leave behind
_TYPING = {"annotations", "TYPE_CHECKING", "Any"}


@pytest.mark.parametrize("name", sorted(PUBLIC_MODULES))
def test_no_public_name_outside_all(name):
    """A package facade shows nothing but its ``__all__``; a plain module defines no public
    class or function outside it (imported helpers such as ``Any`` aside)."""
    module = _import(name)
    is_package = hasattr(module, "__path__")
    public = set()
    for attr, value in vars(module).items():
        if (attr.startswith("_") or isinstance(value, types.ModuleType) or attr in _TYPING
                or isinstance(value, typing.TypeVar | typing_extensions.TypeVar)):
            continue
        if is_package or getattr(value, "__module__", None) == name:
            public.add(attr)
    assert public <= set(module.__all__), sorted(public - set(module.__all__))


@pytest.mark.parametrize("name", sorted(PUBLIC_MODULES))
def test_exported_objects_come_from_the_package(name):
    module = _import(name)
    for exported in module.__all__:
        obj = getattr(module, exported)
        if not isinstance(obj, type | types.FunctionType):
            continue  # constants and type aliases
        owner = obj.__module__
        assert owner.startswith("reactive"), f"{name}.{exported} comes from {owner}"


_IMPORT = re.compile(r"\b(?:from|import)\s+(reactive(?:\.\w+)*)")
_DOTTED = re.compile(r"`(reactive(?:\.\w+)+)")


def _resolves_to_module(dotted: str) -> tuple[str, bool]:
    """The longest importable module prefix of ``dotted``, and whether ``dotted`` names
    an attribute of it (not the module itself)."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        try:
            importlib.import_module(candidate)
        except ImportError:
            continue
        except MissingExtraError:
            return candidate, end < len(parts)
        return candidate, end < len(parts)
    raise AssertionError(f"{dotted} names no module")


def _documented_references() -> tuple[dict[str, str], dict[str, str]]:
    """What the README, the docs and the examples tell users to import -> the file that
    says so: the modules of ``from X import`` and ``import X`` statements, and the dotted
    names in backquotes (```reactive.metrics_exporter.serve_metrics```). A bare module
    named in prose (the list of internal packages) is not an instruction to import it."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md")),
             *sorted((ROOT / "examples").glob("*.py"))]
    imports, dotted = {}, {}
    for path in files:
        if not path.exists():
            continue
        text = path.read_text()
        imports.update((m.group(1), path.name) for m in _IMPORT.finditer(text))
        if path.suffix == ".md":
            dotted.update((m.group(1), path.name) for m in _DOTTED.finditer(text))
    return imports, dotted


def test_documented_imports_are_public_modules():
    imports, dotted = _documented_references()
    assert "reactive" in imports  # the scan reads the files
    wrong = []
    for name, where in sorted(imports.items()):
        module, _ = _resolves_to_module(name)
        if module not in PUBLIC_MODULES and name not in KNOWN_INTERNAL_REFERENCES:
            wrong.append(f"{where}: import from {module}")
    for name, where in sorted(dotted.items()):
        module, is_attribute = _resolves_to_module(name)
        if (is_attribute and module not in PUBLIC_MODULES
                and name not in KNOWN_INTERNAL_REFERENCES):
            wrong.append(f"{where}: {name} (in {module})")
    assert not wrong, "documented names from internal modules: " + "; ".join(wrong)


def test_the_known_internal_references_are_internal():
    """A reference leaves the known list once its module is public."""
    for name in KNOWN_INTERNAL_REFERENCES:
        module, _ = _resolves_to_module(name)
        assert module not in PUBLIC_MODULES, name
