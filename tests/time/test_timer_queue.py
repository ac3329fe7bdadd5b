"""The timer queue holds exactly the live timers: deleting a timer removes it (Flink's
``HeapPriorityQueueSet``), so the "reset the inactivity timer" pattern keeps one entry per
key, not one per record; and its firing order matches a sorted-list model under random
registrations, deletions, firings (with callbacks that register and delete) and restores."""

from __future__ import annotations

import tracemalloc
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from reactive import (
    Dataflow,
    KeyedProcessFunction,
    ManualClock,
    ValueStateDescriptor,
    key_group_range_for_operator,
)
from reactive.backends.heap import HeapKeyedStateBackend
from reactive.connectors.collections import ListSink
from reactive.time.timers import EVENT_TIMERS, InternalTimerService

MAXP = 16


def _service(fire: Any = None) -> tuple[HeapKeyedStateBackend, InternalTimerService]:
    backend = HeapKeyedStateBackend(key_group_range_for_operator(0, 1, MAXP), MAXP)
    svc = InternalTimerService(backend, ManualClock(), None, fire or (lambda ts, ns: []),
                               lambda ts, ns: [])
    return backend, svc


def test_reset_timer_keeps_one_entry_per_key():
    """Delete-and-register 100,000 times: the queue holds one timer and does not grow
    (the lazy-deletion heap kept one entry per registration: ~11 MiB here)."""
    backend, svc = _service()
    backend.set_current_key("user")
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        previous = None
        for i in range(100_000):
            if previous is not None:
                svc.delete_event_time_timer(previous)
            previous = float(i + 1_000)
            svc.register_event_time_timer(previous)
            if i % 10_000 == 0:
                assert svc.num_event_time_timers() == 1
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert svc.num_event_time_timers() == 1
    assert len(svc.event.times) <= 2 + 64  # stale timestamps stay bounded
    assert grown < 256 * 1024, f"the queue grew by {grown} bytes for one live timer"
    fired: list[float] = []
    svc.on_event_time = lambda ts, ns: fired.append(ts) or []
    svc.advance_watermark(float("inf"))
    assert fired == [previous]
    assert svc.num_event_time_timers() == 0


class InactivityTimeout(KeyedProcessFunction):
    """Emits ``(key, last timestamp)`` once a key saw no record for 1,000 s of event time;
    every record moves its timer (delete the old one, register a new one)."""

    queue_sizes: list[int] = []  # class attribute: shared by the job's copies

    def open(self, ctx: Any) -> None:
        self.deadline = ctx.get_state(ValueStateDescriptor("deadline"))

    def process_element(self, value: Any, ctx: Any) -> Any:
        timers = ctx.timer_service
        old = self.deadline.value()
        if old is not None:
            timers.delete_event_time_timer(old)
        self.deadline.update(value[1] + 1_000)
        timers.register_event_time_timer(value[1] + 1_000)
        if value[1] % 10_000 == 0:
            # the operator's timer service behind ctx.timer_service (no public count)
            self.queue_sizes.append(timers._internal.num_event_time_timers())
        return None

    def on_timer(self, timestamp: float, ctx: Any) -> Any:
        yield (ctx.current_key, timestamp - 1_000)


async def test_reset_timer_in_a_job_keeps_one_live_timer():
    n = 100_000
    sink = ListSink()
    InactivityTimeout.queue_sizes = []
    flow = Dataflow("reset-timer", batch_size=256)
    (flow.from_collection([("user", float(i)) for i in range(n)])
         .assign_timestamps(lambda r: r[1]).key_by(lambda r: r[0])
         .process(InactivityTimeout()).sink(sink))
    await flow.run()
    assert InactivityTimeout.queue_sizes == [1] * (n // 10_000)
    assert sink.records == [("user", float(n - 1))]


# ---------------------------------------------------------------------------- model test
KEYS = ["a", "b", "c"]
NAMESPACES = [None, "w"]
ops = st.lists(
    st.one_of(
        st.tuples(st.just("register"), st.sampled_from(KEYS), st.integers(0, 12),
                  st.sampled_from(NAMESPACES)),
        st.tuples(st.just("delete"), st.sampled_from(KEYS), st.integers(0, 12),
                  st.sampled_from(NAMESPACES)),
        st.tuples(st.just("fire"), st.integers(-1, 14)),
        st.tuples(st.just("restore")),
    ),
    max_size=80,
)


class Model:
    """A sorted list of live timers ``(timestamp, sequence, key, namespace)``: what the
    queue must behave like (timers fire in time order, registration order among equals)."""

    def __init__(self) -> None:
        self.live: list[tuple[int, int, str, Any]] = []
        self.seq = 0

    def register(self, key: str, ts: int, ns: Any) -> None:
        if not any(k == key and t == ts and n == ns for t, _, k, n in self.live):
            self.seq += 1
            self.live.append((ts, self.seq, key, ns))
            self.live.sort()

    def delete(self, key: str, ts: int, ns: Any) -> None:
        self.live = [e for e in self.live if not (e[2] == key and e[0] == ts and e[3] == ns)]

    def pop_due(self, watermark: int) -> tuple[int, int, str, Any] | None:
        if self.live and self.live[0][0] <= watermark:
            return self.live.pop(0)
        return None


def _callback_ops(key: str, ts: int, ns: Any) -> list[tuple[str, str, int, Any]]:
    """What firing a timer does (the same for the model and the queue): timers of key "a"
    register an *earlier* timer of "b" (it must fire next, before the rest of the time's
    timers) and a timer of "c" at the same time (it fires after the time's other timers),
    and delete the "c" timer one second later."""
    if key != "a":
        return []
    return [("register", "b", ts - 1, ns), ("register", "c", ts, ns), ("delete", "c", ts + 1, ns)]


@settings(max_examples=300, deadline=None)
@given(ops)
def test_queue_matches_sorted_list_model(operations: list[tuple[Any, ...]]) -> None:
    model = Model()
    fired: list[tuple[str, float, Any]] = []
    backend, svc = _service()

    def apply(op: tuple[Any, ...]) -> None:
        name, key, ts, ns = op
        backend.set_current_key(key)
        if name == "register":
            svc.register_event_time_timer(float(ts), ns)
        else:
            svc.delete_event_time_timer(float(ts), ns)

    def on_event_time(ts: float, ns: Any) -> list[Any]:
        key = backend.current_key
        fired.append((key, ts, ns))
        for op in _callback_ops(key, int(ts), ns):
            apply(op)
        return []

    svc.on_event_time = on_event_time
    for op in operations:
        if op[0] == "register":
            apply(op)
            model.register(op[1], op[2], op[3])
        elif op[0] == "delete":
            apply(op)
            model.delete(op[1], op[2], op[3])
        elif op[0] == "fire":
            # the service only moves forward; fire with a fresh watermark each time
            wm = op[1]
            svc.watermark = float("-inf")
            fired.clear()
            svc.advance_watermark(float(wm))
            expected = []
            while (entry := model.pop_due(wm)) is not None:
                ts, _, key, ns = entry
                expected.append((key, float(ts), ns))
                for name, k, t, n in _callback_ops(key, ts, ns):
                    (model.register if name == "register" else model.delete)(k, t, n)
            assert fired == expected
        else:
            # a restore re-reads the state: equal times then fire in the state's order
            svc.restore()
            order = []
            for key in backend.keys(EVENT_TIMERS):
                backend.set_current_key(key)
                order.extend((ts, key, ns) for (ts, ns), _ in svc.event.state.items())
            rank = {e: i for i, e in enumerate(order)}
            model.live.sort(key=lambda e: (e[0], rank[(float(e[0]), e[2], e[3])]))
            model.live = [(t, i, k, n) for i, (t, _, k, n) in enumerate(model.live)]
        assert svc.num_event_time_timers() == len(model.live)
        assert svc.event.next_time() == (float(model.live[0][0]) if model.live else None)
