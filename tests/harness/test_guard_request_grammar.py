"""RequestGrammar and the full request repair: no request a strict provider rejects leaves the chain.

The property tests drive :func:`repair_request` with arbitrary message sequences; the agent tests
put a deliberately broken middleware outer of the guard and check attribution (strict) and repair.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from guard_kit import GuardHarness
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain.agents.middleware import AgentMiddleware
from langchain.agents.middleware.types import ModelRequest, ModelResponse
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from agentkeel.harness.middleware.base import KeelMiddleware, ModelHandler
from agentkeel.harness.middleware.chain import ChainError, build_chain, check_order
from agentkeel.harness.middleware.contracts import Contract, on
from agentkeel.harness.middleware.dangling_tool_call import DanglingToolCall
from agentkeel.harness.middleware.grammar import RequestGrammarError, grammar_violation
from agentkeel.harness.middleware.repair import (
    CONTINUING,
    drop_empty_assistant,
    ensure_user_first,
    merge_system_messages,
    repair_request,
    repair_tool_pairing,
)
from agentkeel.harness.middleware.request_grammar import HISTORY, UNTRACED, RequestGrammar
from agentkeel.harness.middleware.responses import hint_message
from agentkeel.harness.scripted.strict import RULES, is_empty_assistant

# -- strategies ----------------------------------------------------------------------------------

_CALL_IDS = st.sampled_from(["a", "b", "c", "", None])
_calls = st.lists(
    st.fixed_dictionaries({"name": st.sampled_from(["ls", "grep", ""]), "args": st.just({}), "id": _CALL_IDS}),
    max_size=3,
)
_human = st.sampled_from(["hi", "more"]).map(HumanMessage)
_hint = st.just(None).map(lambda _: hint_message("LoopDetection", ["slow down"]))
_ai = st.builds(lambda text, calls: AIMessage(content=text, tool_calls=calls), st.sampled_from(["", "ok"]), _calls)
_tool = st.builds(
    lambda call_id, status: ToolMessage(content="r", tool_call_id=call_id, status=status),
    st.sampled_from(["a", "b", "c", "z", ""]), st.sampled_from(["success", "error"]),
)
_system = st.sampled_from(["rules", "more rules", ""]).map(SystemMessage)
_any_message = st.one_of(_human, _hint, _ai, _tool, _system)


@st.composite
def _valid_requests(draw: st.DrawFn) -> tuple[SystemMessage | None, list[BaseMessage]]:
    system = draw(st.none() | _system)
    messages: list[BaseMessage] = []
    if system is None and draw(st.booleans()):
        messages.append(draw(_system))  # a lone leading system message in the list is valid too
    messages.append(draw(_human))
    for kind in draw(st.lists(st.sampled_from(["human", "hint", "text", "calls"]), max_size=8)):
        if kind == "calls":
            ids = draw(st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=1, max_size=3, unique=True))
            messages.append(AIMessage(content="", tool_calls=[{"name": "ls", "args": {}, "id": i} for i in ids]))
            messages.extend(ToolMessage(content=i, tool_call_id=i) for i in draw(st.permutations(ids)))
        else:
            messages.append(draw({"human": _human, "hint": _hint, "text": st.just(AIMessage("ok"))}[kind]))
    assert grammar_violation(system, messages) is None
    return system, messages


def _conversation(messages: list[BaseMessage]) -> list[tuple[str, Any]]:
    """The user/assistant turns, in order, ignoring tool results and system prompts."""
    return [(m.type, m.content) for m in messages if not isinstance(m, (ToolMessage, SystemMessage))]


# -- properties ----------------------------------------------------------------------------------


@settings(max_examples=400, deadline=None)
@given(st.none() | _system, st.lists(_any_message, max_size=12))
def test_any_request_repairs_to_the_grammar_and_stays_repaired(
    system: SystemMessage | None, messages: list[BaseMessage]
) -> None:
    snapshot = list(messages)
    repaired = repair_request(system, messages)
    assert grammar_violation(repaired.system_message, repaired.messages) is None
    assert messages == snapshot  # pure: the input list is untouched
    # Nothing the user or the model said is lost or reordered (an empty assistant message said nothing).
    kept = [turn for turn in _conversation(repaired.messages) if turn != ("human", CONTINUING)]
    assert kept == _conversation([m for m in messages if not is_empty_assistant(m)])
    again = repair_request(repaired.system_message, repaired.messages)
    assert again.repairs == [] and again.system_message is repaired.system_message
    assert all(x is y for x, y in zip(again.messages, repaired.messages, strict=True))


@settings(max_examples=300, deadline=None)
@given(_valid_requests())
def test_a_valid_request_is_left_exactly_as_it_is(request: tuple[SystemMessage | None, list[BaseMessage]]) -> None:
    system, messages = request
    repaired = repair_request(system, messages)
    assert repaired.repairs == [] and repaired.system_message is system
    assert all(x is y for x, y in zip(repaired.messages, messages, strict=True))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_human, _hint, _ai, _tool), max_size=12))
def test_pairing_alone_restores_the_tool_rules(messages: list[BaseMessage]) -> None:
    paired, _ = repair_tool_pairing(messages)
    broken = grammar_violation(None, paired)
    assert broken is None or broken.rule in (2, 6)  # the opening and empty replies are other repairs


# -- the other repairs, directly -----------------------------------------------------------------


def test_an_empty_assistant_message_is_left_out_of_the_request_and_the_rule_named() -> None:
    quiet = AIMessage(content="", id="quiet")
    blank_blocks = AIMessage(content=[{"type": "text", "text": "  "}], id="blank")
    history = [HumanMessage("go"), quiet, HumanMessage("still there?"), blank_blocks, AIMessage("yes")]
    broken = grammar_violation(None, history)
    assert broken is not None and broken.rule == 6 and broken.index == 1
    out, repairs = drop_empty_assistant(history)
    assert [m.content for m in out] == ["go", "still there?", "yes"]
    assert [(r.rule, r.action, r.subject) for r in repairs] == [
        (6, "empty_assistant_dropped", "quiet"), (6, "empty_assistant_dropped", "blank"),
    ]
    assert RULES[6] == "assistant message with neither content nor tool calls"
    # A reply with tool calls, or with any non-text block, is not empty.
    assert not is_empty_assistant(AIMessage(content="", tool_calls=[{"name": "ls", "args": {}, "id": "a"}]))
    assert not is_empty_assistant(AIMessage(content=[{"type": "image_url", "image_url": {"url": "x"}}]))


async def test_a_quiet_reply_in_the_history_is_never_resent(tmp_path: Path) -> None:
    script = {"agents": {"lead": [{"say": ""}, {"say": "back", "expect": {"contains": "again"}}]}}
    harness = GuardHarness(script, [RequestGrammar()], tmp_path / "ws", strict_grammar=False)
    first = await harness.run("hello", run_id="r1")
    assert isinstance(first.messages[-1], AIMessage) and first.messages[-1].content == ""  # state keeps it
    out = await harness.run("again", run_id="r2")
    assert [m.type for m in out.requests[1]] == ["system", "human", "human"]
    (record,) = [r for r in out.journal.kinds("intervention") if r["data"]["action"] == "repair"]
    assert record["data"]["rules"] == [RULES[6]] and record["data"]["counts"] == {"empty_assistant_dropped": 1}


def test_system_messages_merge_into_the_request_system_prompt_first_stays_first() -> None:
    base = SystemMessage("You are a test agent.", id="sys")
    history = [HumanMessage("go"), SystemMessage("Extra A"), AIMessage("ok"), SystemMessage(["Extra B"])]
    system, rest, repairs = merge_system_messages(base, history)
    assert system is not None and system.id == "sys"
    # Text (strings and bare text blocks alike) joins into one string, a blank line per message.
    assert system.content == "You are a test agent.\n\nExtra A\n\nExtra B"
    assert [m.type for m in rest] == ["human", "ai"] and {r.rule for r in repairs} == {1}
    assert base.content == "You are a test agent."


def test_merged_system_content_keeps_non_text_blocks_as_blocks() -> None:
    image = {"type": "image", "url": "https://example.test/a.png"}
    cached = {"type": "text", "text": "Cached rules.", "cache_control": {"type": "ephemeral"}}
    system, _, _ = merge_system_messages(
        SystemMessage("Prompt."), [HumanMessage("go"), SystemMessage([{"type": "text", "text": "A"}, image]),
                                   SystemMessage([cached]), SystemMessage("B")],
    )
    assert system is not None and system.content == [
        {"type": "text", "text": "Prompt.\n\nA"}, image, cached, {"type": "text", "text": "B"},
    ]


def test_without_a_request_system_prompt_the_first_system_message_becomes_it() -> None:
    system, rest, repairs = merge_system_messages(None, [HumanMessage("go"), SystemMessage("A"), SystemMessage("B")])
    assert system is not None and system.content == "A\n\nB" and [m.type for m in rest] == ["human"]
    assert [r.action for r in repairs] == ["system_merged", "system_moved_first"]
    lone = [SystemMessage("A"), HumanMessage("go")]
    assert merge_system_messages(None, lone) == (None, lone, [])


def test_assistant_first_history_gets_a_leading_user_message() -> None:
    out, repairs = ensure_user_first([AIMessage("earlier answer"), HumanMessage("go on")])
    assert [(m.type, m.content) for m in out][:2] == [("human", CONTINUING), ("ai", "earlier answer")]
    assert [(r.rule, r.action) for r in repairs] == [(2, "leading_user")]
    out, _ = ensure_user_first([SystemMessage("s")])
    assert [m.type for m in out] == ["system", "human"]


# -- deliberately broken middleware outer of the guard --------------------------------------------


def _break(request: ModelRequest, how: str) -> ModelRequest:
    messages = list(request.messages)
    if how == "second_system":
        return request.override(messages=[*messages, SystemMessage("Also obey these extra rules.")])
    calls = [i for i, m in enumerate(messages) if isinstance(m, AIMessage) and m.tool_calls]
    if not calls or calls[-1] + 1 >= len(messages):
        return request
    at = calls[-1] + 1
    return request.override(messages=[*messages[:at], HumanMessage("A note slipped in too early."), *messages[at:]])


class KeelBreaker(KeelMiddleware):
    """An AgentKeel middleware with a bug: it traces its handler, so strict mode names it."""

    contract = Contract(axes={"model": on(mutates={"model_request.messages"})})

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how

    async def awrap_model_call(self, request: ModelRequest, handler: ModelHandler) -> ModelResponse:
        handler = self.traced(request, handler)
        return await handler(_break(request, self.how))


class PlainBreaker(AgentMiddleware):
    """The same bug in third-party middleware, which knows nothing of tracing."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how

    async def awrap_model_call(self, request: ModelRequest, handler: ModelHandler) -> ModelResponse:
        return await handler(_break(request, self.how))


SCRIPT = {"agents": {"lead": [
    {"tool_calls": [{"name": "ls", "args": {"path": "/workspace"}}]},
    {"say": "done"},
]}}
# The model call at which each breakage first shows (0-based): a second system prompt at once,
# a note between call and result once there is a tool call.
BREAKS_AT = {"second_system": 0, "user_between": 1}
BROKEN_RULE = {"second_system": 1, "user_between": 5}


@pytest.mark.parametrize("how", sorted(BREAKS_AT))
async def test_strict_names_the_traced_middleware_that_broke_the_request(tmp_path: Path, how: str) -> None:
    harness = GuardHarness(SCRIPT, [KeelBreaker(how), RequestGrammar()], tmp_path / "ws", strict_grammar=True)
    with pytest.raises(RequestGrammarError) as raised:
        await harness.run()
    assert raised.value.producer == "KeelBreaker" and "KeelBreaker" in str(raised.value)
    assert raised.value.rule == BROKEN_RULE[how]
    assert len(harness.log.requests) == BREAKS_AT[how]  # the model never saw the broken request


@pytest.mark.parametrize(("mode", "strict_grammar"), [("strict", False), ("repair", True)])
@pytest.mark.parametrize("how", sorted(BREAKS_AT))
async def test_strict_catches_untraced_middleware(tmp_path: Path, how: str, mode: Any, strict_grammar: bool) -> None:
    middleware = [PlainBreaker(how), RequestGrammar(mode)]
    harness = GuardHarness(SCRIPT, middleware, tmp_path / "ws", strict_grammar=strict_grammar)
    with pytest.raises(RequestGrammarError) as raised:
        await harness.run()
    assert raised.value.producer == UNTRACED and raised.value.rule == BROKEN_RULE[how]
    assert len(harness.log.requests) == BREAKS_AT[how]


async def test_strict_blames_the_thread_history_when_state_is_already_broken(tmp_path: Path) -> None:
    script = {"agents": {"lead": [{"say": "one"}, {"say": "two"}]}}
    harness = GuardHarness(script, [RequestGrammar("strict")], tmp_path / "ws")
    await harness.run("hello")
    dangling = AIMessage(content="", tool_calls=[{"name": "ls", "args": {}, "id": "dangle-1"}])
    await harness.graph.aupdate_state({"configurable": {"thread_id": harness.thread_id}}, {"messages": [dangling]})
    with pytest.raises(RequestGrammarError) as raised:
        await harness.run("again", run_id="r2")
    assert raised.value.producer == HISTORY and raised.value.rule == 3
    assert len(harness.log.requests) == 1


async def test_strict_passes_once_dangling_tool_call_repaired_the_history(tmp_path: Path) -> None:
    harness = GuardHarness(
        {"agents": {"lead": [{"say": "one"}, {"say": "two"}]}},
        [DanglingToolCall(), RequestGrammar("strict")], tmp_path / "ws",
    )
    await harness.run("hello")
    dangling = AIMessage(content="", tool_calls=[{"name": "ls", "args": {}, "id": "dangle-1"}])
    await harness.graph.aupdate_state({"configurable": {"thread_id": harness.thread_id}}, {"messages": [dangling]})
    outcome = await harness.run("again", run_id="r2")
    assert outcome.messages[-1].content == "two"


@pytest.mark.parametrize("breaker", [KeelBreaker, PlainBreaker])
@pytest.mark.parametrize("how", sorted(BREAKS_AT))
async def test_repair_mode_sends_a_valid_request_and_journals_it(tmp_path: Path, how: str, breaker: type) -> None:
    harness = GuardHarness(SCRIPT, [breaker(how), RequestGrammar()], tmp_path / "ws", strict_grammar=False)
    outcome = await harness.run()  # the scripted model is strict: a broken request would raise

    assert outcome.messages[-1].content == "done" and len(outcome.requests) == 2
    for request in outcome.requests:
        assert grammar_violation(None, request) is None
    last = outcome.requests[-1]
    if how == "second_system":
        assert [m.type for m in last].count("system") == 1
        assert last[0].text.startswith("You are a test agent.") and "extra rules" in last[0].text
    else:
        assert [m.type for m in last[-3:]] == ["ai", "tool", "human"]
    records = [r["data"] for r in outcome.journal.kinds("intervention") if r["data"]["middleware"] == "RequestGrammar"]
    assert records and all(r["action"] == "repair" for r in records)
    assert RULES[BROKEN_RULE[how]] in records[0]["rules"]
    assert not any(isinstance(m, SystemMessage) for m in outcome.messages)  # state never repaired


async def test_a_valid_run_is_neither_repaired_nor_journaled(tmp_path: Path) -> None:
    outcome = await GuardHarness(SCRIPT, [RequestGrammar("strict")], tmp_path / "ws").run()
    assert outcome.messages[-1].content == "done" and outcome.journal.kinds("intervention") == []


def test_contract_puts_the_guard_innermost_and_after_every_request_mutator() -> None:
    chain = build_chain("lead", [RequestGrammar(), DanglingToolCall()], derive=True)
    assert [m.name for m in chain.middlewares] == ["DanglingToolCall", "RequestGrammar"]
    with pytest.raises(ChainError) as inner_mutator:
        check_order("lead", [RequestGrammar(), PlainBreaker("second_system")])
    assert inner_mutator.value.rule in (2, 3)
    for kind in ("lead", "subagent"):
        with pytest.raises(ChainError) as missing:
            build_chain(kind, [DanglingToolCall()], catalog=[RequestGrammar])
        assert missing.value.rule == 4
