"""``keel serve`` with provider models, end to end: a real server process calling the stubs through
``langchain-openai`` / ``langchain-anthropic``, driven by the official ``langgraph_sdk`` client.

Each test scripts the stub, runs on a fresh thread (the model picked by ``context.model_name``) and
checks what the provider received (``/_requests``) against what the run resource and its journal
say: tokens counted exactly, the budget binding on a streamed run, one retry layer with visible
retries, no retry of what cannot succeed, stalled calls abandoned.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from keel_support import (
    PROMPT,
    STUB_KEY_ENV,
    UNSET_KEY_ENV,
    first_user_message,
    journal,
    messages_of,
    retries,
    run_streamed,
    tool_task,
    workspace,
    write_call,
)
from provider_support import StubServer
from server_support import KeelServer, sdk

pytestmark = pytest.mark.asyncio(loop_scope="session")

def stub_for(request: pytest.FixtureRequest, model: str) -> StubServer:
    return request.getfixturevalue("openai_stub" if model == "gpt" else "anthropic_stub")


@pytest.mark.parametrize("model", ["gpt", "claude"])
async def test_a_streamed_tool_task_completes_with_the_providers_exact_usage(
        keel_provider_server: KeelServer, request: pytest.FixtureRequest, model: str) -> None:
    stub = stub_for(request, model)
    expected = tool_task(stub)
    run, parts = await run_streamed(keel_provider_server, model)
    assert run["status"] == "success", run
    assert (run["usage"]["input_tokens"], run["usage"]["output_tokens"]) == (expected["input"], expected["output"])
    assert stub.served_usage() == expected
    note = workspace(keel_provider_server.config, run["thread_id"]) / "outputs" / "note.md"
    assert note.read_text() == "hello from a provider\n"
    assert any(p.event == "messages" for p in parts), "no token stream reached the client"
    bodies = stub.bodies()
    assert len(bodies) == 2 and all(b.get("stream") is True for b in bodies) and stub.violations() == []
    if model == "gpt":
        assert all(b["stream_options"] == {"include_usage": True} for b in bodies)
        assert all(b["top_p"] == 0.9 for b in bodies)  # models[].options reach the provider


async def test_a_streamed_run_counts_tokens_exactly_and_stops_at_the_token_budget(
        keel_provider_server: KeelServer, openai_stub: StubServer) -> None:
    openai_stub.script(*[
        {"text": f"Step {i}.", "tool_calls": [write_call(f"/workspace/outputs/part{i}.md", f"part {i}\n")],
         "usage": {"input": 300, "output": 100}}
        for i in range(6)
    ])
    run, _ = await run_streamed(keel_provider_server, "gpt", modes=("messages-tuple",))
    served = openai_stub.served_usage()
    assert run["stop_reason"] == "token_capped", run
    assert run["usage"]["total_tokens"] == served["input"] + served["output"] >= 1000
    # 400 tokens a call against a budget of 1000: the third call's tool calls are withheld, and one
    # tool-less call (TerminalResponse) asks for the final answer.
    bodies = openai_stub.bodies()
    assert len(bodies) == 4 and "tools" not in bodies[3] and all("tools" in b for b in bodies[:3])
    assert not (workspace(keel_provider_server.config, run["thread_id"]) / "outputs" / "part2.md").exists()


async def test_a_provider_that_reports_no_usage_is_estimated_and_marked(
        keel_provider_server: KeelServer, openai_stub: StubServer) -> None:
    openai_stub.script({"text": "An answer whose usage the server never reports.", "no_usage": True})
    run, _ = await run_streamed(keel_provider_server, "gpt")
    assert run["status"] == "success" and run["usage"]["total_tokens"] > 0
    [call] = [e["data"] for e in await journal(keel_provider_server, run, "model.call")]
    assert call.get("estimated") is True


async def test_a_persistent_429_makes_exactly_max_attempts_requests_each_retry_journaled(
        keel_provider_server: KeelServer, openai_stub: StubServer) -> None:
    openai_stub.script({"error": "rate_limit", "retry_after": 0.3},
                       {"error": "rate_limit", "retry_after": 30, "repeat": True})
    run, _ = await run_streamed(keel_provider_server, "gpt")
    received = openai_stub.requests()
    assert len(received) == 3 and [r["answered"]["status"] for r in received] == [429, 429, 429]
    assert run["status"] == "error" and "gpt" in run["error"] and "3 attempts" in run["error"]
    first, second = retries(await journal(keel_provider_server, run))
    assert (first["attempt"], first["status"], first["wait_ms"], first["capped"]) == (1, 429, 300, False)
    assert (second["attempt"], second["wait_ms"], second["requested_wait_ms"], second["capped"]) == (2, 400, 30000, True)
    gaps = [b["at"] - a["at"] for a, b in zip(received, received[1:], strict=False)]
    assert 0.3 <= gaps[0] < 10 and 0.4 <= gaps[1] < 10  # Retry-After honoured, the 30 s one capped


@pytest.mark.parametrize(("model", "preset", "kind"), [
    ("gpt", "auth", "auth"),
    ("gpt", "insufficient_quota", "quota"),
    ("gpt", "invalid_request", "invalid_request"),
    ("gpt", "context_length", "context_length"),
    ("claude", "auth", "auth"),
    ("claude", "context_length", "context_length"),
])
async def test_an_error_no_retry_can_fix_is_sent_once_and_named(
        keel_provider_server: KeelServer, request: pytest.FixtureRequest, model: str, preset: str, kind: str) -> None:
    stub = stub_for(request, model)
    stub.script({"error": preset, "repeat": True})
    run, _ = await run_streamed(keel_provider_server, model)
    assert len(stub.requests()) == 1
    assert run["status"] == "error" and f"'{model}'" in run["error"], run
    assert run["error_detail"]["kind"] == kind and run["error_detail"]["model"] == model
    if kind == "auth":
        assert STUB_KEY_ENV in run["error"] and run["error_detail"]["key_env"] == STUB_KEY_ENV
    assert retries(await journal(keel_provider_server, run)) == []


@pytest.mark.parametrize(("model", "stall"), [
    ("gpt", {"text": "a stalled stream", "stall_s": 12, "stall_after": 1}),  # headers sent, then nothing
    ("claude", {"text": "a late answer", "delay_s": 12}),  # no headers at all
])
async def test_a_stalled_call_is_abandoned_after_timeout_s_and_retried(
        keel_provider_server: KeelServer, request: pytest.FixtureRequest, model: str, stall: dict[str, Any]) -> None:
    stub = stub_for(request, model)
    stub.script(stall, {"text": "The answer, on time."})
    run, _ = await run_streamed(keel_provider_server, model)
    assert run["status"] == "success" and len(stub.requests()) == 2, run
    [retry] = retries(await journal(keel_provider_server, run))
    assert retry["reason"] == "timeout" and retry["attempt"] == 1
    received = stub.requests()
    assert 1.5 <= received[1]["at"] - received[0]["at"] < 10  # models[].timeout_s is 2 s; the stall is 12 s


async def test_unusable_models_are_refused_before_admission_and_threads_still_work(
        keel_provider_server: KeelServer, openai_stub: StubServer) -> None:
    output = keel_provider_server.output()
    assert "nokey" in output and UNSET_KEY_ENV in output and "nosuchprovider" in output  # one line each
    async with httpx.AsyncClient(base_url=keel_provider_server.url) as http:
        thread = (await http.post("/threads", json={})).json()["thread_id"]  # lead's default model: nokey
        for model, named in (("nokey", UNSET_KEY_ENV), ("bogus", "nosuchprovider")):
            refused = await http.post(f"/threads/{thread}/runs", json={
                "assistant_id": "lead", "input": PROMPT, "context": {"model_name": model}})
            assert refused.status_code == 422 and model in refused.text and named in refused.text, refused.text
        default = await http.post(f"/threads/{thread}/runs", json={"assistant_id": "lead", "input": PROMPT})
        assert default.status_code == 422 and "nokey" in default.text
        assert (await http.get(f"/threads/{thread}/runs")).json() == []
        state = await http.get(f"/threads/{thread}/state")
        assert state.status_code == 200, state.text
        assert (await http.post("/threads/search", json={})).status_code == 200
        history = await http.post(f"/threads/{thread}/history", json={})
        assert history.status_code == 200, history.text
    assert openai_stub.requests() == []


async def two_runs(server: KeelServer, stub: StubServer, first: list[dict[str, Any]],
                   second: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two runs on one thread, each with its own scripted answers."""
    thread = f"thread-{uuid.uuid4().hex[:8]}"
    async with sdk(server.url) as client:
        await client.threads.create(thread_id=thread)
    stub.script(*first)
    run1, _ = await run_streamed(server, "gpt", thread_id=thread)
    stub.script(*second)
    run2, _ = await run_streamed(server, "gpt", thread_id=thread,
                                 prompt={"messages": [{"role": "user", "content": "And again."}]})
    return run1, run2


async def test_the_provider_never_gets_an_empty_assistant_message(
        keel_provider_server: KeelServer, openai_stub: StubServer) -> None:
    # The first run's model goes quiet (no text, no calls); the thread keeps that message.
    _, second = await two_runs(keel_provider_server, openai_stub, [{"text": "", "repeat": True}],
                               [{"text": "The second answer."}])
    assert second["status"] == "success", (second["error"], openai_stub.violations())
    assert openai_stub.violations() == []
    for body in openai_stub.bodies():
        for message in messages_of(body):
            if message["role"] == "assistant":
                assert message.get("content") or message.get("tool_calls"), message


async def test_the_threads_first_user_message_is_sent_identically_in_every_run(
        keel_provider_server: KeelServer, openai_stub: StubServer) -> None:
    first, second = await two_runs(keel_provider_server, openai_stub, [{"text": "The first answer."}],
                                   [{"text": "The second answer."}])
    assert first["status"] == second["status"] == "success"
    bodies = openai_stub.bodies()
    assert len(bodies) == 2 and openai_stub.violations() == []
    assert first_user_message(bodies[0]) == first_user_message(bodies[1])  # prompt-cache stable
