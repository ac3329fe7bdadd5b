"""The Spark runner's timer service stands in for the runtime's ``InternalTimerService``
inside Spark's ``transformWithState``: every registration method an operator calls must
accept the same arguments (a keyword the runtime's service gained, ``new=``, failed every
windowed Spark query before this test existed)."""

from __future__ import annotations

import inspect

import pytest

from reactive.time.timers import InternalTimerService

state_adapter = pytest.importorskip("reactive.connectors.spark.state_adapter")

METHODS = ["register_event_time_timer", "delete_event_time_timer",
           "register_processing_time_timer", "delete_processing_time_timer"]


@pytest.mark.parametrize("method", METHODS)
def test_the_spark_timer_service_accepts_every_argument_of_the_runtimes(method):
    runtime = inspect.signature(getattr(InternalTimerService, method)).parameters
    spark = inspect.signature(getattr(state_adapter.SparkTimerService, method)).parameters
    for name, parameter in runtime.items():
        assert name in spark, f"SparkTimerService.{method} lacks parameter {name!r}"
        assert spark[name].kind == parameter.kind, (method, name)
        assert (spark[name].default is inspect.Parameter.empty) == \
            (parameter.default is inspect.Parameter.empty), (method, name)
