"""SafetyFinishReason and ModelLengthFinishReason: a cut or filtered response never acts.

Driven through the real agent loop: the scripted model answers with provider-shaped finish
reasons (OpenAI, Anthropic, Gemini) and the workspace tools run for real, so "nothing written"
is checked on disk.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from guard_kit import Outcome, run_agent
from hypothesis import given
from hypothesis import strategies as st
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import AIMessage

from agentkeel.harness.middleware.model_length import LENGTH_DETECTORS, ModelLengthFinishReason
from agentkeel.harness.middleware.responses import SUPPRESSED, intended_calls, last_ai, replace_ai
from agentkeel.harness.middleware.safety_finish_reason import (
    SAFETY_DETECTORS,
    SAFETY_STAMP,
    SafetyFinishReason,
    detect,
)

WRITE = {"name": "write_file", "args": {"path": "out/report.md", "content": "half a rep"}}

GEMINI_SAFETY = [
    "SAFETY", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "RECITATION",
    "IMAGE_SAFETY", "IMAGE_PROHIBITED_CONTENT", "IMAGE_RECITATION",
]


class RawProviderCalls(AgentMiddleware):
    """Inner test layer: adds the raw OpenAI ``tool_calls`` field a real integration keeps."""

    async def awrap_model_call(self, request: Any, handler: Any) -> Any:
        response = await handler(request)
        ai = last_ai(response)
        if ai is None or not ai.tool_calls:
            return response
        raw = [{"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": "{}"}} for c in ai.tool_calls]
        return replace_ai(response, ai, ai.model_copy(update={"additional_kwargs": {**ai.additional_kwargs, "tool_calls": raw}}))


def _ai(**metadata: Any) -> AIMessage:
    return AIMessage(content="x", response_metadata=metadata)


def _final_ai(out: Outcome) -> AIMessage:
    return [m for m in out.messages if isinstance(m, AIMessage)][-1]


# -- detectors --------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("metadata", "detector"),
    [
        ({"finish_reason": "content_filter"}, "openai_content_filter"),
        ({"finish_reason": "CONTENT_FILTER"}, "openai_content_filter"),
        ({"stop_reason": "refusal"}, "anthropic_refusal"),
        *[({"finish_reason": value}, "gemini_safety") for value in GEMINI_SAFETY],
    ],
)
def test_safety_detectors_match(metadata: dict[str, str], detector: str) -> None:
    found = detect(_ai(**metadata), SAFETY_DETECTORS)
    assert found is not None and found.detector == detector


@pytest.mark.parametrize(
    "metadata",
    [
        {"finish_reason": "stop"}, {"finish_reason": "tool_calls"}, {"finish_reason": "length"},
        {"finish_reason": "MAX_TOKENS"}, {"finish_reason": "OTHER"}, {"finish_reason": "MALFORMED_FUNCTION_CALL"},
        {"stop_reason": "end_turn"}, {"stop_reason": "max_tokens"}, {}, {"finish_reason": None},
    ],
)
def test_safety_detectors_ignore_other_reasons(metadata: dict[str, Any]) -> None:
    assert detect(_ai(**metadata), SAFETY_DETECTORS) is None


def test_detectors_fall_back_to_additional_kwargs_but_prefer_response_metadata() -> None:
    from_kwargs = AIMessage(content="", additional_kwargs={"finish_reason": "content_filter"})
    assert detect(from_kwargs, SAFETY_DETECTORS) is not None
    both = AIMessage(content="", response_metadata={"finish_reason": "stop"}, additional_kwargs={"finish_reason": "content_filter"})
    assert detect(both, SAFETY_DETECTORS) is None


def _casings(word: str) -> st.SearchStrategy[str]:
    return st.tuples(*[st.sampled_from([ch.lower(), ch.upper()]) for ch in word]).map("".join)


@given(st.sampled_from(["length", "max_tokens"]).flatmap(_casings))
def test_length_detectors_are_case_insensitive(value: str) -> None:
    fields = ["finish_reason"] if value.lower() == "length" else ["stop_reason", "finish_reason"]
    for field in fields:
        message = _ai(**{field: value})
        assert detect(message, LENGTH_DETECTORS) is not None
        assert detect(message, SAFETY_DETECTORS) is None


@given(st.text(max_size=30))
def test_safety_and_length_never_both_match(value: str) -> None:
    for field in ("finish_reason", "stop_reason"):
        message = _ai(**{field: value})
        assert detect(message, SAFETY_DETECTORS) is None or detect(message, LENGTH_DETECTORS) is None


# -- safety through the agent ----------------------------------------------------------------

async def test_content_filter_with_write_file_writes_nothing(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    script = {"agents": {"lead": [{"say": "Writing the report.", "tool_calls": [WRITE], "finish_reason": "content_filter"}]}}
    out = await run_agent(script, [SafetyFinishReason(), RawProviderCalls()], ws)

    assert not (ws / "out" / "report.md").exists()
    assert out.codes == ["safety_capped"]
    entry = out.stop_reasons[0]
    assert entry["class"] == "safety" and entry["cause"] == "msg-k-lead-0-1"
    assert entry["data"] == {"field": "finish_reason", "value": "content_filter", "suppressed": ["write_file"]}

    ai = _final_ai(out)
    assert ai.id == "msg-k-lead-0-1"
    assert ai.tool_calls == [] and "tool_calls" not in ai.additional_kwargs
    assert intended_calls(ai) == []  # a protocol repair is never counted as intent
    assert ai.additional_kwargs[SUPPRESSED]["tool_calls"][0]["name"] == "write_file"
    assert ai.additional_kwargs[SAFETY_STAMP] == {
        "detector": "openai_content_filter", "field": "finish_reason", "value": "content_filter",
        "suppressed_tool_calls": ["write_file"],
    }
    assert ai.response_metadata["finish_reason"] == "content_filter"
    assert "safety" in str(ai.content) and "not executed" in str(ai.content)
    assert not any(m.type == "tool" for m in out.messages)

    (intervention,) = out.journal.kinds("intervention")
    assert intervention["data"]["tool_calls"] == [{"name": "write_file", "id": "call-k-lead-0-1-0"}]
    assert "half a rep" not in repr(intervention) and "half a rep" not in repr(out.stop_reasons)


@pytest.mark.parametrize(
    ("provider", "field", "value"),
    [("anthropic", "stop_reason", "refusal"), ("gemini", "finish_reason", "SAFETY")],
)
async def test_provider_variants_are_capped(tmp_path: Path, provider: str, field: str, value: str) -> None:
    ws = tmp_path / "ws"
    script = {"agents": {"lead": [{"tool_calls": [WRITE], "finish_reason": "content_filter", "provider": provider}]}}
    out = await run_agent(script, [SafetyFinishReason()], ws)

    assert not (ws / "out" / "report.md").exists()
    assert out.codes == ["safety_capped"]
    assert out.stop_reasons[0]["data"] == {"field": field, "value": value, "suppressed": ["write_file"]}
    assert _final_ai(out).tool_calls == []


async def test_refusal_without_tool_calls_is_recorded_not_rewritten(tmp_path: Path) -> None:
    script = {"agents": {"lead": [{"say": "I can't help with that.", "finish_reason": "refusal", "provider": "anthropic"}]}}
    out = await run_agent(script, [SafetyFinishReason()], tmp_path / "ws")

    assert out.codes == ["safety_capped"]
    ai = _final_ai(out)
    assert ai.content == "I can't help with that." and ai.id == "msg-k-lead-0-1"
    assert ai.additional_kwargs[SAFETY_STAMP]["suppressed_tool_calls"] == []
    assert out.journal.kinds("intervention") == []


async def test_clean_responses_pass_untouched(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    script = {"agents": {"lead": [{"tool_calls": [WRITE], "provider": "gemini"}, {"say": "Done.", "provider": "gemini"}]}}
    out = await run_agent(script, [SafetyFinishReason(), ModelLengthFinishReason()], ws)

    assert (ws / "out" / "report.md").read_text() == "half a rep"
    assert out.codes == []
    assert _final_ai(out).content == "Done."
    assert all(SAFETY_STAMP not in m.additional_kwargs for m in out.messages)


# -- length through the agent ----------------------------------------------------------------

@pytest.mark.parametrize(
    ("provider", "field", "value"),
    [("openai", "finish_reason", "length"), ("anthropic", "stop_reason", "max_tokens"), ("gemini", "finish_reason", "MAX_TOKENS")],
)
async def test_length_cut_tool_call_never_executes(tmp_path: Path, provider: str, field: str, value: str) -> None:
    ws = tmp_path / "ws"
    script = {"agents": {"lead": [{"say": "Here it comes", "tool_calls": [WRITE], "finish_reason": "length", "provider": provider}]}}
    out = await run_agent(script, [ModelLengthFinishReason(), RawProviderCalls()], ws)

    assert not (ws / "out" / "report.md").exists()
    assert out.codes == ["model_length_capped"]
    assert out.stop_reasons[0]["cause"] == "msg-k-lead-0-1"
    assert out.stop_reasons[0]["data"] == {"field": field, "value": value, "suppressed": ["write_file"]}
    ai = _final_ai(out)
    assert ai.id == "msg-k-lead-0-1" and ai.tool_calls == [] and "tool_calls" not in ai.additional_kwargs
    assert "smaller" in str(ai.content) and str(ai.content).startswith("Here it comes")
    assert intended_calls(ai) == []
    (intervention,) = out.journal.kinds("intervention")
    assert intervention["data"]["tool_calls"] == [{"name": "write_file", "id": "call-k-lead-0-1-0"}]


async def test_length_cut_text_answer_is_recorded_and_kept(tmp_path: Path) -> None:
    script = {"agents": {"lead": [{"say": "The answer is that the", "finish_reason": "length"}]}}
    out = await run_agent(script, [ModelLengthFinishReason()], tmp_path / "ws")

    assert out.codes == ["model_length_capped"]
    assert out.stop_reasons[0]["data"]["suppressed"] == []
    assert _final_ai(out).content == "The answer is that the"


async def test_safety_stop_is_not_a_length_stop(tmp_path: Path) -> None:
    script = {"agents": {"lead": [{"tool_calls": [WRITE], "finish_reason": "SAFETY", "provider": "gemini"}]}}
    out = await run_agent(script, [ModelLengthFinishReason(), SafetyFinishReason()], tmp_path / "ws")
    assert out.codes == ["safety_capped"]
