"""A job that owns its process runs with the collector tuned for throughput, and the
process's own settings come back afterwards (also when the job fails)."""

from __future__ import annotations

import gc

import pytest

from reactive import Dataflow
from reactive.connectors.collections import ListSink
from reactive.runtime.gc_tuning import THRESHOLD0, throughput_gc
from reactive.runtime.loop import run_coroutine


@pytest.fixture(autouse=True)
def _restore_gc():
    """Each test starts with nothing frozen (a test run before it in this worker may have left
    objects frozen: a heap fork snapshot freezes the parent's objects, and outside
    ``throughput_gc`` nothing unfreezes them), and gets the thresholds back afterwards."""
    gc.unfreeze()
    threshold = gc.get_threshold()
    yield
    gc.set_threshold(*threshold)
    gc.unfreeze()


def _seen_by_a_map() -> tuple[list[tuple[int, int, int]], ListSink, Dataflow]:
    """A job whose map notes the collector's thresholds it runs under."""
    seen: list[tuple[int, int, int]] = []

    def look(x: int) -> int:
        seen.append(gc.get_threshold())
        return x

    sink = ListSink()
    flow = Dataflow("gc", parallelism=1)
    flow.from_collection(range(10)).map(look).sink(sink)
    return seen, sink, flow


def test_execute_runs_the_job_with_the_tuned_collector_and_restores_it():
    before = gc.get_threshold()
    seen, sink, flow = _seen_by_a_map()
    flow.execute()
    assert sink.records == list(range(10))
    assert {t[0] for t in seen} == {max(THRESHOLD0, before[0])}
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0  # what was frozen for the job is back


def test_the_settings_come_back_when_the_job_fails():
    before = gc.get_threshold()

    async def failing() -> None:
        assert gc.get_threshold()[0] == max(THRESHOLD0, before[0])
        assert gc.get_freeze_count() > 0
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        run_coroutine(failing())
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_an_applications_own_freeze_is_left_alone(monkeypatch: pytest.MonkeyPatch):
    gc.freeze()
    calls: list[str] = []
    # the freeze count itself can drop while we look: another thread (pytest-xdist's
    # channel) may free a frozen object; so the calls are what is checked
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr(gc, "unfreeze", lambda: calls.append("unfreeze"))
    with throughput_gc():
        assert gc.get_freeze_count() > 0
    assert calls == [] and gc.get_freeze_count() > 0  # neither refrozen nor unfrozen by us


def test_embedded_runs_keep_the_applications_settings():
    before = gc.get_threshold()
    seen, sink, flow = _seen_by_a_map()

    async def app() -> None:
        await flow.run()

    run_coroutine(app(), tune_gc=False)
    assert sink.records == list(range(10)) and set(seen) == {before}


def test_a_disabled_collector_stays_disabled_and_untouched():
    before = gc.get_threshold()
    gc.disable()
    try:
        with throughput_gc():
            assert not gc.isenabled() and gc.get_threshold() == before
    finally:
        gc.enable()
