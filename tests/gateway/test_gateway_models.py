"""A provider model that is unusable here (key unset, package missing) over HTTP: threads are still
created and read, its runs are refused with 422 before admission, the other models keep working."""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from test_gateway_runs_support import fresh_mode, make_config  # noqa: F401

from agentkeel.gateway.app import create_app
from agentkeel.runtime.runtime import Runtime, open_runtime
from agentkeel.runtime.stores.assistants import system_assistant_id

MODELS = [
    {"name": "fast", "use": "scripted", "script": "script.yaml"},
    {"name": "gpt", "use": "openai:gpt-4.1-mini", "api_key_env": "KEEL_TEST_MISSING_KEY",
     "base_url": "http://127.0.0.1:9/v1"},
    {"name": "groq", "use": "groq:llama-3.3-70b", "api_key_env": "KEEL_TEST_MISSING_KEY"},
]


@pytest.fixture
async def runtime(tmp_path: Path, fresh_mode: None, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Runtime]:  # noqa: F811
    monkeypatch.delenv("KEEL_TEST_MISSING_KEY", raising=False)
    config = make_config(
        tmp_path, models=MODELS,
        assistants=[{"assistant_id": "lead", "model": "gpt"}, {"assistant_id": "other", "model": "groq"}],
    )
    async with open_runtime(config) as rt:  # unusable models do not stop start-up
        yield rt


@pytest.fixture
async def http(runtime: Runtime) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(runtime), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=20) as client:
        yield client


async def test_threads_are_created_and_read_while_the_assistants_model_has_no_key(http: httpx.AsyncClient) -> None:
    thread = (await http.post("/threads", json={"metadata": {"graph_id": "lead"}})).json()
    tid = thread["thread_id"]
    state = await http.get(f"/threads/{tid}/state")
    assert state.status_code == 200, state.text
    assert state.json()["values"] == {}
    update = await http.post(f"/threads/{tid}/state", json={"values": {"messages": [{"role": "user", "content": "hi"}]}})
    assert update.status_code == 200, update.text
    history = await http.post(f"/threads/{tid}/history", json={"limit": 5})
    assert history.status_code == 200, history.text
    assert history.json()[0]["values"]["messages"][0]["content"] == "hi"
    schemas = await http.get(f"/assistants/{system_assistant_id('lead')}/schemas")  # built from the same graph
    assert schemas.status_code == 200, schemas.text


@pytest.mark.skipif(importlib.util.find_spec("langchain_groq") is not None, reason="langchain-groq is installed here")
async def test_a_run_for_an_unusable_model_is_refused_with_422_and_leaves_no_run(
    http: httpx.AsyncClient, runtime: Runtime,
) -> None:
    tid = (await http.post("/threads", json={})).json()["thread_id"]
    refused = await http.post(f"/threads/{tid}/runs", json={"assistant_id": "lead", "input": {"messages": []}})
    assert refused.status_code == 422, refused.text
    body = refused.json()
    assert body["field"] == "assistant_id"
    assert body["detail"] == (
        "model 'gpt' cannot be used: environment variable KEEL_TEST_MISSING_KEY (the API key) is not set"
    )
    chosen = await http.post("/runs/wait", json={"assistant_id": "lead", "input": {"messages": []},
                                                 "context": {"model_name": "groq"}})
    assert chosen.status_code == 422 and chosen.json()["field"] == "context.model_name"
    assert "langchain-groq package: pip install langchain-groq" in chosen.json()["detail"]
    assert "KEEL_TEST_MISSING_KEY" in chosen.json()["detail"]  # every problem, not the first only
    other = await http.post(f"/threads/{tid}/runs/stream", json={"assistant_id": "other", "input": {"messages": []}})
    assert other.status_code == 422 and "model 'groq'" in other.json()["detail"]
    assert (await http.get(f"/threads/{tid}/runs")).json() == []
    assert await runtime.store.list_runs(limit=10) == []  # never admitted, in any route

    # The scripted model of the same server is unaffected.
    done = await http.post(f"/threads/{tid}/runs/wait", json={
        "assistant_id": "lead", "input": {"messages": [{"role": "user", "content": "go"}]},
        "context": {"model_name": "fast"},
    })
    assert done.status_code == 200, done.text
    assert done.json()["messages"][-1]["content"] == "All done."
    assert [r["status"] for r in (await http.get(f"/threads/{tid}/runs")).json()] == ["success"]
