"""Health, readiness, info and metrics; how failures are answered; the gateway config section."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from test_gateway_runs_support import client, fresh_mode, new_thread, runtime  # noqa: F401

from agentkeel.config import ConfigError, load_config
from agentkeel.runtime.runtime import Runtime


async def test_health_info_and_readiness(client: httpx.AsyncClient) -> None:
    assert (await client.get("/ok")).json() == {"ok": True}
    assert (await client.get("/healthz")).json() == {"ok": True}
    info = (await client.get("/info")).json()
    assert info["flags"]["assistants"] is True and info["version"]
    ready = await client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"ok": True, "store": "ok", "stream": "ok", "draining": False}


async def test_readiness_fails_when_the_store_does_not_answer(client: httpx.AsyncClient, runtime: Runtime,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    async def down(_thread_id: str) -> None:
        raise ConnectionError("database down")

    monkeypatch.setattr(runtime.store, "get_thread", down)
    ready = await client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["store"] == "unreachable: ConnectionError" and ready.json()["stream"] == "ok"


async def test_metrics_are_prometheus_text(client: httpx.AsyncClient, runtime: Runtime) -> None:
    tid = await new_thread(runtime)
    await client.post(f"/threads/{tid}/runs/stream", json={"assistant_id": "echo", "input": {"steps": 1}})
    response = await client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert "# TYPE agentkeel_runs_created_total counter" in text
    assert "agentkeel_runs_created_total 1" in text
    assert "agentkeel_runs_active 0" in text or "agentkeel_runs_active 1" in text
    assert "agentkeel_stream_events_sent_total 3" in text  # metadata + two values
    assert "agentkeel_streams_open 0" in text


async def test_unexpected_failures_are_a_bare_500(client: httpx.AsyncClient, runtime: Runtime,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(_run_id: str) -> None:
        raise RuntimeError("secret internals")

    monkeypatch.setattr(runtime.store, "get", broken)
    response = await client.get("/threads/t/runs/r")
    assert response.status_code == 500
    assert response.json() == {"detail": "internal error"}


async def test_no_new_runs_while_shutting_down(client: httpx.AsyncClient, runtime: Runtime) -> None:
    tid = await new_thread(runtime)
    await runtime.manager.shutdown(0)
    response = await client.post(f"/threads/{tid}/runs", json={"assistant_id": "echo"})
    assert response.status_code == 503 and "shutting down" in response.json()["detail"]


def test_gateway_config_section(tmp_path: Path) -> None:
    path = tmp_path / "keel.yaml"
    path.write_text("gateway: {end_event: true, drain_s: 3, heartbeat_s: 2, wait_keepalive_s: 1}\n")
    gateway = load_config(path, env={}).gateway
    assert (gateway.end_event, gateway.drain_s, gateway.heartbeat_s, gateway.wait_keepalive_s) == (True, 3, 2, 1)
    assert load_config(None, env={}).gateway.heartbeat_s == 5
    path.write_text("gateway: {heartbeat_s: 30}\n")  # the JS SDK's idle watchdog needs <= 5 s
    with pytest.raises(ConfigError, match="gateway.heartbeat_s"):
        load_config(path, env={})
