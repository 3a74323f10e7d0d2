"""Cancelling runs, stateless runs, and what a run payload may not contain."""

from __future__ import annotations

import uuid

import httpx
import pytest
from test_gateway_runs_support import client, fresh_mode, new_thread, run_status, runtime, wait_until  # noqa: F401

from agentkeel.runtime.runtime import Runtime

SLOW = {"assistant_id": "echo", "input": {"steps": 50, "delay": 0.1}}


async def test_cancel_interrupts_is_idempotent_and_refuses_finished_runs(client: httpx.AsyncClient, runtime: Runtime) -> None:
    tid = await new_thread(runtime)
    run = (await client.post(f"/threads/{tid}/runs", json=SLOW)).json()
    path = f"/threads/{tid}/runs/{run['run_id']}"
    await run_status(runtime, run["run_id"], "running")
    first = await client.post(f"{path}/cancel")
    assert first.status_code == 202 and first.content == b""
    record = await run_status(runtime, run["run_id"], "interrupted")
    assert record.stop_reason == "cancelled"
    assert (await client.post(f"{path}/cancel")).status_code == 202  # cancelling again changes nothing

    done = (await client.post(f"/threads/{tid}/runs/wait", json={"assistant_id": "echo", "input": {"steps": 1, "delay": 0}})).status_code
    assert done == 200
    finished = (await client.get(f"/threads/{tid}/runs")).json()[0]
    refused = await client.post(f"/threads/{tid}/runs/{finished['run_id']}/cancel")
    assert refused.status_code == 409 and "already finished" in refused.json()["detail"]
    assert (await client.post(f"/threads/{tid}/runs/{uuid.uuid4()}/cancel")).status_code == 404


async def test_cancel_with_wait_answers_like_join(client: httpx.AsyncClient, runtime: Runtime) -> None:
    tid = await new_thread(runtime)
    run = (await client.post(f"/threads/{tid}/runs", json=SLOW)).json()
    await run_status(runtime, run["run_id"], "running")
    # Its input is checkpointed (cancelled before that, the thread has no state to answer with).
    await wait_until(lambda: runtime.checkpointer.aget_tuple({"configurable": {"thread_id": tid, "checkpoint_ns": ""}}))
    path = f"/threads/{tid}/runs/{run['run_id']}"
    response = await client.post(f"{path}/cancel", params={"wait": 1, "action": "interrupt", "reason": "user stop"})
    assert response.status_code == 200
    assert response.headers["location"] == f"{path}/join"
    assert response.json() == {"steps": 50, "delay": 0.1, "log": []}  # the node never finished
    record = await runtime.store.get(run["run_id"])
    assert record is not None and record.status.value == "interrupted"
    assert record.stop_reasons[0]["detail"] == "user stop" and record.stop_reasons[0]["source"] == "gateway"


async def test_cancel_rollback_deletes_the_run(client: httpx.AsyncClient, runtime: Runtime) -> None:
    tid = await new_thread(runtime)
    run = (await client.post(f"/threads/{tid}/runs", json=SLOW)).json()
    await run_status(runtime, run["run_id"], "running")
    body = (await client.post(f"/threads/{tid}/runs/{run['run_id']}/cancel", params={"wait": "true", "action": "rollback"})).json()
    assert body["__error__"]["error"] == "RunDeleted"
    assert (await client.get(f"/threads/{tid}/runs/{run['run_id']}")).status_code == 404


async def test_cancel_many(client: httpx.AsyncClient, runtime: Runtime) -> None:
    tid = await new_thread(runtime)
    running = (await client.post(f"/threads/{tid}/runs", json=SLOW)).json()
    queued = (await client.post(f"/threads/{tid}/runs", json=SLOW)).json()
    await run_status(runtime, running["run_id"], "running")
    assert (await client.post("/runs/cancel", json={"thread_id": tid, "run_ids": [queued["run_id"]]})).status_code == 204
    await run_status(runtime, queued["run_id"], "interrupted")
    assert (await client.post("/runs/cancel", json={"status": "running"})).status_code == 204
    await run_status(runtime, running["run_id"], "interrupted")
    nothing = await client.post("/runs/cancel", json={"status": "all"})
    assert nothing.status_code == 404
    both = await client.post("/runs/cancel", json={"status": "all", "thread_id": tid})
    assert both.status_code == 422 and both.json()["field"] == "status"
    assert (await client.post("/runs/cancel", json={})).status_code == 422


async def test_stateless_wait_deletes_its_temporary_thread(client: httpx.AsyncClient, runtime: Runtime) -> None:
    response = await client.post("/runs/wait", json={"assistant_id": "echo", "input": {"steps": 1}})
    assert response.json() == {"steps": 1, "log": ["stepped"]}
    run_path = response.headers["content-location"]
    assert run_path.startswith("/runs/") and response.headers["location"] == f"{run_path}/join"
    run_id = run_path.rsplit("/", 1)[1]

    async def gone() -> bool:
        return await runtime.store.get(run_id) is None

    from test_gateway_runs_support import wait_until

    await wait_until(gone)
    assert await runtime.store.list_threads() == []


async def test_stateless_keep_and_named_thread(client: httpx.AsyncClient, runtime: Runtime) -> None:
    kept = await client.post("/runs", json={"assistant_id": "echo", "input": {}, "on_completion": "keep"})
    run = kept.json()
    assert kept.headers["content-location"] == f"/runs/{run['run_id']}"
    await run_status(runtime, run["run_id"], "success")
    assert (await client.get(f"/runs/{run['run_id']}")).json()["status"] == "success"
    assert await runtime.store.get_thread(run["thread_id"]) is not None

    # a thread the caller names and that already exists is never deleted by a stateless run
    tid = await new_thread(runtime, "mine")
    stream = await client.post(
        "/runs/stream", json={"assistant_id": "echo", "input": {}, "config": {"configurable": {"thread_id": tid}}}
    )
    assert stream.headers["location"].startswith("/runs/") and stream.headers["location"].endswith("/stream")
    run_id = stream.headers["content-location"].rsplit("/", 1)[1]
    await run_status(runtime, run_id, "success")
    assert await runtime.store.get_thread(tid) is not None
    replay = await client.get(f"/runs/{run_id}/stream", headers={"Last-Event-ID": "-1"})
    assert "event: metadata" in replay.text
    assert (await client.get(f"/runs/{run_id}/join")).json() == {"log": ["stepped"]}


async def test_stateless_resume_needs_a_thread(client: httpx.AsyncClient) -> None:
    response = await client.post("/runs", json={"assistant_id": "hitl", "command": {"resume": "yes"}})
    assert response.status_code == 400
    assert response.json() == {"detail": "You must provide a thread_id when resuming.", "field": "command"}


@pytest.mark.parametrize("field, value", [
    ("webhook", "http://example.com/hook"),
    ("feedback_keys", ["score"]),
    ("langsmith_tracer", {"project_name": "p"}),
])
async def test_unsupported_fields_are_refused_naming_the_field(client: httpx.AsyncClient, runtime: Runtime, field: str, value: object) -> None:
    tid = await new_thread(runtime)
    response = await client.post(f"/threads/{tid}/runs", json={"assistant_id": "echo", field: value})
    assert response.status_code == 422
    assert response.json()["field"] == field and field in response.json()["detail"]
    assert await runtime.store.list_runs(tid) == []


async def test_payload_validation(client: httpx.AsyncClient, runtime: Runtime) -> None:
    tid = await new_thread(runtime)
    url = f"/threads/{tid}/runs"
    missing = await client.post(url, json={"input": {}})
    assert missing.status_code == 422 and missing.json()["field"] == "assistant_id"
    bad_mode = await client.post(url, json={"assistant_id": "echo", "stream_mode": "tools"})
    assert bad_mode.status_code == 422 and bad_mode.json()["field"] == "stream_mode"
    bad_strategy = await client.post(url, json={"assistant_id": "echo", "multitask_strategy": "later"})
    assert bad_strategy.status_code == 422 and bad_strategy.json()["field"] == "multitask_strategy"
    both = await client.post(url, json={"assistant_id": "echo", "context": {"a": 1}, "config": {"configurable": {"b": 2}}})
    assert both.status_code == 400 and both.json()["field"] == "context"
    model = await client.post(url, json={"assistant_id": "lead", "context": {"model_name": "gpt-9"}})
    assert model.status_code == 400
    contradiction = await client.post(url, json={"assistant_id": "echo", "checkpoint_during": False, "durability": "sync"})
    assert contradiction.status_code == 422 and contradiction.json()["field"] == "checkpoint_during"
    fork = await client.post(url, json={"assistant_id": "echo", "checkpoint_id": "1f0-none"})
    assert fork.status_code == 404
    assert await runtime.store.list_runs(tid) == []  # nothing refused left a run behind
    tolerated = await client.post(url, json={"assistant_id": "echo", "input": {}, "some_future_field": 1})
    assert tolerated.status_code == 200


async def test_server_owned_keys_never_reach_the_run(client: httpx.AsyncClient, runtime: Runtime) -> None:
    tid = await new_thread(runtime)
    body = {
        "assistant_id": "echo", "input": {}, "checkpoint_during": True,
        "config": {"configurable": {"user_id": "mallory", "__secret": 1, "langgraph_auth_user": "x",
                                    "thread_id": "elsewhere", "flavour": "kept"}},
    }
    run = (await client.post(f"/threads/{tid}/runs", json=body)).json()
    assert run["thread_id"] == tid
    assert run["kwargs"]["durability"] == "async"
    await run_status(runtime, run["run_id"], "success")
    from agentkeel.runtime.checkpoints import checkpoint_config

    saved = await runtime.checkpointer.aget_tuple(checkpoint_config(tid))
    assert saved is not None
    configurable = saved.config["configurable"]
    assert configurable["thread_id"] == tid
    assert "user_id" not in configurable and "__secret" not in configurable
    assert "langgraph_auth_user" not in configurable


async def test_a_malformed_configurable_is_a_422(client: httpx.AsyncClient, runtime: Runtime) -> None:
    tid = await new_thread(runtime)
    response = await client.post(f"/threads/{tid}/runs", json={"assistant_id": "echo", "config": {"configurable": [1]}})
    assert response.status_code == 422 and response.json()["field"] == "config.configurable"
