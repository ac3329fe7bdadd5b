"""An HTTP service around a running job: events come in over HTTP, per-user state is
queried, and committed window results are streamed to clients as server-sent events.

    python examples/http_service.py [--host 127.0.0.1] [--port 8080] [--checkpoint-dir DIR]
                                    [--interval S] [--window S] [--out-of-orderness S]
                                    [--parallelism N] [--capacity N] [--max-future S]

Needs aiohttp (``pip install 'reactive[http]'``). One process: the aiohttp server and the job
share the event loop. The pipeline, per user: a running total of ``amount`` in keyed state
(a ``KeyedProcessFunction``, uid ``totals``, state ``total``), and tumbling event-time
windows (``--window`` seconds, default 60) summing the amounts, whose results go to a sink
with uid ``windows``; late events (beyond ``--out-of-orderness``) go to a sink with uid
``late``. Checkpoints every ``--interval`` seconds into ``--checkpoint-dir`` (default: a new
temporary directory), with a restart strategy: a failing pipeline restarts from its latest
checkpoint, and every accepted event is still counted exactly once.

Endpoints:

``POST /events``
    A JSON event ``{"user": "ada", "amount": 3, "ts": 1700000000.5}`` (``ts``: event time,
    seconds since the Unix epoch; ``amount``: a number) or a JSON list of them. The events
    are validated first: a malformed one is answered with 400 and
    ``{"error": "events[2].amount: ..."}`` naming what is wrong, and nothing of the request
    is pushed. A ``ts`` must lie between 0 and ``--max-future`` seconds (default 300: clock
    skew) past the server's clock: one event far in the future would move the watermark
    there and make every later event late. A body that is not JSON, or nested too deeply to
    parse, is a 400 too. Otherwise they are pushed into the
    job's ``PushSource`` and the answer is 200 ``{"accepted": n, "durable": false}`` once they
    are accepted (waiting while the source's buffer is full: backpressure). With
    ``?durable=1`` it answers once a completed checkpoint covers them (``"durable": true``).
    503 when the service no longer accepts events (shutting down, or the job failed).
``GET /state/{user}``
    ``{"user": "ada", "total": 12, "committed": true}``: the running total in the latest
    completed checkpoint (``job.query_state``), a value no failure takes back; ``?live=1``
    asks the running operator instead (``"committed": false``; it may include events a
    failure replays). 404 when there is no total for the user (yet), 503 when live state
    cannot be asked (the job is restarting or has ended).
``GET /results``
    ``text/event-stream``: every committed window result, in commit order, as
    ``id: <n>`` / ``event: window`` / ``data: {"user", "start", "end", "sum", "count"}``, and
    late events as ``event: late`` / ``data: <the event>``. Each result is sent once it is
    committed (``job.results``): a failure never takes back what a client saw. A client that
    connects late gets the results from the beginning (the service keeps them in memory),
    or after ``Last-Event-ID: <n>`` (or ``?after=<n>``) when it reconnects. The stream ends
    with ``event: end`` when the job ends (``data: {"status": ..., "error": ...}``).
``GET /status``
    The job's status, restarts, completed checkpoints, events accepted and durable.

Event time: a window's result comes once the watermark (the largest ``ts`` pushed minus
``--out-of-orderness``) has passed its end, so when later events arrive; the last windows
come when the service shuts down (Ctrl-C: it stops accepting events, lets the job finish
with a final checkpoint, sends the last results to the connected clients, then exits).

Try it::

    curl -s localhost:8080/events -d '[{"user": "ada", "amount": 3, "ts": 1700000000.5},
                                      {"user": "bob", "amount": 5, "ts": 1700000042}]'
    curl -s 'localhost:8080/events?durable=1' -d '{"user": "ada", "amount": 4, "ts": 1700000130}'
    curl -s localhost:8080/state/ada
    curl -sN localhost:8080/results
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import tempfile
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
from typing import Any

from aiohttp import web

from reactive import (
    AggregateFunction,
    CheckpointConfig,
    ConfigurationError,
    Dataflow,
    Job,
    JobEndedError,
    KeyedProcessFunction,
    PushSource,
    ReactiveError,
    RestartStrategy,
    StateQueryError,
    TumblingEventTimeWindows,
    ValueStateDescriptor,
    WindowResult,
)
from reactive.connectors.collections import DiscardingSink

log = logging.getLogger("http_service")

TOTALS_UID = "totals"  # the running-total operator
TOTAL_STATE = "total"  # its keyed state
WINDOWS_UID = "windows"  # the sink of the window results
LATE_UID = "late"  # the sink of the late events

Event = dict[str, Any]


# ---------------------------------------------------------------------------------- events
class InvalidEvent(ValueError):
    """A malformed event; the message names the field and what is wrong."""


# how far (seconds) an event's ts may be ahead of the server's clock: clients' clocks skew
MAX_FUTURE = 300.0


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(event: dict[str, Any], field: str, where: str) -> float:
    if field not in event:
        raise InvalidEvent(f"{where}: missing field {field!r}")
    value = event[field]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidEvent(f"{where}.{field}: expected a number, got "
                           f"{type(value).__name__} {_preview(value)}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int beyond any float
        finite = False
    if not finite:
        raise InvalidEvent(f"{where}.{field}: expected a finite number, got {_preview(value)}")
    return value


def _event_time(event: dict[str, Any], where: str, max_ts: float | None) -> float:
    ts = _number(event, "ts", where)
    if ts < 0:
        raise InvalidEvent(f"{where}.ts: expected seconds since the Unix epoch (>= 0), got "
                           f"{ts!r}")
    if max_ts is not None and ts > max_ts:
        raise InvalidEvent(
            f"{where}.ts: {ts!r} is in the future, beyond {max_ts:.0f} (the server's clock "
            "plus the clock skew it allows): it would move the watermark there and make "
            "every later event late")
    return ts


def parse_event(raw: Any, where: str = "event", max_ts: float | None = None) -> Event:
    """A validated event ``{"user": str, "amount": number, "ts": number}``.

    Args:
        raw: the decoded JSON value.
        where: how the message names the event (``events[2]``).
        max_ts: the largest ``ts`` accepted (seconds since the epoch; None: no bound).

    Raises:
        InvalidEvent: naming the field (``where.field``) and what is wrong: a ``ts`` that
            is negative or beyond ``max_ts`` included.
    """
    if not isinstance(raw, dict):
        raise InvalidEvent(f"{where}: expected a JSON object, got {type(raw).__name__}")
    unknown = sorted(set(raw) - {"user", "amount", "ts"})
    if unknown:
        raise InvalidEvent(f"{where}: unknown field {unknown[0]!r} (expected user, amount, ts)")
    if "user" not in raw:
        raise InvalidEvent(f"{where}: missing field 'user'")
    user = raw["user"]
    if not isinstance(user, str) or not user:
        raise InvalidEvent(f"{where}.user: expected a non-empty string, got {user!r}")
    return {"user": user, "amount": _number(raw, "amount", where),
            "ts": _event_time(raw, where, max_ts)}


def parse_events(body: Any, max_ts: float | None = None) -> list[Event]:
    """The events of a request body: one event or a non-empty list of them.

    Args:
        body: the decoded JSON body.
        max_ts: the largest ``ts`` accepted (see :func:`parse_event`).

    Raises:
        InvalidEvent: for the first malformed event (``events[i]...``).
    """
    if isinstance(body, list):
        if not body:
            raise InvalidEvent("events: empty list")
        return [parse_event(raw, f"events[{i}]", max_ts) for i, raw in enumerate(body)]
    return [parse_event(body, max_ts=max_ts)]


def event_time(event: Event) -> float:
    return float(event["ts"])


def user_of(event: Event) -> str:
    return str(event["user"])


# ---------------------------------------------------------------------------------- pipeline
class RunningTotal(KeyedProcessFunction):
    """The running total of ``amount`` per user, in keyed state ``total`` (queried by
    ``GET /state/{user}``); emits nothing.

    Args:
        before_event: called with each event before it is counted (the tests' failure
            injection). A plain function: the job copies this object per instance, and a
            function is shared, not copied.
    """

    def __init__(self, before_event: Callable[[Event], None] | None = None) -> None:
        self.before_event = before_event

    def open(self, ctx: Any) -> None:
        self.total = ctx.get_state(ValueStateDescriptor(TOTAL_STATE, default=0))

    def process_element(self, event: Event, ctx: Any) -> None:
        if self.before_event is not None:
            self.before_event(event)
        self.total.update(self.total.value() + event["amount"])


class SumAmounts(AggregateFunction):
    """Sum and count of the amounts in a window."""

    def create_accumulator(self) -> tuple[float, int]:
        return (0, 0)

    def add(self, event: Event, acc: tuple[float, int]) -> tuple[float, int]:
        return (acc[0] + event["amount"], acc[1] + 1)

    def get_result(self, acc: tuple[float, int]) -> tuple[float, int]:
        return acc

    def merge(self, a: tuple[float, int], b: tuple[float, int]) -> tuple[float, int]:
        return (a[0] + b[0], a[1] + b[1])


def inject_failures(fail_at: Iterable[int]) -> Callable[[Event], None]:
    """A ``before_event`` hook that raises once when the running total has seen its n-th
    event (1-based, replayed events included) for each n of ``fail_at`` (for tests)."""
    pending = sorted(fail_at)
    seen = 0

    def before_event(event: Event) -> None:
        nonlocal seen
        seen += 1
        if pending and seen >= pending[0]:
            pending.pop(0)
            raise RuntimeError(f"injected failure at event {seen} ({event['user']!r})")

    return before_event


def build_flow(source: PushSource, *, window: float = 60.0, out_of_orderness: float = 5.0,
               parallelism: int = 2,
               before_event: Callable[[Event], None] | None = None) -> Dataflow:
    """The service's pipeline on ``source``: running totals (uid ``totals``) and window sums
    (results to the sink ``windows``, late events to the sink ``late``)."""
    flow = Dataflow("http-service", parallelism=parallelism, max_parallelism=128)
    # one timestamp assigner, chained to the source: the watermark follows the push order
    events = (flow.source(source, name="http-events").uid("events")
              .assign_timestamps(event_time, max_out_of_orderness=out_of_orderness)
              .uid("timestamps").set_parallelism(1))
    (events.key_by(user_of)
           .process(RunningTotal(before_event), name="running-total").uid(TOTALS_UID))
    windowed = (events.key_by(user_of)
                .window(TumblingEventTimeWindows.of(window))
                .side_output_late_data())
    (windowed.aggregate(SumAmounts(), name="window-sums").uid("window-sums")
             .sink(DiscardingSink(), name="window-results").uid(WINDOWS_UID))
    windowed.late_data().sink(DiscardingSink(), name="late-events").uid(LATE_UID)
    return flow


def window_json(result: WindowResult) -> dict[str, Any]:
    total, count = result.value
    return {"user": result.key, "start": result.start, "end": result.end, "sum": total,
            "count": count}


# ---------------------------------------------------------------------------------- results
class ResultLog:
    """The committed results in commit order, shared by every ``GET /results`` client.

    ``job.results`` is asked once, right after the start (so it sees every record); each
    client follows this log from where it wants, so a late client sees everything. The log
    is kept in memory for the service's lifetime.
    """

    def __init__(self) -> None:
        self.entries: list[tuple[str, str]] = []  # (SSE event name, JSON data)
        self.ended = False
        self.end_data = "{}"
        self._changed = asyncio.Event()

    def append(self, kind: str, data: Any) -> None:
        self.entries.append((kind, json.dumps(data)))
        self._wake()

    def end(self, data: dict[str, Any]) -> None:
        if not self.ended:
            self.ended = True
            self.end_data = json.dumps(data)
            self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def follow(self, start: int, keepalive: float
                     ) -> AsyncGenerator[tuple[int, str, str] | None, None]:
        """``(id, kind, data)`` for the entries from ``start`` on, as they come, until the
        log ends; None after ``keepalive`` seconds without one."""
        i = max(start, 0)
        while True:
            while i < len(self.entries):
                kind, data = self.entries[i]
                yield i, kind, data
                i += 1
            if self.ended:
                return
            changed = self._changed  # checked and registered with no await between
            try:
                await asyncio.wait_for(changed.wait(), keepalive)
            except TimeoutError:
                yield None


# ---------------------------------------------------------------------------------- service
def _flag(request: web.Request, name: str) -> bool:
    value = request.query.get(name, "0").lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise web.HTTPBadRequest(text=json.dumps({"error": f"?{name}= expects 1 or 0, got {value!r}"}),
                             content_type="application/json")


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status)


class Service:
    """The job and the HTTP handlers around it (see the module docstring).

    Args:
        checkpoint_dir: where the job's checkpoints go.
        interval: checkpoint interval, seconds.
        window: tumbling window size, seconds of event time.
        out_of_orderness: how far (seconds) an event's ``ts`` may lag the largest one pushed
            before it is late for its window.
        parallelism: the job's parallelism.
        capacity: events accepted but not yet covered by a checkpoint, at most.
        restarts, restart_delay: the restart strategy.
        query_timeout: seconds a state query may take before the answer is 503.
        drain_timeout: seconds the shutdown waits for the job to finish, then cancels it.
        keepalive: seconds between SSE keep-alive comments on an idle stream.
        max_future: seconds an event's ``ts`` may be ahead of the server's clock.
        fail_at: inject a failure at these event counts (tests only; see
            :func:`inject_failures`).
    """

    def __init__(self, checkpoint_dir: str, *, interval: float = 1.0, window: float = 60.0,
                 out_of_orderness: float = 5.0, parallelism: int = 2, capacity: int = 10_000,
                 restarts: int = 10, restart_delay: float = 0.5, query_timeout: float = 5.0,
                 drain_timeout: float = 30.0, keepalive: float = 15.0,
                 max_future: float = MAX_FUTURE, fail_at: Iterable[int] = ()) -> None:
        self.checkpoint_dir = checkpoint_dir
        self.interval = interval
        self.restart = RestartStrategy.fixed(restarts, restart_delay)
        self.query_timeout = query_timeout
        self.drain_timeout = drain_timeout
        self.keepalive = keepalive
        self.max_future = max_future
        fail_at = list(fail_at)
        self.source = PushSource(capacity=capacity)
        self.flow = build_flow(self.source, window=window, out_of_orderness=out_of_orderness,
                               parallelism=parallelism,
                               before_event=inject_failures(fail_at) if fail_at else None)
        self.results = ResultLog()
        self.accepted = 0
        self._job: Job | None = None
        self._job_done: asyncio.Task[None] | None = None  # never raises: see _watch
        self._results_done: asyncio.Task[None] | None = None
        self.job_error: BaseException | None = None

    @property
    def job(self) -> Job:
        if self._job is None:
            raise RuntimeError("the service has not started")
        return self._job

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Start the job, and the tasks that move its committed results to the log."""
        job = self._job = await self.flow.start(
            checkpoints=CheckpointConfig(interval=self.interval, directory=self.checkpoint_dir),
            restart=self.restart)
        # asked at once, before any record reaches the sinks, so the log misses none
        windows, late = job.results(WINDOWS_UID), job.results(LATE_UID)
        self._job_done = asyncio.create_task(self._watch(job))
        self._results_done = asyncio.create_task(self._forward_results(windows, late))
        log.info("job started, checkpoints in %s", self.checkpoint_dir)

    async def _watch(self, job: Job) -> None:
        try:
            await job.wait()
        except ReactiveError as exc:
            self.job_error = exc
            log.error("job ended: %s", exc)

    async def _pump(self, results: AsyncIterator[Any], kind: str,
                    convert: Callable[[Any], Any]) -> None:
        with contextlib.suppress(ReactiveError):  # the job failed: _watch reports it
            async for record in results:
                self.results.append(kind, convert(record))

    async def _forward_results(self, windows: AsyncIterator[Any],
                               late: AsyncIterator[Any]) -> None:
        """Move the committed results to the log until the job ends; then end the log."""
        assert self._job_done is not None
        await asyncio.gather(self._pump(windows, "window", window_json),
                             self._pump(late, "late", dict))
        await self._job_done
        error = self.job_error
        self.results.end({"status": self.job.status,
                          "error": None if error is None else str(error)})

    async def drain(self, timeout: float | None = None) -> None:
        """Stop accepting events and let the job finish: it processes every accepted event,
        fires the remaining windows and takes a final checkpoint; the results log then
        ends. After ``timeout`` seconds (default ``drain_timeout``) the job is cancelled."""
        if self._job is None or self._job_done is None:
            return
        self.source.close()
        try:
            await asyncio.wait_for(asyncio.shield(self._job_done),
                                   self.drain_timeout if timeout is None else timeout)
        except TimeoutError:
            log.warning("the job did not finish in time: cancelling it")
            await self.job.cancel()
        assert self._results_done is not None
        await self._results_done

    async def stop(self) -> None:
        """Cancel the job if it still runs (after :meth:`drain`, it does not)."""
        if self._job is None or self._results_done is None:
            return
        await self.job.cancel()
        await self._results_done

    # ------------------------------------------------------------------ handlers
    def routes(self) -> list[web.RouteDef]:
        return [web.post("/events", self.post_events),
                web.get("/state/{user}", self.get_state),
                web.get("/results", self.get_results),
                web.get("/status", self.get_status)]

    async def _push(self, events: list[Event], durable: bool, seqs: list[int]) -> None:
        for event in events:
            seqs.append(await self.source.send(event))
        if durable:
            await self.source.wait_durable(seqs[-1])

    async def post_events(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError as exc:
            return _json({"error": f"the body is not JSON: {exc}"}, 400)
        except RecursionError:
            return _json({"error": "the body is nested too deeply to parse (an event is a "
                                   "flat JSON object)"}, 400)
        try:
            events = parse_events(body, max_ts=time.time() + self.max_future)
        except InvalidEvent as exc:
            return _json({"error": str(exc)}, 400)
        durable = _flag(request, "durable")
        assert self._job_done is not None
        if self._job_done.done():
            return _json({"error": f"not accepting events: the job is {self.job.status}"}, 503)
        seqs: list[int] = []
        push = asyncio.ensure_future(self._push(events, durable, seqs))
        try:
            # a job that fails for good never frees the buffer nor covers the events
            await asyncio.wait({push, self._job_done}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not push.done():
                push.cancel()
                await asyncio.wait({push})  # until it is cancelled (never raises its error)
        if push.cancelled():
            return _json({"error": f"the job is {self.job.status}: {len(seqs)} of "
                                   f"{len(events)} events were accepted, with no guarantee",
                          "accepted": len(seqs)}, 503)
        error = push.exception()
        if isinstance(error, ConfigurationError):  # the source was closed: shutting down
            return _json({"error": f"not accepting events: {error}", "accepted": len(seqs)},
                         503)
        if isinstance(error, JobEndedError):  # the job ended while the events came in
            return _json({"error": f"the job is {self.job.status}: {len(seqs)} of "
                                   f"{len(events)} events were accepted, with no guarantee "
                                   f"({error})", "accepted": len(seqs)}, 503)
        if error is not None:
            raise error
        self.accepted += len(events)
        return _json({"accepted": len(events), "durable": durable})

    async def get_state(self, request: web.Request) -> web.Response:
        user = request.match_info["user"]
        live = _flag(request, "live")
        try:
            total = await asyncio.wait_for(
                self.job.query_state(TOTALS_UID, TOTAL_STATE, user, committed=not live),
                self.query_timeout)
        except StateQueryError as exc:
            return _json({"user": user, "error": str(exc)}, 503)
        except TimeoutError:
            return _json({"user": user, "error": f"no answer in {self.query_timeout} s (the job "
                                                 f"is {self.job.status})"}, 503)
        if total is None:
            what = "live" if live else "committed"
            return _json({"user": user, "error": f"no {what} total for user {user!r}"}, 404)
        return _json({"user": user, "total": total, "committed": not live})

    async def get_results(self, request: web.Request) -> web.StreamResponse:
        after = request.headers.get("Last-Event-ID") or request.query.get("after")
        try:
            start = int(after) + 1 if after else 0
        except ValueError:
            return _json({"error": f"Last-Event-ID / ?after= expects a number, got {after!r}"},
                         400)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache",
                                               "X-Accel-Buffering": "no"})
        await response.prepare(request)
        try:
            async with contextlib.aclosing(self.results.follow(start, self.keepalive)) as entries:
                async for entry in entries:
                    if entry is None:
                        await response.write(b": keep-alive\n\n")
                        continue
                    i, kind, data = entry
                    await response.write(f"id: {i}\nevent: {kind}\ndata: {data}\n\n".encode())
            await response.write(f"event: end\ndata: {self.results.end_data}\n\n".encode())
            await response.write_eof()
        except ConnectionError:  # the client went away
            pass
        return response

    async def get_status(self, request: web.Request) -> web.Response:
        job = self.job
        return _json({"job": job.status, "restarts": job.metrics.restarts,
                      "checkpoints": job.metrics.totals.completed,
                      "accepted": self.accepted, "durable": self.source.durable,
                      "results": len(self.results.entries),
                      "error": None if self.job_error is None else str(self.job_error)})


SERVICE = web.AppKey("service", Service)


def make_app(checkpoint_dir: str, **options: Any) -> web.Application:
    """The aiohttp application: its startup starts the job; its shutdown drains it (no more
    events, the job finishes with a final checkpoint, the result streams end); its cleanup
    cancels the job if it still runs. ``app[SERVICE]`` is the :class:`Service`.

    Args:
        checkpoint_dir: where the job's checkpoints go.
        options: the keyword arguments of :class:`Service`.
    """
    service = Service(checkpoint_dir, **options)
    app = web.Application()
    app[SERVICE] = service
    app.add_routes(service.routes())

    async def job_context(app: web.Application) -> AsyncIterator[None]:
        await service.start()
        yield
        await service.stop()

    async def on_shutdown(app: web.Application) -> None:
        # before aiohttp waits for the open requests: the result streams end here
        await service.drain()

    app.cleanup_ctx.append(job_context)
    app.on_shutdown.append(on_shutdown)
    return app


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--checkpoint-dir", default=None, help="default: a new temporary directory")
    p.add_argument("--interval", type=float, default=1.0, help="checkpoint interval, seconds")
    p.add_argument("--window", type=float, default=60.0, help="window size, seconds")
    p.add_argument("--out-of-orderness", type=float, default=5.0,
                   help="seconds an event's ts may lag the largest one before it is late")
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--capacity", type=int, default=10_000,
                   help="events accepted but not yet covered by a checkpoint, at most")
    p.add_argument("--max-future", type=float, default=MAX_FUTURE,
                   help="seconds an event's ts may be ahead of the server's clock")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    from reactive import new_event_loop

    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    checkpoint_dir = args.checkpoint_dir or tempfile.mkdtemp(prefix="http-service-chk-")
    app = make_app(checkpoint_dir, interval=args.interval, window=args.window,
                   out_of_orderness=args.out_of_orderness, parallelism=args.parallelism,
                   capacity=args.capacity, max_future=args.max_future)
    web.run_app(app, host=args.host, port=args.port, loop=new_event_loop())


if __name__ == "__main__":
    main()
