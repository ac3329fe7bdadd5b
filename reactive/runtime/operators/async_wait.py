"""The async operator: ``map_async(fn)`` calls a coroutine per record with bounded concurrency
(Flink's ``AsyncWaitOperator``).

Each record starts a call ``fn(record)`` in its own asyncio task; results go downstream
through the task's mailbox (:mod:`reactive.time.mailbox`) as the calls complete, in input
order (``ordered=True``) or in completion order with watermarks as fences (records before a
watermark are emitted before it, records after it after it).

- **Capacity.** At most ``capacity`` calls are started and not yet emitted (in flight, or
  completed and waiting for an earlier record or watermark): memory stays bounded. A batch
  that does not fit waits in the operator, and a mailbox action holds the task (it reads no
  more input) until every record of that batch has started: backpressure.
- **Checkpoints.** At a barrier the synchronous part stores the input of every call not yet
  emitted (in flight, completed but held back, or not yet started) as ``"split"`` operator
  state; it waits for no call. A completed result not emitted at the barrier is therefore
  *not* kept: its input is called again after a restore, first, before new input, so ``fn``
  must be idempotent (as in Flink). After the end of input a barrier (the job's final
  checkpoint) waits for the calls still in flight instead, so that no record is left only in
  a checkpoint that nothing restores.
- **Failures.** ``timeout`` bounds one attempt; a :class:`RetryPolicy` retries failed or timed
  out attempts after a backoff. A call that fails for good fails the job with a
  :class:`~reactive.errors.UserFunctionError` naming the operator and the record, or, with
  ``on_failure="emit"``, is emitted in place of its result as an :class:`AsyncFailure`.
- **End of input.** The task asks the operator to :meth:`~AsyncWaitOperator.drain` before it
  forwards the final watermark: the calls still in flight are awaited and their results
  emitted first, so an event-time operator downstream gets every result before its windows
  close.

The operator declares ``generates_watermarks`` so that its task stops the watermarks at it;
it emits them again itself once the records before them are out (the final watermark, which
the task always forwards, excepted).
"""

from __future__ import annotations

import asyncio
import inspect
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from ...errors import ConfigurationError, ReactiveError, UserFunctionError
from ...state.operator_state import OperatorListState
from .base import StreamOperator

__all__ = ["AsyncFailure", "AsyncWaitOperator", "RetryPolicy", "is_async_failure",
           "is_async_result"]

_INF = float("inf")


@dataclass(frozen=True)
class RetryPolicy:
    """How ``map_async`` retries a call that raised or timed out (exponential backoff).

    Args:
        attempts: attempts in total, the first one included (>= 1).
        backoff: seconds before the second attempt (>= 0).
        multiplier: factor applied to the backoff after each further attempt (>= 1).
        max_backoff: upper bound of one backoff (seconds).
        retry_on: the exception types that are retried (a timed-out attempt is a
            ``TimeoutError``); any other error is final at once.

    Raises:
        ConfigurationError: on values out of range.
    """

    attempts: int = 3
    backoff: float = 0.1
    multiplier: float = 2.0
    max_backoff: float = 10.0
    retry_on: tuple[type[BaseException], ...] = (Exception,)

    def __post_init__(self) -> None:
        if type(self.attempts) is not int or self.attempts < 1:
            raise ConfigurationError(f"retry attempts must be an int >= 1, got {self.attempts!r}")
        if not (self.backoff >= 0 and self.multiplier >= 1 and self.max_backoff >= 0):
            raise ConfigurationError("retry backoff and max_backoff must be >= 0 and multiplier "
                                     ">= 1")

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1 for the first)."""
        return float(min(self.max_backoff, self.backoff * self.multiplier ** (attempt - 1)))

    def retries(self, error: BaseException) -> bool:
        """Whether ``error`` is retried."""
        return isinstance(error, self.retry_on)


@dataclass(frozen=True, slots=True)
class AsyncFailure:
    """A record whose call failed for good (timed out or raised on every attempt), emitted in
    place of its result by ``map_async(..., on_failure="dead_letter")`` (or sent to the
    ``on_failure`` sink), so the pipeline routes it to a dead-letter output
    (``isinstance(record, AsyncFailure)``).

    Attributes:
        record: the input record.
        reason: the last attempt's error, ``"<type>: <message>"``.
        attempts: how many attempts were made.
    """

    record: Any
    reason: str
    attempts: int


def is_async_failure(record: Any) -> bool:
    """True for an :class:`AsyncFailure` (the side output's filter)."""
    return type(record) is AsyncFailure


def is_async_result(record: Any) -> bool:
    """True for a result (not an :class:`AsyncFailure`): the main output's filter."""
    return type(record) is not AsyncFailure


class _Segment:
    """The calls between two watermarks, in input order, and the watermark that closes them
    (None for the last, open segment)."""

    __slots__ = ("calls", "done", "watermark")

    def __init__(self) -> None:
        self.calls: OrderedDict[int, _Call] = OrderedDict()
        self.done: list[_Call] = []  # unordered mode: completed, not yet emitted
        self.watermark: float | None = None


class _Call:
    """One record's call: its input, its place, and its result once done."""

    __slots__ = ("done", "record", "result", "segment", "seq", "task")

    def __init__(self, record: Any, seq: int, segment: _Segment) -> None:
        self.record = record
        self.seq = seq
        self.segment = segment
        self.done = False
        self.result: Any = None
        self.task: asyncio.Task[None] | None = None


class AsyncWaitOperator(StreamOperator):
    """``map_async(fn)``: one output per record, ``await fn(record)``, with at most
    ``capacity`` calls started and not yet emitted per instance.

    Args:
        name, uid: operator identity.
        fn: ``async def fn(record)`` (a function returning an awaitable); it may be called
            again for the same record after a restore, so it must be idempotent.
        capacity: calls started and not yet emitted, at most (>= 1).
        timeout: seconds one attempt may take (None: no limit).
        ordered: emit in input order; else in completion order, with watermarks as fences.
        retry: None (one attempt), a number of attempts, or a :class:`RetryPolicy`.
        on_failure: ``"fail"`` fails the job on a call that failed for good; ``"emit"``
            emits an :class:`AsyncFailure` in place of its result.

    Raises:
        ConfigurationError: on invalid options.
    """

    generates_watermarks = True
    forwards_watermark_status = True
    STATE = "async-wait-inputs"

    def __init__(self, name: str, uid: str, fn: Callable[[Any], Any], capacity: int = 100,
                 timeout: float | None = 5.0, ordered: bool = True,
                 retry: RetryPolicy | int | None = None,
                 on_failure: Literal["fail", "emit"] = "fail") -> None:
        super().__init__(name, uid)
        if not callable(fn):
            raise ConfigurationError(f"map_async needs a callable, got {type(fn).__name__}")
        if type(capacity) is not int or capacity < 1:
            raise ConfigurationError(f"map_async capacity must be an int >= 1, got {capacity!r}")
        if timeout is not None and not timeout > 0:
            raise ConfigurationError(f"map_async timeout must be > 0 seconds or None, got "
                                     f"{timeout!r}")
        if on_failure not in ("fail", "emit"):
            raise ConfigurationError(f"on_failure must be 'fail' or 'emit', got {on_failure!r}")
        if isinstance(retry, bool) or not (retry is None or isinstance(retry, int | RetryPolicy)):
            raise ConfigurationError("retry must be None, a number of attempts or a RetryPolicy, "
                                     f"got {retry!r}")
        self.fn = fn
        self.capacity = capacity
        self.timeout = None if timeout is None else float(timeout)
        self.ordered = ordered
        self.retry = RetryPolicy(retry) if isinstance(retry, int) else retry
        self.emit_failures = on_failure == "emit"
        self._segments: deque[_Segment] = deque([_Segment()])
        self._waiting: deque[_Call] = deque()  # in a segment, not started (over capacity)
        self._queued = 0  # started and not yet emitted
        self._seq = 0
        self._state: OperatorListState | None = None
        self._failure: UserFunctionError | None = None
        self._input_ended = False
        self._final = False  # the final watermark went past: fences are over
        self._closed = False
        self._flush_posted = False
        self._drain_posted = False
        self._draining = False
        self._dirty = False
        self._wake: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ lifecycle
    def open(self) -> None:
        if self.mailbox is None:
            raise ReactiveError(f"operator {self.name!r}: map_async runs only inside a task")
        self._loop = asyncio.get_running_loop()
        self._state = self.operator_state.get_list_state(self.STATE, "split")
        restored = self._state.get()
        if restored:
            # the calls not emitted at the restored checkpoint go first, in their order
            self._enqueue(restored)

    def close(self) -> None:
        self._closed = True
        for seg in self._segments:
            for call in seg.calls.values():
                if call.task is not None and not call.task.done():
                    call.task.cancel()
        super().close()

    # ------------------------------------------------------------------ data path
    def process_batch(self, batch: list[Any]) -> list[Any]:
        if self._failure is not None:
            raise self._failure
        out = self._take_ready()
        self._enqueue(batch)
        segments = self._segments
        if len(segments) > 1 and not segments[0].calls:
            self._notify()  # the first segment emptied: its watermark may go out
        return out

    def process_watermark(self, timestamp: float) -> list[Any]:
        if self._failure is not None:
            raise self._failure
        segments = self._segments
        if timestamp == _INF:
            # the task forwards the final watermark at once (it ends event time): the fences
            # before it are moot, so the segments merge into one
            self._final = True
            if len(segments) > 1:
                merged = _Segment()
                for seg in segments:
                    for seq, call in seg.calls.items():
                        call.segment = merged
                        merged.calls[seq] = call
                    merged.done.extend(seg.done)
                segments.clear()
                segments.append(merged)
            return self._take_ready()
        if self._final:
            return []
        last = segments[-1]
        if len(segments) > 1 and not last.calls:
            segments[-2].watermark = timestamp  # no record since the previous one: replace it
        else:
            last.watermark = timestamp
            segments.append(_Segment())
        if not segments[0].calls:
            self._notify()
        return []

    def drain(self) -> Awaitable[None] | None:
        """The final watermark comes next: wait for every call and emit its result first
        (the input has ended: the final watermark precedes the end of data)."""
        self._input_ended = True
        if self._failure is not None:
            raise self._failure
        if self._empty() and not self._waiting:
            return None
        return self._drain()

    def end_input(self) -> list[Any]:
        self._input_ended = True
        if self._failure is not None:
            raise self._failure
        out = self._take_ready()
        if not self._empty():
            self._post_drain()
        return out

    def snapshot_state(self, checkpoint_id: int) -> Awaitable[None] | None:
        if self._input_ended and not self._empty():
            # the job's final checkpoint: nothing restores it to re-issue the calls
            return self._drain_then_snapshot()
        assert self._state is not None
        self._state.update([call.record for seg in self._segments
                            for call in seg.calls.values()])
        return None

    async def _drain_then_snapshot(self) -> None:
        await self._drain()
        assert self._state is not None
        self._state.update([])

    # ------------------------------------------------------------------ calls
    def _enqueue(self, records: list[Any]) -> None:
        seg = self._segments[-1]
        calls = seg.calls
        waiting = self._waiting
        capacity = self.capacity
        start = self._start
        seq = self._seq
        for r in records:
            seq += 1
            call = _Call(r, seq, seg)
            calls[seq] = call
            if self._queued < capacity and not waiting:
                start(call)
            else:
                waiting.append(call)
        self._seq = seq
        if waiting or self._input_ended:
            self._post_drain()

    def _start(self, call: _Call) -> None:
        self._queued += 1
        assert self._loop is not None
        call.task = self._loop.create_task(self._call(call))

    def _start_waiting(self) -> None:
        waiting = self._waiting
        while waiting and self._queued < self.capacity:
            self._start(waiting.popleft())

    async def _call(self, call: _Call) -> None:
        """Run ``fn(record)`` with the timeout and retries, then hand over the outcome."""
        fn, timeout, policy, record = self.fn, self.timeout, self.retry, call.record
        attempts = 1 if policy is None else policy.attempts
        attempt = 0
        while True:
            attempt += 1
            scope = None
            try:
                if timeout is None:
                    result = fn(record)
                    if inspect.isawaitable(result):
                        result = await result
                else:
                    async with asyncio.timeout(timeout) as scope:
                        result = fn(record)
                        if inspect.isawaitable(result):
                            result = await result
            except asyncio.CancelledError as exc:
                task = asyncio.current_task()
                if self._closed or (task is not None and task.cancelling()):
                    raise  # the operator closes
                # fn cancelled itself: a failed attempt, not a call that never ends
                self._failed(call, RuntimeError(f"the call was cancelled: {exc!r}"), attempt,
                             attempts)
                return
            except Exception as exc:
                error: Exception = exc
                if scope is not None and scope.expired():
                    error = TimeoutError(f"no result within {timeout} s")
                if policy is not None and attempt < attempts and policy.retries(error):
                    await asyncio.sleep(policy.delay(attempt))
                    continue
                self._failed(call, error, attempt, attempts)
                return
            self._completed(call, result)
            return

    def _failed(self, call: _Call, error: Exception, attempt: int, attempts: int) -> None:
        if self._closed:
            return
        tried = f" (attempt {attempt} of {attempts})" if attempts > 1 else ""
        if self.emit_failures:
            reason = f"{type(error).__name__}: {error}{tried}"
            self._completed(call, AsyncFailure(call.record, reason, attempt))
            return
        if self._failure is None:
            failure = self.fail(call.record, error)
            if tried:
                failure.args = (failure.args[0] + tried,)
            failure.__cause__ = error
            self._failure = failure
        self._notify()

    def _completed(self, call: _Call, result: Any) -> None:
        if self._closed:
            return
        call.done = True
        call.result = result
        seg = call.segment
        if self.ordered:
            emittable = seg is self._segments[0] and next(iter(seg.calls)) == call.seq
        else:
            seg.done.append(call)
            emittable = seg is self._segments[0]
        if emittable:
            self._notify()

    # ------------------------------------------------------------------ emitting
    def _take_ready(self) -> list[Any]:
        """Remove and return the results of the first segment that may be emitted now."""
        seg = self._segments[0]
        calls = seg.calls
        out: list[Any] = []
        if self.ordered:
            while calls:
                call = calls[next(iter(calls))]
                if not call.done:
                    break
                calls.popitem(last=False)
                out.append(call.result)
        elif seg.done:
            done, seg.done = seg.done, []
            for call in done:
                del calls[call.seq]
                out.append(call.result)
        self._queued -= len(out)
        return out

    async def _emit_ready(self) -> None:
        """Emit what may go out now: results, and the watermarks whose records are out."""
        mailbox = self.mailbox
        assert mailbox is not None
        segments = self._segments
        while True:
            out = self._take_ready()
            seg = segments[0]
            closed = seg.watermark is not None and not seg.calls
            if closed:
                segments.popleft()
            if out:
                self.records_out += len(out)
                await mailbox.task.push_from(mailbox.index + 1, out)
            if not closed:
                return
            if not self._final:
                assert seg.watermark is not None
                await mailbox.emit_watermark(seg.watermark)

    def _empty(self) -> bool:
        """Nothing left to emit (no call, no held watermark)."""
        return not self._waiting and self._queued == 0 and len(self._segments) == 1

    def _notify(self) -> None:
        """Something may be emitted (or the job must fail): wake the drain, or post a flush."""
        if self._closed:
            return
        if self._draining:
            self._dirty = True
            wake = self._wake
            if wake is not None and not wake.done():
                wake.set_result(None)
            if self._failure is None:
                return
            # the drain raises it too, but a drain inside a checkpoint's synchronous part
            # only declines the checkpoint: the mailbox action fails the task
        if not self._flush_posted:
            self._flush_posted = True
            assert self.mailbox is not None
            self.mailbox.post(self._flush)

    def _flush(self) -> Awaitable[None] | None:
        """Mailbox action: emit what completed."""
        self._flush_posted = False
        if self._failure is not None:
            raise self._failure
        if self._draining or self._closed:
            return None
        return self._emit_ready()

    def _post_drain(self) -> None:
        if not self._drain_posted and not self._closed:
            self._drain_posted = True
            assert self.mailbox is not None
            self.mailbox.post(self._drain_action)

    def _drain_action(self) -> Awaitable[None]:
        self._drain_posted = False
        return self._drain()

    async def _drain(self) -> None:
        """Hold the task, emitting as calls complete, until every waiting record has started
        (backpressure) or, after the end of input, until everything is emitted."""
        if self._closed:
            return
        self._draining = True
        try:
            while True:
                self._dirty = False
                if self._failure is not None:
                    raise self._failure
                await self._emit_ready()
                self._start_waiting()
                if not self._waiting and (not self._input_ended or self._empty()):
                    return
                if self._dirty:
                    continue
                assert self._loop is not None
                self._wake = self._loop.create_future()
                try:
                    await self._wake
                finally:
                    self._wake = None
        finally:
            self._draining = False
