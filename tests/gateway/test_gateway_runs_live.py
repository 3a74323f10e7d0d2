"""Live streaming against a real server: heartbeats, keep-alives, disconnects, shutdown drain."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import yaml
from test_gateway_runs_support import fresh_mode, live_server, make_config, parse_sse, wait_until  # noqa: F401

from agentkeel.runtime.records import RunStatus

SLOW = {"assistant_id": "echo", "input": {"steps": 40, "delay": 0.1}, "if_not_exists": "create",
        "stream_mode": ["values", "custom"]}


async def _status(http: httpx.AsyncClient, tid: str, run_id: str) -> str:
    return (await http.get(f"/threads/{tid}/runs/{run_id}")).json()["status"]


async def _first_frame(lines: AsyncIterator[str]) -> str:
    async for line in lines:
        if line.startswith("event:"):
            return line
    raise AssertionError("the stream ended without an event")


async def test_disconnect_cancels_only_when_asked(tmp_path: Path, fresh_mode: None) -> None:
    async with live_server(make_config(tmp_path)) as (server, http):
        runs = {}
        for tid, on_disconnect in (("t-cancel", "cancel"), ("t-continue", "continue")):
            async with http.stream("POST", f"/threads/{tid}/runs/stream",
                                   json={**SLOW, "on_disconnect": on_disconnect}) as response:
                assert await _first_frame(response.aiter_lines()) == "event: metadata"
                runs[tid] = response.headers["content-location"].rsplit("/", 1)[1]
        gw = server._app.state.gateway

        async def interrupted() -> bool:
            return await _status(http, "t-cancel", runs["t-cancel"]) == "interrupted"

        await wait_until(interrupted)
        record = await gw.runtime.store.get(runs["t-cancel"])
        assert record.stop_reason == "client_disconnected"
        assert await _status(http, "t-continue", runs["t-continue"]) == "running"
        # a join that asks for it cancels on disconnect too
        async with http.stream("GET", f"/threads/t-continue/runs/{runs['t-continue']}/stream",
                               params={"cancel_on_disconnect": "true", "stream_mode": "custom"}) as response:
            assert await _first_frame(response.aiter_lines()) == "event: custom"

        async def joined_cancel() -> bool:
            return await _status(http, "t-continue", runs["t-continue"]) == "interrupted"

        await wait_until(joined_cancel)


async def test_heartbeats_keepalives_and_end_event(tmp_path: Path, fresh_mode: None) -> None:
    config = make_config(tmp_path, gateway={"end_event": True})
    quiet = {"assistant_id": "echo", "input": {"steps": 1, "delay": 1.0}, "if_not_exists": "create"}
    async with live_server(config) as (_server, http):
        response = await http.post("/threads/t-1/runs/stream", json=quiet)
        frames = parse_sse(response.text)
        assert {"comment": "heartbeat"} in frames  # heartbeat_s=0.3 during a 1 s quiet step
        assert frames[-1] == {"event": "end", "data": None}
        waited = await http.post("/threads/t-1/runs/wait", json={**quiet, "if_not_exists": "reject"})
        assert waited.text.startswith("\n")  # wait_keepalive_s=0.2 while the run works
        assert waited.json() == {"steps": 1, "delay": 1.0, "log": ["stepped", "stepped"]}
        metrics = (await http.get("/metrics")).text  # this gateway owns its runtime: it counts ends
        assert 'agentkeel_runs_finished_total{status="success",stop_reason="none"} 2.0' in metrics


async def test_wait_disconnect_cancels_with_on_disconnect_cancel(tmp_path: Path, fresh_mode: None) -> None:
    async with live_server(make_config(tmp_path)) as (server, http):
        async with http.stream("POST", "/threads/t-w/runs/wait", json={**SLOW, "on_disconnect": "cancel"}) as response:
            run_id = response.headers["content-location"].rsplit("/", 1)[1]
            async for chunk in response.aiter_bytes():
                assert chunk.strip() == b""  # a keep-alive: the run is still going
                break
        gw = server._app.state.gateway

        async def stopped() -> bool:
            record = await gw.runtime.store.get(run_id)
            return record.status is RunStatus.interrupted

        await wait_until(stopped)
        assert (await gw.runtime.store.get(run_id)).stop_reason == "client_disconnected"


async def test_drain_finishes_streams_with_their_end(tmp_path: Path, fresh_mode: None) -> None:
    config = make_config(tmp_path, gateway={"drain_s": 0.3})
    async with live_server(config) as (server, http):
        async with http.stream("POST", "/threads/t-d/runs/stream", json=SLOW) as response:
            run_id = response.headers["content-location"].rsplit("/", 1)[1]
            lines = response.aiter_lines()
            assert await _first_frame(lines) == "event: metadata"
            server.handle_exit(signal.SIGTERM, None)
            rest = [line async for line in lines]  # until the server closes the stream
        assert "event: custom" in rest
        gw = server._app.state.gateway
        record = await gw.runtime.store.get(run_id)
        assert record.status is RunStatus.interrupted and record.stop_reason == "cancelled"
        assert gw.draining


def test_keel_serve_prints_url_drains_on_sigterm_and_exits_0(tmp_path: Path) -> None:
    """A second signal cuts a long drain short; the run is still finalized, the exit still 0."""
    config = make_config(tmp_path, gateway={"drain_s": 60}, database=f"sqlite:///{tmp_path / 'keel.db'}")
    path = tmp_path / "keel.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    process = subprocess.Popen(
        [sys.executable, "-m", "agentkeel.cli", "serve", "--config", str(path), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "AGENTKEEL_CONFIG": ""},
    )
    try:
        line = process.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("AgentKeel gateway listening on http://127.0.0.1:"), line + process.stderr.read()  # type: ignore[union-attr]
        url = line.rsplit(" ", 1)[1].strip()
        with httpx.Client(base_url=url, timeout=20) as http:
            assert http.get("/readyz").json()["ok"] is True
            run = http.post("/threads/t-s/runs", json=SLOW).json()
            deadline = time.monotonic() + 10
            while http.get(f"/threads/t-s/runs/{run['run_id']}").json()["status"] != "running":
                assert time.monotonic() < deadline
                time.sleep(0.05)
            process.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            assert http.get("/readyz").status_code == 503  # draining: the balancer stops sending
            assert http.post("/threads/t-s/runs", json=SLOW).status_code == 503
            process.send_signal(signal.SIGINT)
            assert process.wait(timeout=20) == 0, process.stderr.read()  # type: ignore[union-attr]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    asyncio.run(_assert_interrupted(config, run["run_id"]))


async def _assert_interrupted(config, run_id: str) -> None:
    from agentkeel.runtime.connections import open_connections
    from agentkeel.runtime.stores.factory import open_stores

    async with open_connections(config.db) as connections:
        record = await (await open_stores(connections)).runs.get(run_id)
        assert record is not None and record.status is RunStatus.interrupted
        assert record.stop_reason == "cancelled"
