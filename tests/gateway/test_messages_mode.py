"""The ``messages`` stream mode and the per-client mode rendering of bridge events."""

from __future__ import annotations

import json
from functools import reduce
from itertools import pairwise
from operator import add
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessageChunk, ToolMessage, message_chunk_to_message

from agentkeel.gateway.messages import MessagesModeTransformer
from agentkeel.gateway.render import ModeRenderer

META = {"langgraph_node": "model", "langgraph_step": 1}


def chunk(msg_id: str = "m1", content: Any = "", calls: list[dict[str, Any]] | None = None, **fields: Any) -> dict:
    return AIMessageChunk(content=content, id=msg_id, tool_call_chunks=calls or [], **fields).model_dump()


def call(args: str, index: int = 0, name: str | None = None, call_id: str | None = None) -> dict[str, Any]:
    return {"name": name, "args": args, "id": call_id, "index": index}


def expected_partial(chunks: list[dict]) -> dict:
    """What LangChain's own chunk addition gives for the chunks so far, in message form."""
    return message_chunk_to_message(reduce(add, [AIMessageChunk(**c) for c in chunks])).model_dump()


def feed_all(transformer: MessagesModeTransformer, chunks: list[dict], event: str = "messages") -> list:
    return [frame for c in chunks for frame in transformer.feed(event, [c, META])]


def partials(frames: list) -> list[dict]:
    return [data[0] for name, data in frames if name.startswith("messages/partial")]


def reply_stream() -> list[dict]:
    """Text, then two tool calls streamed interleaved, usage and finish metadata, the closing chunk."""
    return [
        chunk(content="Let me "),
        chunk(content="write it."),
        chunk(calls=[call("", 0, "write_file", "call_a")]),
        chunk(calls=[call('{"path": "/a.t', 0)]),
        chunk(calls=[call("", 1, "read_file", "call_b")]),
        chunk(calls=[call('xt", "content": "line\\n', 0)]),
        chunk(calls=[call('{"path": "/b"}', 1)]),
        chunk(calls=[call('two \\"q\\""}', 0)]),
        chunk(usage_metadata={"input_tokens": 5, "output_tokens": 9, "total_tokens": 14}),
        chunk(response_metadata={"finish_reason": "tool_calls"}, chunk_position="last"),
    ]


def test_metadata_is_sent_once_per_message_id_before_its_first_partial() -> None:
    frames = feed_all(MessagesModeTransformer(), reply_stream())
    names = [name for name, _ in frames]
    assert names[0] == "messages/metadata" and names.count("messages/metadata") == 1
    assert frames[0][1] == {"m1": {"metadata": META}}
    assert names[1:] == ["messages/partial"] * len(reply_stream())


def test_every_partial_equals_langchains_sum_of_the_chunks_so_far() -> None:
    stream = reply_stream()
    got = partials(feed_all(MessagesModeTransformer(), stream))
    for count, partial in enumerate(got, start=1):
        assert partial == expected_partial(stream[:count])
    final = got[-1]
    assert final["type"] == "ai" and final["content"] == "Let me write it."
    assert final["tool_calls"] == [
        {
            "name": "write_file",
            "args": {"path": "/a.txt", "content": 'line\ntwo "q"'},
            "id": "call_a",
            "type": "tool_call",
        },
        {"name": "read_file", "args": {"path": "/b"}, "id": "call_b", "type": "tool_call"},
    ]
    assert "tool_call_chunks" not in final and final["usage_metadata"]["total_tokens"] == 14


def test_partials_match_langchain_for_provider_shaped_chunks() -> None:
    openai_delta = lambda args, **kw: {  # noqa: E731 - langchain-openai repeats the delta in additional_kwargs
        "tool_calls": [
            {
                "index": 0,
                "id": kw.get("id"),
                "function": {"arguments": args, "name": kw.get("name")},
                "type": kw.get("type"),
            }
        ]
    }
    openai = [
        chunk(
            calls=[call("", 0, "write_file", "c1")],
            additional_kwargs=openai_delta("", id="c1", name="write_file", type="function"),
        ),
        chunk(
            calls=[call('{"pa', 0)],
            additional_kwargs=openai_delta('{"pa'),
            response_metadata={"model_provider": "openai"},
        ),
        chunk(calls=[call('th": "x"}', 0)], additional_kwargs=openai_delta('th": "x"}')),
    ]
    anthropic = [
        chunk(content=[{"type": "text", "text": "ok", "index": 0}]),
        chunk(
            content=[{"type": "tool_use", "id": "t1", "name": "write_file", "input": {}, "index": 1}],
            calls=[call("", 1, "write_file", "t1")],
        ),
        chunk(
            content=[{"type": "input_json_delta", "partial_json": '{"path"', "index": 1}], calls=[call('{"path"', 1)]
        ),
        chunk(content=[{"type": "input_json_delta", "partial_json": ': "y"}', "index": 1}], calls=[call(': "y"}', 1)]),
    ]
    v1 = [
        chunk(
            content=[{"type": "tool_call_chunk", "name": "write_file", "args": '{"a": ', "id": "t1", "index": 0}],
            calls=[call('{"a": ', 0, "write_file", "t1")],
            response_metadata={"output_version": "v1"},
        ),
        chunk(
            content=[{"type": "tool_call_chunk", "args": "1}", "index": 0}],
            calls=[call("1}", 0)],
            response_metadata={"output_version": "v1"},
        ),
        chunk(content=[], chunk_position="last", response_metadata={"output_version": "v1"}),
    ]
    for stream in (openai, anthropic, v1):
        got = partials(feed_all(MessagesModeTransformer(), stream))
        assert got == [expected_partial(stream[:count]) for count in range(1, len(stream) + 1)]


@settings(max_examples=60, deadline=None)
@given(
    text=st.text(min_size=0, max_size=40),
    payload=st.dictionaries(st.text(max_size=5), st.one_of(st.text(max_size=20), st.integers()), max_size=4),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=12),
)
def test_any_chunking_accumulates_to_langchains_message(text: str, payload: dict, cuts: list[int]) -> None:
    args = json.dumps(payload)
    text_cuts = sorted({c % (len(text) + 1) for c in cuts})
    arg_cuts = sorted({c % (len(args) + 1) for c in cuts})
    stream = [chunk(content=piece) for piece in _pieces(text, text_cuts)]
    stream += [chunk(calls=[call("", 0, "write_file", "c1")])]
    stream += [chunk(calls=[call(piece, 0)]) for piece in _pieces(args, arg_cuts)]
    got = partials(feed_all(MessagesModeTransformer(), stream))
    assert got[-1] == expected_partial(stream)
    assert got[-1]["tool_calls"][0]["args"] == payload


def _pieces(text: str, cuts: list[int]) -> list[str]:
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in pairwise(bounds) if b > a]


def test_non_chunk_messages_are_sent_complete() -> None:
    tool = ToolMessage(content="done", tool_call_id="c1", id="t1").model_dump()
    human = {"type": "human", "content": "hi", "id": "h1"}
    transformer = MessagesModeTransformer()
    assert transformer.feed("messages", [tool, META]) == [
        ("messages/metadata", {"t1": {"metadata": META}}),
        ("messages/complete", [tool]),
    ]
    assert transformer.feed("messages", [human, {}])[1] == ("messages/complete", [human])


def test_namespaced_events_keep_their_suffix_and_accumulate_apart() -> None:
    transformer = MessagesModeTransformer()
    sub = feed_all(transformer, [chunk(content="a"), chunk(content="b")], event="messages|tools:1")
    root = feed_all(transformer, [chunk(content="x")])
    assert [name for name, _ in sub] == [
        "messages/metadata|tools:1",
        "messages/partial|tools:1",
        "messages/partial|tools:1",
    ]
    assert sub[-1][1][0]["content"] == "ab"
    assert [name for name, _ in root] == ["messages/metadata", "messages/partial"]
    assert root[-1][1][0]["content"] == "x"


def test_a_message_is_forgotten_after_its_last_chunk() -> None:
    transformer = MessagesModeTransformer()
    feed_all(transformer, [chunk(content="a"), chunk(chunk_position="last")])
    again = feed_all(transformer, [chunk(content="b")])
    assert [name for name, _ in again] == ["messages/metadata", "messages/partial"]
    assert again[-1][1][0]["content"] == "b"


def test_at_most_max_messages_are_remembered() -> None:
    transformer = MessagesModeTransformer(max_messages=2)
    for msg_id in ("a", "b", "c", "b"):  # "a" is evicted by "c"; "b" stays, recently fed
        transformer.feed("messages", [chunk(msg_id, content=msg_id), META])
    assert [name for name, _ in transformer.feed("messages", [chunk("b", content="!"), META])] == ["messages/partial"]
    assert transformer.feed("messages", [chunk("a", content="!"), META])[0][0] == "messages/metadata"


def test_a_finish_reason_does_not_end_a_message() -> None:
    # OpenAI sends the usage-only chunk after the one with the finish reason.
    stream = [
        chunk(content="hi", response_metadata={"finish_reason": "stop"}),
        chunk(usage_metadata={"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}),
    ]
    frames = feed_all(MessagesModeTransformer(), stream)
    assert [name for name, _ in frames].count("messages/metadata") == 1
    assert partials(frames)[-1]["content"] == "hi"


def test_malformed_and_id_less_events() -> None:
    transformer = MessagesModeTransformer()
    assert transformer.feed("messages", {"not": "a pair"}) == []
    no_id = {**chunk(content="x"), "id": None}
    assert transformer.feed("messages", [no_id, META]) == [("messages/partial", [expected_partial([no_id])])]


def render_all(renderer: ModeRenderer, events: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    return [frame for event, data in events for frame in renderer.feed(event, data)] + renderer.flush()


RUN_EVENTS: list[tuple[str, Any]] = [
    ("metadata", {"run_id": "r1", "attempt": 1}),
    ("values", {"messages": []}),
    ("messages", [chunk(content="hi"), META]),
    ("updates", {"model": {"messages": []}}),
    ("custom", {"progress": 1}),
    ("values|sub:1", {"x": 1}),
    ("stop_reason", {"code": "completed"}),
    ("error", {"error": "Boom", "message": "x"}),
]


def test_requested_modes_pass_by_base_name_and_the_rest_is_dropped() -> None:
    frames = render_all(ModeRenderer(["values", "custom"]), RUN_EVENTS)
    assert [name for name, _ in frames] == ["metadata", "values", "custom", "values|sub:1", "stop_reason", "error"]
    assert frames[1][1] == {"messages": []}


def test_messages_tuple_mode_sends_raw_chunks_as_messages() -> None:
    frames = render_all(ModeRenderer(["messages-tuple"]), RUN_EVENTS)
    assert frames[:2] == [RUN_EVENTS[0], ("messages", RUN_EVENTS[2][1])]
    assert [name for name, _ in frames] == ["metadata", "messages", "stop_reason", "error"]


def test_messages_mode_and_both_message_modes() -> None:
    frames = render_all(ModeRenderer(["messages", "updates"]), RUN_EVENTS)
    assert [name for name, _ in frames] == [
        "metadata",
        "messages/metadata",
        "messages/partial",
        "updates",
        "stop_reason",
        "error",
    ]
    both = render_all(ModeRenderer(["messages-tuple", "messages"]), RUN_EVENTS[2:3])
    assert [name for name, _ in both] == ["messages", "messages/metadata", "messages/partial"]


def test_message_events_are_dropped_without_a_message_mode() -> None:
    assert render_all(ModeRenderer(["values"]), [("messages", [chunk(content="x"), META])]) == []
