"""The run resource and run options through the official SDK, and the request errors (400/404/422).

Streams, joins and waits themselves are in ``test_sdk_streams.py`` (run on both backends).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import pytest
from langgraph_sdk.errors import (
    BadRequestError,
    NotFoundError,
    UnprocessableEntityError,
)
from server_support import KeelServer, collect

RUN_KEYS = {"run_id", "thread_id", "assistant_id", "metadata", "status", "kwargs", "multitask_strategy", "created_at", "updated_at"}


async def test_create_get_list(client: Any) -> None:
    tid = (await client.threads.create())["thread_id"]
    created: list[dict[str, Any]] = []
    run = await client.runs.create(tid, "echo", input={"steps": 1}, metadata={"who": "test"},
                                   stream_mode=["updates"], on_run_created=created.append)
    assert RUN_KEYS <= set(run)
    assert created == [{"run_id": run["run_id"], "thread_id": tid}]  # from Content-Location
    assert run["metadata"]["who"] == "test" and run["multitask_strategy"] == "enqueue"
    await client.runs.join(tid, run["run_id"])
    got = await client.runs.get(tid, run["run_id"])
    assert got["status"] == "success" and got["kwargs"]["stream_mode"] == ["updates"]
    assert got["kwargs"]["input"] == {"steps": 1}

    second = await client.runs.create(tid, "broken", input={})
    await client.runs.join(tid, second["run_id"])
    listed = await client.runs.list(tid)
    assert [r["run_id"] for r in listed] == [second["run_id"], run["run_id"]]  # newest first
    assert [r["run_id"] for r in await client.runs.list(tid, status="error")] == [second["run_id"]]
    assert [r["run_id"] for r in await client.runs.list(tid, limit=1, offset=1)] == [run["run_id"]]
    assert all(set(r) == {"run_id", "status"} for r in await client.runs.list(tid, select=["run_id", "status"]))


async def test_options(client: Any) -> None:
    for durability, checkpoints in (("exit", 1), ("sync", 5), ("async", 5)):
        tid = (await client.threads.create())["thread_id"]
        await client.runs.wait(tid, "echo", input={"steps": 3}, durability=durability)
        assert len(await client.threads.get_history(tid, limit=100)) == checkpoints, durability

    tid = (await client.threads.create())["thread_id"]
    begin = time.monotonic()
    delayed = await client.runs.create(tid, "echo", input={"steps": 1}, after_seconds=1)
    assert delayed["status"] == "pending"
    await client.runs.join(tid, delayed["run_id"])
    assert time.monotonic() - begin >= 0.9

    capped = await client.runs.wait(tid, "echo", input={"steps": 10}, config={"recursion_limit": 3}, raise_error=False)
    assert capped["__error__"]["error"] == "GraphRecursionError"
    run = (await client.runs.list(tid, limit=1))[0]
    assert run["status"] == "error" and run["stop_reason"] == "recursion_capped"


async def test_if_not_exists(client: Any) -> None:
    missing = str(uuid.uuid4())
    with pytest.raises(NotFoundError):
        await client.runs.create(missing, "echo", input={})
    with pytest.raises(httpx.HTTPStatusError) as caught:
        await collect(client.runs.stream(missing, "echo", input={}))
    assert caught.value.response.status_code == 404
    with pytest.raises(NotFoundError):
        await client.threads.get(missing)  # a refused run leaves no thread behind
    assert (await client.runs.wait(missing, "echo", input={"steps": 1}, if_not_exists="create"))["done"] == 1
    assert (await client.threads.get(missing))["status"] == "idle"


async def test_request_errors(client: Any, keel_server: KeelServer) -> None:
    tid = (await client.threads.create())["thread_id"]
    # AgentKeel answers 404 for an unknown assistant (the official server answers 422)
    with pytest.raises(NotFoundError):
        await client.runs.create(tid, "no-such-graph", input={})
    with pytest.raises(UnprocessableEntityError):
        await client.runs.create(tid, "echo", input={}, stream_mode="bogus")
    with pytest.raises(UnprocessableEntityError):
        await client.runs.create(tid, "echo", input={}, webhook="http://127.0.0.1:9/hook")  # not supported
    with pytest.raises(BadRequestError):
        await client.runs.create(tid, "echo", input={}, context={"a": 1}, config={"configurable": {"b": 1}})
    async with httpx.AsyncClient(base_url=keel_server.url) as http:
        for body in ({"input": {}}, {"assistant_id": "echo", "multitask_strategy": "bogus"},
                     {"assistant_id": "echo", "durability": "forever"}):
            response = await http.post(f"/threads/{tid}/runs", json=body)
            assert response.status_code == 422, body
            assert isinstance(response.json()["detail"], str)
    assert await client.runs.list(tid) == []  # nothing was admitted

    with pytest.raises(NotFoundError):
        await client.runs.get(tid, str(uuid.uuid4()))
    with pytest.raises(NotFoundError):
        await collect(client.runs.join_stream(tid, str(uuid.uuid4())))
    run = await client.runs.create(tid, "echo", input={"steps": 1})
    other = (await client.threads.create())["thread_id"]
    with pytest.raises(NotFoundError):
        await client.runs.get(other, run["run_id"])  # a run is found only under its own thread
    with pytest.raises(UnprocessableEntityError):
        await collect(client.runs.join_stream(tid, run["run_id"], last_event_id="garbage"))
