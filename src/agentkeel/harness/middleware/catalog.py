"""The chains AgentKeel builds: which guards a lead or subagent gets, from the ``limits:`` config.

This module decides *membership* only. The order is derived from the contracts by
:func:`agentkeel.harness.middleware.chain.build_chain` and checked there, so nobody maintains a
list whose positions encode invariants. Every chain kind gets the mandatory guards by construction
(a subagent chain lacking the lead's runaway guards is how DeerFlow's subagents burned 4.4M tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agentkeel.harness.middleware.base import KeelMiddleware
from agentkeel.harness.middleware.chain import Chain, build_chain
from agentkeel.harness.middleware.clarification import Clarification
from agentkeel.harness.middleware.coalescing import SystemMessageCoalescing
from agentkeel.harness.middleware.contracts import ChainKind
from agentkeel.harness.middleware.dangling_tool_call import DanglingToolCall
from agentkeel.harness.middleware.durable_context import DurableContext
from agentkeel.harness.middleware.input_sanitization import InputSanitization
from agentkeel.harness.middleware.llm_error_handling import LLMErrorHandling, ModelRef
from agentkeel.harness.middleware.loop_detection import LoopDetection
from agentkeel.harness.middleware.model_length import ModelLengthFinishReason
from agentkeel.harness.middleware.read_before_write import ReadBeforeWrite
from agentkeel.harness.middleware.request_grammar import RequestGrammar
from agentkeel.harness.middleware.safety_finish_reason import SafetyFinishReason
from agentkeel.harness.middleware.side_effect_ledger import SideEffectLedger
from agentkeel.harness.middleware.subagent_limit import SubagentLimit
from agentkeel.harness.middleware.summarization import Summarization
from agentkeel.harness.middleware.terminal_response import TerminalResponse
from agentkeel.harness.middleware.token_budget import TokenBudget
from agentkeel.harness.middleware.tool_call_arguments import ToolCallArguments
from agentkeel.harness.middleware.tool_error_handling import ToolErrorHandling
from agentkeel.harness.middleware.tool_output_budget import ToolOutputBudget
from agentkeel.harness.middleware.tool_progress import ToolProgress
from agentkeel.harness.middleware.tool_result_sanitization import ToolResultSanitization
from agentkeel.harness.middleware.turn_limit import TurnLimit
from agentkeel.limits import Limits, SubagentSummarizationLimits, SummarizationLimits

if TYPE_CHECKING:  # only the type: the guard takes the two numbers
    from agentkeel.config import SubagentsConfig

CATALOG: tuple[type[KeelMiddleware], ...] = (
    Clarification,
    DanglingToolCall,
    DurableContext,
    InputSanitization,
    LLMErrorHandling,
    LoopDetection,
    ModelLengthFinishReason,
    ReadBeforeWrite,
    RequestGrammar,
    SafetyFinishReason,
    SideEffectLedger,
    SubagentLimit,
    Summarization,
    SystemMessageCoalescing,
    TerminalResponse,
    TokenBudget,
    ToolCallArguments,
    ToolErrorHandling,
    ToolOutputBudget,
    ToolProgress,
    ToolResultSanitization,
    TurnLimit,
)
"""Every AgentKeel middleware; their ``mandatory_for`` declarations are enforced on every chain."""


def guard_members(
    kind: ChainKind, limits: Limits, model: ModelRef | None = None, delegation: SubagentsConfig | None = None,
    *, summarization: SummarizationLimits | None = None,
) -> list[KeelMiddleware]:
    """Fresh guard instances for one run of an agent of ``kind`` (unordered). ``model``: the model
    the chain calls (its errors name it; its ``timeout_s`` bounds each attempt). ``delegation``:
    given when the agent has the ``task`` tool, whose calls it bounds. ``summarization``: a
    subagent's compaction when ``limits.summarization`` is off (``subagents.summarization``;
    None: its default) — a subagent always compacts and always gates writes on reads."""
    members: list[KeelMiddleware] = [
        DanglingToolCall(),
        LLMErrorHandling(limits.llm_retry, model=model),
        ToolErrorHandling(),
        ToolCallArguments(),
        LoopDetection(limits.loop_detection),
        TokenBudget(limits.token_budget),
        TurnLimit(limits.turn_limit),
        SafetyFinishReason(),
        ModelLengthFinishReason(),
        TerminalResponse(),
        RequestGrammar(limits.request_grammar.mode),
        SideEffectLedger(),
        DurableContext(),
        SystemMessageCoalescing(),
    ]
    if kind == "lead":
        members.append(Clarification())
    if delegation is not None:
        members.append(SubagentLimit(delegation.max_concurrent, delegation.max_per_run))
    if limits.input_sanitization.enabled:
        members.append(InputSanitization())
    if limits.tool_result_sanitization.enabled:
        members.append(ToolResultSanitization(limits.tool_result_sanitization))
    if limits.tool_output.enabled:
        members.append(ToolOutputBudget(limits.tool_output))
    if limits.read_before_write.enabled or kind == "subagent":
        members.append(ReadBeforeWrite())
    if limits.tool_progress.enabled:
        members.append(ToolProgress(limits.tool_progress))
    if limits.summarization.enabled:
        members.append(Summarization(limits.summarization))
    elif kind == "subagent":
        members.append(Summarization(summarization or SubagentSummarizationLimits()))
    return members


def build_agent_chain(
    kind: ChainKind, limits: Limits, *, strict_grammar: bool = False, extra: Sequence[Any] = (),
    model: ModelRef | None = None, delegation: SubagentsConfig | None = None,
    summarization: SummarizationLimits | None = None,
) -> Chain:
    """The checked chain for one run: the guards plus ``extra`` (third-party) middleware, ordered
    by their contracts. ``strict_grammar`` makes every member attribute grammar violations;
    ``delegation`` and ``summarization`` as in :func:`guard_members`."""
    members: list[Any] = [
        *guard_members(kind, limits, model, delegation, summarization=summarization), *extra,
    ]
    for member in members:
        if isinstance(member, KeelMiddleware):
            member.strict_grammar = strict_grammar
    return build_chain(kind, members, catalog=CATALOG, derive=True)


__all__ = ["CATALOG", "build_agent_chain", "guard_members"]
