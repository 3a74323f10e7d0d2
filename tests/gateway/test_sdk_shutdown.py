"""SIGTERM while runs stream: the server drains, ends every stream and wait honestly, exits 0.

A run that finishes within ``gateway.drain_s`` finishes; one that does not is interrupted with a
stop reason, and its clients get the end of the stream (or the /wait body) instead of a dropped
connection. A restarted server on the same SQLite database reads the same verdict.

The streams are read with raw httpx: after a clean close the SDK asks the (now stopping) server
for the run's status and would retry for ~15 s, which says nothing about the server.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

import httpx
from server_support import collect, sdk, start_server, write_project

DRAIN_S = 2.0
EXIT_BOUND_S = DRAIN_S + 3.0  # drain, finalize, close connections, exit
LONG = {"steps": 200, "delay": 0.05, "custom": 1}  # ~10 s: outlives the drain
SHORT = {"steps": 10, "delay": 0.05, "custom": 1}  # ~0.5 s: finishes within it


async def _read_sse(http: httpx.AsyncClient, path: str, body: dict[str, Any], started: asyncio.Event) -> dict[str, Any]:
    """Stream a run to its end; frames seen and whether the body ended cleanly."""
    frames: list[tuple[str, Any]] = []
    event = None
    async with http.stream("POST", path, json=body) as response:
        run_id = response.headers["content-location"].rsplit("/", 1)[1]
        try:
            async for line in response.aiter_lines():
                if line.startswith("event:"):
                    event = line.partition(":")[2].strip()
                elif line.startswith("data:") and event is not None:
                    frames.append((event, json.loads(line.partition(":")[2])))
                    if sum(1 for name, _ in frames if name == "custom") == 2:
                        started.set()
            clean = True
        except httpx.HTTPError:
            clean = False
    return {"run_id": run_id, "frames": frames, "clean": clean}


async def test_sigterm_drains_and_exits_zero(tmp_path: Path) -> None:
    config = write_project(tmp_path, gateway={"drain_s": DRAIN_S})
    server = start_server(config)
    try:
        async with sdk(server.url) as client, httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            long_tid = (await client.threads.create())["thread_id"]
            short_tid = (await client.threads.create())["thread_id"]
            wait_tid = (await client.threads.create())["thread_id"]
            started = [asyncio.Event(), asyncio.Event()]
            long_stream = asyncio.ensure_future(_read_sse(
                http, f"/threads/{long_tid}/runs/stream",
                {"assistant_id": "echo", "input": LONG, "stream_mode": ["custom", "values"]}, started[0]))
            short_stream = asyncio.ensure_future(_read_sse(
                http, f"/threads/{short_tid}/runs/stream",
                {"assistant_id": "echo", "input": SHORT, "stream_mode": ["custom", "values"]}, started[1]))
            waiter = asyncio.ensure_future(http.post(
                f"/threads/{wait_tid}/runs/wait", json={"assistant_id": "echo", "input": LONG}))
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 20)

            signalled = time.monotonic()
            server.signal(signal.SIGTERM)
            await asyncio.sleep(0.3)
            ready = await http.get("/readyz")
            assert ready.status_code == 503 and ready.json()["draining"] is True
            refused = await http.post(f"/threads/{short_tid}/runs", json={"assistant_id": "echo", "input": {}})
            assert refused.status_code == 503

            long_result, short_result = await asyncio.wait_for(asyncio.gather(long_stream, short_stream), EXIT_BOUND_S + 5)
            waited = await asyncio.wait_for(waiter, EXIT_BOUND_S + 5)
        returncode = await asyncio.to_thread(server.wait, EXIT_BOUND_S + 5)
        elapsed = time.monotonic() - signalled
    finally:
        server.stop()
    assert returncode == 0, server.output()
    assert elapsed < EXIT_BOUND_S, f"exit took {elapsed:.1f} s"
    assert long_result["clean"] and short_result["clean"]  # both streams ended, neither was dropped
    stops = [data for name, data in long_result["frames"] if name == "stop_reason"]
    assert [s["code"] for s in stops] == ["cancelled"]  # the stream told why the run stopped
    assert not any(name == "stop_reason" for name, _ in short_result["frames"])
    print(f"SIGTERM to exit: {elapsed:.2f} s (drain_s {DRAIN_S:g})")
    assert waited.status_code == 200 and waited.json()["done"] >= 1  # the /wait was answered

    restarted = start_server(config)
    try:
        async with sdk(restarted.url) as client:
            long_run = await client.runs.get(long_tid, long_result["run_id"])
            assert long_run["status"] == "interrupted"
            assert long_run["stop_reason"] == "cancelled"
            assert "shut down" in long_run["stop_reasons"][0]["detail"]
            assert (await client.threads.get(long_tid))["status"] == "interrupted"
            assert (await client.runs.list(wait_tid))[0]["status"] == "interrupted"
            short_run = await client.runs.get(short_tid, short_result["run_id"])
            assert short_run["status"] == "success" and short_run["stop_reasons"] == []
            # the long run's stream is over: a join from the start ends instead of waiting
            await collect(client.runs.join_stream(long_tid, long_result["run_id"], last_event_id="-1"), timeout=10)
            done = (await client.threads.get_state(long_tid))["values"]["done"]
            assert 0 < done < LONG["steps"]
    finally:
        assert restarted.stop() == 0
