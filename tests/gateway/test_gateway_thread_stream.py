"""The thread join stream (``GET /threads/{tid}/stream``) against a live server: it never ends by
itself, so it is read frame by frame and left by the client."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_gateway_runs_support import (  # noqa: F401
    client,
    fresh_mode,
    live_server,
    make_config,
    new_thread,
    runtime,
    wait_until,
)

from agentkeel.runtime.runtime import Runtime


def _run(steps: int, delay: float) -> dict[str, Any]:
    return {"assistant_id": "echo", "input": {"steps": steps, "delay": delay}, "stream_mode": ["values", "custom"]}


async def _sse(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """Frames as they arrive: ``{event, data, id}``; heartbeat comments are skipped."""
    frame: dict[str, Any] = {}
    async for line in response.aiter_lines():
        if not line:
            if "event" in frame:
                yield frame
            frame = {}
        elif not line.startswith(":"):
            key, _, value = line.partition(":")
            value = value.removeprefix(" ")
            frame[key] = json.loads(value) if key == "data" else value


async def _until_done(frames: AsyncIterator[dict[str, Any]], run_id: str) -> list[dict[str, Any]]:
    got = []
    async for frame in frames:
        got.append(frame)
        if frame["event"] == "metadata" and frame["data"] == {"status": "run_done", "run_id": run_id}:
            return got
    raise AssertionError("the stream ended before the run was done")


async def _start(http: httpx.AsyncClient, tid: str, body: dict[str, Any]) -> str:
    response = await http.post(f"/threads/{tid}/runs", json=body)
    assert response.status_code == 200, response.text
    return str(response.json()["run_id"])


async def _running(http: httpx.AsyncClient, tid: str, run_id: str) -> None:
    async def check() -> bool:
        return (await http.get(f"/threads/{tid}/runs/{run_id}")).json()["status"] == "running"

    await wait_until(check)


async def test_join_follows_current_and_later_runs_and_resumes(tmp_path: Path, fresh_mode: None) -> None:
    async with live_server(make_config(tmp_path)) as (_server, http):
        assert (await http.post("/threads", json={"thread_id": "t-1"})).status_code == 200
        first = await _start(http, "t-1", _run(8, 0.1))
        await _running(http, "t-1", first)
        async with http.stream("GET", "/threads/t-1/stream") as response:
            assert response.status_code == 200
            frames = _sse(response)
            seen_first = await _until_done(frames, first)
            second = await _start(http, "t-1", _run(3, 0.02))
            seen_second = await _until_done(frames, second)
        customs = [f for f in seen_first if f["event"] == "custom"]
        assert customs and customs[-1]["data"] == {"step": 7}  # joined mid-run: live frames only
        assert all(f["id"].startswith(f"{first}:") and f["id"].endswith("-0") for f in customs)
        assert seen_second[0] == {"event": "metadata", "data": {"run_id": second, "attempt": 1},
                                  "id": f"{second}:1-0"}  # admitted after joining: in full
        assert [f["data"] for f in seen_second if f["event"] == "custom"] == [{"step": i} for i in range(3)]
        assert seen_second[-1]["event"] == "metadata" and "id" not in seen_second[-1]

        # Resume after the third-to-last custom frame of the first run: the rest of it, then the second.
        cursor = customs[-3]["id"]
        async with http.stream("GET", "/threads/t-1/stream", headers={"Last-Event-ID": cursor}) as response:
            frames = _sse(response)
            rest_first = await _until_done(frames, first)
            rest_second = await _until_done(frames, second)
        assert [f["data"] for f in rest_first if f["event"] == "custom"] == [{"step": 6}, {"step": 7}]
        assert [f for f in rest_second if "id" in f] == [f for f in seen_second if "id" in f]


async def test_lifecycle_mode_gets_only_metadata(tmp_path: Path, fresh_mode: None) -> None:
    async with live_server(make_config(tmp_path)) as (_server, http):
        assert (await http.post("/threads", json={"thread_id": "t-2"})).status_code == 200
        async with http.stream("GET", "/threads/t-2/stream", params={"stream_modes": "lifecycle"}) as response:
            frames = _sse(response)
            run_id = await _start(http, "t-2", _run(3, 0.02))
            got = await _until_done(frames, run_id)
        assert [f["event"] for f in got] == ["metadata", "metadata"]
        assert got[0]["data"] == {"run_id": run_id, "attempt": 1}
        # state_update (repeated stream_mode spelling) adds values events
        async with http.stream("GET", "/threads/t-2/stream",
                               params=[("stream_mode", "lifecycle"), ("stream_mode", "state_update")]) as response:
            frames = _sse(response)
            run_id = await _start(http, "t-2", _run(2, 0.02))
            got = await _until_done(frames, run_id)
        assert {f["event"] for f in got} == {"metadata", "values"}


async def test_unknown_thread_bad_cursor_and_bad_mode_are_refused(client: httpx.AsyncClient, runtime: Runtime) -> None:
    assert (await client.get("/threads/nope/stream")).status_code == 404
    await new_thread(runtime, "t-3")
    for bad in ("garbage", "5-0", ":1-0", "run-1:x-0", "run-1:"):
        response = await client.get("/threads/t-3/stream", headers={"Last-Event-ID": bad})
        assert response.status_code == 422, (bad, response.text)
        assert response.json()["field"] == "Last-Event-ID"
    response = await client.get("/threads/t-3/stream", params={"stream_mode": "values"})
    assert response.status_code == 422 and response.json()["field"] == "stream_mode"


async def test_an_idle_thread_stream_makes_no_store_query_and_is_woken_by_an_admission(
    tmp_path: Path, fresh_mode: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with live_server(make_config(tmp_path, database=f"sqlite:///{tmp_path / 'keel.db'}")) as (server, http):
        assert (await http.post("/threads", json={"thread_id": "t-idle"})).status_code == 200
        store = server.config.app.state.gateway.runtime.store
        calls: list[str] = []
        for name in ("list_runs", "active_runs", "get"):
            def counted(*args: Any, _name: str = name, _real: Any = getattr(store, name), **kwargs: Any) -> Any:
                if "t-idle" in args or kwargs.get("thread_id") == "t-idle":
                    calls.append(_name)
                return _real(*args, **kwargs)

            monkeypatch.setattr(store, name, counted)
        async with http.stream("GET", "/threads/t-idle/stream") as response:
            assert response.status_code == 200
            frames = _sse(response)
            await asyncio.sleep(0.5)  # the join's own first checks
            calls.clear()
            await asyncio.sleep(2.5)  # idle: a polling stream would query ~10 times here
            assert calls == []
            run_id = await _start(http, "t-idle", _run(2, 0.01))
            async with asyncio.timeout(10):  # woken by the admission's announcement, not a poll
                got = await _until_done(frames, run_id)
        assert got[0]["event"] == "metadata" and got[0]["data"]["run_id"] == run_id
        assert calls.count("list_runs") <= 3  # a check per wake-up and per run end, no more
