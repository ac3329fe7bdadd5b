"""Event-time joins of two keyed streams: the interval join and the window join (Flink's
``IntervalJoinOperator`` and the window join that Flink builds from ``coGroup``).

Both keep the records of each input in keyed state (so they are checkpointed, restored and
rescaled with the key groups, on either state backend) and remove them with event-time
timers as the watermark passes. Watermarks here mean what they mean everywhere in the
runtime: after watermark ``w`` no record with a timestamp ``< w`` is expected. A record that
can no longer join is *late*: for the interval join one with a timestamp ``< w``, for the
window join one none of whose windows is still open (``end <= w``, as for windows). A late
record never joins: it goes to the join's late output (``late_data()``) as a
:class:`LateJoinInput`, or, when nobody takes that output, it is counted in
``late_records`` with a warning (Flink drops it silently).

Join results carry no timestamp of their own: event-time operators after a join need
``assign_timestamps`` (a :class:`~reactive.two_input_functions.JoinContext` gives the
interval join's function both timestamps).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

from ...state.api import MapState
from ...state.descriptors import MapStateDescriptor
from ...time.clock import ProcessingClock
from ...two_input_functions import JoinContext, ProcessJoinFunction
from .base import GENERATOR, checked_outputs, instance_copy
from .event_time import EventTimeOperator
from .two_input import TwoInputOperator

__all__ = [
    "IntervalJoinOperator",
    "LateJoinInput",
    "WindowJoinOperator",
    "is_join_output",
    "unwrap_late_join_input",
]

log = logging.getLogger(__name__)

_SIDES = ("left", "right")


class JoinWindow(Protocol):
    """A window ``[start, end)`` in seconds (``reactive.windowing.TimeWindow`` is one)."""

    @property
    def start(self) -> float: ...

    @property
    def end(self) -> float: ...


class JoinWindowAssigner(Protocol):
    """What the window join needs of a window assigner: the windows of a timestamp
    (``reactive.windowing``'s event-time assigners are ones; the operators stay below the
    windowing layer, which builds on them)."""

    def assign_windows(self, timestamp: float) -> Sequence[JoinWindow]:
        """The windows an element with event time ``timestamp`` (seconds) belongs to."""
        ...


class LateJoinInput:
    """A record that arrived after the watermark had passed it, so it joined nothing.

    Attributes:
        side: ``"left"`` (the first input) or ``"right"`` (the second).
        record: the record as it arrived.
    """

    __slots__ = ("record", "side")

    def __init__(self, side: str, record: Any) -> None:
        self.side = side
        self.record = record

    def __reduce__(self) -> tuple[Any, ...]:
        return (LateJoinInput, (self.side, self.record))

    def __eq__(self, other: object) -> bool:
        return (type(other) is LateJoinInput and other.side == self.side
                and other.record == self.record)

    def __hash__(self) -> int:
        return hash((self.side, repr(self.record)))

    def __repr__(self) -> str:
        return f"LateJoinInput({self.side!r}, {self.record!r})"


def is_join_output(record: Any) -> bool:
    """True for a join result (not a late input on its way to the late output)."""
    return type(record) is not LateJoinInput


def unwrap_late_join_input(record: Any) -> tuple[Any, ...]:
    """``(record,)`` for a late input, ``()`` for a join result (a flat_map function)."""
    return (record,) if type(record) is LateJoinInput else ()


class _JoinBase(TwoInputOperator, EventTimeOperator):
    """Keys, timestamps and late records of a join, per input."""

    def __init__(self, name: str, uid: str, key_selectors: tuple[Callable[[Any], Any], ...],
                 timestamp_fns: tuple[Callable[[Any], float], ...], clock: ProcessingClock,
                 late_output: Callable[[], bool]) -> None:
        super().__init__(name, uid, key_selectors[0], clock, late_output)
        self.key_selectors = key_selectors
        self.timestamp_fns = timestamp_fns

    def open(self) -> None:
        self._open_timers()

    def add(self, record: Any, timestamp: float, side: int, out: list[Any]) -> None:
        """One record of input ``side`` with its key already current: join it or store
        it, or send it to the late output."""
        raise NotImplementedError

    def _process(self, batch: list[Any], side: int) -> list[Any]:
        assert self.keyed_backend is not None
        set_key = self.keyed_backend.set_current_key
        key_of = self.key_selectors[side]
        ts_of = self.timestamp_fns[side]
        out: list[Any] = []
        r = None
        try:
            for r in batch:
                set_key(key_of(r))
                self.add(r, ts_of(r), side, out)
        except Exception as exc:
            raise self.fail(r, exc, f"input {side + 1} ({_SIDES[side]})") from exc
        return out

    def process_batch(self, batch: list[Any]) -> list[Any]:
        return self._process(batch, 0)

    def process_batch2(self, batch: list[Any]) -> list[Any]:
        return self._process(batch, 1)

    def _late(self, side: str, record: Any, out: list[Any]) -> None:
        if self.emit_late:
            out.append(LateJoinInput(side, record))
            return
        self._count_late("join %r got a late %s record (behind the watermark) and has no "
                         "late output: use late_data() to receive late records; counting "
                         "them in late_records", self.name, side)


def _outputs(res: Any, method: str) -> Any:
    t = type(res)
    if t is list or t is GENERATOR:
        return res
    return checked_outputs(res, method)


class IntervalJoinOperator(_JoinBase):
    """``a.key_by(f).interval_join(b.key_by(g)).between(lower, upper).process(fn)``: joins
    each left record at ``t`` with the right records of its key at ``t + lower <= t' <= t +
    upper`` (bounds optionally exclusive), whichever arrives first.

    State: per key and input, a map from a time slot (``floor(t / (upper - lower))``) to
    the ``(t, record)`` pairs of the slot, so a record looks at the one to three slots its
    partners can be in, not at everything buffered for its key (one input may run far ahead
    of the other, e.g. a small table read at once beside a long event stream). A left record
    at ``t`` is removed once the watermark passes ``t + upper``, a right record at ``t'``
    once it passes ``t' - lower``: no record that is not late can join it after that.

    Args:
        name, uid: operator identity.
        fn: a ``ProcessJoinFunction``, or ``fn(left, right) -> result`` (one output per pair).
        key_selectors: record -> key, for the left and the right input.
        timestamp_fns: record -> event time (seconds), per input.
        lower, upper: the bounds (seconds, ``lower <= upper``).
        lower_inclusive, upper_inclusive: whether a pair exactly at a bound joins.
        clock: processing-time clock (timers).
        late_output: whether late records go to the late output (asked at ``open``).
    """

    def __init__(self, name: str, uid: str, fn: ProcessJoinFunction | Callable[[Any, Any], Any],
                 key_selectors: tuple[Callable[[Any], Any], Callable[[Any], Any]],
                 timestamp_fns: tuple[Callable[[Any], float], Callable[[Any], float]],
                 lower: float, upper: float, lower_inclusive: bool, upper_inclusive: bool,
                 clock: ProcessingClock, late_output: Callable[[], bool]) -> None:
        super().__init__(name, uid, key_selectors, timestamp_fns, clock, late_output)
        self.fn = instance_copy(fn)
        self.lower = float(lower)
        self.upper = float(upper)
        self.lower_inclusive = lower_inclusive
        self.upper_inclusive = upper_inclusive
        self.join_ctx = JoinContext()
        self.slot_width = self.upper - self.lower or 1.0
        self.buffers: tuple[MapState, MapState]

    def open(self) -> None:
        super().open()
        assert self.keyed_backend is not None
        backend = self.keyed_backend
        self.buffers = (
            cast(MapState, backend.get_state(MapStateDescriptor("interval-join/left"))),
            cast(MapState, backend.get_state(MapStateDescriptor("interval-join/right"))),
        )
        if isinstance(self.fn, ProcessJoinFunction):
            self.fn.open(self.ctx)

    def _within(self, delta: float) -> bool:
        """Whether ``right timestamp - left timestamp`` lies within the bounds."""
        lo, hi = self.lower, self.upper
        if delta < lo or delta > hi:
            return False
        if delta == lo and not self.lower_inclusive:
            return False
        return not (delta == hi and not self.upper_inclusive)

    def add(self, record: Any, timestamp: float, side: int, out: list[Any]) -> None:
        if timestamp < self.timers.watermark:
            self._late(_SIDES[side], record, out)
            return
        ours, theirs = self.buffers[side], self.buffers[1 - side]
        width = self.slot_width
        slot = math.floor(timestamp / width)
        # a new list: the stored one may still be serialized by a snapshot in progress
        entries = ours.get(slot)
        ours.put(slot, [*entries, (timestamp, record)] if entries else [(timestamp, record)])
        ctx = self.join_ctx
        ctx.current_key = self.ctx.current_key
        fn = self.fn
        process = fn.process_element if isinstance(fn, ProcessJoinFunction) else None
        # the partners' times: [t + lower, t + upper] for a left record, [t' - upper,
        # t' - lower] for a right one
        lo, hi = ((timestamp + self.lower, timestamp + self.upper) if side == 0
                  else (timestamp - self.upper, timestamp - self.lower))
        for other_slot in range(math.floor(lo / width), math.floor(hi / width) + 1):
            for other_ts, other in theirs.get(other_slot) or ():
                if side == 0:
                    left_ts, right_ts, left, right = timestamp, other_ts, record, other
                else:
                    left_ts, right_ts, left, right = other_ts, timestamp, other, record
                if not self._within(right_ts - left_ts):
                    continue
                if process is None:
                    out.append(fn(left, right))
                else:
                    ctx.left_timestamp, ctx.right_timestamp = left_ts, right_ts
                    res = process(left, right, ctx)
                    if res is not None:
                        out.extend(_outputs(res, "process_element"))
        # no record that is not late joins this one once the watermark is past its last
        # partner's time (strictly: a partner exactly at the bound may still come)
        horizon = timestamp + self.upper if side == 0 else timestamp - self.lower
        self.timers.register_event_time_timer(math.nextafter(horizon, math.inf),
                                              (side, timestamp))

    def on_event_time(self, timestamp: float, namespace: Any) -> list[Any]:
        side, expired = namespace
        buffer = self.buffers[side]
        slot = math.floor(expired / self.slot_width)
        kept = [e for e in buffer.get(slot) or () if e[0] != expired]
        if kept:
            buffer.put(slot, kept)
        else:
            buffer.remove(slot)
        return []

    def close(self) -> None:
        try:
            if isinstance(self.fn, ProcessJoinFunction):
                self.fn.close()
        finally:
            super().close()


class WindowJoinOperator(_JoinBase):
    """``a.join(b).where(f).equal_to(g).window(assigner).apply(fn)``: when an event-time
    window ends (the watermark reaches its end), ``fn(left, right)`` is called for every
    pair of a left and a right record of the same key in that window, left records outer,
    each side in arrival order (Flink's window join: an inner join per window).

    State: per key, the records of each window and input under ``(input, start, end, i)``
    and their count under ``(input, start, end)``, so adding a record costs O(1) whatever
    the window's size. A record none of whose windows is still open is late.

    Args:
        name, uid: operator identity.
        fn: ``fn(left, right) -> result``, one output per pair.
        key_selectors, timestamp_fns: per input, as for the interval join.
        assigner: a non-merging event-time window assigner (tumbling or sliding).
        clock, late_output: as for the interval join.
    """

    def __init__(self, name: str, uid: str, fn: Callable[[Any, Any], Any],
                 key_selectors: tuple[Callable[[Any], Any], Callable[[Any], Any]],
                 timestamp_fns: tuple[Callable[[Any], float], Callable[[Any], float]],
                 assigner: JoinWindowAssigner, clock: ProcessingClock,
                 late_output: Callable[[], bool]) -> None:
        super().__init__(name, uid, key_selectors, timestamp_fns, clock, late_output)
        self.fn = fn
        self.assigner = assigner
        self.records: MapState
        self.counts: MapState

    def open(self) -> None:
        super().open()
        assert self.keyed_backend is not None
        backend = self.keyed_backend
        self.records = cast(MapState, backend.get_state(MapStateDescriptor("window-join/records")))
        self.counts = cast(MapState, backend.get_state(MapStateDescriptor("window-join/counts")))

    def add(self, record: Any, timestamp: float, side: int, out: list[Any]) -> None:
        watermark = self.timers.watermark
        windows = [w for w in self.assigner.assign_windows(timestamp) if w.end > watermark]
        if not windows:
            self._late(_SIDES[side], record, out)
            return
        for w in windows:
            slot = (side, w.start, w.end)
            n = self.counts.get(slot, 0)
            self.records.put((side, w.start, w.end, n), record)
            self.counts.put(slot, n + 1)
            self.timers.register_event_time_timer(w.end, (w.start, w.end))

    def _take(self, side: int, start: float, end: float) -> list[Any]:
        n = self.counts.get((side, start, end), 0)
        out = [self.records.get((side, start, end, i)) for i in range(n)]
        for i in range(n):
            self.records.remove((side, start, end, i))
        self.counts.remove((side, start, end))
        return out

    def on_event_time(self, timestamp: float, namespace: Any) -> list[Any]:
        start, end = namespace
        lefts = self._take(0, start, end)
        rights = self._take(1, start, end)
        fn = self.fn
        return [fn(left, right) for left in lefts for right in rights]
