"""Strict-provider grammar checks of the scripted model's requests."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from agentkeel.harness.scripted import (
    Script,
    ScriptedBadRequestError,
    ScriptedChatModel,
    StrictRequestError,
    check_request,
)


def _calls(*ids: str) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": "t", "args": {}, "id": i, "type": "tool_call"} for i in ids])


def _result(call_id: str) -> ToolMessage:
    return ToolMessage(content="ok", tool_call_id=call_id)


def _broken(messages: list[BaseMessage]) -> StrictRequestError:
    with pytest.raises(StrictRequestError) as caught:
        check_request(messages)
    return caught.value


def test_valid_history_with_system_first_and_parallel_tool_calls() -> None:
    check_request(
        [
            SystemMessage("You are helpful."),
            HumanMessage("do two things"),
            _calls("a", "b"),
            _result("b"),
            _result("a"),
            AIMessage("done"),
            HumanMessage("again"),
            _calls("c"),
            _result("c"),
        ]
    )


def test_second_system_message_breaks_rule_1() -> None:
    error = _broken([SystemMessage("one"), HumanMessage("hi"), SystemMessage("two")])
    assert (error.rule, error.index) == (1, 2)
    assert "second system message" in str(error)


def test_system_message_not_first_breaks_rule_1() -> None:
    error = _broken([HumanMessage("hi"), SystemMessage("late")])
    assert (error.rule, error.index) == (1, 1)
    assert "not the first" in str(error)


def test_assistant_first_history_breaks_rule_2() -> None:
    error = _broken([SystemMessage("sys"), AIMessage("hello"), HumanMessage("hi")])
    assert (error.rule, error.index) == (2, 1)


def test_system_only_request_breaks_rule_2() -> None:
    assert _broken([SystemMessage("sys")]).rule == 2


def test_missing_tool_result_breaks_rule_3() -> None:
    error = _broken([HumanMessage("hi"), _calls("a", "b"), _result("a"), AIMessage("done")])
    assert (error.rule, error.index) == (3, 1)
    assert "'b'" in str(error) and "ai message at 3" in str(error)


def test_duplicate_tool_result_breaks_rule_3() -> None:
    error = _broken([HumanMessage("hi"), _calls("a"), _result("a"), _result("a")])
    assert (error.rule, error.index) == (3, 3)


def test_trailing_tool_call_without_result_breaks_rule_3() -> None:
    error = _broken([HumanMessage("hi"), _calls("a")])
    assert error.rule == 3 and "end of the request" in str(error)


def test_unknown_tool_call_id_breaks_rule_4() -> None:
    error = _broken([HumanMessage("hi"), _calls("a"), _result("a"), _result("zzz")])
    assert (error.rule, error.index) == (4, 3)
    assert "'zzz'" in str(error)


def test_orphan_tool_message_breaks_rule_4() -> None:
    error = _broken([HumanMessage("hi"), AIMessage("plain"), _result("nope")])
    assert (error.rule, error.index) == (4, 2)


def test_user_message_between_call_and_results_breaks_rule_5() -> None:
    error = _broken([SystemMessage("s"), HumanMessage("hi"), _calls("a"), HumanMessage("hurry"), _result("a")])
    assert (error.rule, error.index) == (5, 3)


def test_strict_errors_are_provider_bad_requests() -> None:
    error = _broken([AIMessage("first")])
    assert isinstance(error, ScriptedBadRequestError)
    assert error.status_code == 400
    assert str(error).startswith("strict request check, rule 2 (history starts with a user message) broken at message 0")


def test_model_checks_requests_only_in_strict_mode() -> None:
    history = [AIMessage("assistant first"), HumanMessage("hi")]
    strict = ScriptedChatModel(script=Script.model_validate({"agents": {"lead": [{"say": "ok"}]}}))
    with pytest.raises(StrictRequestError):
        strict.invoke(history)
    lenient = ScriptedChatModel(script=Script.model_validate({"strict": False, "agents": {"lead": [{"say": "ok"}]}}))
    assert lenient.invoke(history).content == "ok"
