"""examples/http_service.py driven over real HTTP (aiohttp client and server on 127.0.0.1):
events posted concurrently while injected failures restart the pipeline, then every accepted
event counted exactly once in the committed per-user totals and in the committed window
results streamed as server-sent events; malformed events refused; shutdown and a job that
fails for good seen from the clients' side."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytest.importorskip("aiohttp", reason="examples/http_service.py needs aiohttp: "
                                      "pip install 'reactive[http]'")

import aiohttp
from aiohttp import web

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "http_service.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("http_service", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


http_service = _load()

BASE_TS = 1_700_000_000
WINDOW = 60.0
USERS = [f"user-{i}" for i in range(25)]


@contextlib.asynccontextmanager
async def serve(app: web.Application) -> AsyncIterator[str]:
    """Run ``app`` on a free port of 127.0.0.1 (its startup starts the job); its base URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


async def read_sse(response: aiohttp.ClientResponse) -> tuple[list[tuple[int, str, Any]], Any]:
    """The ``(id, event, data)`` of a server-sent event stream up to its ``end`` event, and
    that event's data."""
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/event-stream")
    events: list[tuple[int, str, Any]] = []
    fields: dict[str, str] = {}
    async for raw in response.content:
        line = raw.decode().rstrip("\r\n")
        if line.startswith(":"):
            continue  # a comment (keep-alive)
        if line:
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
            continue
        if fields.get("event") == "end":
            return events, json.loads(fields["data"])
        if fields:
            events.append((int(fields["id"]), fields["event"], json.loads(fields["data"])))
        fields = {}
    raise AssertionError(f"the stream ended without an end event after {len(events)} events")


def make_events(n: int, seed: int) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    weights = [1.0 / (i + 1) for i in range(len(USERS))]
    users = rnd.choices(USERS, weights=weights, k=n)
    return [{"user": u, "amount": rnd.randint(1, 50), "ts": BASE_TS + i * 0.5}
            for i, u in enumerate(users)]


def totals(events: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in events:
        out[e["user"]] = out.get(e["user"], 0) + e["amount"]
    return out


def batch_windows(events: list[dict[str, Any]]) -> dict[tuple[str, float], tuple[int, int]]:
    """The tumbling windows' (sum, count) per (user, window start), computed in batch."""
    out: dict[tuple[str, float], tuple[int, int]] = {}
    for e in events:
        key = (e["user"], e["ts"] - e["ts"] % WINDOW)
        total, count = out.get(key, (0, 0))
        out[key] = (total + e["amount"], count + 1)
    return out


def window_results(stream: list[tuple[int, str, Any]]) -> dict[tuple[str, float], tuple[int, int]]:
    """The window results of an SSE stream by (user, start); no window may come twice."""
    keys = [(d["user"], d["start"]) for _, kind, d in stream if kind == "window"]
    assert len(keys) == len(set(keys)), "a window result came twice"
    for _, kind, d in stream:
        assert kind == "window", f"unexpected {kind} event: {d}"
        assert d["end"] - d["start"] == WINDOW
    return {(d["user"], d["start"]): (d["sum"], d["count"]) for _, _, d in stream}


# (body, what the 400 must name): never pushed, so "mallory" must never get a total
MALFORMED: list[tuple[Any, str]] = [
    ({"user": "mallory", "amount": "3", "ts": BASE_TS}, "event.amount: expected a number"),
    ({"user": "mallory", "amount": 3}, "event: missing field 'ts'"),
    ({"user": "", "amount": 3, "ts": BASE_TS}, "event.user"),
    ({"user": "mallory", "amount": True, "ts": BASE_TS}, "event.amount"),
    ({"user": "mallory", "amount": 3, "ts": BASE_TS, "amout": 1}, "unknown field 'amout'"),
    ([{"user": "mallory", "amount": 1, "ts": BASE_TS},
      {"user": "mallory", "amount": 1, "ts": float("nan")}], "events[1].ts: expected a finite"),
    ([], "empty list"),
    (["mallory"], "events[0]: expected a JSON object"),
    ("not json", "not JSON"),
]


async def test_posted_events_are_counted_exactly_once_through_failures(tmp_path):
    events = make_events(2_000, seed=11)
    rnd = random.Random(12)
    requests: list[list[dict[str, Any]]] = []
    i = 0
    while i < len(events):
        size = rnd.randint(1, 40)
        requests.append(events[i:i + size])
        i += size
    # At most CONCURRENT requests in flight, and request j starts only once request
    # j - CONCURRENT was answered: an event is pushed at most CONCURRENT * 40 * 0.5 s of
    # event time behind the largest one pushed before it, so an out-of-orderness of 200 s
    # leaves no event late, whatever order the concurrent requests arrive in.
    concurrent = 8
    # capacity 150 and failures at the 600th and 1,300th event the running total sees
    # (replays included): at most 1,450 events can have been accepted when the second
    # failure strikes, so both come while the posts are still going on
    app = http_service.make_app(str(tmp_path / "chk"), interval=0.05, window=WINDOW,
                                out_of_orderness=200.0, capacity=150, restarts=5,
                                restart_delay=0.0, fail_at=[600, 1_300])
    service = app[http_service.SERVICE]
    async with asyncio.timeout(120), serve(app) as url, aiohttp.ClientSession() as session:
        # a client that follows the results from the start
        early = await session.get(f"{url}/results")
        early_reader = asyncio.create_task(read_sse(early))

        answered = [asyncio.Event() for _ in requests]
        accepted: list[dict[str, Any]] = []

        async def post(j: int, chunk: list[dict[str, Any]]) -> None:
            if j >= concurrent:
                await answered[j - concurrent].wait()
            body: Any = chunk[0] if len(chunk) == 1 else chunk
            query = "?durable=1" if j % 10 == 9 else ""
            try:
                async with session.post(f"{url}/events{query}", json=body) as r:
                    assert r.status == 200, await r.text()
                    assert await r.json() == {"accepted": len(chunk), "durable": bool(query)}
                accepted.extend(chunk)
            finally:
                answered[j].set()

        async def post_malformed(body: Any, expected: str) -> None:
            data = body if isinstance(body, str) else json.dumps(body)
            async with session.post(f"{url}/events", data=data) as r:
                assert r.status == 400
                assert expected in (await r.json())["error"]

        await asyncio.gather(*(post(j, chunk) for j, chunk in enumerate(requests)),
                             *(post_malformed(body, expected) for body, expected in MALFORMED))
        assert sorted(accepted, key=lambda e: e["ts"]) == events

        # a durable post: once answered, a completed checkpoint covers it and every event
        # accepted before it
        last = {"user": USERS[0], "amount": 7, "ts": BASE_TS + len(events) * 0.5}
        async with session.post(f"{url}/events?durable=1", json=last) as r:
            assert r.status == 200 and (await r.json())["durable"] is True
        accepted.append(last)
        expected_totals = totals(accepted)

        async with session.get(f"{url}/status") as r:
            status = await r.json()
        # both injected failures struck (the running total has seen > 1,300 events)
        assert status["restarts"] == 2 and status["job"] == "running", status
        assert status["accepted"] == len(accepted) and status["durable"] >= len(accepted)

        async def state(user: str, live: bool = False) -> tuple[int, Any]:
            async with session.get(f"{url}/state/{user}" + ("?live=1" if live else "")) as r:
                return r.status, await r.json()

        for user, total in expected_totals.items():
            assert await state(user) == (200, {"user": user, "total": total, "committed": True})
            assert await state(user, live=True) == (
                200, {"user": user, "total": total, "committed": False})
        assert (await state("mallory"))[0] == 404  # only ever in malformed requests

        # end of input: the job finishes with a final checkpoint; the streams end
        await service.drain()
        assert service.job.status == "finished" and service.job_error is None
        stream, end = await early_reader
        early.release()
        assert end == {"status": "finished", "error": None}
        assert [i for i, _, _ in stream] == list(range(len(stream)))
        assert window_results(stream) == batch_windows(accepted)

        # a client connecting now gets the same results; one resuming gets the rest
        async with session.get(f"{url}/results") as late:
            assert await read_sse(late) == (stream, end)
        resume_at = len(stream) // 2
        async with session.get(f"{url}/results",
                               headers={"Last-Event-ID": str(resume_at)}) as resumed:
            assert await read_sse(resumed) == (stream[resume_at + 1:], end)

        # the final checkpoint's totals; no live state, no more events
        for user, total in expected_totals.items():
            assert await state(user) == (200, {"user": user, "total": total, "committed": True})
        code, body = await state(USERS[0], live=True)
        assert code == 503 and "finished" in body["error"]
        async with session.post(f"{url}/events", json=last) as r:
            assert r.status == 503 and "not accepting events" in (await r.json())["error"]


async def test_shutdown_drains_the_job_and_ends_the_result_streams(tmp_path):
    events = make_events(300, seed=21)
    app = http_service.make_app(str(tmp_path / "chk"), interval=0.05, window=WINDOW,
                                out_of_orderness=0.0)
    async with asyncio.timeout(60), aiohttp.ClientSession() as session:
        async with serve(app) as url:
            stream = await session.get(f"{url}/results")
            reader = asyncio.create_task(read_sse(stream))
            async with session.post(f"{url}/events", json=events) as r:
                assert r.status == 200 and (await r.json())["accepted"] == len(events)
        # leaving serve() ran the runner's cleanup: the shutdown closed the source and let
        # the job finish, so the last windows reached the connected client before the end
        results, end = await reader
        stream.release()
        assert end == {"status": "finished", "error": None}
        assert window_results(results) == batch_windows(events)


async def test_a_job_that_fails_for_good_is_reported_to_the_clients(tmp_path):
    app = http_service.make_app(str(tmp_path / "chk"), interval=0.05, restarts=0,
                                fail_at=[1])
    async with asyncio.timeout(60), serve(app) as url, aiohttp.ClientSession() as session:
        # durable: the failure comes before any checkpoint can cover the event
        event = {"user": "ada", "amount": 1, "ts": BASE_TS}
        async with session.post(f"{url}/events?durable=1", json=event) as r:
            assert r.status == 503
            assert "the job is failed" in (await r.json())["error"]
        async with session.post(f"{url}/events", json=event) as r:
            assert r.status == 503
        async with session.get(f"{url}/results") as r:
            results, end = await read_sse(r)
        assert results == [] and end["status"] == "failed"
        assert "injected failure at event 1" in end["error"]
        async with session.get(f"{url}/status") as r:
            assert (await r.json())["job"] == "failed"
        async with session.get(f"{url}/state/ada?live=1") as r:
            assert r.status == 503


async def test_absurd_event_times_and_unparsable_shapes_are_refused_with_400(tmp_path):
    now = time.time()
    refused: list[tuple[str, str]] = [
        # (raw body, what the 400 must name)
        (json.dumps({"user": "mallory", "amount": 1, "ts": 1e12}), "event.ts: 1000000000000.0"),
        (json.dumps({"user": "mallory", "amount": 1, "ts": 1.7e308}), "event.ts: 1.7e+308 is in"),
        (json.dumps({"user": "mallory", "amount": 1, "ts": now + 3_600}), "is in the future"),
        (json.dumps({"user": "mallory", "amount": 1, "ts": -1.7e308}), "event.ts: expected "
                                                                        "seconds since"),
        (json.dumps([{"user": "mallory", "amount": 1, "ts": BASE_TS},
                     {"user": "mallory", "amount": 1, "ts": 1e12}]), "events[1].ts"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"user": "mallory", "amount": ' + "9" * 400 + f', "ts": {BASE_TS}}}',
         "event.amount: expected a finite number"),
        (json.dumps({"user": "mallory", "amount": {"a": [[1]]}, "ts": BASE_TS}),
         "event.amount: expected a number, got dict"),
        (json.dumps([[{"user": "mallory", "amount": 1, "ts": BASE_TS}]]),
         "events[0]: expected a JSON object"),
    ]
    # the default allowed clock skew (MAX_FUTURE, 300 s)
    app = http_service.make_app(str(tmp_path / "chk"), interval=0.05, window=WINDOW)
    async with asyncio.timeout(60), serve(app) as url, aiohttp.ClientSession() as session:
        for body, expected in refused:
            async with session.post(f"{url}/events", data=body) as r:
                assert r.status == 400, (body[:80], r.status, await r.text())
                assert expected in (await r.json())["error"], body[:80]
        # the server's clock plus the allowed skew is accepted, and nothing refused counted
        ok = [{"user": "ada", "amount": 2, "ts": BASE_TS},
              {"user": "ada", "amount": 3, "ts": now + 30}]
        async with session.post(f"{url}/events?durable=1", json=ok) as r:
            assert r.status == 200, await r.text()
        async with session.get(f"{url}/state/ada") as r:
            assert (r.status, (await r.json())["total"]) == (200, 5)
        async with session.get(f"{url}/state/mallory") as r:
            assert r.status == 404
