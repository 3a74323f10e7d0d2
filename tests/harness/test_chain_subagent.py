"""The subagent chain: every guard declared mandatory for subagents is enforced at build time, by
name; read-before-write and summarization are always in it (a lead's are switches)."""

from __future__ import annotations

import pytest

from agentkeel.harness.middleware.catalog import CATALOG, build_agent_chain, guard_members
from agentkeel.harness.middleware.chain import ChainError, build_chain
from agentkeel.harness.middleware.summarization import Summarization
from agentkeel.limits import Limits, SubagentSummarizationLimits, SummarizationLimits

SUBAGENT_MANDATORY = [cls for cls in CATALOG if "subagent" in cls.contract.mandatory_for]

# The guards the subagent issue names as mandatory for every subagent chain.
ISSUE_LIST = {
    "LoopDetection", "TokenBudget", "TurnLimit", "SafetyFinishReason", "ModelLengthFinishReason",
    "DurableContext", "Summarization", "SystemMessageCoalescing", "ToolErrorHandling", "ReadBeforeWrite",
    "RequestGrammar",
}


def test_the_issues_guards_are_all_mandatory_for_subagents() -> None:
    assert ISSUE_LIST <= {cls.__name__ for cls in SUBAGENT_MANDATORY}


@pytest.mark.parametrize("missing", SUBAGENT_MANDATORY, ids=lambda cls: cls.__name__)
def test_a_subagent_chain_without_a_mandatory_guard_does_not_build(missing: type) -> None:
    # Every switch off: the mandatory guards must be there regardless.
    off = {"enabled": False}
    limits = Limits(read_before_write=off, input_sanitization=off, tool_result_sanitization=off,
                    tool_output=off, tool_progress=off)
    members = guard_members("subagent", limits)
    assert any(isinstance(m, missing) for m in members)
    without = [m for m in members if not isinstance(m, missing)]
    with pytest.raises(ChainError, match=rf"rule 4 \(mandatory_for\): {missing.__name__} is mandatory for subagent"):
        build_chain("subagent", without, catalog=CATALOG, derive=True)


def test_read_before_write_and_summarization_stay_optional_for_a_lead() -> None:
    off = Limits(read_before_write={"enabled": False})
    names = [m.name for m in build_agent_chain("lead", off).middlewares]
    assert "ReadBeforeWrite" not in names and "Summarization" not in names
    sub = [m.name for m in build_agent_chain("subagent", off).middlewares]
    assert "ReadBeforeWrite" in sub and "Summarization" in sub


def _summarizer(kind: str, limits: Limits, summarization: SummarizationLimits | None = None) -> Summarization:
    [member] = [m for m in guard_members(kind, limits, summarization=summarization) if isinstance(m, Summarization)]  # type: ignore[arg-type]
    return member


def test_a_subagent_compacts_with_the_leads_settings_else_its_own() -> None:
    lead_on = Limits(summarization={"enabled": True, "trigger_tokens": 30_000, "keep_messages": 8})
    assert _summarizer("subagent", lead_on, SubagentSummarizationLimits(trigger_tokens=99_000)).limits == lead_on.summarization
    own = SubagentSummarizationLimits(trigger_tokens=99_000, keep_messages=5)
    assert _summarizer("subagent", Limits(), own).limits == own
    default = _summarizer("subagent", Limits()).limits
    assert (default.enabled, default.trigger_tokens, default.keep_messages) == (True, 64_000, 20)
