"""SideEffectLedger and tool idempotency: intents journaled before a tool acts, calls lost with a
worker answered instead of repeated, on the real agent loop with the scripted model."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from guard_kit import GuardHarness, ListJournal, assert_provider_valid, script
from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool, tool

from agentkeel.harness.middleware.catalog import build_agent_chain
from agentkeel.harness.middleware.keys import TOOL_META
from agentkeel.harness.middleware.side_effect_ledger import TOOL_INTENT, SideEffectLedger
from agentkeel.harness.middleware.tool_error_handling import ToolErrorHandling
from agentkeel.harness.tools import READ_ONLY_TOOL_NAMES, WORKSPACE_TOOL_NAMES, build_tools, is_idempotent
from agentkeel.harness.tools.idempotency import IDEMPOTENT, declare_idempotent
from agentkeel.limits import Limits


def effect_tool(counter: Counter[str], journal: ListJournal, seen: list[list[int]], idempotent: bool) -> BaseTool:
    """A tool whose effect is counting; it notes which records were stored when the effect happened."""

    def effect(n: int = 0) -> str:
        """Do the effect."""
        seen.append(list(journal.written_through))
        counter["effect"] += 1
        return f"effect {n} done"

    return declare_idempotent(tool("effect")(effect), idempotent)


def _chain() -> list[Any]:
    return build_agent_chain("lead", Limits()).for_agent()


def _harness(
    tmp_path: Path, turns: dict[str, Any], *, idempotent: bool, middleware: list[Any] | None = None, **kwargs: Any
) -> tuple[GuardHarness, Counter[str], list[list[int]]]:
    """The default lead chain over the ``effect`` tool; (harness, effect counter, stored seqs seen)."""
    counter: Counter[str] = Counter()
    seen: list[list[int]] = []
    journal = ListJournal()
    tools = [effect_tool(counter, journal, seen, idempotent)]
    harness = GuardHarness(turns, _chain() if middleware is None else middleware, tmp_path,
                           tools=tools, journal=journal, **kwargs)
    return harness, counter, seen


CALL = {"name": "effect", "args": {"n": 1}, "id": "call_effect_1"}


# -- idempotency declarations ---------------------------------------------------------------------


def test_builtins_declare_idempotency_read_only_only() -> None:
    tools = {t.name: t for t in build_tools(bash_enabled=True)}
    assert set(tools) == set(WORKSPACE_TOOL_NAMES)
    assert {name for name, t in tools.items() if is_idempotent(t)} == READ_ONLY_TOOL_NAMES
    assert READ_ONLY_TOOL_NAMES == {"read_file", "ls", "glob", "grep", "ask_clarification"}
    for name in ("write_file", "str_replace", "bash"):
        assert tools[name].metadata == {IDEMPOTENT: False}


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [(None, False), ({}, False), ({"idempotent": "yes"}, False), ({"idempotent": 1}, False),
     ({"idempotent": True, "other": 1}, True)],
)
def test_custom_tools_are_not_idempotent_unless_they_declare_true(metadata: Any, expected: bool) -> None:
    @tool
    def custom(x: int) -> str:
        """A third-party tool."""
        return str(x)

    custom.metadata = metadata
    assert is_idempotent(custom) is expected
    assert is_idempotent(None) is False


# -- the chain -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["lead", "subagent"])
def test_ledger_is_mandatory_and_innermost_on_the_tool_axis(kind: str) -> None:
    chain = build_agent_chain(kind, Limits())  # type: ignore[arg-type]
    tool_axis = chain.manifest()["axes"]["tool"]["outer_to_inner"]
    assert tool_axis[-1] == "SideEffectLedger"  # after every guard that may refuse or answer a call
    assert kind in SideEffectLedger.contract.mandatory_for


# -- intents ---------------------------------------------------------------------------------------


async def test_intent_is_written_through_before_the_tool_acts(tmp_path: Path) -> None:
    harness, counter, seen = _harness(tmp_path, script({"tool_calls": [CALL]}, {"say": "Done."}), idempotent=False)
    outcome = await harness.run()
    intents = outcome.journal.kinds(TOOL_INTENT)
    assert [i["data"] for i in intents] == [
        {"call_id": "call_effect_1", "name": "effect", "idempotent": False, "attempt": 1}
    ]
    assert intents[0]["caller"] == "middleware:SideEffectLedger"
    assert counter["effect"] == 1
    assert seen == [[intents[0]["seq"]]]  # stored through, before the effect
    assert_provider_valid(outcome)


async def test_no_intent_for_calls_a_guard_answers_instead_of_the_tool(tmp_path: Path) -> None:
    """ask_clarification never reaches its tool (Clarification pauses the run): no intent."""
    ask = {"name": "ask_clarification", "args": {"question": "Which file?"}, "id": "call_ask"}
    harness = GuardHarness(script({"tool_calls": [ask]}), _chain(), tmp_path)
    outcome = await harness.run()
    assert outcome.interrupts
    assert outcome.journal.kinds(TOOL_INTENT) == []


@pytest.mark.parametrize("idempotent", [False, True])
async def test_when_the_intent_cannot_be_stored_only_an_idempotent_tool_runs(tmp_path: Path, idempotent: bool) -> None:
    harness, counter, _ = _harness(tmp_path, script({"tool_calls": [CALL]}, {"say": "Done."}), idempotent=idempotent)
    harness.journal.down = True
    outcome = await harness.run()
    result = next(m for m in outcome.messages if isinstance(m, ToolMessage))
    assert counter["effect"] == int(idempotent)
    actions = [r["data"]["action"] for r in outcome.journal.kinds("intervention")]
    if idempotent:  # repeating it after a crash is harmless: its intent is only buffered, and it runs
        assert result.status != "error" and result.content == "effect 1 done"
        assert [i["data"]["name"] for i in outcome.journal.kinds(TOOL_INTENT)] == ["effect"]
        assert harness.journal.written_through == [] and actions == []
    else:
        assert result.status == "error" and "was not run" in str(result.content)
        assert result.additional_kwargs[TOOL_META]["source"] == "SideEffectLedger"
        assert actions == ["intent_unrecorded"]


# -- recovered calls -------------------------------------------------------------------------------


async def test_a_recovered_call_is_answered_not_run(tmp_path: Path) -> None:
    turns = script(
        {"tool_calls": [CALL]},
        {"expect": {"contains": "It was not repeated"}, "say": "I will check the effect first."},
    )
    harness, counter, _ = _harness(tmp_path, turns, idempotent=False, attempt=2,
                                   recovered_calls={"call_effect_1": "started by attempt 1, journal seq 7"})
    outcome = await harness.run()
    assert counter["effect"] == 0
    result = next(m for m in outcome.messages if isinstance(m, ToolMessage))
    assert result.status == "error" and result.tool_call_id == "call_effect_1"
    text = str(result.content)
    assert "outcome of this effect call is unknown" in text and "started by attempt 1, journal seq 7" in text
    assert "Check its effects" in text
    assert outcome.journal.kinds(TOOL_INTENT) == []  # nothing ran, so nothing was intended
    [note] = outcome.journal.kinds("intervention")
    assert note["data"]["action"] == "recovered_call" and note["data"]["tool_call_id"] == "call_effect_1"
    assert_provider_valid(outcome)


async def test_other_calls_of_a_recovered_attempt_run_normally(tmp_path: Path) -> None:
    other = {**CALL, "id": "call_effect_2"}
    harness, counter, _ = _harness(tmp_path, script({"tool_calls": [other]}, {"say": "Done."}), idempotent=False,
                                   attempt=2, recovered_calls={"call_effect_1": "lost"})
    outcome = await harness.run()
    assert counter["effect"] == 1
    assert [i["data"]["attempt"] for i in outcome.journal.kinds(TOOL_INTENT)] == [2]


async def test_without_a_journal_calls_pass_through(tmp_path: Path) -> None:
    harness, counter, _ = _harness(tmp_path, script({"tool_calls": [CALL]}, {"say": "Done."}), idempotent=False,
                                   middleware=[ToolErrorHandling(), SideEffectLedger()])
    harness.journal = None  # a RunContext without a journal, as outside the runtime
    outcome = await harness.run()
    assert counter["effect"] == 1
    assert next(m for m in outcome.messages if isinstance(m, ToolMessage)).content == "effect 1 done"
