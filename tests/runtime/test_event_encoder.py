"""The worker's stream-event encoder: the same JSON as the JSON-safe conversion, and a bounded memo."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage
from langgraph.types import Interrupt

from agentkeel.runtime import serialization
from agentkeel.runtime.serialization import EventEncoder, to_jsonable


def reference(data: Any) -> bytes:
    """What the stream carried before: ``to_jsonable`` then compact ``json.dumps``."""
    return json.dumps(to_jsonable(data), default=str, separators=(",", ":"), ensure_ascii=False).encode()


def thread(turns: int) -> list[Any]:
    messages: list[Any] = [HumanMessage("héllo", id="h")]
    for i in range(turns):
        messages.append(AIMessage(f"step {i}", id=f"a{i}", tool_calls=[{"name": "ls", "args": {"path": "/w"}, "id": f"c{i}"}]))
        messages.append(ToolMessage("f1\nf2", tool_call_id=f"c{i}", id=f"t{i}"))
    return messages


def test_events_encode_to_the_bytes_the_json_safe_conversion_gives() -> None:
    encoder = EventEncoder()
    messages = thread(5)
    samples: list[Any] = [
        {"messages": messages[:3]},
        {"messages": messages},  # the first three again, now from the memo
        (AIMessageChunk("tok", id="a9"), {"langgraph_step": 3, "tags": ("x",)}),
        {"__interrupt__": (Interrupt(value={"q": "?"}, id="i1"),)},
        {"at": datetime(2026, 1, 2, tzinfo=UTC), "ids": {1}, "raw": b"\xffok", 7: "int key", "obj": object},
        {"config": {"__pregel_send": print, "thread_id": "t"}},  # LangGraph internals are dropped
        {"big": 2**70},  # beyond orjson's integers
    ]
    for data in samples:
        assert encoder.encode(data) == reference(data), data


def test_the_memo_is_bounded_and_never_holds_token_chunks() -> None:
    encoder = EventEncoder(max_bytes=2_000)
    for i in range(200):
        encoder.encode((AIMessageChunk(f"token {i}", id="a"), {"step": 1}))
    assert encoder.held_bytes == 0
    messages = thread(50)
    for n in range(1, len(messages) + 1):
        data = {"messages": messages[:n]}
        assert orjson.loads(encoder.encode(data)) == json.loads(reference(data))
        assert 0 < encoder.held_bytes <= 2_000


def test_a_messages_chunk_takes_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    # LangGraph's metadata names "__pregel_pull" as a value in every messages chunk: only a
    # "__pregel*" *key* needs the JSON-safe walk.
    chunk = (AIMessageChunk("tok", id="a1"), {"langgraph_path": ["__pregel_pull", "model"], "langgraph_step": 1})
    expected = reference(chunk)

    def refused(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("the fallback path was taken")

    monkeypatch.setattr(serialization, "to_jsonable", refused)
    assert EventEncoder().encode(chunk) == expected
