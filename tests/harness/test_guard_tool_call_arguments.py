"""ToolCallArguments: tool calls with malformed arguments never run; the model is told and retries.

Driven through the real agent loop on the default lead chain. The scripted model sends raw
argument text (``raw_args``): answered whole it is parsed like the OpenAI client parses a complete
reply (unparsable text becomes an ``invalid_tool_call``); streamed, LangChain aggregates the real
``AIMessageChunk`` fragments with its partial-JSON parser, which *repairs* a truncated string into
a valid-looking call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from guard_kit import GuardHarness, Outcome, final_ai
from langchain.agents.middleware.types import ModelResponse
from langchain_core.messages import AIMessage, AIMessageChunk, ToolMessage
from langchain_core.messages.tool import tool_call_chunk
from langchain_core.outputs import ChatGenerationChunk

from agentkeel.harness.middleware.catalog import build_agent_chain
from agentkeel.harness.middleware.keys import TOOL_META
from agentkeel.harness.middleware.responses import replace_ai, withhold
from agentkeel.harness.middleware.tool_call_arguments import (
    MALFORMED,
    StreamedArguments,
    argument_error,
    content_raw_args,
    malformed_result,
    split_malformed,
)
from agentkeel.limits import Limits

PATH = "/workspace/notes.md"
CUT_MID_STRING = '{"path": "' + PATH + '", "content": "# Notes\\nThe first half of the'
NO_CLOSING_BRACE = '{"path": "' + PATH + '", "content": "complete text"'
RETRY = {"name": "write_file", "id": "retry", "args": {"path": PATH, "content": "# Notes\nall of it\n"}}


def _script(*first: dict[str, Any], stream_chunks: int = 4) -> dict[str, Any]:
    return {"agents": {"lead": [
        {"tool_calls": list(first), "stream_chunks": stream_chunks},
        {"tool_calls": [RETRY]},
        {"say": "Written."},
    ]}}


async def _run(tmp_path: Path, script: dict[str, Any], streamed: bool) -> tuple[Outcome, Path]:
    chain = build_agent_chain("lead", Limits(), strict_grammar=True)
    modes = ("updates", "messages") if streamed else ("updates",)
    harness = GuardHarness(script, chain.for_agent(), tmp_path / "ws", stream_modes=modes)
    return await harness.run(), tmp_path / "ws" / "notes.md"


def _errors(out: Outcome) -> list[ToolMessage]:
    return [m for m in out.messages if isinstance(m, ToolMessage) and m.status == "error"]


@pytest.mark.parametrize(("raw", "error"), [
    (CUT_MID_STRING, "Unterminated string starting at: line 1 column 44 (char 43)"),
    (NO_CLOSING_BRACE, "Expecting ',' delimiter: line 1 column 59 (char 58)"),
])
@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "complete"])
async def test_a_malformed_call_writes_nothing_and_the_model_is_told_why(
    tmp_path: Path, raw: str, error: str, streamed: bool
) -> None:
    out, written = await _run(tmp_path, _script({"name": "write_file", "id": "bad", "raw_args": raw}), streamed)
    # The retry wrote the file; the malformed call never ran (no half content at any point).
    assert written.read_text() == "# Notes\nall of it\n"
    assert [r["data"]["calls"][0]["id"] for r in out.journal.kinds("intervention")
            if r["data"]["action"] == "malformed_arguments"] == ["bad"]
    (answer,) = _errors(out)
    assert answer.tool_call_id == "bad" and answer.name == "write_file"
    assert error in str(answer.content) and "not executed" in str(answer.content)
    assert answer.additional_kwargs[TOOL_META]["source"] == "ToolCallArguments"
    # The next request carries the call (with `{}` as arguments) and its error result right after it.
    second = out.requests[1]
    index = next(i for i, m in enumerate(second) if isinstance(m, AIMessage) and m.tool_calls)
    assert second[index].tool_calls[0]["args"] == {} and second[index].tool_calls[0]["id"] == "bad"
    assert isinstance(second[index + 1], ToolMessage) and second[index + 1].tool_call_id == "bad"
    # State keeps what the model sent; the run went on to a real answer, with no stop reason.
    kept = next(m for m in out.messages if isinstance(m, AIMessage) and MALFORMED in m.additional_kwargs)
    assert kept.additional_kwargs[MALFORMED] == [{"id": "bad", "name": "write_file", "args": raw, "error": error}]
    assert final_ai(out).content == "Written." and out.stop_reasons == []


async def test_a_response_with_only_malformed_calls_is_never_the_final_answer(tmp_path: Path) -> None:
    script = {"agents": {"lead": [
        {"tool_calls": [{"name": "write_file", "id": "bad", "raw_args": NO_CLOSING_BRACE}]},
        {"say": "I could not write the file."},
    ]}}
    out, written = await _run(tmp_path, script, streamed=False)
    assert not written.exists()
    assert len(out.requests) == 2  # back to the model with the error, not ended with an empty answer
    assert isinstance(out.requests[1][-1], ToolMessage) and out.requests[1][-1].tool_call_id == "bad"
    assert final_ai(out).content == "I could not write the file."


async def test_valid_siblings_run_and_only_the_malformed_call_is_refused(tmp_path: Path) -> None:
    good = {"name": "write_file", "id": "good", "args": {"path": "/workspace/other.md", "content": "fine\n"}}
    bad = {"name": "write_file", "id": "bad", "raw_args": CUT_MID_STRING}
    out, written = await _run(tmp_path, _script(good, bad), streamed=True)
    assert (tmp_path / "ws" / "other.md").read_text() == "fine\n"
    assert [m.tool_call_id for m in _errors(out)] == ["bad"]
    assert written.read_text() == "# Notes\nall of it\n"  # from the retry only


def test_argument_error_is_a_strict_parse_of_the_raw_text() -> None:
    assert argument_error('{"a": 1}') is None
    assert argument_error("") is None  # no arguments, as the OpenAI client reads it
    assert argument_error('{"a": "line\nbreak"}') is None  # raw newline in a string, like the client
    assert argument_error("[1, 2]") == "the arguments are a JSON list, not an object"
    assert argument_error(None) == "no argument text was received"
    assert argument_error('{"a": "cut') == "Unterminated string starting at: line 1 column 7 (char 6)"


def test_a_streamed_anthropic_tool_use_block_keeps_its_raw_text() -> None:
    # What langchain-anthropic aggregates from input_json_delta events: input {} and partial_json.
    raw = '{"path": "a.md", "content": "half'
    message = AIMessage(
        content=[{"type": "tool_use", "id": "toolu_1", "name": "write_file", "input": {}, "partial_json": raw, "index": 0}],
        tool_calls=[{"name": "write_file", "args": {"path": "a.md", "content": "half"}, "id": "toolu_1"}],
    )
    checked, malformed = split_malformed(message, content_raw_args(message))
    assert checked.tool_calls == [{"name": "write_file", "args": {}, "id": "toolu_1", "type": "tool_call"}]
    assert malformed == [{"id": "toolu_1", "name": "write_file", "args": raw,
                          "error": "Unterminated string starting at: line 1 column 29 (char 28)"}]


def test_withholding_an_answered_call_drops_its_result_too() -> None:
    ai = AIMessage(content="", tool_calls=[{"name": "write_file", "args": {}, "id": "bad"}])
    response = ModelResponse(result=[ai, malformed_result("bad", "write_file", "{", "broken", "ToolCallArguments")])
    stripped = replace_ai(response, ai, withhold(ai, "TurnLimit", "[turn limit]"))
    assert [type(m).__name__ for m in stripped.result] == ["AIMessage"]


def test_streamed_arguments_count_each_chunk_once_and_join_fragments_by_index() -> None:
    def piece(args: str, call_id: str | None = None, index: int = 0) -> ChatGenerationChunk:
        fragment = tool_call_chunk(name="write_file" if call_id else None, args=args, id=call_id, index=index)
        return ChatGenerationChunk(message=AIMessageChunk(content="", tool_call_chunks=[fragment]))

    run, capture = uuid4(), StreamedArguments()
    chunks = [piece('{"path": "a', "c1"), piece('{"x": 1}', "c2", index=1), piece('.md"}')]
    for chunk in chunks:  # the provider and the base model both report each chunk
        capture.on_llm_new_token("", chunk=chunk, run_id=run)
        capture.on_llm_new_token("", chunk=chunk, run_id=run)
    assert capture.raw_args() == {"c1": '{"path": "a.md"}', "c2": '{"x": 1}'}
