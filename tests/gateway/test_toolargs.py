"""Batching of file-tool argument deltas, and the partial-JSON parser it shares with messages mode."""

from __future__ import annotations

import importlib.util
import json
import sys
from functools import reduce
from itertools import pairwise
from operator import add
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessageChunk
from langchain_core.utils.json import parse_partial_json

from agentkeel.gateway.messages import PartialJson
from agentkeel.gateway.render import ModeRenderer
from agentkeel.gateway.toolargs import FIXED_BATCHES, BatchPolicy, ToolArgBatcher

META = {"langgraph_node": "model"}
BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "tool_args.py"


def chunk(msg_id: str = "m1", content: Any = "", calls: list[dict[str, Any]] | None = None, **fields: Any) -> dict:
    return AIMessageChunk(content=content, id=msg_id, tool_call_chunks=calls or [], **fields).model_dump()


def call(args: str, index: int = 0, name: str | None = None, call_id: str | None = None) -> dict[str, Any]:
    return {"name": name, "args": args, "id": call_id, "index": index}


def file_call(pieces: list[str], tool: str = "write_file", index: int = 0, msg_id: str = "m1") -> list[tuple[str, Any]]:
    """The events of one streamed tool call: the chunk naming it, then one chunk per argument piece."""
    head = chunk(msg_id, calls=[call("", index, tool, f"call_{index}")])
    return [("messages", [head, META])] + [
        ("messages", [chunk(msg_id, calls=[call(piece, index)]), META]) for piece in pieces
    ]


def push_all(batcher: ToolArgBatcher, events: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    return [frame for event, data in events for frame in batcher.push(event, data)]


def sent_args(frames: list[tuple[str, Any]], index: int = 0) -> list[str]:
    """The argument fragments of one tool call, in the order the client receives them."""
    return [
        piece["args"]
        for name, data in frames
        if name.startswith("messages") and isinstance(data, list)
        for piece in data[0]["tool_call_chunks"]
        if piece["index"] == index and piece["args"]
    ]


# --- PartialJson: LangChain's partial parse, kept cheap ---------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
JSON_ISH = st.text(alphabet='{}[]":,\\ntrue0-1.e a\n\t/u', max_size=30)


def langchain_parse(text: str) -> Any:
    try:
        return parse_partial_json(text)
    except ValueError:
        return None


@settings(max_examples=400, deadline=None)
@given(
    text=st.one_of(JSON_VALUES.map(json.dumps), JSON_ISH),
    cut=st.integers(min_value=0),
    splits=st.lists(st.integers(min_value=0), max_size=6),
)
def test_partial_json_equals_langchains_parse_for_every_prefix_and_fragmentation(
    text: str, cut: int, splits: list[int]
) -> None:
    prefix = text[: cut % (len(text) + 1)]
    bounds = sorted({0, len(prefix), *(s % (len(prefix) + 1) for s in splits)})
    parsed = PartialJson()
    for start, end in pairwise(bounds):
        parsed.append(prefix[start:end])
    assert parsed.text == prefix
    if prefix:
        assert parsed.value() == langchain_parse(prefix)


# --- every flush trigger -------------------------------------------------------------------------


def test_a_batch_is_flushed_after_32_chunks() -> None:
    batcher = ToolArgBatcher(FIXED_BATCHES)
    events = file_call([f"p{i}," for i in range(70)])
    frames = push_all(batcher, events[:32])  # the naming chunk and 31 deltas
    assert len(frames) == 1 and batcher.holding
    frames += batcher.push(*events[32])
    assert len(frames) == 2 and not batcher.holding
    assert sent_args(frames[1:]) == ["".join(f"p{i}," for i in range(32))]
    frames += push_all(batcher, events[33:])
    assert len(frames) == 3 and batcher.holding  # 64 deltas sent, 6 held
    assert sent_args(frames + batcher.flush()) == sent_args(frames) + ["".join(f"p{i}," for i in range(64, 70))]


def test_a_different_identity_flushes_the_pending_batch() -> None:
    batcher = ToolArgBatcher(FIXED_BATCHES)
    frames = push_all(batcher, file_call(["a1", "a2"], index=0) + file_call(["b1"], index=1)[:1])
    # Call 1's naming chunk passes at once, after call 0's held deltas.
    assert sent_args(frames, 0) == ["a1a2"]
    assert [data[0]["tool_call_chunks"][0]["index"] for _, data in frames] == [0, 0, 1]
    frames += push_all(batcher, file_call(["b1"], index=1)[1:]) + batcher.push(*file_call(["a3"])[1])
    assert sent_args(frames, 1) == ["b1"] and batcher.holding


def test_another_event_flushes_first() -> None:
    renderer = ModeRenderer(["messages-tuple", "custom"], FIXED_BATCHES)
    for event in file_call(["x1", "x2"]):
        renderer.feed(*event)
    assert renderer.holding
    frames = renderer.feed("custom", {"n": 1})
    assert [name for name, _ in frames] == ["messages", "custom"] and sent_args(frames) == ["x1x2"]
    # A chunk that cannot be held (text of another message) flushes too.
    renderer.feed(*file_call(["x3"])[1])
    frames = renderer.feed("messages", [chunk("m2", content="hello"), META])
    assert sent_args(frames) == ["x3"] and frames[-1][1][0]["content"] == "hello"


def test_a_values_boundary_flushes_and_forgets_names_even_when_values_is_not_requested() -> None:
    renderer = ModeRenderer(["messages-tuple"], FIXED_BATCHES)
    for event in file_call(["v1"]):
        renderer.feed(*event)
    assert sent_args(renderer.feed("values", {"messages": []})) == ["v1"] and not renderer.holding
    # The call's name is forgotten: later deltas of it pass one by one.
    assert sent_args(renderer.feed(*file_call(["v2"])[1])) == ["v2"] and not renderer.holding


def test_end_and_error_flush() -> None:
    renderer = ModeRenderer(["messages-tuple"], FIXED_BATCHES)
    for event in file_call(["e1"]):
        renderer.feed(*event)
    assert sent_args(renderer.flush()) == ["e1"] and renderer.flush() == []
    renderer.feed(*file_call(["e2"])[1])
    frames = renderer.feed("error", {"error": "Boom", "message": "x"})
    assert [name for name, _ in frames] == ["messages", "error"] and sent_args(frames) == ["e2"]


def test_the_last_chunk_of_a_message_follows_its_held_arguments() -> None:
    batcher = ToolArgBatcher(FIXED_BATCHES)
    frames = push_all(batcher, file_call(["l1"]) + [("messages", [chunk(chunk_position="last"), META])])
    assert sent_args(frames) == ["l1"] and frames[-1][1][0]["chunk_position"] == "last"


# --- what is held and what is not ---------------------------------------------------------------


def test_text_and_reasoning_on_a_held_chunk_are_sent_at_once() -> None:
    batcher = ToolArgBatcher(FIXED_BATCHES)
    push_all(batcher, file_call([]))
    mixed = chunk(
        content="Writing",
        calls=[call('{"pa', 0)],
        additional_kwargs={"reasoning_content": "think"},
        usage_metadata={"input_tokens": 1, "output_tokens": 1, "total_tokens": 2},
    )
    frames = batcher.push("messages", [mixed, META])
    assert len(frames) == 1 and batcher.holding
    visible = frames[0][1][0]
    assert visible["content"] == "Writing" and visible["additional_kwargs"] == {"reasoning_content": "think"}
    assert visible["usage_metadata"]["total_tokens"] == 2
    assert visible["tool_call_chunks"] == visible["tool_calls"] == visible["invalid_tool_calls"] == []
    assert sent_args(batcher.flush()) == ['{"pa']


@pytest.mark.parametrize("tool", ["read_file", "bash", "write_files"])
def test_other_tools_are_never_held(tool: str) -> None:
    batcher = ToolArgBatcher(FIXED_BATCHES)
    events = file_call([f"{i}" for i in range(40)], tool=tool)
    frames = push_all(batcher, events)
    assert [data for _, data in frames] == [data for _, data in events] and not batcher.holding


def test_a_name_streamed_in_fragments_is_recognised_once_complete() -> None:
    batcher = ToolArgBatcher(FIXED_BATCHES)
    frames = push_all(
        batcher,
        [
            ("messages", [chunk(calls=[call("", 0, "write", "c1")]), META]),
            ("messages", [chunk(calls=[call("", 0, "_file")]), META]),
            ("messages", [chunk(calls=[call('{"a"', 0)]), META]),
        ],
    )
    assert len(frames) == 2 and batcher.holding


def test_merged_chunks_equal_langchains_addition_for_provider_shapes() -> None:
    openai_delta = lambda args: {  # noqa: E731
        "tool_calls": [{"index": 0, "id": None, "function": {"arguments": args, "name": None}, "type": None}]
    }
    openai = [
        chunk(calls=[call(p, 0)], additional_kwargs=openai_delta(p), response_metadata={"model_provider": "openai"})
        for p in ['{"path": "/x"', ', "content": "a\\n', 'b"}']
    ]
    anthropic = [
        chunk(content=[{"type": "input_json_delta", "partial_json": p, "index": 1}], calls=[call(p, 1)])
        for p in ['{"pa', 'th": "/', 'y"}']
    ]
    for index, stream in ((0, openai), (1, anthropic)):
        batcher = ToolArgBatcher(FIXED_BATCHES)
        head = chunk(calls=[call("", index, "write_file", "c1")])
        assert batcher.push("messages", [head, META]) == [("messages", [head, META])]
        assert push_all(batcher, [("messages", [c, META]) for c in stream]) == []
        [(_, [merged, metadata])] = batcher.flush()
        assert merged == reduce(add, [AIMessageChunk(**c) for c in stream]).model_dump()
        assert metadata == META


def test_a_chunk_that_differs_in_more_than_its_text_starts_a_new_batch() -> None:
    batcher = ToolArgBatcher(FIXED_BATCHES)
    push_all(batcher, file_call(["s1"]))
    frames = batcher.push("messages", [chunk(calls=[call("s2", 0, call_id="other")]), META])
    assert sent_args(frames) == ["s1"] and batcher.holding


@settings(max_examples=150, deadline=None)
@given(
    args=st.text(max_size=3000),
    cuts=st.lists(st.integers(min_value=0), max_size=300),
    policy=st.sampled_from([FIXED_BATCHES, BatchPolicy(), BatchPolicy(chunks=2, growth=0.1, first_chars=8)]),
    text_at=st.sets(st.integers(min_value=0, max_value=300), max_size=5),
)
def test_any_chunking_sends_the_arguments_whole_and_in_order(
    args: str, cuts: list[int], policy: BatchPolicy, text_at: set[int]
) -> None:
    bounds = sorted({0, len(args), *(c % (len(args) + 1) for c in cuts)})
    events = file_call([args[a:b] for a, b in pairwise(bounds)])
    for at in sorted(text_at, reverse=True):  # some deltas carry text as well
        if 1 <= at < len(events):
            event, (message, meta) = events[at]
            events[at] = (event, [{**message, "content": f"<{at}>"}, meta])
    renderer = ModeRenderer(["messages-tuple"], policy)
    frames = [f for event in events for f in renderer.feed(*event)] + renderer.flush()
    assert "".join(sent_args(frames)) == args
    texts = [data[0]["content"] for _, data in frames if data[0]["content"]]
    assert texts == [f"<{at}>" for at in sorted(text_at) if 1 <= at < len(events)]


# --- parse work --------------------------------------------------------------------------------


def parsed_bytes(mode: str, policy: BatchPolicy | None, size: int) -> int:
    args = json.dumps({"path": "/f", "content": "x = 'y'\n" * (size // 8)})
    events = file_call([args[i : i + 64] for i in range(0, len(args), 64)])
    renderer = ModeRenderer([mode], policy)
    frames = [f for event in events for f in renderer.feed(*event)] + renderer.flush()
    return sum(len(json.dumps(data)) for _, data in frames)


@pytest.mark.parametrize("mode", ["messages", "messages-tuple"])
def test_adaptive_batching_keeps_parse_work_linear(mode: str) -> None:
    small, large = (parsed_bytes(mode, BatchPolicy(), size) for size in (32_000, 128_000))
    assert large <= 5 * small
    assert small <= 6 * 32_000


def test_fixed_batches_are_quadratic_in_messages_mode() -> None:
    small, large = (parsed_bytes("messages", FIXED_BATCHES, size) for size in (32_000, 128_000))
    assert large >= 12 * small


def test_the_benchmark_runs_at_a_tiny_size(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("agentkeel_benchmark_tool_args", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    rows = module.main(["--sizes", "0.01,0.02", "--chunks-per-mb", "4000", "--sample", "2"])
    assert len(rows) == 12 and all(row.frames > 0 and row.parsed_bytes > 0 for row in rows)
    assert "bytes/arg" in capsys.readouterr().out
