"""Stream faults as a client sees them: a full subscriber limit is a 503 for that client only, a
cursor beyond the run's stream an ``error`` event, and a hung Redis never holds up shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from server_support import slow_input, start_server, wait_until, write_project
from test_gateway_runs_support import (  # noqa: F401
    client,
    fresh_mode,
    make_config,
    new_thread,
    parse_sse,
    runtime,
)

from agentkeel.gateway.app import create_app
from agentkeel.runtime.runtime import Runtime, open_runtime
from private_redis import PrivateRedis, private_redis  # noqa: F401 (the fixture)


@pytest.fixture
async def crowded(
    tmp_path: Path, fresh_mode: None,  # noqa: F811
) -> AsyncIterator[tuple[Runtime, httpx.AsyncClient]]:
    """A gateway whose process serves at most 2 stream subscribers, both taken by idle ones."""
    config = make_config(tmp_path, limits={"stream_heartbeat_s": 0.2, "stream_max_subscribers": 2})
    async with open_runtime(config) as rt:
        idle = [rt.bridge.subscribe(f"idle-{n}") for n in range(2)]
        await asyncio.gather(*(anext(s) for s in idle))
        transport = httpx.ASGITransport(app=create_app(rt), raise_app_exceptions=False)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=20) as http:
                yield rt, http
        finally:
            await asyncio.gather(*(s.aclose() for s in idle))


async def test_a_full_subscriber_limit_is_503_for_that_client_only(
    crowded: tuple[Runtime, httpx.AsyncClient],
) -> None:
    rt, http = crowded
    thread = await new_thread(rt)
    body = {"assistant_id": "lead", "input": {"messages": [{"role": "user", "content": "hi"}]}}
    refused = await http.post(f"/threads/{thread}/runs/stream", json=body)
    assert refused.status_code == 503 and "stream_max_subscribers" in refused.json()["detail"]
    assert refused.headers["retry-after"]
    assert await rt.store.list_runs(thread) == [], "no run is admitted for a client that cannot follow it"
    run = (await http.post(f"/threads/{thread}/runs", json=body)).json()  # not a subscriber: fine
    for path in (f"/threads/{thread}/runs/{run['run_id']}/stream", f"/threads/{thread}/runs/{run['run_id']}/join",
                 f"/threads/{thread}/stream"):
        answer = await http.get(path)
        assert answer.status_code == 503, path
    await wait_until(lambda: _status(http, thread, run["run_id"], "success"))
    metrics = (await http.get("/metrics")).text
    assert "agentkeel_stream_subscribers 2" in metrics
    assert "agentkeel_stream_publish_failures_total 0" in metrics


async def _status(http: httpx.AsyncClient, thread: str, run_id: str, status: str) -> bool:
    return (await http.get(f"/threads/{thread}/runs/{run_id}")).json()["status"] == status


async def test_a_cursor_beyond_the_stream_is_an_error_event(
    client: httpx.AsyncClient,  # noqa: F811
    runtime: Runtime,  # noqa: F811
) -> None:
    thread = await new_thread(runtime)
    body = {"assistant_id": "lead", "input": {"messages": [{"role": "user", "content": "hi"}]}}
    text = (await http_stream(client, f"/threads/{thread}/runs/stream", body))
    ids = [f["id"] for f in parse_sse(text) if f.get("id")]
    run_id = (await client.get(f"/threads/{thread}/runs")).json()[0]["run_id"]
    last = int(ids[-1].split("-")[0])
    answer = await client.get(f"/threads/{thread}/runs/{run_id}/stream", headers={"Last-Event-ID": f"{last + 5}-0"})
    frames = [f for f in parse_sse(answer.text) if f.get("event")]
    assert answer.status_code == 200
    assert [f["event"] for f in frames] == ["error"]
    assert frames[0]["data"]["error"] == "LastEventIdAhead" and frames[0]["data"]["head"] == last
    thread_answer = await client.get(f"/threads/{thread}/stream", headers={"Last-Event-ID": f"{run_id}:{last + 5}-0"})
    assert [f["event"] for f in parse_sse(thread_answer.text) if f.get("event")] == ["error"]


async def http_stream(http: httpx.AsyncClient, path: str, body: dict[str, object]) -> str:
    answer = await http.post(path, json=body)
    assert answer.status_code == 200, answer.text
    return answer.text


def test_sigterm_with_a_hung_redis_exits_within_the_drain_bound(
    tmp_path: Path, private_redis: PrivateRedis  # noqa: F811
) -> None:
    drain_s = 2.0
    config = write_project(tmp_path, stream=private_redis.url, gateway={"drain_s": drain_s})
    server = start_server(config)
    try:
        with httpx.Client(base_url=server.url, timeout=10) as http:
            thread = http.post("/threads", json={}).json()["thread_id"]
            run = http.post(f"/threads/{thread}/runs", json={"assistant_id": "echo", "input": slow_input(200, 0.05)}).json()
            deadline = time.monotonic() + 10
            while http.get(f"/threads/{thread}/runs/{run['run_id']}").json()["status"] != "running":
                assert time.monotonic() < deadline, "the run never started"
                time.sleep(0.05)
        time.sleep(0.3)  # some events published
        private_redis.pause()  # connections stay open, nothing answers
        begin = time.monotonic()
        server.signal()
        status = server.wait(timeout=drain_s + 20)
        took = time.monotonic() - begin
    finally:
        private_redis.resume()
        with contextlib.suppress(Exception):
            server.stop(timeout=5)
    print(f"SIGTERM exit took {took:.2f} s")
    assert took < drain_s + 10, f"exit took {took:.1f} s:\n{server.output()[-3000:]}"
    assert status == 0, server.output()[-3000:]
