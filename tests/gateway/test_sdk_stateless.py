"""Stateless runs (``thread_id=None``): ``/runs/stream``, ``/runs/wait``, ``/runs`` and the
temporary thread's fate under ``on_completion``."""

from __future__ import annotations

from typing import Any

import httpx
from langgraph_sdk.errors import NotFoundError
from server_support import KeelServer, collect, events, wait_until


async def _thread_gone(client: Any, thread_id: str) -> None:
    async def gone() -> bool:
        try:
            await client.threads.get(thread_id)
        except NotFoundError:
            return True
        return False

    await wait_until(gone)


async def test_stateless_stream(client: Any, keel_server: KeelServer) -> None:
    created: list[dict[str, Any]] = []
    parts = await collect(
        client.runs.stream(None, "echo", input={"steps": 2, "custom": 1}, stream_mode=["updates", "custom"],
                           on_run_created=created.append)
    )
    assert events(parts) == ["metadata", "custom", "updates", "custom", "updates"]
    assert created == [{"run_id": parts[0].data["run_id"], "thread_id": None}]


async def test_stateless_wait(client: Any) -> None:
    result = await client.runs.wait(None, "echo", input={"steps": 3})
    assert result["done"] == 3 and [m["content"] for m in result["messages"]] == ["step 0", "step 1", "step 2"]
    chat = await client.runs.wait(None, "chat", input={"messages": [{"role": "user", "content": "hi"}]})
    assert chat["messages"][-1]["content"].startswith("Hello from the fake chat model")


async def test_temporary_thread_is_deleted_by_default(client: Any, keel_server: KeelServer) -> None:
    run = await client.runs.create(None, "echo", input={"steps": 1})
    assert run["thread_id"] and run["status"] in ("pending", "running", "success")
    await _thread_gone(client, run["thread_id"])
    async with httpx.AsyncClient(base_url=keel_server.url) as http:
        assert (await http.get(f"/runs/{run['run_id']}")).status_code == 404


async def test_keep_and_rejoin_a_stateless_stream(client: Any, keel_server: KeelServer) -> None:
    created: list[dict[str, Any]] = []
    result = await client.runs.wait(None, "echo", input={"steps": 2}, on_completion="keep", on_run_created=created.append)
    run_id = created[0]["run_id"]
    async with httpx.AsyncClient(base_url=keel_server.url, timeout=10) as http:
        run = (await http.get(f"/runs/{run_id}")).json()
        assert run["status"] == "success"
        assert (await client.threads.get_state(run["thread_id"]))["values"] == result
        assert (await http.get(f"/runs/{run_id}/join")).json() == result
        # the stateless stream's Location (/runs/{id}/stream) replays after Last-Event-ID
        replay = await http.get(f"/runs/{run_id}/stream", headers={"Last-Event-ID": "1-0"})
        assert replay.headers["content-type"].startswith("text/event-stream")
        assert [line for line in replay.text.splitlines() if line.startswith("event:")] == ["event: values"] * 3


async def test_stateless_run_on_a_named_thread(client: Any) -> None:
    tid = (await client.threads.create())["thread_id"]
    await client.runs.wait(None, "echo", input={"steps": 1}, config={"configurable": {"thread_id": tid}})
    assert (await client.threads.get_state(tid))["values"]["done"] == 1  # an existing thread is never deleted


async def test_stateless_stream_location_header(keel_server: KeelServer) -> None:
    async with (
        httpx.AsyncClient(base_url=keel_server.url, timeout=10) as http,
        http.stream("POST", "/runs/stream", json={"assistant_id": "echo", "input": {"steps": 1}}) as response,
    ):
        body = (await response.aread()).decode()
    run_id = response.headers["content-location"].rsplit("/", 1)[1]
    assert response.headers["location"] == f"/runs/{run_id}/stream"
    assert response.headers["content-location"] == f"/runs/{run_id}"
    assert body.count("event: values") == 2


async def test_stateless_interrupt_reports_it(client: Any) -> None:
    body = await client.runs.wait(None, "hitl", input={})
    assert body["__interrupt__"][0]["value"] == {"question": "approve?"}
