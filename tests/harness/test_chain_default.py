"""The chains the product builds: every documented configuration builds and passes every rule;
reordering them breaks a rule with a named error; and the primary stop reason does not depend on
which valid order the guards run in."""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

import pytest
from guard_kit import GuardHarness
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentkeel.harness.middleware.catalog import CATALOG, build_agent_chain, guard_members
from agentkeel.harness.middleware.chain import ChainError, build_chain, check_order, constraints
from agentkeel.harness.middleware.contracts import CHAIN_KINDS
from agentkeel.harness.stop_reasons import primary_code
from agentkeel.limits import Limits

SWITCHES = ("input_sanitization", "tool_result_sanitization", "tool_output", "read_before_write", "tool_progress")


def _limits(**enabled: bool) -> Limits:
    return Limits(**{name: {"enabled": on} for name, on in enabled.items()})


@pytest.mark.parametrize("kind", CHAIN_KINDS)
@pytest.mark.parametrize("switches", list(itertools.product([True, False], repeat=len(SWITCHES))))
def test_every_documented_configuration_builds(kind: str, switches: tuple[bool, ...]) -> None:
    limits = _limits(**dict(zip(SWITCHES, switches, strict=True)))
    chain = build_agent_chain(kind, limits)  # type: ignore[arg-type]
    names = [m.name for m in chain.middlewares]
    # Mandatory guards are present by construction; the request validator is innermost.
    for cls in CATALOG:
        if kind in cls.contract.mandatory_for:
            assert cls.__name__ in names
    model_axis = [n for n in names if n in chain.manifest()["axes"]["model"]["outer_to_inner"]]
    assert model_axis[-1] == "RequestGrammar"
    assert ("Clarification" in names) is (kind == "lead")


def test_lead_chain_order_is_derived_from_contracts_not_from_the_member_list() -> None:
    limits = Limits()
    members = guard_members("lead", limits)
    orders = set()
    for seed in range(5):
        shuffled = list(members)
        random.Random(seed).shuffle(shuffled)
        orders.add(tuple(m.name for m in build_chain("lead", shuffled, catalog=CATALOG, derive=True).middlewares))
    assert len(orders) == 1


def test_default_lead_manifest_names_axes_orders_and_contracts() -> None:
    manifest = build_agent_chain("lead", Limits()).manifest()
    model = manifest["axes"]["model"]["outer_to_inner"]
    tool = manifest["axes"]["tool"]["outer_to_inner"]
    assert model[0] == "InputSanitization" and model[-1] == "RequestGrammar"
    # Safety repairs the response before any guard counts it; the terminal answer comes last.
    assert model.index("TerminalResponse") < model.index("LoopDetection") < model.index("SafetyFinishReason")
    assert tool.index("ToolProgress") < tool.index("ToolErrorHandling")
    assert tool[0] == "ToolOutputBudget"
    contracts = {m["name"]: m["contract"] for m in manifest["middlewares"]}
    assert contracts["ToolErrorHandling"]["axes"]["tool"]["provides"] == ["tool_result.meta"]
    assert manifest["notes"] == []


def test_moving_any_guard_to_the_wrong_side_fails_with_a_named_error() -> None:
    chain = build_agent_chain("lead", Limits())
    members = list(chain.middlewares)
    index = {m.name: i for i, m in enumerate(members)}
    facts = constraints("lead", members)
    assert facts, "the default chain has ordering facts"
    for fact in facts:
        swapped = list(members)
        i, j = index[fact.outer], index[fact.inner]
        swapped[i], swapped[j] = swapped[j], swapped[i]
        with pytest.raises(ChainError) as info:
            check_order("lead", swapped)
        message = str(info.value)
        assert f"rule {info.value.rule}" in message
        assert "axis" in message


def _random_valid_order(members: list[Any], rng: random.Random) -> list[Any]:
    facts = constraints("lead", members)
    remaining = list(members)
    order: list[Any] = []
    while remaining:
        placed = {m.name for m in order}
        ready = [m for m in remaining if all(f.outer in placed for f in facts if f.inner == m.name)]
        pick = rng.choice(ready)
        order.append(pick)
        remaining.remove(pick)
    return order


# The fifth response trips the loop guard (5th identical call set), the turn limit (5th turn) and
# the token budget (its usage) at once: the primary must not depend on the guards' order.
SCRIPT = {
    "agents": {
        "lead": [
            {"say": "Listing.", "tool_calls": [{"name": "ls", "args": {"path": "/workspace"}}],
             "usage": {"input": 100, "output": 10}, "repeat": 4},
            {"say": "Listing again.", "tool_calls": [{"name": "ls", "args": {"path": "/workspace"}}],
             "usage": {"input": 9000, "output": 10}},
            {"say": "Final summary."},
        ]
    }
}


def _tight_limits() -> Limits:
    return Limits(turn_limit={"max_turns": 5}, token_budget={"max_tokens": 5000})


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(min_value=0, max_value=2**32 - 1))
async def test_primary_stop_reason_is_the_same_under_any_valid_order(seed: int, tmp_path: Path) -> None:
    members = list(build_agent_chain("lead", _tight_limits()).middlewares)
    order = _random_valid_order(members, random.Random(seed))
    build_chain("lead", order, catalog=CATALOG)
    harness = GuardHarness(SCRIPT, order, tmp_path / f"ws{seed}", thread_id=f"t{seed}")
    outcome = await harness.run("go")
    # A fresh reference run in the derived order.
    reference = await GuardHarness(
        SCRIPT, list(build_agent_chain("lead", _tight_limits()).middlewares), tmp_path / f"ref{seed}",
    ).run("go")
    assert sorted(outcome.codes) == sorted(reference.codes)
    assert primary_code(outcome.stop_reasons) == primary_code(reference.stop_reasons)
    assert {"loop_capped", "token_capped", "turn_capped"} <= set(outcome.codes)
    assert outcome.messages[-1].text == "Final summary."


def test_composition_keeps_the_checked_order_around_third_party_middleware() -> None:
    from langchain.agents.middleware import AgentMiddleware

    from agentkeel.harness.middleware.composed import ComposedGuards

    class Outsider(AgentMiddleware):
        async def awrap_model_call(self, request: Any, handler: Any) -> Any:
            return await handler(request)

    chain = build_agent_chain("lead", Limits(), extra=[Outsider()])
    runnable = chain.for_agent()
    flattened = [n for m in runnable for n in ([x.name for x in m.members] if isinstance(m, ComposedGuards) else [m.name])]
    assert flattened == [m.name for m in chain.middlewares]  # same members, same order
    assert "Outsider" in [m.name for m in runnable]  # third-party keeps its own place
    # Every AgentKeel guard of the default chain is wrap-only: one group on each side of it.
    assert [m.name for m in runnable if not isinstance(m, ComposedGuards)] == ["Outsider"]
    assert sum(isinstance(m, ComposedGuards) for m in runnable) == 2
    assert len({m.name for m in runnable}) == len(runnable)  # LangChain needs unique names
    manifest = chain.manifest()
    assert [g["name"] for g in manifest["langchain_middleware"]] == [m.name for m in runnable]


async def test_composed_chain_behaves_like_the_separate_middlewares(tmp_path: Path) -> None:
    composed = GuardHarness(SCRIPT, build_agent_chain("lead", _tight_limits()).for_agent(), tmp_path / "a")
    separate = GuardHarness(SCRIPT, list(build_agent_chain("lead", _tight_limits()).middlewares), tmp_path / "b")
    one, two = await composed.run("go"), await separate.run("go")
    assert one.codes == two.codes and [m.text for m in one.messages] == [m.text for m in two.messages]
    assert len(one.requests) == len(two.requests)


def _named(chain_members: list[Any], *names: str) -> list[Any]:
    by_name = {m.name: m for m in chain_members}
    return [by_name[n] for n in names]


def test_each_rule_fails_by_name_on_the_real_guards() -> None:
    members = guard_members("lead", Limits())
    # Rule 1: ToolProgress needs the metadata ToolErrorHandling stamps, so it must wrap it.
    progress, errors = _named(members, "ToolProgress", "ToolErrorHandling")
    with pytest.raises(ChainError, match=r"rule 1 \(requires\).*axis tool.*tool_result\.meta.*ToolProgress.*ToolErrorHandling"):
        check_order("lead", [errors, progress])
    # Rule 2: loop counting must see the calls after the safety repair.
    loop, safety = _named(members, "LoopDetection", "SafetyFinishReason")
    with pytest.raises(ChainError, match=r"rule 2 \(observes_final\).*axis model.*model_response\.tool_calls.*LoopDetection.*SafetyFinishReason"):
        check_order("lead", [safety, loop])
    # Rule 3: the request grammar is innermost on the model axis.
    grammar, retries = _named(members, "RequestGrammar", "LLMErrorHandling")
    with pytest.raises(ChainError, match=r"rule 3 \(slot\).*axis model.*LLMErrorHandling.*RequestGrammar"):
        check_order("lead", [grammar, retries])
    # Rule 4: a subagent chain without the loop guard (the 4.4M-token incident) does not build.
    sub = [m for m in guard_members("subagent", Limits()) if m.name != "LoopDetection"]
    with pytest.raises(ChainError, match=r"rule 4 \(mandatory_for\).*LoopDetection.*subagent"):
        build_chain("subagent", sub, catalog=CATALOG, derive=True)


def test_configured_third_party_middleware_is_placed_conservatively(tmp_path: Path) -> None:
    from agentkeel.config import KeelConfig
    from agentkeel.harness.agents import Harness

    (tmp_path / "extra.py").write_text(
        "from langchain.agents.middleware import AgentMiddleware\n"
        "class Audit(AgentMiddleware):\n"
        "    async def awrap_tool_call(self, request, handler):\n"
        "        return await handler(request)\n"
    )
    config = KeelConfig(assistants=[{"assistant_id": "lead", "middleware": ["./extra.py:Audit"]}], base_dir=tmp_path)
    harness = Harness(config)
    chain = harness.chain(harness.resolve("lead"))
    names = [m.name for m in chain.middlewares]
    # It may mutate any tool result, so every guard that observes results final wraps it.
    assert names.index("ToolOutputBudget") < names.index("Audit")
    manifest = chain.manifest()
    assert any(note.startswith("Audit declares no contract") for note in manifest["notes"])
