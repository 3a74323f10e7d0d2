"""TerminalResponse: a run whose last response carries no answer gets exactly one tool-less call.

Driven through the real agent loop with the scripted model in strict mode, so the extra request
must keep the provider grammar, and every model call consumes one scripted turn (the count of
requests is the count of provider calls).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from guard_kit import RetryOnce, run_agent
from hypothesis import given
from hypothesis import strategies as st
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from agentkeel.harness.middleware.chain import build_chain
from agentkeel.harness.middleware.contracts import implemented_axes
from agentkeel.harness.middleware.model_length import ModelLengthFinishReason
from agentkeel.harness.middleware.responses import SUPPRESSED, hint_message, last_ai, replace_ai, was_stripped, withhold
from agentkeel.harness.middleware.safety_finish_reason import SafetyFinishReason
from agentkeel.harness.middleware.terminal_response import (
    INSTRUCTION,
    INSTRUCTION_NAME,
    TerminalResponse,
    final_answer_missing,
    tool_work_since_user,
)

WRITE = {"name": "write_file", "args": {"path": "notes.md", "content": "late"}}
LS = {"name": "ls", "args": {"path": "/workspace"}}


class ToolsSpy(AgentMiddleware):
    """Innermost test layer: the names of the tools bound to each provider call."""

    def __init__(self) -> None:
        super().__init__()
        self.bound: list[list[str]] = []

    async def awrap_model_call(self, request: Any, handler: Any) -> Any:
        self.bound.append([getattr(t, "name", None) or t.get("name") for t in request.tools])
        return await handler(request)


class WithholdFirst(AgentMiddleware):
    """A stand-in guard: withholds the tool calls of the first response (like a turn limit)."""

    def __init__(self) -> None:
        super().__init__()
        self.done = False

    async def awrap_model_call(self, request: Any, handler: Any) -> Any:
        response = await handler(request)
        ai = last_ai(response)
        if self.done or ai is None or not ai.tool_calls:
            return response
        self.done = True
        return replace_ai(response, ai, withhold(ai, "WithholdFirst", "[Calls withheld by a guard.]"))




def _ais(messages: list[BaseMessage]) -> list[AIMessage]:
    return [m for m in messages if isinstance(m, AIMessage)]


# -- pure helpers ----------------------------------------------------------------------------

def test_tool_work_counts_only_after_the_latest_genuine_user_message() -> None:
    call = AIMessage(content="", tool_calls=[{"name": "ls", "args": {}, "id": "c1"}])
    result = ToolMessage(content="a.txt", tool_call_id="c1")
    assert tool_work_since_user([HumanMessage("go"), call, result])
    assert not tool_work_since_user([HumanMessage("go"), call, result, HumanMessage("and now?")])
    # A transient hint is not the user speaking.
    assert tool_work_since_user([HumanMessage("go"), call, result, hint_message("loop_warning", ["careful"])])
    assert not tool_work_since_user([HumanMessage("go")])


@given(text=st.text(max_size=20), stripped=st.booleans(), live_calls=st.booleans(), tool_work=st.booleans())
def test_trigger_table(text: str, stripped: bool, live_calls: bool, tool_work: bool) -> None:
    calls = [{"name": "ls", "args": {}, "id": "c9"}] if live_calls else []
    ai = AIMessage(content=text, tool_calls=calls)
    if stripped:
        ai = withhold(ai.model_copy(update={"tool_calls": [{"name": "ls", "args": {}, "id": "c8"}]}), "G", "[x]")
        ai = ai.model_copy(update={"tool_calls": calls})
    history: list[BaseMessage] = [HumanMessage("go")]
    if tool_work:
        history += [AIMessage(content="", tool_calls=[{"name": "ls", "args": {}, "id": "c1"}]), ToolMessage("r", tool_call_id="c1")]
    expected = None
    if not live_calls:
        if stripped:
            expected = "stripped"
        elif not text.strip() and tool_work:
            expected = "empty"
    assert final_answer_missing(ai, history) == expected


def test_contract_matches_hooks_and_it_runs_outside_the_response_repairs() -> None:
    terminal, safety, length = TerminalResponse(), SafetyFinishReason(), ModelLengthFinishReason()
    assert implemented_axes(terminal) == ["model"]
    chain = build_chain("lead", [safety, length, terminal], derive=True)
    assert chain.middlewares[0] is terminal


# -- through the agent -----------------------------------------------------------------------

async def test_after_a_safety_strip_one_tool_less_call_gives_the_final_answer(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    spy = ToolsSpy()
    script = {"agents": {"lead": [
        {"say": "Writing it.", "tool_calls": [WRITE], "finish_reason": "content_filter"},
        {"say": "I could not write the notes; here is what I have."},
        {"say": "never reached"},
    ]}}
    out = await run_agent(script, [TerminalResponse(), SafetyFinishReason(), spy], ws)

    assert len(out.requests) == 2  # the original call and exactly one extra
    assert spy.bound[0] and spy.bound[1] == []  # the extra call has no tools bound
    extra = out.requests[-1]
    assert isinstance(extra[-1], HumanMessage) and extra[-1].name == INSTRUCTION_NAME
    assert extra[-1].content == INSTRUCTION
    assert extra[-2].id == "msg-k-lead-0-1" and was_stripped(extra[-2])

    first, final = _ais(out.messages)
    assert first.id == "msg-k-lead-0-1" and first.tool_calls == []
    assert final.content == "I could not write the notes; here is what I have." and final.tool_calls == []
    assert out.messages[-1].id == final.id
    assert not any(getattr(m, "name", None) == INSTRUCTION_NAME for m in out.messages)  # never in state
    assert not (ws / "notes.md").exists()
    (entry,) = [r for r in out.journal.kinds("intervention") if r["data"]["action"] == "final_answer"]
    assert entry["data"]["trigger"] == "stripped" and entry["data"]["final_message_id"] == final.id


async def test_a_guard_withhold_also_gets_its_final_answer(tmp_path: Path) -> None:
    script = {"agents": {"lead": [{"tool_calls": [LS]}, {"say": "Summary without listing."}]}}
    out = await run_agent(script, [TerminalResponse(), WithholdFirst()], tmp_path / "ws")
    assert len(out.requests) == 2
    assert _ais(out.messages)[-1].content == "Summary without listing."
    assert not any(isinstance(m, ToolMessage) for m in out.messages)


async def test_tool_calls_in_the_extra_response_are_suppressed_and_no_second_call(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    script = {"agents": {"lead": [
        {"tool_calls": [WRITE], "finish_reason": "length"},
        {"say": "One more thing.", "tool_calls": [WRITE]},
        {"say": "never reached"},
    ]}}
    out = await run_agent(script, [TerminalResponse(), ModelLengthFinishReason()], ws)

    assert len(out.requests) == 2
    assert not (ws / "notes.md").exists()
    final = _ais(out.messages)[-1]
    assert final.id == "msg-k-lead-0-2" and final.tool_calls == []
    assert final.additional_kwargs[SUPPRESSED]["tool_calls"][0]["name"] == "write_file"
    assert not any(isinstance(m, ToolMessage) for m in out.messages)
    assert out.codes == ["model_length_capped"]


async def test_a_stripped_extra_response_never_gets_a_second_extra_call(tmp_path: Path) -> None:
    script = {"agents": {"lead": [
        {"tool_calls": [WRITE], "finish_reason": "content_filter"},
        {"tool_calls": [WRITE], "finish_reason": "content_filter"},
        {"say": "never reached"},
    ]}}
    out = await run_agent(script, [TerminalResponse(), SafetyFinishReason()], tmp_path / "ws")
    assert len(out.requests) == 2
    assert out.codes == ["safety_capped", "safety_capped"]
    assert [e["cause"] for e in out.stop_reasons] == ["msg-k-lead-0-1", "msg-k-lead-0-2"]


async def test_an_outer_retry_never_causes_a_second_extra_call(tmp_path: Path) -> None:
    script = {"agents": {"lead": [
        {"tool_calls": [WRITE], "finish_reason": "content_filter"},
        {"raise": {"kind": "server_error"}},  # the extra call fails; the retry re-runs everything
        {"say": "Retried answer.", "tool_calls": [WRITE], "finish_reason": "content_filter"},
        {"say": "never reached"},
    ]}}
    out = await run_agent(script, [RetryOnce(), TerminalResponse(), SafetyFinishReason()], tmp_path / "ws")
    assert len(out.requests) == 3
    assert [m.id for m in _ais(out.messages)] == ["msg-k-lead-0-3"]
    assert not (tmp_path / "ws" / "notes.md").exists()


async def test_empty_answer_after_tool_work_gets_one_extra_call(tmp_path: Path) -> None:
    script = {"agents": {"lead": [
        {"tool_calls": [LS]},
        {"say": ""},
        {"say": "The workspace is empty."},
        {"say": "never reached"},
    ]}}
    spy = ToolsSpy()
    out = await run_agent(script, [TerminalResponse(), spy], tmp_path / "ws")

    assert len(out.requests) == 3
    assert spy.bound[2] == [] and spy.bound[1]
    assert out.requests[-1][-1].name == INSTRUCTION_NAME
    empty, final = _ais(out.messages)[-2:]
    assert empty.content == "" and empty.id == "msg-k-lead-0-2"  # kept in state, documented
    assert final.content == "The workspace is empty."
    (entry,) = out.journal.kinds("intervention")
    assert entry["data"]["trigger"] == "empty"


@pytest.mark.parametrize(
    "turns",
    [
        [{"tool_calls": [LS]}, {"say": "Done."}],
        [{"say": ""}],  # empty, but no tool work since the user spoke
        [{"say": "Hello."}],
    ],
)
async def test_clean_runs_make_no_extra_call(tmp_path: Path, turns: list[dict[str, Any]]) -> None:
    script = {"agents": {"lead": [*turns, {"say": "never reached"}]}}
    out = await run_agent(script, [TerminalResponse()], tmp_path / "ws")
    assert len(out.requests) == len(turns)
    assert out.journal.kinds("intervention") == []
    assert all(m.name != INSTRUCTION_NAME for r in out.requests for m in r if isinstance(m, HumanMessage))
