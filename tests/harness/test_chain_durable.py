"""DurableContext and SystemMessageCoalescing in the chain: both are mandatory, the builder keeps
coalescing inner of every producer of a system message, and coalescing itself sends exactly one
leading system message, the agent's own prompt first."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from langchain.agents.middleware.types import ModelRequest, ModelResponse
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from agentkeel.harness.middleware.catalog import CATALOG, build_agent_chain, guard_members
from agentkeel.harness.middleware.chain import ChainError, build_chain, check_order
from agentkeel.harness.middleware.coalescing import SystemMessageCoalescing, coalesce
from agentkeel.harness.middleware.contracts import CHAIN_KINDS
from agentkeel.limits import Limits


@pytest.mark.parametrize("kind", CHAIN_KINDS)
def test_removing_coalescing_fails_the_build(kind: Any) -> None:
    members = [m for m in guard_members(kind, Limits()) if m.name != "SystemMessageCoalescing"]
    with pytest.raises(ChainError) as info:
        build_chain(kind, members, catalog=CATALOG, derive=True)
    assert info.value.rule == 4 and "SystemMessageCoalescing is mandatory" in str(info.value)


@pytest.mark.parametrize("kind", CHAIN_KINDS)
def test_removing_durable_context_fails_the_build(kind: Any) -> None:
    members = [m for m in guard_members(kind, Limits()) if m.name != "DurableContext"]
    with pytest.raises(ChainError) as info:
        build_chain(kind, members, catalog=CATALOG, derive=True)
    # The missing member is named first (membership is checked before the order is derived) …
    assert info.value.rule == 4 and "DurableContext is mandatory" in str(info.value)
    # … and without the membership rule, coalescing's requirement has no provider left.
    with pytest.raises(ChainError) as info:
        build_chain(kind, members, derive=True)
    assert info.value.rule == 1 and "system_authority_message" in str(info.value)


@pytest.mark.parametrize("kind", CHAIN_KINDS)
def test_coalescing_outer_of_durable_context_fails_the_build(kind: Any) -> None:
    order = list(build_agent_chain(kind, Limits()).middlewares)
    names = [m.name for m in order]
    i, j = names.index("DurableContext"), names.index("SystemMessageCoalescing")
    order[i], order[j] = order[j], order[i]
    with pytest.raises(ChainError) as info:
        check_order(kind, order)
    message = str(info.value)
    assert info.value.rule == 1
    for part in ("DurableContext", "SystemMessageCoalescing", "axis model", "system_authority_message"):
        assert part in message


@pytest.mark.parametrize("kind", CHAIN_KINDS)
def test_default_chains_hold_both_in_a_valid_order(kind: Any) -> None:
    chain = build_agent_chain(kind, Limits())
    model = chain.manifest()["axes"]["model"]["outer_to_inner"]
    assert model[0] == "InputSanitization" and model[-1] == "RequestGrammar"
    assert model.index("DurableContext") < model.index("SystemMessageCoalescing")
    # DurableContext sees the final response: every guard that withholds or suppresses is inner.
    for guard in ("TerminalResponse", "LoopDetection", "TokenBudget", "TurnLimit", "SafetyFinishReason",
                  "ModelLengthFinishReason", "ToolCallArguments"):
        assert model.index("DurableContext") < model.index(guard)
    # No graph node of its own, per turn or per run (a subagent's compaction is one: Summarization).
    axes = chain.manifest()["axes"]
    assert {a: axes[a]["execution_order"] for a in set(axes) - {"model", "tool"}} == (
        {"before_model": ["Summarization"]} if kind == "subagent" else {})


# -- coalescing itself -----------------------------------------------------------------------


async def _sent(system: SystemMessage | None, messages: list[Any]) -> ModelRequest:
    seen: list[ModelRequest] = []

    async def handler(request: ModelRequest) -> ModelResponse:
        seen.append(request)
        return ModelResponse(result=[AIMessage("ok")])

    request = ModelRequest(model=None, messages=messages, system_message=system, tools=[], state={}, runtime=None)  # type: ignore[arg-type]
    await SystemMessageCoalescing().awrap_model_call(request, handler)
    (out,) = seen
    assert not any(isinstance(m, SystemMessage) for m in out.messages)
    return out


async def test_every_system_message_joins_the_prompt_the_agents_own_first() -> None:
    prompt = SystemMessage("You are the agent.", id="prompt")
    messages = [SystemMessage("Kept instructions."), SystemMessage("Rules."), HumanMessage("data"), HumanMessage("go")]
    out = await _sent(prompt, messages)
    assert out.system_message is not None and out.system_message.id == "prompt"
    assert out.system_message.content == "You are the agent.\n\nKept instructions.\n\nRules."
    assert [m.content for m in out.messages] == ["data", "go"]


async def test_a_request_without_system_messages_passes_through_untouched() -> None:
    prompt = SystemMessage("You are the agent.")
    messages = [HumanMessage("go")]
    seen: list[ModelRequest] = []

    async def handler(request: ModelRequest) -> ModelResponse:
        seen.append(request)
        return ModelResponse(result=[AIMessage("ok")])

    request = ModelRequest(model=None, messages=messages, system_message=prompt, tools=[], state={}, runtime=None)  # type: ignore[arg-type]
    await SystemMessageCoalescing().awrap_model_call(request, handler)
    assert seen == [request] and seen[0].system_message is prompt  # the cacheable prefix is unchanged


async def test_block_content_keeps_non_text_blocks() -> None:
    image = {"type": "image", "url": "https://example.test/logo.png"}
    out = await _sent(SystemMessage([{"type": "text", "text": "Prompt."}]),
                      [SystemMessage([{"type": "text", "text": "Rules."}, image]), HumanMessage("go")])
    assert out.system_message is not None
    assert out.system_message.content == [{"type": "text", "text": "Prompt.\n\nRules."}, image]


async def test_without_an_agent_prompt_the_first_system_message_becomes_it() -> None:
    out = await _sent(None, [SystemMessage("A"), HumanMessage("go"), SystemMessage("B")])
    assert out.system_message is not None and out.system_message.content == "A\n\nB"
    assert [m.content for m in out.messages] == ["go"]


_message = st.one_of(
    st.text(min_size=1, max_size=8).map(lambda t: SystemMessage(t)),
    st.text(min_size=1, max_size=8).map(lambda t: HumanMessage(t)),
    st.text(min_size=1, max_size=8).map(lambda t: AIMessage(t)),
)


@given(prompt=st.one_of(st.none(), st.text(min_size=1, max_size=8)), messages=st.lists(_message, max_size=8))
def test_coalesce_leaves_one_system_prompt_the_agents_first_and_every_other_message_in_order(
    prompt: str | None, messages: list[Any]
) -> None:
    system, rest = coalesce(SystemMessage(prompt) if prompt is not None else None, messages)
    systems = [m for m in messages if isinstance(m, SystemMessage)]
    assert rest == [m for m in messages if not isinstance(m, SystemMessage)]
    if prompt is None and not systems:
        assert system is None
        return
    assert system is not None
    texts = ([prompt] if prompt is not None else []) + [str(m.content) for m in systems]
    assert system.content == "\n\n".join(texts)
