"""The worker's stream-event encoder: the same JSON as the JSON-safe conversion, and a bounded memo."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
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


def test_a_growing_message_list_is_encoded_from_its_remembered_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    encoder = EventEncoder()
    messages = thread(20)
    frames = [{"messages": messages[:n], "other": [1, 2]} for n in range(10, len(messages) + 1)]
    expected = [reference(data) for data in frames]
    dumped: list[str] = []
    for cls in {type(m) for m in messages}:  # count how often each message is encoded
        monkeypatch.setattr(cls, "model_dump", _counting(cls.model_dump, dumped))
    assert [encoder.encode(data) for data in frames] == expected
    assert sorted(dumped) == sorted(m.id for m in messages), "each message encoded once"
    assert encoder.held_bytes >= len(reference(messages)) - 2  # the list, without its brackets


def test_a_list_that_changed_other_than_by_appending_is_encoded_anew() -> None:
    encoder = EventEncoder()
    messages = thread(10)
    steps = [
        messages,
        messages[1:],  # the first removed
        [*messages[:5], AIMessage("replaced", id="r"), *messages[6:]],
        messages[:12],  # shorter than the remembered list
        [*messages, AIMessageChunk("chunk", id="c")],  # a chunk in the list: the plain path
    ]
    for data in ({"messages": step} for step in steps):
        assert encoder.encode(data) == reference(data)


def test_langgraph_internals_beside_or_inside_a_remembered_list_are_dropped_as_before() -> None:
    encoder = EventEncoder()
    messages = thread(10)
    inside = [*messages, AIMessage("x", id="p", additional_kwargs={"__pregel_secret": 1, "kept": 2})]
    for data in (
        {"messages": messages, "config": {"__pregel_send": print, "thread_id": "t"}},  # beside
        {"messages": messages},  # remembered, clean
        {"messages": inside},  # a message holding an internal key: this key is no longer remembered
        {"messages": [*inside, AIMessage("y", id="q")]},
    ):
        assert encoder.encode(data) == reference(data)


def test_remembered_lists_are_charged_shed_and_given_back() -> None:
    from agentkeel.runtime.content_budget import ContentBudget

    budget = ContentBudget(10_000_000)
    encoder = EventEncoder(budget=budget)
    messages = thread(30)
    encoder.encode({"messages": messages})
    assert budget.held == encoder.held_bytes >= len(reference(messages)) - 2
    assert encoder.shed(1) > 0
    data = {"messages": messages}
    assert encoder.encode(data) == reference(data)  # the same bytes after shedding
    encoder.close()
    assert budget.held == 0 and encoder.held_bytes == 0
    small = EventEncoder(max_bytes=500)  # a list larger than the memo's bound is not remembered
    assert small.encode(data) == reference(data) and small.held_bytes <= 500


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["append", "drop", "replace", "truncate"]), st.integers(0, 40)), max_size=25))
def test_any_sequence_of_list_edits_encodes_like_a_fresh_encoder(edits: list[tuple[str, int]]) -> None:
    encoder = EventEncoder()
    pool = thread(25)
    current = list(pool[:9])
    for op, n in edits:
        if op == "append":
            current = [*current, *pool[len(current) % len(pool):][: n % 4 + 1]]
        elif op == "drop" and current:
            current = current[:n % len(current)] + current[n % len(current) + 1:]
        elif op == "replace" and current:
            i = n % len(current)
            current = [*current[:i], AIMessage(f"new {n}", id=f"n{n}"), *current[i + 1:]]
        elif op == "truncate":
            current = current[: n % (len(current) + 1)]
        data = {"messages": current}
        assert encoder.encode(data) == reference(data)


def _counting(original: Any, seen: list[str]) -> Any:
    def model_dump(self: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(self.id)
        return original(self, *args, **kwargs)

    return model_dump
