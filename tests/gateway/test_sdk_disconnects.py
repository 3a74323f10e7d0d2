"""Clients that go away: ``/wait``, streams and joins under ``on_disconnect`` /
``cancel_on_disconnect``.

``cancel`` must stop the run with stop reason ``client_disconnected``; ``continue`` (the default)
must let it finish. ``/wait`` is driven with raw httpx because the SDK never gives up on a wait:
a short read timeout stands for a client that stops waiting, an explicit close after the first
keep-alive byte for one that leaves mid-body.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from server_support import KeelServer, run_reaches, slow_input

CANCELLABLE = slow_input(steps=100, delay=0.05)  # ~5 s: ends only if cancelled within the test
FINISHES = slow_input(steps=20, delay=0.05)  # ~1 s


async def _leave_wait(http: httpx.AsyncClient, path: str, body: dict[str, Any], how: str) -> str:
    """POST a /wait and go away before the answer; the run id (from Content-Location)."""
    timeout = httpx.Timeout(10, read=0.3) if how == "timeout" else httpx.Timeout(10)
    async with http.stream("POST", path, json=body, timeout=timeout) as response:
        assert response.status_code == 200
        run_id = response.headers["content-location"].rsplit("/", 1)[1]
        if how == "timeout":
            with pytest.raises(httpx.ReadTimeout):
                await response.aread()
        else:
            async for chunk in response.aiter_bytes():
                assert chunk.strip() == b""  # a keep-alive newline: the body has started, no answer yet
                break
    return run_id


@pytest.mark.parametrize("how", ["timeout", "close"])
@pytest.mark.parametrize("on_disconnect", ["cancel", "continue"])
async def test_wait_client_disconnects(client: Any, keel_server: KeelServer, on_disconnect: str, how: str) -> None:
    tid = (await client.threads.create())["thread_id"]
    body = {"assistant_id": "echo", "input": CANCELLABLE if on_disconnect == "cancel" else FINISHES,
            "on_disconnect": on_disconnect}
    async with httpx.AsyncClient(base_url=keel_server.url) as http:
        run_id = await _leave_wait(http, f"/threads/{tid}/runs/wait", body, how)
    if on_disconnect == "cancel":
        run = await run_reaches(client, tid, run_id, "interrupted", "success", "error", timeout=4)
        assert run["status"] == "interrupted" and run["stop_reason"] == "client_disconnected"
    else:
        assert (await client.runs.get(tid, run_id))["status"] in ("pending", "running")
        run = await run_reaches(client, tid, run_id, "success", "interrupted", "error", timeout=15)
        assert run["status"] == "success" and run["stop_reasons"] == []


async def test_stateless_wait_client_disconnects(client: Any, keel_server: KeelServer) -> None:
    async with httpx.AsyncClient(base_url=keel_server.url) as http:
        body = {"assistant_id": "echo", "input": CANCELLABLE, "on_disconnect": "cancel", "on_completion": "keep"}
        run_id = await _leave_wait(http, "/runs/wait", body, "timeout")
        run = (await http.get(f"/runs/{run_id}")).json()
        run = await run_reaches(client, run["thread_id"], run_id, "interrupted", "success", timeout=4)
    assert run["stop_reason"] == "client_disconnected"


@pytest.mark.parametrize("on_disconnect", ["cancel", "continue"])
async def test_stream_client_disconnects(client: Any, on_disconnect: str) -> None:
    tid = (await client.threads.create())["thread_id"]
    stream = client.runs.stream(tid, "echo", input=CANCELLABLE if on_disconnect == "cancel" else FINISHES,
                                stream_mode="custom", on_disconnect=on_disconnect)
    async for part in stream:
        run_id = part.data["run_id"]
        break
    await stream.aclose()
    if on_disconnect == "cancel":
        run = await run_reaches(client, tid, run_id, "interrupted", "success", timeout=4)
        assert run["stop_reason"] == "client_disconnected"
    else:
        run = await run_reaches(client, tid, run_id, "success", "interrupted", timeout=15)
        assert run["status"] == "success"


async def test_join_cancel_on_disconnect(client: Any, keel_server: KeelServer) -> None:
    tid = (await client.threads.create())["thread_id"]
    run_id = (await client.runs.create(tid, "echo", input=CANCELLABLE, stream_mode="custom"))["run_id"]
    joined = client.runs.join_stream(tid, run_id, cancel_on_disconnect=False)
    async for _ in joined:
        break
    await joined.aclose()
    assert (await client.runs.get(tid, run_id))["status"] == "running"  # the default leaves it running

    joined = client.runs.join_stream(tid, run_id, cancel_on_disconnect=True)
    async for _ in joined:
        break
    await joined.aclose()
    run = await run_reaches(client, tid, run_id, "interrupted", "success", timeout=4)
    assert run["stop_reason"] == "client_disconnected"

    # the same through /join (the non-streaming join)
    run_id = (await client.runs.create(tid, "echo", input=CANCELLABLE))["run_id"]
    async with httpx.AsyncClient(base_url=keel_server.url) as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.get(f"/threads/{tid}/runs/{run_id}/join", params={"cancel_on_disconnect": "true"},
                           timeout=httpx.Timeout(10, read=0.3))
    run = await run_reaches(client, tid, run_id, "interrupted", "success", timeout=4)
    assert run["stop_reason"] == "client_disconnected"
