"""TokenBudget: stop dispatching tool calls once the run has spent its token budget (``token_capped``).

Why: a runaway agent burns input tokens (the whole context is re-sent every turn), and in DeerFlow
#3875 99.7% of them were spent by subagents. So the budget is on the WHOLE run — the run context's
usage meter, which the runtime updates from a model-call callback that fires before the model
handler returns, so the figure includes this very response and every subagent call so far (DeerFlow
saw subagent usage one call late). Without a meter it falls back to the usage of the responses this
instance saw. Total, input and output are each checked against their own limit; the worst fraction
decides.

Over budget, the response's tool calls are withheld (its text stays as the partial answer) and
``token_capped`` is recorded once per run; later responses still over budget are withheld again
without a second entry. Near the budget one ``budget_warning`` note goes to the next request.
A response without intended tool calls ends the run by itself, so it is neither withheld nor capped.
"""

from __future__ import annotations

from dataclasses import dataclass

from langchain.agents.middleware.types import ModelRequest, ModelResponse
from langchain_core.messages import AIMessage

from agentkeel.harness.middleware.base import HintQueue, KeelMiddleware, ModelHandler, run_context
from agentkeel.harness.middleware.contracts import Contract, on
from agentkeel.harness.middleware.responses import intended_calls, last_ai, replace_ai, withhold
from agentkeel.limits import TokenBudgetLimits


@dataclass(frozen=True)
class Pressure:
    """The most-used budget: ``kind`` is ``total``, ``input`` or ``output``."""

    kind: str
    used: int
    budget: int

    @property
    def fraction(self) -> float:
        return self.used / self.budget


def pressure(limits: TokenBudgetLimits, input_tokens: int, output_tokens: int) -> Pressure:
    """The budget closest to (or furthest past) its limit; ties go to ``total``."""
    candidates = [Pressure("total", input_tokens + output_tokens, limits.max_tokens)]
    if limits.max_input_tokens is not None:
        candidates.append(Pressure("input", input_tokens, limits.max_input_tokens))
    if limits.max_output_tokens is not None:
        candidates.append(Pressure("output", output_tokens, limits.max_output_tokens))
    return max(candidates, key=lambda p: p.fraction)


class TokenBudget(KeelMiddleware):
    """Warns near, and withholds tool calls past, the run's token budget; see the module docstring."""

    contract = Contract(
        axes={"model": on(
            reads={"model_response.usage"},
            # Withholding decides what is dispatched, so it must see the calls after the protocol
            # repairs (safety, length, clarification), never before them.
            observes_final={"model_response.tool_calls"},
            mutates={"model_response.dispatch", "model_request.messages"},
        )},
        mandatory_for=frozenset({"lead", "subagent"}),
    )

    def __init__(self, limits: TokenBudgetLimits) -> None:
        super().__init__()
        self.limits = limits
        self._hints = HintQueue("budget_warning")
        self._seen_input = 0
        self._seen_output = 0
        self._warned = False
        self._capped = False

    def usage(self, request: ModelRequest) -> tuple[int, int]:
        """(input, output) tokens of the run: the meter if the run has one, else what this saw."""
        ctx = run_context(request.runtime)
        if ctx is not None and ctx.usage is not None:
            return ctx.usage.input_tokens, ctx.usage.output_tokens
        return self._seen_input, self._seen_output

    async def awrap_model_call(self, request: ModelRequest, handler: ModelHandler) -> ModelResponse:
        handler = self.traced(request, handler)
        outgoing, sent = self._hints.apply(request)
        response = await handler(outgoing)
        self._hints.delivered(sent)

        for message in response.result:
            if isinstance(message, AIMessage) and message.usage_metadata:
                self._seen_input += int(message.usage_metadata.get("input_tokens") or 0)
                self._seen_output += int(message.usage_metadata.get("output_tokens") or 0)
        worst = pressure(self.limits, *self.usage(request))
        ai = last_ai(response)
        runtime = request.runtime
        if worst.fraction >= 1.0:
            if ai is None or not intended_calls(ai):
                return response
            note = (
                f"[TOKEN BUDGET EXCEEDED] The run's {worst.kind} token usage ({worst.used}) reached its "
                f"limit ({worst.budget}); these tool calls were not run. Answer with what you have."
            )
            if not self._capped:
                self._capped = True
                data = {"kind": worst.kind, "used": worst.used, "budget": worst.budget}
                detail = f"{worst.kind} tokens {worst.used} >= budget {worst.budget}; tool calls withheld."
                await self.stop(runtime, "token_capped", detail, data, cause=ai.id)
            self.intervene(runtime, "withhold", note, message_id=ai.id)
            return replace_ai(response, ai, withhold(ai, self.name, note))
        if worst.fraction >= self.limits.warn_fraction and not self._warned:
            self._warned = True
            text = (
                f"[TOKEN BUDGET WARNING] You have used {worst.used} of your {worst.budget} {worst.kind} "
                f"token budget ({worst.fraction:.0%}). Wrap up: finish the current step and give your "
                "final answer soon."
            )
            self._hints.push(text)
            self.intervene(runtime, "warn", text, message_id=ai.id if ai is not None else None)
        return response


__all__ = ["Pressure", "TokenBudget", "pressure"]
