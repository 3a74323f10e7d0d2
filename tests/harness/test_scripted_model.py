"""Behaviour of ScriptedChatModel on invoke/ainvoke: turns, fallback, templating, usage, errors."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool

from agentkeel.harness.middleware.keys import TASK_ID_METADATA
from agentkeel.harness.scripted import (
    Script,
    ScriptedBadRequestError,
    ScriptedChatModel,
    ScriptedProviderError,
    ScriptedRateLimitError,
    ScriptedServerError,
    ScriptedTimeoutError,
    ScriptError,
    ScriptExhaustedError,
    ScriptExpectationError,
    ScriptSession,
)

HELLO: list[BaseMessage] = [HumanMessage("hello")]


def _model(data: dict[str, Any], **fields: Any) -> ScriptedChatModel:
    return ScriptedChatModel(script=Script.model_validate(data), **fields)


def _lead(*turns: dict[str, Any], **fields: Any) -> ScriptedChatModel:
    return _model({"agents": {"lead": list(turns)}}, **fields)


def _says(model: ScriptedChatModel, calls: int) -> list[str]:
    return [model.invoke(HELLO).text for _ in range(calls)]


def test_turns_play_in_order_with_repeat_then_fallback() -> None:
    model = _lead({"say": "a", "repeat": 2}, {"say": "b"})
    assert _says(model, 5) == ["a", "a", "b", "Done.", "Done."]


def test_repeat_forever() -> None:
    model = _lead({"say": "first"}, {"say": "again {turn}", "repeat": "forever"})
    assert _says(model, 4) == ["first", "again 2", "again 3", "again 4"]


def test_custom_fallback_text_is_a_plain_final_answer() -> None:
    reply = _model({"fallback": "All done at turn {turn}.", "agents": {}}).invoke(HELLO)
    assert reply.text == "All done at turn 1."
    assert reply.tool_calls == []
    assert reply.response_metadata["finish_reason"] == "stop"


def test_fallback_error_names_agent_and_turn() -> None:
    model = _model({"fallback": "error", "agents": {"lead": [{"say": "only"}]}})
    assert model.invoke(HELLO).text == "only"
    with pytest.raises(ScriptExhaustedError, match=r"'lead' \(instance 0\) was called for turn 2") as caught:
        model.invoke(HELLO)
    assert (caught.value.agent, caught.value.turn) == ("lead", 2)
    assert isinstance(caught.value, ScriptError)


def test_agent_list_then_star_list_then_fallback() -> None:
    data = {"agents": {"lead": [{"say": "lead"}], "*": [{"say": "anyone: {agent}"}]}}
    model = _model(data)
    assert model.invoke(HELLO).text == "lead"
    assert model.for_agent("researcher").invoke(HELLO).text == "anyone: researcher"
    assert _model({"agents": {"lead": [{"say": "x"}]}}, agent="other").invoke(HELLO).text == "Done."


def test_templating_reaches_every_string_and_counts_instances() -> None:
    turn = {
        "say": "{agent}/{instance}/{turn} keeps {braces} and {\"json\": 1}",
        "tool_calls": [{"name": "search", "id": "c-{instance}-{turn}", "args": {"q": "news {turn}", "n": [1, "{agent}"]}}],
        "repeat": "forever",
    }
    lead = _model({"agents": {"worker": [turn]}}, agent="worker")
    first = lead.invoke(HELLO)  # claims instance 0 on its first call
    second = lead.for_agent("worker")  # claims instance 1 when created
    assert first.text == 'worker/0/1 keeps {braces} and {"json": 1}'
    assert first.tool_calls[0]["args"] == {"q": "news 1", "n": [1, "worker"]}
    assert first.tool_calls[0]["id"] == "c-0-1"
    assert second.invoke(HELLO).text.startswith("worker/1/1 ")
    assert lead.invoke(HELLO).text.startswith("worker/0/2 ")


def test_templating_in_raise_message_and_expect_text() -> None:
    model = _lead(
        {"expect": {"contains": "turn {turn}"}, "raise": {"kind": "server_error", "message": "{agent} down at {turn}"}}
    )
    with pytest.raises(ScriptedServerError, match="^lead down at 1$"):
        model.invoke([HumanMessage("this is turn 1")])


def test_tool_call_and_message_ids_are_deterministic_per_session_key() -> None:
    data = {"agents": {"lead": [{"tool_calls": [{"name": "a"}, {"name": "b", "id": "mine"}]}]}}
    reply = _model(data, session=ScriptSession("run7")).invoke(HELLO)
    assert reply.id == "msg-run7-lead-0-1"
    assert [call["id"] for call in reply.tool_calls] == ["call-run7-lead-0-1-0", "mine"]
    assert _model(data).invoke(HELLO).id != _model(data).invoke(HELLO).id  # random keys differ per session


def test_two_sessions_replay_the_same_script_independently() -> None:
    script = Script.model_validate({"agents": {"lead": [{"say": "one"}, {"say": "two"}]}})
    first = ScriptedChatModel(script=script, session=ScriptSession())
    assert first.invoke(HELLO).text == "one"
    second = ScriptedChatModel(script=script, session=ScriptSession())
    assert [second.invoke(HELLO).text, first.invoke(HELLO).text, second.invoke(HELLO).text] == ["one", "two", "two"]


def test_session_numbers_instances_per_agent_name() -> None:
    session = ScriptSession()
    cursors = [session.cursor(name) for name in ("a", "b", "a", "a")]
    assert [(cursor.agent, cursor.instance) for cursor in cursors] == [("a", 0), ("b", 0), ("a", 1), ("a", 2)]
    assert [cursors[0].advance(), cursors[0].advance(), cursors[2].advance()] == [1, 2, 1]


def test_an_instance_list_answers_that_instance_and_the_others_play_the_agents_list() -> None:
    script = Script.model_validate({"agents": {
        "lead": [{"say": "lead"}], "researcher#1": [{"say": "second, own"}], "researcher": [{"say": "shared"}]}})
    lead = ScriptedChatModel(script=script, session=ScriptSession())
    children = [lead.for_agent("researcher") for _ in range(3)]
    assert [c.invoke(HELLO).text for c in children] == ["shared", "second, own", "shared"]
    assert lead.invoke(HELLO).text == "lead"


def test_a_task_list_answers_the_subagent_serving_that_task_whatever_its_instance() -> None:
    script = Script.model_validate({"agents": {"gp@call_b": [{"say": "b"}], "gp@call_a": [{"say": "a"}],
                                               "gp": [{"say": "other"}]}})
    lead = ScriptedChatModel(script=script, session=ScriptSession())
    first, second, third = (lead.for_agent("gp") for _ in range(3))  # built in this order ...
    answers = [child.invoke(HELLO, config={"metadata": {TASK_ID_METADATA: task}}).text
               for child, task in ((first, "call_b"), (second, "call_a"), (third, "call_c"))]
    assert answers == ["b", "a", "other"]  # ... answered by task


def test_usage_auto_is_request_and_answer_chars_over_four() -> None:
    request: list[BaseMessage] = [
        SystemMessage("s" * 10),
        HumanMessage("h" * 7),
        AIMessage("", tool_calls=[{"name": "t", "args": {"k": "v"}, "id": "1", "type": "tool_call"}]),
        ToolMessage("r" * 5, tool_call_id="1"),
    ]
    request_chars = 10 + 7 + len('{"k": "v"}') + 5
    reply = _lead({"say": "abcde", "tool_calls": [{"name": "x", "args": {"q": 1}}]}).invoke(request)
    answer_chars = 5 + len('{"q": 1}')
    expected = {"input_tokens": math.ceil(request_chars / 4), "output_tokens": math.ceil(answer_chars / 4)}
    assert reply.usage_metadata == {**expected, "total_tokens": sum(expected.values())}


def test_usage_auto_is_at_least_one_token() -> None:
    reply = _lead({"say": ""}).invoke([HumanMessage("")])
    assert reply.usage_metadata == {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}


def test_usage_explicit_and_mixed() -> None:
    reply = _lead({"say": "abcdefgh", "usage": {"input": 1200, "output": 40}}).invoke(HELLO)
    assert reply.usage_metadata == {"input_tokens": 1200, "output_tokens": 40, "total_tokens": 1240}
    mixed = _lead({"say": "abcdefgh", "usage": {"input": 30000}}).invoke(HELLO)
    assert mixed.usage_metadata == {"input_tokens": 30000, "output_tokens": 2, "total_tokens": 30002}


@pytest.mark.parametrize(
    ("provider", "key", "model_provider", "expected"),
    [
        ("openai", "finish_reason", "openai", ["stop", "tool_calls", "length", "content_filter", "content_filter"]),
        ("anthropic", "stop_reason", "anthropic", ["end_turn", "tool_use", "max_tokens", "refusal", "refusal"]),
        ("gemini", "finish_reason", "google_genai", ["STOP", "STOP", "MAX_TOKENS", "SAFETY", "SAFETY"]),
    ],
)
def test_finish_reasons_are_shaped_per_provider(provider: str, key: str, model_provider: str, expected: list[str]) -> None:
    turns = [
        {"say": "plain", "provider": provider},
        {"tool_calls": [{"name": "t"}], "provider": provider},
        {"say": "cut", "finish_reason": "length", "provider": provider},
        {"say": "", "finish_reason": "content_filter", "provider": provider},
        {"say": "", "finish_reason": "SAFETY", "provider": provider},
    ]
    model = _model({"agents": {"lead": turns}}, model_name="demo-model")
    replies = [model.invoke(HELLO) for _ in turns]
    assert [reply.response_metadata[key] for reply in replies] == expected
    for reply in replies:
        assert reply.response_metadata["model_provider"] == model_provider
        assert reply.response_metadata["model_name"] == "demo-model"


def test_refusal_maps_like_a_safety_stop() -> None:
    reply = _lead({"say": "I can't help with that.", "finish_reason": "refusal", "provider": "anthropic"}).invoke(HELLO)
    assert reply.response_metadata["stop_reason"] == "refusal"
    assert {"type": "refusal", "refusal": ""} in reply.content_blocks  # LangChain's anthropic translator sees it


@pytest.mark.parametrize(
    ("kind", "error_type", "status"),
    [
        ("rate_limit", ScriptedRateLimitError, 429),
        ("server_error", ScriptedServerError, 500),
        ("bad_request", ScriptedBadRequestError, 400),
        ("timeout", ScriptedTimeoutError, 408),
    ],
)
def test_raise_kinds(kind: str, error_type: type[ScriptedProviderError], status: int) -> None:
    model = _lead({"raise": {"kind": kind}}, {"say": "recovered"})
    with pytest.raises(error_type) as caught:
        model.invoke(HELLO)
    assert (caught.value.kind, caught.value.status_code) == (kind, status)
    assert f"scripted {kind} (HTTP {status}) for agent 'lead' instance 0 turn 1" == str(caught.value)
    assert model.invoke(HELLO).text == "recovered"  # the failed call consumed its turn


def test_timeout_error_is_a_timeout_error() -> None:
    with pytest.raises(TimeoutError, match="^too slow$"):
        _lead({"raise": {"kind": "timeout", "message": "too slow"}}).invoke(HELLO)


def test_expect_passes_when_text_is_anywhere_in_the_request() -> None:
    model = _lead({"say": "1", "expect": {"contains": "t1-secret"}}, {"say": "2", "expect": {"contains": '"path": "/w"'}})
    history: list[BaseMessage] = [
        HumanMessage("go"),
        AIMessage("", tool_calls=[{"name": "read", "args": {"path": "/w"}, "id": "c1", "type": "tool_call"}]),
        ToolMessage("the t1-secret value", tool_call_id="c1"),
    ]
    assert model.invoke(history).text == "1"
    assert model.invoke(history).text == "2"


def test_expect_failure_names_agent_turn_and_text() -> None:
    model = _lead({"say": "fine"}, {"say": "never", "expect": {"contains": "t1"}})
    model.invoke(HELLO)
    with pytest.raises(ScriptExpectationError, match=r"'lead' \(instance 0\) turn 2: .* expected text 't1'") as caught:
        model.invoke(HELLO)
    assert (caught.value.agent, caught.value.turn, caught.value.expected) == ("lead", 2, "t1")


def test_delay_sync() -> None:
    model = _lead({"say": "slow", "delay_ms": 120})
    started = time.monotonic()
    model.invoke(HELLO)
    assert time.monotonic() - started >= 0.11


async def test_delay_async_does_not_block_the_loop() -> None:
    model = _lead({"say": "slow", "delay_ms": 150})
    started = time.monotonic()
    task = asyncio.create_task(model.ainvoke(HELLO))
    ticks = 0  # a blocking sleep would let this loop run only once
    while not task.done():
        ticks += 1
        await asyncio.sleep(0.01)
    assert (await task).text == "slow"
    assert time.monotonic() - started >= 0.14
    assert ticks >= 3


async def test_async_and_sync_share_one_cursor() -> None:
    model = _lead({"say": "{turn}", "repeat": "forever"})
    assert [model.invoke(HELLO).text, (await model.ainvoke(HELLO)).text, model.invoke(HELLO).text] == ["1", "2", "3"]


def test_bind_tools_accepts_langchain_tool_formats() -> None:
    @tool
    def lookup(query: str) -> str:
        """Look something up."""
        return query

    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    model = _lead({"tool_calls": [{"name": "lookup", "args": {"query": "x"}}]})
    bound = model.bind_tools([lookup, add, {"type": "function", "function": {"name": "raw", "parameters": {}}}])
    assert [spec["function"]["name"] for spec in bound.kwargs["tools"]] == ["lookup", "add", "raw"]  # type: ignore[attr-defined]
    assert bound.invoke(HELLO).tool_calls[0]["name"] == "lookup"
    assert model.bind_tools([lookup], tool_choice="any").kwargs["tool_choice"] == "any"  # type: ignore[attr-defined]


def test_a_tool_is_converted_once_per_name_description_and_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentkeel.harness.scripted import model as scripted

    converted: list[str] = []
    original = scripted.convert_to_openai_tool

    def counting(value: Any) -> Any:
        converted.append(getattr(value, "name", "?"))
        return original(value)

    monkeypatch.setattr(scripted, "convert_to_openai_tool", counting)
    monkeypatch.setattr(scripted, "_OPENAI_TOOLS", {})

    from langchain_core.tools import StructuredTool
    from pydantic import BaseModel

    class LookupArgs(BaseModel):
        query: str

    def make(description: str) -> Any:  # a tool made per run, as ``task`` is: one schema class
        return StructuredTool.from_function(lambda query: query, name="lookup", description=description,
                                            args_schema=LookupArgs)

    model = _lead({"say": "x"})
    first = model.bind_tools([make("Look up.")]).kwargs["tools"]  # type: ignore[attr-defined]
    again = model.bind_tools([make("Look up.")]).kwargs["tools"]  # another object, the same tool
    other = model.bind_tools([make("Look it up elsewhere.")]).kwargs["tools"]  # type: ignore[attr-defined]
    assert again == first and other[0]["function"]["description"] == "Look it up elsewhere."  # type: ignore[attr-defined]
    assert converted == ["lookup", "lookup"]  # the first and the other description, not the same one again


def test_model_identity() -> None:
    model = _lead({"say": "x"}, model_name="demo")
    assert model._llm_type == "scripted"
    assert model._get_ls_params()["ls_provider"] == "scripted"
    assert model._get_ls_params()["ls_model_name"] == "demo"
    assert model.for_agent("sub").model_name == "demo"
    assert model.cache is False
