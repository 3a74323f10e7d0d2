"""The provider stubs themselves, driven through the real ``langchain-openai`` and
``langchain-anthropic`` packages over HTTP: if these pass, a test of AgentKeel against a stub sees
what the provider package would see against the real API (streams, tool-call deltas, usage, each
error as the SDK's own exception type, strict request validation)."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import openai
import pytest
from langchain_anthropic import ChatAnthropic
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from provider_support import STUB_KEY, StubServer

# langchain-openai caches one httpx client per base URL across model instances: its pooled
# connections belong to the loop that opened them, so these tests share the session's loop.
pytestmark = pytest.mark.asyncio(loop_scope="session")


@tool
def write_file(path: str, content: str) -> str:
    """Write a file."""
    return "written"


def gpt(stub: StubServer, **kwargs: Any) -> ChatOpenAI:
    return ChatOpenAI(model="gpt-4.1-mini", base_url=stub.base_url, api_key=STUB_KEY, max_retries=0,
                      **{"stream_usage": True, **kwargs})


def claude(stub: StubServer, **kwargs: Any) -> ChatAnthropic:
    return ChatAnthropic(model="claude-sonnet-4-5", base_url=stub.base_url, api_key=STUB_KEY, max_retries=0,
                         **kwargs)


async def streamed(model: Any, messages: Any) -> tuple[AIMessageChunk, list[AIMessageChunk]]:
    chunks = [chunk async for chunk in model.astream(messages)]
    total = chunks[0]
    for chunk in chunks[1:]:
        total = total + chunk
    return total, chunks


ARGS = {"path": "/workspace/a.md", "content": "hello there"}


# -- OpenAI-compatible ------------------------------------------------------------------------------
async def test_openai_plain_answer_carries_usage(openai_stub: StubServer) -> None:
    openai_stub.script({"text": "Hello!", "usage": {"input": 11, "output": 3}})
    answer = await gpt(openai_stub).ainvoke("hi")
    assert answer.content == "Hello!"
    assert answer.usage_metadata and (answer.usage_metadata["input_tokens"], answer.usage_metadata["output_tokens"]) == (11, 3)
    [request] = openai_stub.requests()
    assert request["headers"]["authorization"] == f"Bearer {STUB_KEY}" and request["body"].get("stream") is not True
    assert request["violations"] == []


async def test_openai_stream_sends_usage_only_when_asked(openai_stub: StubServer) -> None:
    openai_stub.script({"text": "one two three", "chunks": 3, "usage": {"input": 40, "output": 7}},
                       {"text": "again", "usage": {"input": 40, "output": 7}})
    total, chunks = await streamed(gpt(openai_stub), "hi")
    assert total.content == "one two three" and sum(1 for c in chunks if c.content) == 3
    assert total.usage_metadata and total.usage_metadata["total_tokens"] == 47
    assert openai_stub.bodies()[0]["stream_options"] == {"include_usage": True}

    total, _ = await streamed(gpt(openai_stub, stream_usage=False), "hi")
    assert total.content == "again" and not total.usage_metadata  # no include_usage: no usage chunk
    assert "stream_options" not in openai_stub.bodies()[1]


async def test_openai_no_usage_step_reports_none_even_when_asked(openai_stub: StubServer) -> None:
    openai_stub.script({"text": "quiet", "no_usage": True}, {"text": "quiet", "no_usage": True})
    total, _ = await streamed(gpt(openai_stub), "hi")
    assert total.content == "quiet" and not total.usage_metadata
    assert not (await gpt(openai_stub).ainvoke("hi")).usage_metadata
    assert openai_stub.served_usage() == {"input": 0, "output": 0}


async def test_openai_tool_call_deltas_are_reassembled(openai_stub: StubServer) -> None:
    openai_stub.script({"text": "Writing.", "tool_calls": [{"name": "write_file", "arguments": ARGS, "id": "call_w"}],
                        "arg_chunks": 4, "usage": {"input": 30, "output": 9}})
    total, chunks = await streamed(gpt(openai_stub).bind_tools([write_file]), "write it")
    assert total.tool_calls == [{"name": "write_file", "args": ARGS, "id": "call_w", "type": "tool_call"}]
    assert sum(1 for c in chunks for t in c.tool_call_chunks if t.get("args")) == 4
    assert total.response_metadata["finish_reason"] == "tool_calls"
    assert openai_stub.bodies()[0]["tools"][0]["function"]["name"] == "write_file"


async def test_openai_raw_malformed_arguments_reach_the_client_as_sent(openai_stub: StubServer) -> None:
    raw = '{"path": "/workspace/a.md", "content": "hel'
    openai_stub.script({"tool_calls": [{"name": "write_file", "arguments": raw}]})
    answer = await gpt(openai_stub).bind_tools([write_file]).ainvoke("write it")
    assert answer.invalid_tool_calls and answer.invalid_tool_calls[0]["args"] == raw and not answer.tool_calls


@pytest.mark.parametrize("finish", ["stop", "length", "tool_calls", "content_filter"])
async def test_openai_every_finish_reason(openai_stub: StubServer, finish: str) -> None:
    calls = [{"name": "write_file", "arguments": ARGS}] if finish == "tool_calls" else []
    openai_stub.script({"text": "partial", "finish": finish, "tool_calls": calls},
                       {"text": "partial", "finish": finish, "tool_calls": calls})
    assert (await gpt(openai_stub).ainvoke("hi")).response_metadata["finish_reason"] == finish
    total, _ = await streamed(gpt(openai_stub), "hi")
    assert total.response_metadata["finish_reason"] == finish


@pytest.mark.parametrize(("preset", "error", "status", "code"), [
    ("rate_limit", openai.RateLimitError, 429, "rate_limit_exceeded"),
    ("insufficient_quota", openai.RateLimitError, 429, "insufficient_quota"),
    ("server", openai.InternalServerError, 500, None),
    ("auth", openai.AuthenticationError, 401, "invalid_api_key"),
    ("invalid_request", openai.BadRequestError, 400, None),
    ("context_length", openai.BadRequestError, 400, "context_length_exceeded"),
])
async def test_openai_errors_raise_the_sdk_exception(openai_stub: StubServer, preset: str, error: type[Exception],
                                                     status: int, code: str | None) -> None:
    openai_stub.script({"error": preset, "retry_after": 2})
    with pytest.raises(error) as raised:
        await gpt(openai_stub).ainvoke("hi")
    exc = raised.value
    assert isinstance(exc, openai.APIStatusError) and exc.status_code == status and exc.code == code
    assert exc.response.headers["retry-after"] == "2" and exc.response.headers["retry-after-ms"] == "2000"
    assert len(openai_stub.requests()) == 1  # max_retries=0: the SDK did not retry


async def test_openai_repeat_step_answers_every_request(openai_stub: StubServer) -> None:
    openai_stub.script({"error": "rate_limit", "repeat": True})
    for _ in range(3):
        with pytest.raises(openai.RateLimitError):
            await gpt(openai_stub).ainvoke("hi")
    assert [r["answered"]["status"] for r in openai_stub.requests()] == [429, 429, 429]
    openai_stub.reset()
    assert (await gpt(openai_stub).ainvoke("hi")).content == "ok"  # the default answer


async def test_match_steps_answer_only_the_requests_that_contain_their_text(openai_stub: StubServer) -> None:
    # The run's own turns play in order; a summary call, whenever it comes, gets the match step.
    openai_stub.script({"match": "Summarise the conversation", "text": "SUMMARY", "repeat": True},
                       {"text": "first"}, {"match": "Ünïcode \"quoted\"", "text": "escaped"}, {"text": "second"})
    model = gpt(openai_stub)
    assert (await model.ainvoke("hi")).content == "first"
    assert (await model.ainvoke("Summarise the conversation so far")).content == "SUMMARY"
    assert (await model.ainvoke('say Ünïcode "quoted" back')).content == "escaped"  # JSON escaping is no obstacle
    assert (await model.ainvoke("hi")).content == "second"
    assert (await model.ainvoke("Please Summarise the conversation")).content == "SUMMARY"  # repeat: still queued
    assert (await model.ainvoke("hi")).content == "ok"  # only the match step is left: the default answer
    assert [r["step"].get("match") for r in openai_stub.requests()] == [
        None, "Summarise the conversation", 'Ünïcode "quoted"', None, "Summarise the conversation", None]
    with pytest.raises(httpx.HTTPStatusError):
        openai_stub.script({"match": ""})  # an empty match would answer everything: refused


async def test_openai_delay_before_headers_and_stall_mid_stream_time_out(openai_stub: StubServer) -> None:
    openai_stub.script({"delay_s": 2}, {"text": "slow answer", "stall_s": 2, "stall_after": 2})
    with pytest.raises(openai.APITimeoutError):
        await gpt(openai_stub, timeout=0.5).ainvoke("hi")
    with pytest.raises((openai.APITimeoutError, httpx.ReadTimeout)):
        await streamed(gpt(openai_stub, timeout=0.5), "hi")
    assert len(openai_stub.requests()) == 2


async def test_openai_strict_validation_rejects_what_openai_rejects(openai_stub: StubServer) -> None:
    model = gpt(openai_stub)
    with pytest.raises(openai.BadRequestError, match="neither"):  # an empty assistant message
        await model.ainvoke([HumanMessage("hi"), AIMessage(""), HumanMessage("again")])
    with pytest.raises(openai.BadRequestError, match="preceding message with 'tool_calls'"):
        await model.ainvoke([HumanMessage("hi"), ToolMessage("result", tool_call_id="call_x")])
    unanswered = AIMessage("", tool_calls=[{"name": "write_file", "args": ARGS, "id": "call_1"}])
    with pytest.raises(openai.BadRequestError, match="call_1"):
        await model.ainvoke([HumanMessage("hi"), unanswered, HumanMessage("next")])
    answered = [HumanMessage("hi"), unanswered, ToolMessage("written", tool_call_id="call_1")]
    assert (await model.ainvoke(answered)).content == "ok"
    async with httpx.AsyncClient(base_url=openai_stub.url) as http:
        no_key = await http.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
        assert no_key.status_code == 401 and no_key.json()["error"]["code"] == "invalid_api_key"
        unknown = await http.post("/v1/chat/completions", headers={"authorization": "Bearer k"},
                                  json={"model": "m", "messages": [{"role": "user", "content": "x"}], "max_retries": 2})
        assert unknown.status_code == 400 and "max_retries" in unknown.json()["error"]["message"]
    violations = openai_stub.violations()
    assert len(violations) == 5 and [r["answered"]["status"] for r in openai_stub.requests()] == [400, 400, 400, 200, 401, 400]


# -- Anthropic-compatible ---------------------------------------------------------------------------
async def test_anthropic_plain_and_streamed_answers_carry_usage(anthropic_stub: StubServer) -> None:
    anthropic_stub.script({"text": "Hello!", "usage": {"input": 12, "output": 4}},
                          {"text": "one two three", "chunks": 3, "usage": {"input": 50, "output": 9}})
    answer = await claude(anthropic_stub).ainvoke("hi")
    assert answer.content == "Hello!" and answer.usage_metadata
    assert (answer.usage_metadata["input_tokens"], answer.usage_metadata["output_tokens"]) == (12, 4)
    total, chunks = await streamed(claude(anthropic_stub), "hi")
    assert total.text == "one two three" and total.usage_metadata
    assert (total.usage_metadata["input_tokens"], total.usage_metadata["output_tokens"]) == (50, 9)
    first, second = anthropic_stub.requests()
    assert STUB_KEY in (first["headers"].get("x-api-key"), first["headers"].get("authorization", "")[7:]) and first["headers"]["anthropic-version"]
    assert second["body"]["stream"] is True and first["violations"] == second["violations"] == []


async def test_anthropic_tool_use_input_json_deltas_are_reassembled(anthropic_stub: StubServer) -> None:
    anthropic_stub.script({"text": "Writing.", "tool_calls": [{"name": "write_file", "arguments": ARGS, "id": "toolu_w"}],
                           "arg_chunks": 4},
                          {"tool_calls": [{"name": "write_file", "arguments": ARGS, "id": "toolu_v"}]})
    model = claude(anthropic_stub).bind_tools([write_file])
    total, _ = await streamed(model, "write it")
    assert total.tool_calls == [{"name": "write_file", "args": ARGS, "id": "toolu_w", "type": "tool_call"}]
    assert total.response_metadata["stop_reason"] == "tool_use"
    answer = await model.ainvoke("write it")
    assert answer.tool_calls[0]["args"] == ARGS and answer.tool_calls[0]["id"] == "toolu_v"
    assert anthropic_stub.bodies()[0]["tools"][0]["name"] == "write_file"


@pytest.mark.parametrize("stop", ["end_turn", "max_tokens", "tool_use", "refusal"])
async def test_anthropic_every_stop_reason(anthropic_stub: StubServer, stop: str) -> None:
    calls = [{"name": "write_file", "arguments": ARGS}] if stop == "tool_use" else []
    anthropic_stub.script({"text": "partial", "finish": stop, "tool_calls": calls},
                          {"text": "partial", "finish": stop, "tool_calls": calls})
    model = claude(anthropic_stub).bind_tools([write_file])
    assert (await model.ainvoke("hi")).response_metadata["stop_reason"] == stop
    total, _ = await streamed(model, "hi")
    assert total.response_metadata["stop_reason"] == stop


@pytest.mark.parametrize(("preset", "error", "status", "kind"), [
    ("rate_limit", anthropic.RateLimitError, 429, "rate_limit_error"),
    ("overloaded", anthropic.APIStatusError, 529, "overloaded_error"),
    ("server", anthropic.InternalServerError, 500, "api_error"),
    ("auth", anthropic.AuthenticationError, 401, "authentication_error"),
    ("invalid_request", anthropic.BadRequestError, 400, "invalid_request_error"),
    ("context_length", anthropic.BadRequestError, 400, "invalid_request_error"),
])
async def test_anthropic_errors_raise_the_sdk_exception(anthropic_stub: StubServer, preset: str,
                                                        error: type[Exception], status: int, kind: str) -> None:
    anthropic_stub.script({"error": preset, "retry_after": 3})
    with pytest.raises(error) as raised:
        await claude(anthropic_stub).ainvoke("hi")
    exc = raised.value
    assert isinstance(exc, anthropic.APIStatusError) and exc.status_code == status
    assert exc.body["error"]["type"] == kind and exc.response.headers["retry-after"] == "3"
    if preset == "context_length":
        assert "prompt is too long" in str(exc)
    assert len(anthropic_stub.requests()) == 1


async def test_anthropic_strict_validation_rejects_what_anthropic_rejects(anthropic_stub: StubServer) -> None:
    model = claude(anthropic_stub)
    # langchain-anthropic drops the empty assistant message: two user turns in a row are then refused.
    with pytest.raises(anthropic.BadRequestError, match="alternate|non-empty|non-whitespace"):
        await model.ainvoke([HumanMessage("hi"), AIMessage(""), HumanMessage("again")])
    headers = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
    user = {"role": "user", "content": "x"}
    bad = {
        "system role": {"model": "m", "max_tokens": 10, "messages": [{"role": "system", "content": "s"}, user]},
        "no max_tokens": {"model": "m", "messages": [user]},
        "starts with assistant": {"model": "m", "max_tokens": 10, "messages": [{"role": "assistant", "content": "a"}, user]},
        "tool_use unanswered": {"model": "m", "max_tokens": 10, "messages": [user, {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "t", "input": {}}]}, user]},
    }
    async with httpx.AsyncClient(base_url=anthropic_stub.url) as http:
        for name, body in bad.items():
            response = await http.post("/v1/messages", headers=headers, json=body)
            assert response.status_code == 400, name
            assert response.json()["error"]["type"] == "invalid_request_error", name
        no_version = await http.post("/v1/messages", headers={"x-api-key": "k"}, json=bad["no max_tokens"])
        assert no_version.status_code == 400 and "anthropic-version" in no_version.json()["error"]["message"]
        no_key = await http.post("/v1/messages", headers={"anthropic-version": "2023-06-01"}, json=bad["no max_tokens"])
        assert no_key.status_code == 401 and no_key.json()["error"]["type"] == "authentication_error"
    answered = [HumanMessage("hi"), AIMessage("", tool_calls=[{"name": "write_file", "args": ARGS, "id": "toolu_1"}]),
                ToolMessage("written", tool_call_id="toolu_1")]
    assert (await model.ainvoke(answered)).content == "ok"
    assert json.dumps(anthropic_stub.requests()[-1]["body"]["messages"][-1]["content"][0]["type"]) == '"tool_result"'
    assert len(anthropic_stub.violations()) == 7
