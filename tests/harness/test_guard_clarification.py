"""Clarification and ``ask_clarification``: ask first, act after the answer, resume the same run.

Driven through the real agent loop with a checkpointer, so the interrupt and the resume are
LangGraph's own; the workspace tools run for real, so "nothing written" is checked on disk.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from guard_kit import GuardHarness, run_agent
from langchain_core.messages import AIMessage, ToolMessage

from agentkeel.harness.middleware.clarification import Clarification, normalize_options
from agentkeel.harness.middleware.contracts import implemented_axes
from agentkeel.harness.middleware.responses import SUPPRESSED, intended_calls
from agentkeel.harness.tools import build_tools
from agentkeel.harness.tools.clarify import ASK_CLARIFICATION, NO_USER_ANSWER

ASK = {"name": "ask_clarification", "args": {"question": "Which colour?", "options": ["blue", "red"]}}
WRITE = {"name": "write_file", "args": {"path": "theme.css", "content": "body { color: red }"}}


def _tools() -> list[Any]:
    return [*build_tools(bash_enabled=False), ASK_CLARIFICATION]


def _tool_messages(messages: list[Any]) -> list[ToolMessage]:
    return [m for m in messages if isinstance(m, ToolMessage)]


def test_contract_axes_match_the_hooks() -> None:
    assert set(implemented_axes(Clarification())) == set(Clarification.contract.axes) == {"model", "tool"}
    assert Clarification.contract.mandatory_for == frozenset({"lead"})


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(["a", 2], ["a", "2"]), ("only", ["only"]), ("  ", None), (None, None), ([], None), (5, None)],
)
def test_normalize_options(raw: Any, expected: list[str] | None) -> None:
    assert normalize_options(raw) == expected


async def test_question_with_a_write_pauses_before_anything_is_written_and_resumes(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    script = {"agents": {"lead": [
        {"say": "Let me check first.", "tool_calls": [ASK, WRITE]},
        {"say": "Going with blue.", "expect": {"contains": "The user answered: blue"}},
        {"say": "never reached"},
    ]}}
    harness = GuardHarness(script, [Clarification()], ws, tools=_tools())

    first = await harness.run()
    assert not (ws / "theme.css").exists()
    (pause,) = first.interrupts
    assert pause.value == {
        "type": "clarification", "question": "Which colour?", "options": ["blue", "red"],
        "tool_call_id": "call-k-lead-0-1-0",
    }
    assert first.codes == ["clarification_requested"]
    assert first.stop_reasons[0]["cause"] == "call-k-lead-0-1-0"
    assert first.stop_reasons[0]["data"] == {"question": "Which colour?"}
    asking = [m for m in first.messages if isinstance(m, AIMessage)][-1]
    assert asking.id == "msg-k-lead-0-1"
    assert [c["name"] for c in asking.tool_calls] == ["ask_clarification"]
    assert asking.additional_kwargs[SUPPRESSED]["tool_calls"][0]["name"] == "write_file"
    assert [c["name"] for c in intended_calls(asking)] == ["ask_clarification"]  # siblings not counted
    assert _tool_messages(first.messages) == []
    actions = [r["data"]["action"] for r in first.journal.kinds("intervention")]
    assert actions == ["suppress_tool_calls", "ask_user"]
    recorded_before_resume = len(first.stop_reasons)

    second = await harness.run(resume="blue")
    assert second.interrupts == []
    (answer,) = _tool_messages(second.messages)
    assert answer.content == "The user answered: blue"
    assert answer.name == "ask_clarification" and answer.tool_call_id == "call-k-lead-0-1-0"
    assert [m for m in second.messages if isinstance(m, AIMessage)][-1].content == "Going with blue."
    assert [e["code"] for e in second.stop_reasons[recorded_before_resume:]] == []
    assert len(second.requests) == 2
    assert not (ws / "theme.css").exists()


async def test_only_the_first_of_several_questions_is_kept(tmp_path: Path) -> None:
    second_ask = {"name": "ask_clarification", "args": {"question": "And the font?"}}
    script = {"agents": {"lead": [{"tool_calls": [ASK, second_ask]}]}}
    out = await GuardHarness(script, [Clarification()], tmp_path / "ws", tools=_tools()).run()
    (pause,) = out.interrupts
    assert pause.value["question"] == "Which colour?"
    asking = [m for m in out.messages if isinstance(m, AIMessage)][-1]
    assert [c["args"].get("question") for c in asking.tool_calls] == ["Which colour?"]


async def test_other_calls_pass_through_untouched(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    other = {"name": "write_file", "args": {"path": "b.txt", "content": "b"}}
    script = {"agents": {"lead": [{"tool_calls": [WRITE, other]}, {"say": "Both written."}]}}
    out = await run_agent(script, [Clarification()], ws, tools=_tools())
    assert (ws / "theme.css").exists() and (ws / "b.txt").exists()
    assert out.codes == [] and out.interrupts == [] and out.journal.kinds("intervention") == []


async def test_a_call_without_a_question_is_an_error_not_a_pause(tmp_path: Path) -> None:
    script = {"agents": {"lead": [{"tool_calls": [{"name": "ask_clarification", "args": {"question": " "}}]}, {"say": "ok"}]}}
    out = await GuardHarness(script, [Clarification()], tmp_path / "ws", tools=_tools()).run()
    (result,) = _tool_messages(out.messages)
    assert result.status == "error" and "question" in str(result.content)
    assert out.interrupts == [] and out.codes == []


async def test_without_the_middleware_the_tool_says_nobody_can_answer(tmp_path: Path) -> None:
    script = {"agents": {"lead": [{"tool_calls": [ASK]}, {"say": "Assuming blue.", "expect": {"contains": "best judgement"}}]}}
    out = await run_agent(script, [], tmp_path / "ws", tools=_tools())
    (result,) = _tool_messages(out.messages)
    assert result.content == NO_USER_ANSWER and result.status == "success"
    assert out.interrupts == [] and out.codes == []
