"""Streaming: chunks merge back into exactly the message invoke would have returned."""

from __future__ import annotations

import functools
import operator
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage

from agentkeel.harness.scripted import Script, ScriptedChatModel, ScriptedRateLimitError, ScriptSession

LONG_ARGS = {
    "path": "/workspace/outputs/report.md",
    "content": "# Report\n\n" + "A line with unicode — ünïcødé and \"quotes\" {braces}.\n" * 60,
    "append": False,
    "n": [1, 2.5, None],
}
TURN = {
    "say": "Writing the report now, then checking the notes.",
    "tool_calls": [
        {"name": "write_file", "args": LONG_ARGS},
        {"name": "ls", "args": {}},
        {"name": "grep", "args": {"pattern": "x"}},
    ],
    "usage": {"input": 1200, "output": 40},
    "provider": "anthropic",
    "stream_chunks": 40,
}


def _pair(turn: dict[str, Any]) -> tuple[ScriptedChatModel, ScriptedChatModel]:
    """Two models on identical sessions: one to invoke, one to stream the same turn."""
    script = Script.model_validate({"agents": {"lead": [turn]}})
    return tuple(ScriptedChatModel(script=script, session=ScriptSession("same")) for _ in range(2))  # type: ignore[return-value]


def _merge(chunks: list[AIMessageChunk]) -> AIMessageChunk:
    return functools.reduce(operator.add, chunks)


def _assert_same(merged: AIMessageChunk, message: AIMessage) -> None:
    assert merged.content == message.content
    assert merged.tool_calls == message.tool_calls
    assert merged.invalid_tool_calls == []
    assert merged.usage_metadata == message.usage_metadata
    assert merged.response_metadata == message.response_metadata
    assert merged.id == message.id


def test_stream_merges_to_the_invoked_message() -> None:
    invoked, streamed = _pair(TURN)
    message = invoked.invoke([HumanMessage("hi")])
    chunks = list(streamed.stream([HumanMessage("hi")]))
    _assert_same(_merge(chunks), message)


def test_chunk_layout() -> None:
    _, streamed = _pair(TURN)
    chunks = list(streamed.stream([HumanMessage("hi")]))
    text_chunks = [chunk for chunk in chunks if chunk.content]
    assert len(text_chunks) == 40
    assert "".join(str(chunk.content) for chunk in text_chunks) == TURN["say"]
    tool_chunks = [fragment for chunk in chunks for fragment in chunk.tool_call_chunks]
    write_chunks = [fragment for fragment in tool_chunks if fragment["index"] == 0]
    assert len(write_chunks) == 40
    assert write_chunks[0]["name"] == "write_file" and write_chunks[0]["id"] == "call-same-lead-0-1-0"
    assert all(fragment["name"] is None and fragment["id"] is None for fragment in write_chunks[1:])
    assert [fragment["index"] for fragment in tool_chunks if fragment["name"]] == [0, 1, 2]
    assert len([fragment for fragment in tool_chunks if fragment["index"] == 1]) == 2  # "{}" has two characters
    last = chunks[-1]
    assert last.chunk_position == "last"
    assert last.usage_metadata == {"input_tokens": 1200, "output_tokens": 40, "total_tokens": 1240}
    assert last.response_metadata["stop_reason"] == "tool_use"
    assert all(chunk.usage_metadata is None and not chunk.response_metadata for chunk in chunks[:-1])
    assert {chunk.id for chunk in chunks} == {"msg-same-lead-0-1"}


async def test_astream_merges_to_the_ainvoked_message() -> None:
    invoked, streamed = _pair({**TURN, "provider": "gemini", "stream_chunks": 7})
    message = await invoked.ainvoke([HumanMessage("hi")])
    chunks = [chunk async for chunk in streamed.astream([HumanMessage("hi")])]
    _assert_same(_merge(chunks), message)


@pytest.mark.parametrize("turn", [{"say": "short", "stream_chunks": 40}, {"say": ""}, {"tool_calls": [{"name": "t"}]}])
def test_edge_shapes_merge_too(turn: dict[str, Any]) -> None:
    invoked, streamed = _pair(turn)
    message = invoked.invoke([HumanMessage("hi")])
    _assert_same(_merge(list(streamed.stream([HumanMessage("hi")]))), message)


def test_stream_raises_scripted_errors() -> None:
    _, streamed = _pair({"raise": {"kind": "rate_limit"}})
    with pytest.raises(ScriptedRateLimitError):
        list(streamed.stream([HumanMessage("hi")]))


class _Tokens(BaseCallbackHandler):
    def __init__(self) -> None:
        self.tokens: list[str] = []

    def on_llm_new_token(self, token: str | list[str | dict[str, Any]], **kwargs: Any) -> None:
        assert isinstance(token, str)
        self.tokens.append(token)


def test_text_chunks_reach_token_callbacks() -> None:
    _, streamed = _pair({"say": "abcdefgh", "stream_chunks": 4, "tool_calls": [{"name": "t", "args": {"a": 1}}]})
    handler = _Tokens()
    list(streamed.stream([HumanMessage("hi")], config={"callbacks": [handler]}))
    assert [token for token in handler.tokens if token] == ["ab", "cd", "ef", "gh"]
