"""Test helpers: a scripted source, a one-operator harness, a manual clock, the backend contract suite.

- :class:`TestingSource` emits a list of records, with :data:`TestingSource.EOF` (end the
  stream of a run there), :data:`TestingSource.ABORT` (fail the job there once),
  :data:`TestingSource.CHECKPOINT` (wait there for a completed checkpoint) and
  :data:`TestingSource.HOLD` (stay open there until the job is cancelled or stopped) markers;
  its position is checkpointed, so a test checks exactly-once results across a failure or
  a resumed run.
- :class:`OperatorTestHarness` runs one operator (a keyed process function, a map, a window
  operator ...) without a job: records, watermarks, processing time on a
  :class:`ManualClock`, and snapshots (:class:`OperatorSnapshot`) that restore into new
  harnesses, at another parallelism too.
- :class:`ManualClock` is the processing-time clock that moves only when told to.
- :class:`StateBackendContract` (:mod:`reactive.testing.backend_contract`) is the test suite
  every state backend passes; a backend's test module subclasses it.
  :class:`SourceContract` and :class:`SinkContract` (:mod:`reactive.testing.connector_contract`)
  are those of sources and sinks. They need pytest and pytest-asyncio, so they are imported
  when first used, not with this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..time.clock import ManualClock
from .operator_harness import HarnessOptions, OperatorSnapshot, OperatorTestHarness
from .testing_source import AbortExecution, TestingSource

if TYPE_CHECKING:
    from .backend_contract import BackendHarness, StateBackendContract
    from .connector_contract import SinkContract, SourceContract

__all__ = [
    "AbortExecution",
    "BackendHarness",
    "HarnessOptions",
    "ManualClock",
    "OperatorSnapshot",
    "OperatorTestHarness",
    "SinkContract",
    "SourceContract",
    "StateBackendContract",
    "TestingSource",
]

_CONTRACT_NAMES = ("BackendHarness", "StateBackendContract")
_CONNECTOR_CONTRACT_NAMES = ("SinkContract", "SourceContract")


def __getattr__(name: str) -> Any:
    """Import a contract suite (and pytest) only when one of its names is asked for."""
    if name in _CONTRACT_NAMES:
        from . import backend_contract

        return getattr(backend_contract, name)
    if name in _CONNECTOR_CONTRACT_NAMES:
        from . import connector_contract

        return getattr(connector_contract, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
