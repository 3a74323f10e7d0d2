"""DanglingToolCall and the tool-pairing repair: unanswered calls never reach a strict provider."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from guard_kit import GuardHarness
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from agentkeel.harness.middleware.chain import ChainError, build_chain
from agentkeel.harness.middleware.dangling_tool_call import DanglingToolCall
from agentkeel.harness.middleware.grammar import grammar_violation
from agentkeel.harness.middleware.repair import repair_tool_pairing
from agentkeel.harness.middleware.responses import hint_message
from agentkeel.harness.scripted.errors import StrictRequestError


def _ai(*ids: str, text: str = "") -> AIMessage:
    return AIMessage(content=text, tool_calls=[{"name": "ls", "args": {}, "id": i} for i in ids])


def _result(call_id: str, content: str = "out") -> ToolMessage:
    return ToolMessage(content=content, tool_call_id=call_id, name="ls")


def _shape(messages: list[BaseMessage]) -> list[str]:
    out = []
    for m in messages:
        if isinstance(m, ToolMessage):
            out.append(f"tool:{m.tool_call_id}:{m.status}")
        elif isinstance(m, AIMessage):
            out.append("ai:" + ",".join(str(c["id"]) for c in m.tool_calls))
        else:
            out.append(f"{m.type}:{m.content}")
    return out


# -- the pure repair ---------------------------------------------------------------------------


def test_dangling_call_gets_a_synthetic_error_result_right_after_it() -> None:
    history = [HumanMessage("go"), _ai("a", "b"), _result("b"), HumanMessage("next")]
    out, repairs = repair_tool_pairing(history)
    assert _shape(out) == ["human:go", "ai:a,b", "tool:b:success", "tool:a:error", "human:next"]
    synthetic = out[3]
    assert isinstance(synthetic, ToolMessage) and synthetic.name == "ls"
    assert "ls" in synthetic.text and "interrupted" in synthetic.text and "again" in synthetic.text
    assert [(r.rule, r.action, r.subject) for r in repairs] == [(3, "synthetic_result", "a")]
    assert grammar_violation(None, out) is None


def test_results_are_regrouped_after_their_call_and_user_notes_moved_after_them() -> None:
    note = hint_message("LoopDetection", ["slow down"])
    history = [HumanMessage("go"), _ai("a", "b"), _result("b"), note, HumanMessage("more"), _result("a")]
    out, repairs = repair_tool_pairing(history)
    assert _shape(out) == ["human:go", "ai:a,b", "tool:b:success", "tool:a:success", "human:slow down", "human:more"]
    assert sorted(r.action for r in repairs) == ["regrouped", "user_moved", "user_moved"]
    assert grammar_violation(None, out) is None


def test_first_answer_wins_and_orphans_are_dropped() -> None:
    history = [HumanMessage("go"), _ai("a"), _result("a", "first"), _result("a", "second"), _result("zz")]
    out, repairs = repair_tool_pairing(history)
    assert _shape(out) == ["human:go", "ai:a", "tool:a:success"]
    assert out[2].content == "first"
    assert sorted((r.rule, r.action) for r in repairs) == [(3, "duplicate_dropped"), (4, "orphan_dropped")]


def test_a_result_before_its_call_is_moved_after_it() -> None:
    out, repairs = repair_tool_pairing([HumanMessage("go"), _result("a"), _ai("a")])
    assert _shape(out) == ["human:go", "ai:a", "tool:a:success"]
    assert [r.action for r in repairs] == ["regrouped"]


def test_reused_call_ids_across_turns_pair_with_the_nearest_call() -> None:
    valid = [HumanMessage("go"), _ai("a"), _result("a", "one"), _ai("a"), _result("a", "two")]
    out, repairs = repair_tool_pairing(valid)
    assert repairs == [] and out == valid and all(x is y for x, y in zip(out, valid))
    dangling_first = [HumanMessage("go"), _ai("a"), _ai("a"), _result("a", "late")]
    out, _ = repair_tool_pairing(dangling_first)
    assert _shape(out) == ["human:go", "ai:a", "tool:a:error", "ai:a", "tool:a:success"]
    assert out[4].content == "late"


def test_missing_and_repeated_call_ids_get_fresh_ids_in_the_request_only() -> None:
    original = AIMessage(content="", tool_calls=[
        {"name": "ls", "args": {}, "id": "a"},
        {"name": "ls", "args": {}, "id": "a"},
        {"name": "grep", "args": {}, "id": None},
    ])
    history = [HumanMessage("go"), original, _result("a")]
    out, repairs = repair_tool_pairing(history)
    assert grammar_violation(None, out) is None
    ids = [c["id"] for c in out[1].tool_calls]
    assert ids[0] == "a" and len(set(ids)) == 3 and all(ids)
    assert [c["id"] for c in original.tool_calls] == ["a", "a", None]  # the state's message is untouched
    assert [r.action for r in repairs].count("call_id_assigned") == 2


def test_valid_history_is_returned_unchanged() -> None:
    history = [HumanMessage("go"), _ai("a", "b"), _result("b"), _result("a"), AIMessage("done"), HumanMessage("thanks")]
    snapshot = list(history)
    out, repairs = repair_tool_pairing(history)
    assert repairs == [] and out is not history and all(x is y for x, y in zip(out, history, strict=True))
    assert history == snapshot


# -- the guard on the real agent -----------------------------------------------------------------


DANGLING = AIMessage(
    content="", id="ai-dangling", tool_calls=[{"name": "ls", "args": {"path": "/workspace"}, "id": "dangle-1"}]
)


async def _thread_with_dangling_call(script: dict[str, Any], middleware: list[Any], ws: Path) -> GuardHarness:
    harness = GuardHarness(script, middleware, ws)
    await harness.run("hello")
    await harness.graph.aupdate_state({"configurable": {"thread_id": harness.thread_id}}, {"messages": [DANGLING]})
    return harness


async def test_without_the_guard_a_dangling_call_breaks_the_next_strict_request(tmp_path: Path) -> None:
    script = {"agents": {"lead": [{"say": "one"}, {"say": "two"}]}}
    harness = await _thread_with_dangling_call(script, [], tmp_path / "ws")
    with pytest.raises(StrictRequestError) as raised:
        await harness.run("again", run_id="r2")
    assert raised.value.rule == 3


async def test_guard_sends_a_synthetic_result_and_leaves_state_alone(tmp_path: Path) -> None:
    script = {"agents": {"lead": [
        {"say": "one"},
        {"tool_calls": [{"name": "ls", "args": {"path": "/workspace"}}], "expect": {"contains": "interrupted"}},
        {"say": "two"},
    ]}}
    harness = await _thread_with_dangling_call(script, [DanglingToolCall()], tmp_path / "ws")
    outcome = await harness.run("again", run_id="r2")

    # Both model calls of the second run carried the repair right after the dangling call.
    for request in outcome.requests[1:]:
        at = next(i for i, m in enumerate(request) if m.id == "ai-dangling")
        synthetic = request[at + 1]
        assert isinstance(synthetic, ToolMessage) and synthetic.tool_call_id == "dangle-1"
        assert synthetic.status == "error"
        assert grammar_violation(None, request) is None
    assert len(outcome.requests) == 3 and outcome.messages[-1].content == "two"

    # State keeps the history as it happened: the call is still unanswered there.
    assert not any(isinstance(m, ToolMessage) and m.tool_call_id == "dangle-1" for m in outcome.messages)
    assert any(m.id == "ai-dangling" for m in outcome.messages)

    # Repaired on every call, journaled once for the run.
    [record] = outcome.journal.kinds("intervention")
    assert record["data"]["middleware"] == "DanglingToolCall" and record["data"]["action"] == "repair"
    assert record["data"]["counts"] == {"synthetic_result": 1} and record["data"]["call_ids"] == ["dangle-1"]


async def test_a_run_whose_input_carries_a_dangling_call_succeeds(tmp_path: Path) -> None:
    harness = GuardHarness({"agents": {"lead": [{"say": "fine"}]}}, [DanglingToolCall()], tmp_path / "ws")
    config = {"configurable": {"thread_id": harness.thread_id}, "callbacks": [harness.log]}
    graph_input = {"messages": [HumanMessage("go"), DANGLING, HumanMessage("and now?")]}
    async for _ in harness.graph.astream(graph_input, config, context=harness.context()):
        pass
    [request] = harness.log.requests
    assert _shape(request[1:]) == ["human:go", "ai:dangle-1", "tool:dangle-1:error", "human:and now?"]


async def test_valid_history_is_not_journaled(tmp_path: Path) -> None:
    script = {"agents": {"lead": [{"tool_calls": [{"name": "ls", "args": {"path": "/workspace"}}]}, {"say": "done"}]}}
    harness = GuardHarness(script, [DanglingToolCall()], tmp_path / "ws")
    outcome = await harness.run()
    assert outcome.journal.kinds("intervention") == [] and len(outcome.requests) == 2


def test_contract_is_mandatory_and_matches_the_hooks() -> None:
    build_chain("lead", [DanglingToolCall()], catalog=[DanglingToolCall])
    for kind in ("lead", "subagent"):
        with pytest.raises(ChainError) as missing:
            build_chain(kind, [], catalog=[DanglingToolCall])
        assert missing.value.rule == 4


def test_invalid_tool_calls_count_as_calls_for_the_grammar_and_the_repair() -> None:
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    from agentkeel.harness.middleware.grammar import grammar_violation
    from agentkeel.harness.middleware.repair import repair_tool_pairing

    invalid = AIMessage(content="", invalid_tool_calls=[
        {"name": "write_file", "args": "{not json", "id": "bad1", "error": "bad json", "type": "invalid_tool_call"},
    ])
    answer = ToolMessage(content="Error: invalid arguments", tool_call_id="bad1", status="error")
    answered = [HumanMessage(content="hi"), invalid, answer]
    # Providers receive invalid calls as tool calls, so the answered history is valid as it is...
    assert grammar_violation(None, answered) is None
    assert repair_tool_pairing(answered) == (answered, [])
    # ...and an unanswered invalid call is a dangling call that gets a synthetic result.
    assert grammar_violation(None, answered[:2]) is not None
    repaired, repairs = repair_tool_pairing(answered[:2])
    assert grammar_violation(None, repaired) is None
    assert {r.action for r in repairs} >= {"synthetic_result"}
