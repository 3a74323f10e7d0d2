"""End to end: the scripted model driving LangChain's create_agent, with strict checking on."""

from __future__ import annotations

import functools
import operator
from typing import Any

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool

from agentkeel.harness.scripted import Script, ScriptedChatModel, ScriptSession

SCRIPT = Script.model_validate(
    {
        "strict": True,
        "agents": {
            "lead": [
                {
                    "say": "Adding both pairs.",
                    "tool_calls": [{"name": "add", "args": {"a": 1, "b": 2}}, {"name": "add", "args": {"a": 3, "b": 4}}],
                    "usage": {"input": 120, "output": 30},
                    "stream_chunks": 4,
                },
                {
                    "tool_calls": [{"name": "add", "args": {"a": 3, "b": 7}}],
                    "expect": {"contains": "You add numbers."},
                    "stream_chunks": 40,
                },
                {"say": "The total is 10 (turn {turn}).", "expect": {"contains": "10"}, "stream_chunks": 6},
            ]
        },
    }
)


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def _agent(key: str) -> Any:
    model = ScriptedChatModel(script=SCRIPT, session=ScriptSession(key))
    return create_agent(model=model, tools=[add], system_prompt="You add numbers.")


def _assert_final_messages(messages: list[Any], key: str) -> None:
    kinds = [type(message).__name__ for message in messages]
    assert kinds == ["HumanMessage", "AIMessage", "ToolMessage", "ToolMessage", "AIMessage", "ToolMessage", "AIMessage"]
    first, second, final = messages[1], messages[4], messages[6]
    assert first.content == "Adding both pairs."
    assert [call["args"] for call in first.tool_calls] == [{"a": 1, "b": 2}, {"a": 3, "b": 4}]
    assert first.usage_metadata["input_tokens"] == 120
    assert first.response_metadata["finish_reason"] == "tool_calls"
    assert [m.content for m in messages[2:4]] == ["3", "7"]
    assert [m.tool_call_id for m in messages[2:4]] == [f"call-{key}-lead-0-1-0", f"call-{key}-lead-0-1-1"]
    assert second.tool_calls[0]["args"] == {"a": 3, "b": 7}
    assert messages[5].content == "10"
    assert final.content == "The total is 10 (turn 3)."
    assert final.response_metadata["finish_reason"] == "stop"
    assert [message.id for message in (first, second, final)] == [f"msg-{key}-lead-0-{n}" for n in (1, 2, 3)]


async def test_create_agent_ainvoke() -> None:
    result = await _agent("inv").ainvoke({"messages": [HumanMessage("add 1+2 and 3+4, then sum")]})
    _assert_final_messages(result["messages"], "inv")


async def test_create_agent_astream_messages() -> None:
    streamed: list[Any] = []
    final_state: dict[str, Any] = {}
    async for mode, data in _agent("str").astream(
        {"messages": [HumanMessage("add 1+2 and 3+4, then sum")]}, stream_mode=["messages", "values"]
    ):
        if mode == "messages":
            streamed.append(data[0])
        else:
            final_state = data
    chunks: dict[str, list[AIMessageChunk]] = {}
    for message in streamed:
        if isinstance(message, AIMessageChunk):
            chunks.setdefault(str(message.id), []).append(message)
    assert list(chunks) == ["msg-str-lead-0-1", "msg-str-lead-0-2", "msg-str-lead-0-3"]
    merged = [functools.reduce(operator.add, group) for group in chunks.values()]
    assert [len(call["args"]) for call in merged[0].tool_calls] == [2, 2]
    assert merged[1].tool_calls[0]["args"] == {"a": 3, "b": 7}
    assert merged[2].content == "The total is 10 (turn 3)."
    assert [message.content for message in streamed if isinstance(message, ToolMessage)] == ["3", "7", "10"]
    _assert_final_messages(final_state["messages"], "str")


async def test_agent_sees_system_prompt_and_strict_grammar_holds() -> None:
    seen: list[list[Any]] = []

    class Recording(ScriptedChatModel):
        async def _agenerate(self, messages: list[Any], *args: Any, **kwargs: Any) -> Any:
            seen.append(list(messages))
            return await super()._agenerate(messages, *args, **kwargs)

    agent = create_agent(model=Recording(script=SCRIPT), tools=[add], system_prompt="You add numbers.")
    await agent.ainvoke({"messages": [HumanMessage("go")]})
    assert len(seen) == 3
    assert all(isinstance(request[0], SystemMessage) for request in seen)
    assert isinstance(seen[-1][-1], ToolMessage)
    assert isinstance(seen[1][1], HumanMessage) and isinstance(seen[1][2], AIMessage)
